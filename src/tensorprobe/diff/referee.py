"""A float64 referee: when a port parts from its reference, which side is closer to the exact answer?

PyTorch's answer to "torch.compile gives different results than eager" is to compare both against a float64
run (`torch._dynamo.utils.same(ref, res, fp64_ref=...)`): a candidate that is at least as close to float64 as
the reference is rounding differently, not wrong. This module makes that judgement per record and at the
model's outputs, from three bundles: the reference, the candidate, and the reference model run in float64 on
the same inputs (`tensorprobe.referee.capture_fp64` captures it; `tensorprobe diff --referee fp64` does both).

Per record (every name the three bundles share with stored values: all of them with keep="full", the model
outputs always), with e(x) = ‖x − x64‖ / ‖x64‖:

- `closer`: the candidate is clearly closer to float64 than the reference (2 e_cand < e_ref, and e_ref above
  `PARTS_FLOOR`: a hair's difference, 1.5e-07 against 1.5e-07, is `as_close`);
- `as_close`: within 2x of the reference's own error, or both within float32 rounding of float64 (≤ 1e-5·√n
  is not asked: the floor is the reference's own error, measured here);
- `parts`: further from float64 than twice the reference's error and than `PARTS_FLOOR`: the candidate computes
  something else. The first such record in execution order is where it parts.

The report's verdict is the outputs': `parts` if one parts, else `closer` / `as_close`. When every output is far
from float64 on both sides (a model that amplifies rounding: a vocoder's phase), the outputs cannot tell, and a
record decides: the candidate parts if, somewhere the reference is still close to float64, it is 100 times further
and at least 1e-4 away (`clear_parting`).

Reads bundles with NumPy only.

    >>> r = referee("eager", "compiled", "fp64")                 # doctest: +SKIP
    >>> print(r.summary())                                        # doctest: +SKIP
    compiled is closer to float64 than eager at the output (rel err 2.1e-06 vs 4.8e-06): this is not a bug
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..bundle import Bundle
from ..numbers import json_number
from ..record import KIND_MODEL_OUTPUT, KIND_RNG, WEIGHT_KINDS

# The candidate "parts" when its error to float64 exceeds this many times the reference's own error ...
PARTS_FACTOR = 2.0
# ... and this relative error (differences below it are rounding whatever the ratio says: two float32
# computations of an exactly representable value can differ from float64 by 0 and 1e-8).
PARTS_FLOOR = 1e-6

# Both sides further than this from float64 at an output: neither computes it; rounding decides it.
ILL_CONDITIONED = 1e-2
# Where the outputs are so decided, a record decides instead if the candidate is this much further from float64
# than the reference there, and at least this far (rounding differences stay far below both).
CLEAR_FACTOR, CLEAR_FLOOR = 100.0, 1e-4

VERDICT_CLOSER, VERDICT_AS_CLOSE, VERDICT_PARTS = "closer", "as_close", "parts"
VERDICT_DRAWS_DIFFER = "draws_differ"


@dataclass(frozen=True)
class RefereeRecord:
    """One record judged against float64."""

    name: str
    kind: str
    ref_err: float      # ‖ref − fp64‖ / ‖fp64‖
    cand_err: float     # ‖cand − fp64‖ / ‖fp64‖
    verdict: str

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "ref_err": json_number(self.ref_err),
                "cand_err": json_number(self.cand_err), "verdict": self.verdict}


@dataclass(frozen=True)
class RefereeReport:
    """Which side is closer to float64, per record and at the outputs; `summary()` says it in one sentence."""

    ref_label: str
    cand_label: str
    records: tuple[RefereeRecord, ...] = ()
    skipped: int = 0           # shared records without stored values on all three sides (keep="stats")
    notes: tuple[str, ...] = field(default_factory=tuple)
    draws_differ: tuple[str, ...] = ()   # random draws whose values differ between the two sides

    @property
    def outputs(self) -> tuple[RefereeRecord, ...]:
        return tuple(r for r in self.records if r.kind == KIND_MODEL_OUTPUT)

    @property
    def first_parting(self) -> RefereeRecord | None:
        """The first record (execution order) where the candidate parts from both the reference and float64."""
        return next((r for r in self.records if r.verdict == VERDICT_PARTS and r.kind != KIND_MODEL_OUTPUT),
                    next((r for r in self.outputs if r.verdict == VERDICT_PARTS), None))

    @property
    def verdict(self) -> str:
        """`parts` if the candidate parts from float64 at an output, else `closer` or `as_close` (the outputs'
        worst); `draws_differ` when the two sides drew different random numbers (float64 cannot say which
        computation is right when their inputs differ); `no_data` when no output could be judged."""
        if self.draws_differ:
            return VERDICT_DRAWS_DIFFER
        outs = self.outputs
        if not outs:
            return "no_data"
        if any(r.verdict == VERDICT_PARTS for r in outs):
            return VERDICT_PARTS
        if self.clear_parting is not None:   # outputs decided by rounding: the record where it parts decides
            return VERDICT_PARTS
        return VERDICT_CLOSER if all(r.verdict == VERDICT_CLOSER for r in outs) else VERDICT_AS_CLOSE

    @property
    def ill_conditioned(self) -> bool:
        """Every output is far from float64 on both sides: the model amplifies rounding until the outputs say
        nothing of which side computes right (a vocoder's phase: Kokoro's float32 output is 1.2 from float64)."""
        outs = self.outputs
        return bool(outs) and all(min(o.cand_err, o.ref_err) > ILL_CONDITIONED for o in outs)

    @property
    def clear_parting(self) -> RefereeRecord | None:
        """With ill-conditioned outputs, the first record where the reference is still close to float64 and the
        candidate is far from both (`CLEAR_FACTOR` times the reference's error and above `CLEAR_FLOOR`): a
        computation that is not the reference's, before the amplification hides it."""
        if not self.ill_conditioned:
            return None
        return next((r for r in self.records if r.kind != KIND_MODEL_OUTPUT and r.ref_err <= ILL_CONDITIONED
                     and r.cand_err > max(CLEAR_FACTOR * r.ref_err, CLEAR_FLOOR)), None)

    @property
    def is_bug(self) -> bool:
        return self.verdict == VERDICT_PARTS

    def summary(self) -> str:
        if self.draws_differ:
            return (f"the {self.cand_label} and the {self.ref_label} drew different random numbers (first at "
                    f"{self.draws_differ[0]}): float64 cannot judge two computations fed different noise; replay "
                    "the draws (compare --replay-rng, or capture --replay-rng) to judge the rest")
        outs = self.outputs
        if not outs:
            return "float64 referee: no model output holds values on all three sides; nothing judged"
        worst = max(outs, key=lambda r: r.cand_err / max(r.ref_err, 1e-300))
        c, r = self.cand_label, self.ref_label
        # which output (the worst by ratio) and which side each figure is
        errs = (f"{worst.name}: rel err {worst.cand_err:.2g} {c.split(' ')[0]} vs {worst.ref_err:.2g} "
                f"{r.split(' ')[0]}")
        # both sides far from float64: the output is decided by rounding, not by either implementation
        neither = (f"; neither is close to float64: at {worst.name} the result depends on rounding (an "
                   "ill-conditioned computation at this precision)"
                   if min(worst.cand_err, worst.ref_err) > ILL_CONDITIONED else "")
        if self.verdict == VERDICT_CLOSER:
            return f"{c} is closer to float64 than {r} at the output ({errs}): this is not a bug{neither}"
        if self.verdict == VERDICT_AS_CLOSE:
            how = ("the same error; this is not a bug" if all(o.cand_err == o.ref_err for o in outs)
                   else "they round differently; this is not a bug")
            return f"{c} is as close to float64 as {r} at the output ({errs}): {how}{neither}"
        at = self.clear_parting or self.first_parting
        where = f" at {at.name} ({at.cand_err:.2g} from float64 where {r} is {at.ref_err:.2g})" if at else ""
        if self.clear_parting is not None:
            return (f"the {c} parts from both the {r} and float64{where}; the outputs cannot tell (both far from "
                    f"float64: {errs}, the model amplifies rounding), so the record decides")
        return f"the {c} parts from both the {r} and float64{where}; at the output ({errs})"

    def to_dict(self) -> dict[str, Any]:
        fp = self.clear_parting or self.first_parting
        return {"verdict": self.verdict, "summary": self.summary(), "first_parting": fp.name if fp else None,
                "draws_differ": list(self.draws_differ),
                "records": [r.to_dict() for r in self.records], "skipped": self.skipped, "notes": list(self.notes)}


def judge(ref_err: float, cand_err: float) -> str:
    """`closer`, `as_close` or `parts` from the two errors to float64 (see the module docstring).

        >>> judge(4.8e-6, 2.1e-6), judge(1e-7, 1.5e-7), judge(1.5e-7, 1.4e-7), judge(1e-7, 3e-3)
        ('closer', 'as_close', 'as_close', 'parts')
    """
    if PARTS_FACTOR * cand_err < ref_err and ref_err > PARTS_FLOOR:   # clearly closer, not by a hair
        return VERDICT_CLOSER
    if cand_err <= PARTS_FACTOR * ref_err or cand_err <= PARTS_FLOOR:
        return VERDICT_AS_CLOSE
    return VERDICT_PARTS


def _rel(x: np.ndarray, ref: np.ndarray) -> float:
    ref = ref.astype(np.float64, copy=False).ravel()
    x = x.astype(np.float64, copy=False).ravel()
    both = np.isfinite(ref) & np.isfinite(x)
    if not both.all():
        same = np.array_equal(np.isnan(ref), np.isnan(x)) and np.array_equal(np.isinf(ref) * ref, np.isinf(x) * x)
        if not same:
            return math.inf
        ref, x = ref[both], x[both]
    den = float(np.sqrt(np.dot(ref, ref)))
    num = float(np.sqrt(np.dot(x - ref, x - ref)))
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def referee(ref: Bundle | str | os.PathLike, cand: Bundle | str | os.PathLike,
            fp64: Bundle | str | os.PathLike, *, ref_label: str = "reference",
            cand_label: str = "candidate") -> RefereeReport:
    """Judge which of `ref` and `cand` is closer to `fp64` (the reference model run in float64), per record
    shared by name and at the model outputs.

    Example:
        >>> print(referee("eager", "compiled", "fp64", ref_label="eager", cand_label="compiled").summary())  # doctest: +SKIP
        compiled is as close to float64 as eager at the output (rel err 3.1e-07 vs 2.9e-07): ...
    """
    rb, cb, fb = (b if isinstance(b, Bundle) else Bundle.open(b) for b in (ref, cand, fp64))
    out: list[RefereeRecord] = []
    skipped = 0
    notes = []
    draws_differ = []
    for r in sorted(rb.records, key=lambda x: x.order):
        if r.kind in WEIGHT_KINDS or r.kind == "model_input":
            continue
        c, f = cb.get(r.name), fb.get(r.name)
        if r.kind == KIND_RNG:   # a draw is an input of what follows, not a computation to judge
            if c is not None and r.has_tensor and c.has_tensor and not _same_draw(rb.numpy(r.name), cb.numpy(c.name)):
                draws_differ.append(r.name)
            continue
        if c is None or f is None:
            continue
        if not (r.has_tensor and c.has_tensor and f.has_tensor):
            skipped += 1
            continue
        if tuple(r.shape) != tuple(f.shape) or tuple(c.shape) != tuple(f.shape):
            continue
        if not (_is_float(r.dtype) and _is_float(c.dtype)):
            continue
        a64 = fb.numpy(r.name)
        re_, ce = _rel(rb.numpy(r.name), a64), _rel(cb.numpy(c.name), a64)
        out.append(RefereeRecord(r.name, r.kind, re_, ce, judge(re_, ce)))
    if skipped:
        notes.append(f"{skipped} shared records hold statistics only (keep='stats'); capture with keep='full' "
                     "for a per-record verdict")
    return RefereeReport(ref_label, cand_label, tuple(out), skipped, tuple(notes), tuple(draws_differ))


def _same_draw(a: np.ndarray, b: np.ndarray) -> bool:
    """The same random numbers, up to the rounding of a cast (a float16 port drawing float32 noise)."""
    if a.shape != b.shape:
        return False
    a64, b64 = a.astype(np.float64, copy=False), b.astype(np.float64, copy=False)
    return bool(np.allclose(a64, b64, rtol=1e-3, atol=1e-6, equal_nan=True))


def _is_float(dtype: str) -> bool:
    return dtype.startswith(("float", "bfloat")) or dtype in ("half", "double")


__all__ = ["CLEAR_FACTOR", "CLEAR_FLOOR", "ILL_CONDITIONED", "PARTS_FACTOR", "PARTS_FLOOR", "RefereeRecord", "RefereeReport", "judge", "referee"]
