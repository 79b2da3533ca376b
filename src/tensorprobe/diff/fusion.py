"""What exporters fold and fuse, told apart from bugs.

A faithful export folds an eval-mode BatchNorm into the convolution before it: the port has one value where
the reference has two (the convolution's and the norm's), and the convolution's weights hold the folded values.
Two things follow, and both were false alarms on one of the most common audio blocks:

- `fused_successors`: the port's value named after the convolution holds what the reference's *next* record
  (the norm) computes. When that next record has no candidate of its own and the value matches it, the pair is
  re-made with it, and the convolution's own pair is not comparable ("fused").
- `judge_weight_readers`: a weight that differs is judged by the module that reads it. Its reader agrees,
  compared value by value (or the port has no value of the reader's own and what follows agrees): the weight
  was folded or re-packed by the port, a note (`TAG_FOLDED`), not a divergence. Its reader was compared by
  statistics only, which show nothing (a permutation or a kernel reversed in time keeps every statistic): the
  reader is where the port's bug shows (`TAG_WEIGHT_UNSEEN`, cause `weights`). Its reader's error stands far
  above what its input brings, yet inside a wide noise floor (a bfloat16 port's): the reader fails on the weight.

    >>> from tensorprobe.diff.result import TAG_FOLDED
    >>> report = diff("ref", "onnx")                                      # doctest: +SKIP
    >>> [w.name for w in report.weights if TAG_FOLDED in w.tags]          # doctest: +SKIP
    ['blocks.0.0.weight', 'blocks.0.0.bias']
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Sequence

from ..record import KIND_MODEL_INPUT, KIND_MODEL_OUTPUT, KIND_OUTPUT, WEIGHT_KINDS, Record
from .align import Alignment, Pair, made_from_weights
from .evidence import CAND_ONLY, UNPAIRED, direct_inputs, module_weights
from .explain import family, is_recurrent
from .layout import TAG_LAYOUT
from .noise import CAUSE_AMPLIFIED, CAUSE_INHERITED, CAUSE_OWN, CAUSE_QUANTIZED, CAUSE_WEIGHTS, OWN_MARGIN
from .result import (METHOD_STATS, STATUS_FAIL, STATUS_NOT_COMPARABLE, STATUS_NOT_PROVEN, STATUS_SHAPE, TAG_BEYOND_INT8,
                     TAG_FOLDED, TAG_FUSED, TAG_FUSED_WITH, TAG_WEIGHT_BEHIND, TAG_WEIGHT_MISSING, TAG_WEIGHT_UNSEEN,
                     PairResult)

# a reader whose error exceeds its input's by this much shows its weight's difference, whatever the floor says
READER_MARGIN = OWN_MARGIN * 4
READER_MIN_ERROR = 1e-4             # ... and is no longer float32 rounding
# a value this many times closer to the reference's next record than to its own name's holds the next one
FUSED_CLOSER = 10


def fused_successors(results: list[PairResult], alignment: Alignment,
                     compare: Callable[[Pair], PairResult]) -> tuple[list[PairResult], list[Record]]:
    """Re-pair each failing value that holds what the reference's next record computes, when that next record
    has no candidate of its own (an exporter fused the two); returns the results and what stays reference-only."""
    ref_only = {r.name: r for r in alignment.ref_only}
    if not ref_only:
        return results, list(alignment.ref_only)
    forward = sorted((r for r in [p.ref for p in alignment.pairs] + list(alignment.ref_only)
                      if r.kind not in WEIGHT_KINDS), key=lambda r: r.order)
    following = {a.name: b for a, b in zip(forward, forward[1:])}
    cand_of = {p.ref.name: p for p in alignment.pairs}
    out = []
    for p in results:
        nxt = following.get(p.name)
        pair = cand_of.get(p.name)
        if not p.failed or p.kind in (*WEIGHT_KINDS, KIND_MODEL_INPUT, KIND_MODEL_OUTPUT) or nxt is None \
                or nxt.name not in ref_only or pair is None or tuple(nxt.shape) != tuple(pair.cand.shape):
            out.append(p)
            continue
        moved = compare(Pair(nxt, pair.cand, pair.method))
        now, then = _error_seen(moved), _error_seen(p)
        closer = moved.passed or (now is not None and then is not None and now * FUSED_CLOSER < then)
        if not moved.compared or not closer:
            out.append(p)
            continue
        holds = "holds what" if moved.passed else "is far closer to what"
        out.append(replace(p, status=STATUS_NOT_COMPARABLE, method=None, metrics={}, tags=p.tags + (TAG_FUSED,), reasons=(
            f"the port has no value of its own: {p.cand_name} {holds} {nxt.name} computes after it, so the port "
            f"fused the two (an exporter folds an eval-mode norm into the convolution before it)",)))
        out.append(replace(moved, tags=moved.tags + (TAG_FUSED, TAG_FUSED_WITH + p.name)))
        del ref_only[nxt.name]
    return sorted(out, key=lambda q: q.order), list(ref_only.values())


def _error_seen(p: PairResult) -> float | None:
    """A pair's relative error as well as it is known: measured, else estimated from the two sketches (a
    statistics-only capture; an int8 conv with a norm folded in is 1% from the norm, not 0.5 as from the conv)."""
    return p.rel_err if p.rel_err is not None else p.metrics.get("rel_l2_err_estimate")


def held_transposed(results: list[PairResult]) -> list[PairResult]:
    """A value the port holds transposed, every value right, is not a divergence by itself: an exporter moves a
    module's trailing `transpose` into what reads it (torch.onnx folds a front end's `transpose(1, 2)` into the
    LSTM's own input Transpose), so the module's value never exists in the reference's layout. What reads it
    decides. A model output is the exception: the caller reads it as it is."""
    out = []
    for p in results:
        if p.status == STATUS_SHAPE and f"{TAG_LAYOUT}transposed" in p.tags and p.kind != KIND_MODEL_OUTPUT:
            p = replace(p, status=STATUS_NOT_COMPARABLE, method=None, metrics={}, reasons=p.reasons + (
                "the port holds it transposed (an exporter moves a trailing transpose into what reads it): what "
                "is computed from it decides",))
        out.append(p)
    return out


def readers_of(weights: Sequence[PairResult], ran: set[str]) -> dict[str, list[str]]:
    """module path -> the weights it reads: a weight's own module when it has records (`ran`), else the nearest
    enclosing module that has (MultiheadAttention reads out_proj.weight without calling out_proj)."""
    out: dict[str, list[str]] = {}
    for w in weights:
        owner = w.module
        while owner and owner not in ran:
            owner = owner.rsplit(".", 1)[0] if "." in owner else ""
        out.setdefault(owner, []).append(w.name)
    return out


def judge_weight_readers(forward: list[PairResult], weights: list[PairResult],
                         ref_records: Sequence[Record]) -> tuple[list[PairResult], list[PairResult]]:
    """Judge each weight that differs by the module that reads it (`readers_of`); returns the forward pairs
    and the weights, re-judged."""
    differ = {w.name: w for w in weights if w.failed}
    if not differ:
        return forward, weights
    # at op level a module's records are its ops: any forward record makes a module a reader
    readers = readers_of(list(differ.values()), {r.module for r in ref_records if r.kind not in (
        *WEIGHT_KINDS, KIND_MODEL_INPUT, KIND_MODEL_OUTPUT)})
    order_of = {r.name: r.order for r in ref_records}
    by_name = {r.name: r for r in ref_records}
    folded: dict[str, str] = {}
    failed_on: dict[str, PairResult] = {}
    for module, names in readers.items():
        ws = [differ[n] for n in names if n in differ]
        if not ws:
            continue
        own = [p for p in forward if p.module == module and p.kind not in (KIND_MODEL_INPUT, KIND_MODEL_OUTPUT)]
        if any(p.failed for p in own):
            continue    # the reader diverges: the weight is the cause already
        # (an op that reads nothing, a recurrent layer's zero initial state, shows nothing of a weight)
        compared = [p for p in own if p.compared and not _reads_nothing(by_name.get(p.name))]
        if compared and all(p.status == STATUS_NOT_PROVEN or p.method == METHOD_STATS for p in compared):
            failed_on[compared[0].name] = _failed_on(compared[0], ws, (
                "its statistics show no difference, but a weight it reads differs"
                + (" while every statistic of that weight is the same (a permutation or a kernel reversed in time "
                   "keeps them): --keep full compares the values" if _same_statistics(ws[0]) else
                   ": statistics bound its error from below only (--keep full compares the values)")))
            continue
        if compared:
            before = _input_error(compared[0], forward, {w.name for w in weights})
            worst = max(compared, key=lambda p: p.rel_err or 0.0)
            if worst.rel_err is not None and before is not None and worst.rel_err > READER_MARGIN * before \
                    and worst.rel_err > READER_MIN_ERROR:
                floor = f" (within the port's noise floor {worst.floor:.2g}, but not rounding)" if worst.floor else ""
                failed_on[worst.name] = _failed_on(worst, ws, (
                    f"relative error {worst.rel_err:.3g} where what comes before it differs by {before:.2g}{floor}"))
                continue
            for w in ws:
                folded[w.name] = f"{module} computes from it what the reference computes (compared value by value)"
            continue
        start = min((order_of[r.name] for r in ref_records if r.module == module and r.name in order_of
                     and r.kind not in WEIGHT_KINDS), default=None)
        after = next((p for p in forward if start is not None and p.order > start and p.compared
                      and not _reads_nothing(by_name.get(p.name))), None)
        # (no exporter folds a norm into a recurrent layer: what follows one agreeing says its weights agree)
        foldable = not any(is_recurrent(r.op) for r in ref_records if r.module == module)
        if after is not None and after.passed and foldable:  # statistics too: a folded weight is what exporters do
            how = " as far as its statistics tell" if after.method == METHOD_STATS else ""
            for w in ws:
                folded[w.name] = (f"the port has no value of {module}'s own, and {after.name}, computed after it, "
                                  f"agrees{how}: the port folded it into what follows")
        elif after is not None and after.passed:
            # a recurrent layer the two sides compute by other ops (1,293 against 14): its weight differs, and what
            # follows agrees only within a floor a weight's difference hides under (float16's): it fails there
            failed_on[after.name] = _failed_on(after, ws, (
                f"it agrees within its floor, but {module}, which the port has no comparable value of, reads "
                f"{ws[0].name}, which differs; no exporter folds a weight into a recurrent layer"))
        elif after is not None and after.failed and after.cause in (CAUSE_INHERITED, CAUSE_AMPLIFIED,
                                                                      CAUSE_QUANTIZED) and family(after.op) == "norm":
            # the norm that follows fails by the error it inherits from before (or by int8's, folded into an
            # int8 conv): it cannot tell a weight the exporter folded it into from a bad one, and folding is
            # what exporters do to a conv before a norm
            by = ("int8's error (the port computes it with quantized arithmetic)" if after.cause == CAUSE_QUANTIZED
                  else f"the error it inherits from {after.origin or 'before it'}")
            for w in ws:
                folded[w.name] = (f"the port has no value of {module}'s own, and {after.name}, computed after it, "
                                  f"fails by {by}: the port folded it into what follows, or it differs too; this "
                                  "run cannot tell")
    if not folded and not failed_on:
        return forward, weights
    forward = [failed_on.get(p.name, p) for p in forward]
    weights = [replace(w, tags=w.tags + (TAG_FOLDED,), reasons=w.reasons + (folded[w.name],))
               if w.name in folded else w for w in weights]
    return forward, weights


def missing_weights(forward: list[PairResult], weights: Sequence[PairResult], ref_records: Sequence[Record],
                    cand_records: Sequence[Record]) -> list[PairResult]:
    """A record whose error is its own while a non-zero weight it reads has no counterpart, and the port reads
    no weight there that is left unpaired: the port computes it without that weight (torch.onnx drops a bias of
    zeros from a Conv; a port that zeroed it has the same graph). Its cause is the weight, not its code."""
    ref = {r.name: r for r in ref_records}
    paired = {w.cand_name for w in weights}
    paired_ref = {w.name for w in weights}
    own_weights = module_weights(ref_records)
    cand_weights = {c.name for c in cand_records if c.kind in WEIGHT_KINDS}
    if not cand_weights:
        # a port that records no weights at all (an ExecuTorch program's constants are not in its ETDump): every
        # weight is unpaired, which says nothing of one it lacks
        return forward
    cand_kinds = {c.name: c.kind for c in cand_records}
    # sizes of the weights the port holds unpaired (a bias under another name; not a constant an exporter adds,
    # InstanceNormalization's scale of ones and bias of zeros)
    held = {math.prod(c.shape) for c in cand_records if c.kind in WEIGHT_KINDS and c.name not in paired
            and not (c.stats is not None and c.stats.min == c.stats.max)}
    # a norm's weights are folded into the conv before it by exporters (the port has no norm to read them), so
    # they pair with nothing: that says nothing of a weight the port lacks
    norms = {r.module for r in ref_records if r.op.startswith("module:") and family(r.op) == "norm"}
    out = []
    for p in forward:
        if _jumps_unexplained(p) and p.name in ref:
            # its input's error cannot clear it (made by code no record shows, compared by statistics), but it
            # grew far beyond what that input brings, and a vector the port lacks (a bias: an op runs without
            # one, not without its weight matrix, which the port may hold transposed or quantized under another
            # name; and no unpaired weight of its size) explains the jump
            missing = [n for n in direct_inputs(ref[p.name], own_weights) if n in ref and ref[n].kind in WEIGHT_KINDS
                       and len(ref[n].shape) == 1 and n not in paired_ref and math.prod(ref[n].shape) not in held
                       and ref[n].module not in norms]
            others: list[str] = []
        elif _own_unexplained(p):
            missing, others = _unpaired_inputs(p, ref, cand_kinds)
            missing = [n for n in missing if ref[n].module not in norms]
        else:
            missing, others = [], []
        if missing and not others and not any(_all_zero(ref[n]) for n in missing):
            read = {i for c in cand_records if c.kind not in WEIGHT_KINDS and _within(c.module, p.module)
                    for i in c.inputs if i in cand_weights}
            if read <= paired:
                p = _weights_cause(p, missing[0], TAG_WEIGHT_MISSING, None)
        out.append(p)
    return out


def _unpaired_inputs(p: PairResult, ref: dict[str, Record],
                     cand_kinds: dict[str, str]) -> tuple[list[str], list[str]]:
    """The weights `p` reads that have no counterpart, and its other inputs not compared that are not data only the
    port computes (its own functional ops), not a module an export removes, not a value made of weights alone."""
    missing = [n for n, why in p.uncompared_inputs if why == UNPAIRED and n in ref and ref[n].kind in WEIGHT_KINDS]
    others = [n for n, why in p.uncompared_inputs if n not in missing and not (
        why == CAND_ONLY and cand_kinds.get(n) not in (None, *WEIGHT_KINDS)) and not _identity(ref.get(n))
        and not made_from_weights(ref.get(n), ref)]
    return missing, others


def _own_unexplained(p: PairResult) -> bool:
    """A failing pair whose error is called its own, with no explanation but "beyond what int8 explains"
    (`quantization`): what a weight's difference looks like in an int8 port too."""
    beyond_int8 = (p.quantization is not None and p.explanation == p.quantization.finding) or TAG_BEYOND_INT8 in p.tags
    return p.failed and p.cause == CAUSE_OWN and (not p.explanation or beyond_int8)


