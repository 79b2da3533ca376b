"""Diff integration: was the first divergence caused by noise that was not replayed? (NumPy only)"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable

import numpy as np

from ..bundle import Bundle
from ..record import KIND_RNG, Record
from ..record import TAG_REPLAYED

@dataclass(frozen=True)
class RngSuspect:
    """A random op whose noise differs between two runs and was not replayed, just before a divergence."""

    rng: str                 # record name of the random op
    op: str
    source: str | None
    divergent: str           # the first divergent record it explains
    direct: bool             # the divergent record consumes the noise directly (op graph), or is the noise
    pearson: float | None    # correlation of the two noise tensors, when both were stored
    replayed: bool           # True when the candidate was replayed but this op still differs

    def sentence(self) -> str:
        where = f" ({self.source})" if self.source else ""
        corr = f", correlation {self.pearson:.4f}" if self.pearson is not None else ""
        if self.rng == self.divergent:
            head = f"the first divergence is the random op {self.rng}{where} itself{corr}"
        else:
            rel = "right after" if self.direct else "after"
            head = f"the first divergence {self.divergent} sits {rel} random op {self.rng}{where}{corr}"
        if self.replayed:
            return head + "; it was replayed yet differs: the replay matched a different recorded tensor"
        return head + ", whose noise was not replayed: rerun the candidate with --replay-rng REF_BUNDLE"

    def to_dict(self) -> dict[str, Any]:
        return {"rng": self.rng, "op": self.op, "source": self.source, "divergent": self.divergent,
                "direct": self.direct, "pearson": self.pearson, "replayed": self.replayed,
                "message": self.sentence()}


def unreplayed_rng_before(report_or_records: Any, divergent: str | None = None, *, ref: Any = None,
                          cand: Any = None) -> RngSuspect | None:
    """If the first divergence follows a random op whose noise differs and was not replayed, name that op.

    Args:
        report_or_records: a diff report (anything with `first_divergence` naming a record, and `ref`/
            `cand` bundles or paths), a candidate `Bundle`, or the candidate's records in order.
        divergent: name of the first divergent record (taken from the report when omitted).
        ref, cand: the two bundles (or paths), to check that the noise really differs; without them the
            decision uses the records' "replayed" tags alone.

    Returns:
        An `RngSuspect` (with `.sentence()` for the report), or None when no unreplayed random op
        precedes the divergence.

    Example:
        >>> s = unreplayed_rng_before(cand_bundle, "<root>/tanh.0", ref=ref_bundle)   # doctest: +SKIP
        >>> s.sentence()                                                              # doctest: +SKIP
        'the first divergence <root>/tanh.0 sits right after random op <root>/randn_like.0 (...)'
    """
    recs, divergent, ref, cand = _unpack(report_or_records, divergent, ref, cand)
    if divergent is None:
        return None
    by_name = {r.name: r for r in recs}
    target = by_name.get(divergent)
    if target is None:
        return None
    ancestors = _ancestors(target, by_name)
    ref_recs = {r.name: r for r in ref} if isinstance(ref, Bundle) else {}
    before = sorted((r for r in recs if r.kind == KIND_RNG and r.order <= target.order),
                    key=lambda r: r.order, reverse=True)
    suspects = []
    for r in before:
        replayed = TAG_REPLAYED in r.tags
        pearson, differs = _noise_differs(ref, cand, r, ref_recs)
        if differs is False or (differs is None and replayed):
            continue
        direct = r.name == target.name or r.name in target.inputs
        suspects.append(RngSuspect(r.name, r.op, r.source, divergent, direct, pearson, replayed))
    # Noise the divergence depends on (op graph) first; else the nearest one before it (module-level
    # captures don't record the functional ops that link them).
    linked = [s for s in suspects if s.rng == target.name or s.rng in ancestors]
    return (linked or suspects or [None])[0]


def _unpack(obj: Any, divergent: str | None, ref: Any, cand: Any):
    if isinstance(obj, Bundle) or (isinstance(obj, Iterable) and not hasattr(obj, "first_divergence")):
        recs = list(obj)
        cand = cand if cand is not None else (obj if isinstance(obj, Bundle) else None)
    else:  # a diff report, duck-typed
        first = getattr(obj, "first_divergence", None)
        if divergent is None and first is not None:
            divergent = first if isinstance(first, str) else (getattr(first, "cand_name", None)
                                                             or getattr(first, "name", None))
        ref = ref if ref is not None else getattr(obj, "ref", None) or getattr(obj, "ref_path", None)
        cand = cand if cand is not None else getattr(obj, "cand", None) or getattr(obj, "cand_path", None)
        if cand is None:
            return [], None, ref, cand
        cand = cand if isinstance(cand, Bundle) else Bundle.open(cand)
        recs = list(cand)
    if ref is not None and not isinstance(ref, Bundle):
        ref = Bundle.open(ref)
    if cand is not None and not isinstance(cand, Bundle):
        cand = Bundle.open(cand)
    return recs, divergent, ref, cand


def _ancestors(target: Record, by_name: dict[str, Record]) -> set[str]:
    """Names of every record `target` depends on through the op graph (empty without a graph)."""
    seen: set[str] = set()
    todo = deque(target.inputs)
    while todo:
        n = todo.popleft()
        if n in seen:
            continue
        seen.add(n)
        r = by_name.get(n)
        if r is not None:
            todo.extend(r.inputs)
    return seen


def _noise_differs(ref: Any, cand: Any, r: Record, ref_recs: dict[str, Record]) -> tuple[float | None, bool | None]:
    """(pearson, differs) for random record `r` across both bundles; (None, None) when unknown."""
    other = ref_recs.get(r.name)
    if not isinstance(cand, Bundle) or other is None or not (other.has_tensor and r.has_tensor):
        return None, None
    a, b = ref.numpy(r.name), cand.numpy(r.name)
    if a.shape != b.shape:
        return None, True
    if np.array_equal(a, b):
        return 1.0, False
    from ..diff.metrics import compare
    return compare(a, b).get("pearson"), True
