"""Ops only the port has, caught where they change a value.

A port that applies one more op inside a module (a gain past frame N, a clamp, a cast the reference does not
make) shows at op level as a candidate-only record: nothing on the reference side pairs with it. The first
record that fails is then the op that *reads* its result, in the next module, and its error looks like its own
("its inputs were not compared: candidate only ..."). But that claim can be tested: the reference's op reads
value R, which agrees with the port's Y; the port's op reads X, made from Y by ops only the port has. Compare R
with X: when they differ beyond R's floor, the value is changed before the failing op runs, by the port's own
op X, inside X's module. The pair keeps its place (it is the first compared record that fails) and says where
the error enters (`origin`, tag `port_op`).

    >>> report = diff("ref", "port")                                     # doctest: +SKIP
    >>> p = report.get(report.first_divergence); p.origin, "port_op" in p.tags  # doctest: +SKIP
    ('pre/cat.0', True)
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

from ..record import WEIGHT_KINDS, module_label
from .align import MATCH_VIEW, Pair
from .evidence import CAND_ONLY
from .noise import CAUSE_AMPLIFIED, CAUSE_OWN, MEASURED
from .result import STATUS_FAIL, TAG_NORM_MEASURED, TAG_PORT_OP, Criteria, PairResult

MATCH_READ = "value read"   # a reference value paired with the port's value that replaces it where it is read
_MAX_STEPS = 64             # candidate-only records walked back from one op
_VIEW_PLAUSIBLE = 10.0      # a value paired as a view carries at most this times the error of the op reading it


def changed_by_port_ops(forward: Sequence[PairResult], ref_bundle: Any, cand_bundle: Any, criteria: Criteria,
                        compare: Callable[..., PairResult], noise: Mapping[str, Any] | None) -> list[PairResult]:
    """`forward`, each failing pair whose error is called its own while it reads a value only the port makes
    re-told: where that value differs from what the reference reads, the error enters at the port's op. A pair
    that passes while reading such a value is tested too: an op after it may remove what the port's op changed
    (a LayerNorm removes a gain on some frames), and then no later record shows it."""
    by_cand = {p.cand_name: p for p in forward}
    out = []
    for p in forward:
        extra = [n for n, why in p.uncompared_inputs if why == CAND_ONLY]
        # (a norm's "beyond what its input's error makes" measured the input the reference reads, not the port's)
        if p.failed and p.cause == CAUSE_OWN and (not p.explanation or TAG_NORM_MEASURED in p.tags) and extra:
            p = _entered_at(p, extra, by_cand, ref_bundle, cand_bundle, criteria, compare, noise or {})
        elif p.passed or (p.failed and p.cause == CAUSE_AMPLIFIED):
            p = _reads_port_value(p, by_cand, ref_bundle, cand_bundle, criteria, compare, noise or {})
        out.append(p)
    return out


def _reads_port_value(p: PairResult, by_cand: Mapping[str, PairResult], ref_bundle: Any, cand_bundle: Any,
                      criteria: Criteria, compare: Callable[..., PairResult], noise: Mapping[str, Any]) -> PairResult:
    """A pair that passed (or failed as its input's error amplified) while the port's op reads a value of its own
    instead of the reference's input. Where that value differs from the reference's, the error enters at the
    port's op, and the pair fails with it as origin: on a measured floor ("its input differs by e, which its op
    amplifies"), the measurement was not of what it reads; on any floor, what it reads differs though its own
    value agrees (the op removes it)."""
    cand = cand_bundle.get(p.cand_name)
    if cand is None or not cand.inputs:
        return p
    extra = [i for i in cand.inputs if i not in by_cand and (r := cand_bundle.get(i)) is not None
             and r.kind not in WEIGHT_KINDS]
    if not extra:
        return p
    # (no value paired as a view here: an op that agrees proves nothing of what such a pairing claims)
    found = _entered_at(replace(p, status=STATUS_FAIL, cause=CAUSE_OWN), extra, by_cand, ref_bundle, cand_bundle,
                        criteria, compare, noise, views=False)
    if TAG_PORT_OP not in found.tags:
        return p
    if p.failed:    # "amplified" rested on its input's error, while the port's op reads another value
        return found
    e = p.rel_err if p.rel_err is not None else p.metrics.get("rel_l2_err_lower")
    if not (p.floor_reason or "").startswith(MEASURED):
        error = f" (relative error {e:.3g})" if e is not None else ""
        return replace(found, reasons=(f"its own value agrees{error}, but what it reads differs: {p.name} removes "
                                       "the difference the port's op makes",))
    n = noise.get(p.name)
    floor = n.ceiling if n is not None else p.floor
    return replace(found, floor=floor, floor_reason=f"{found.floor_reason}; not backed: the port's op reads another "
                   "value than the input measured", reasons=(f"relative error {e:.3g} beyond the rounding noise "
                                                             f"{floor:.2g}",))


def _entered_at(p: PairResult, extra: list[str], by_cand: Mapping[str, PairResult], ref_bundle: Any,
                cand_bundle: Any, criteria: Criteria, compare: Callable[..., PairResult],
                noise: Mapping[str, Any], views: bool = True) -> PairResult:
    ref_rec = ref_bundle.get(p.name)
    if ref_rec is None:
        return p
    for name in extra:
        x = _made_by(cand_bundle.get(name), cand_bundle)
        if x is None or x.kind in WEIGHT_KINDS or not x.has_tensor or _inside(x.module, ref_rec):
            continue
        name = x.name
        for q in _compared_sources(x, by_cand, cand_bundle):
            r = ref_bundle.get(q.name)
            if q.name not in ref_rec.inputs or r is None or not r.has_tensor or tuple(r.shape) != tuple(x.shape):
                continue
            seen = compare(ref_bundle, cand_bundle, Pair(r, x, MATCH_READ), criteria, noise=noise.get(q.name))
            if seen.failed and seen.rel_err is not None:
                agrees = "the reference's" if q.cand_name == q.name else q.name
                return replace(p, origin=name, tags=p.tags + (TAG_PORT_OP,), explanation=(
                    f"the value it reads differs already: the port reads {name}, made from {q.cand_name} (which "
                    f"agrees with {agrees}) by ops the reference does not have, in {module_label(x.module)}; "
                    f"against {q.name}, which the reference reads, its relative error is {seen.rel_err:.3g}: the "
                    f"error enters at {name}"))
        r = _replaced(x, ref_rec, ref_bundle, by_cand) if views and p.rel_err else None
        if r is not None:
            seen = compare(ref_bundle, cand_bundle, Pair(r, x, MATCH_VIEW), criteria, noise=noise.get(r.name))
            # (read as a view of another shape, a transposed value would differ wholesale: far beyond what the
            # failing op makes of it, which tells a wrong pairing from a difference that enters there)
            if seen.failed and seen.rel_err is not None and seen.rel_err <= _VIEW_PLAUSIBLE * p.rel_err:
                where = module_label(x.module)
                return replace(p, origin=name, tags=p.tags + (TAG_PORT_OP,), explanation=(
                    f"the value it reads differs already: the port computes {where}'s value {name} by ops the "
                    f"reference does not have (the reference computes {r.name}, which has no counterpart); against "
                    f"it, its relative error is {seen.rel_err:.3g}: the error enters in {where}"))
    return p


def _replaced(x: Any, ref_rec: Any, ref_bundle: Any, by_cand: Mapping[str, PairResult]) -> Any:
    """The reference's input of `ref_rec` that the port's value `x` stands for: made in `x`'s module, of its size
    (the port's may be a view of it in another shape), and paired with nothing (a norm the port computes by
    other ops: its mean, sub, div against one group-norm op)."""
    paired = {q.name for q in by_cand.values()}
    for name in ref_rec.inputs:
        r = ref_bundle.get(name)
        if r is not None and r.name not in paired and r.kind not in WEIGHT_KINDS and r.has_tensor and \
                r.module == x.module and r.stats.numel == x.stats.numel:
            return r
    return None


def _made_by(x: Any, cand_bundle: Any) -> Any:
    """`x`, or for a module's output (a compiled capture's `<root>`, which names the call's inputs, not the op
    that made its value) the last op record of that call with its shape: the value it holds."""
    if x is None or not x.op.startswith("module:"):
        return x
    inside = [r for r in cand_bundle.records if "/" in r.name and r.order < x.order and tuple(r.shape) ==
              tuple(x.shape) and r.kind not in WEIGHT_KINDS and (not x.module or r.module == x.module or
                                                                 r.module.startswith(x.module + "."))]
    return max(inside, key=lambda r: r.order, default=x)


def _inside(module: str, rec: Any) -> bool:
    """Is `module` the failing record's own, or inside the module whose output it is? Then the port's op is part
    of how the port computes that record (a norm decomposed into ReduceMean, Sub...), not an op before it."""
    own = rec.module or ""
    return module == own or (rec.op.startswith("module:") and (not own or module.startswith(own + ".")))


def _compared_sources(x: Any, by_cand: Mapping[str, PairResult], cand_bundle: Any) -> list[PairResult]:
    """The compared, agreeing values that candidate-only record `x` is made from, walking back through other
    candidate-only records (a slice, a multiply, then the cat)."""
    found, todo, seen = [], list(x.inputs), set()
    while todo and len(seen) < _MAX_STEPS:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        q = by_cand.get(name)
        if q is not None:
            if q.passed and q.kind not in WEIGHT_KINDS:
                found.append(q)
            continue
        rec = cand_bundle.get(name)
        if rec is not None and rec.kind not in WEIGHT_KINDS:
            todo.extend(rec.inputs)
    return found


__all__ = ["MATCH_READ", "changed_by_port_ops"]