def _jumps_unexplained(p: PairResult) -> bool:
    """A failing pair called inherited (or int8's) whose error is OWN_MARGIN x what its input brings and int8 adds
    here (`quantization.QuantNoise`), as measured or estimated by the sketches: the error enters here, though the
    rules that name an error "own" cannot prove it (an input made by code no record shows, or only estimated).
    With a non-zero weight the port lacks (`missing_weights`), that is enough: the lacking is the evidence."""
    if not (p.failed and p.cause in (CAUSE_INHERITED, CAUSE_QUANTIZED) and p.input_rel_err):
        return False
    e = p.rel_err if p.method != METHOD_STATS else p.metrics.get("rel_l2_err_estimate")
    int8 = p.quantization.expected if p.quantization is not None else 0.0
    return e is not None and e >= OWN_MARGIN * math.hypot(int8, p.input_rel_err)


def _weights_cause(p: PairResult, weight: str, tag: str, explanation: str | None) -> PairResult:
    """`p` with cause `weights` from `weight`; an int8 finding it had is the weight's doing, not the kernel's."""
    q = p.quantization
    int8_said = q is not None and q.finding is not None and p.explanation == q.finding
    return replace(p, cause=CAUSE_WEIGHTS, origin=weight, tags=p.tags + (tag,), explanation=explanation,
                   quantization=replace(q, finding=None) if int8_said else q)


def weights_behind_unpaired(forward: list[PairResult], weights: Sequence[PairResult],
                            ref_records: Sequence[Record]) -> list[PairResult]:
    """A record whose error is called its own while the reference ran, since the compared record before it, a
    module the port has no value of (an int8 MatMul the quantizer left unnamed) whose weight differs: the error
    comes with that weight, in that module (cause `weights`, origin the weight; `DiffReport.first_place` names
    the module)."""
    bad = {w.module: w for w in weights if w.failed and w.module}
    if not bad:
        return forward
    paired = {p.name for p in forward}
    unseen = [r for r in ref_records if r.kind == KIND_OUTPUT and "/" not in r.name and r.module in bad
              and r.name not in paired]
    if not unseen:
        return forward
    out, before = [], -1
    for p in forward:
        # (not a norm: an exporter folds a norm into the conv before it, whose weights then differ by design)
        if _own_unexplained(p) and p.module not in bad and family(p.op) != "norm":
            behind = [(r.name, bad[r.module]) for r in unseen if before < r.order < p.order]
            if behind:
                n, w = behind[-1]
                p = _weights_cause(p, w.name, TAG_WEIGHT_BEHIND,
                                   f"it reads {n}, which the port has no value of, made with weight {w.name}, "
                                   "which differs")
        out.append(p)
        before = max(before, p.order)
    return out


def folded_predecessors(forward: list[PairResult], ref_records: Sequence[Record]) -> list[PairResult]:
    """A failing record whose error is called its own (or the weights' of the record before it) while the
    reference's record just before it, which it reads, has no counterpart in the port: an exporter folded the two into one value (torch.onnx's dynamo
    exporter folds an eval-mode BatchNorm into the conv before it, weights included), so the difference is made
    in one of the two. Tagged `fused_with:` that record; the summary names both."""
    order = sorted((r for r in ref_records if r.kind not in (*WEIGHT_KINDS, KIND_MODEL_INPUT)), key=lambda r: r.order)
    before = {b.name: a for a, b in zip(order, order[1:])}
    paired = {p.name for p in forward}
    out = []
    for p in forward:
        rec = before.get(p.name)
        prev = rec.name if rec is not None else None
        # a norm after a convolution or a linear: what exporters fold (a renamed block is not folded: `renames`);
        # its error called its own, or the folded weights' of that convolution (they differ by the folding)
        own = p.cause == CAUSE_OWN and (not p.explanation or (
            p.quantization is not None and p.explanation == p.quantization.finding))   # (beyond int8: still own)
        folded_weight = p.cause == CAUSE_WEIGHTS and rec is not None and p.origin is not None and \
            p.origin.rsplit(".", 1)[0] == rec.module
        if p.failed and (own or folded_weight) and rec is not None and \
                family(p.op) == "norm" and family(rec.op) == "linear" and \
                ((prev, UNPAIRED) in p.uncompared_inputs or folded_weight and prev not in paired) and \
                TAG_FUSED not in p.tags:
            p = replace(p, tags=p.tags + (TAG_FUSED_WITH + prev,), explanation=(
                f"the port has no value of {prev}, which it reads: an exporter folded the two into one (an eval-mode "
                f"norm into the convolution before it), so the difference is made here or in {prev}"))
        out.append(p)
    return out


def _reads_nothing(rec: Record | None) -> bool:
    """An op record made from no value (zeros, arange): at op level every record names its inputs."""
    return rec is not None and "/" in rec.name and not rec.inputs


def _identity(rec: Record | None) -> bool:
    """A module an eval-mode export removes (Dropout, Identity): its value is its input's, compared or not."""
    return rec is not None and rec.op.removeprefix("module:").startswith(("Dropout", "Identity", "AlphaDropout"))


def _within(module: str, outer: str) -> bool:
    return module == outer or (bool(outer) and module.startswith(outer + "."))


def _all_zero(rec: Record) -> bool:
    s = rec.stats
    return s is not None and s.min == 0 and s.max == 0


def _failed_on(p: PairResult, ws: list[PairResult], why: str) -> PairResult:
    return replace(p, status=STATUS_FAIL, cause=CAUSE_WEIGHTS, origin=ws[0].name,
                   tags=p.tags + (TAG_WEIGHT_UNSEEN,), reasons=p.reasons + (why,))


def _same_statistics(w: PairResult) -> bool:
    """A weight whose content fingerprint differs while its statistics agree (diff's words for it)."""
    return any("every statistic is identical" in r for r in w.reasons)


def _input_error(p: PairResult, forward: Sequence[PairResult], weights: set[str]) -> float | None:
    """What `p`'s data input brings: its measured input error when that input is not a weight, else the error
    of the last record compared value by value before it (a module-level record names no data input)."""
    if p.input_rel_err is not None and p.input_name not in weights:
        return p.input_rel_err
    before = [q for q in forward if q.order < p.order and q.compared and q.rel_err is not None
              and q.method != METHOD_STATS and not q.module.startswith(p.module + ".")]
    return before[-1].rel_err if before else None


def folded_note(weights: Sequence[PairResult]) -> str | None:
    """The sentence that says which weights the port folded (they differ; what reads them agrees)."""
    folded = [w for w in weights if TAG_FOLDED in w.tags]
    if not folded:
        return None
    more = f", and {len(folded) - 1} more" if len(folded) > 1 else ""
    err = f" (relative error {folded[0].rel_err:.2g})" if folded[0].rel_err is not None else ""
    return (f"Weights the port folded or re-packed: {folded[0].name}{err}{more} differ, but what is computed "
            "from them agrees (an exporter folds an eval-mode norm into the convolution before it): a note, "
            "not a divergence")
