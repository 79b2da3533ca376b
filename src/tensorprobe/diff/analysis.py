"""What the per-pair results mean together: error gain, causes, first divergence, amplifiers, calls.

Error gain of a record = its relative L2 error over the largest relative error of its inputs (the
records it consumed, from `Record.inputs`, the op graph, weights included; a module-level record also reads
its module's own weights). Gain ≫ 1 marks an amplifier (a `sin` of a large accumulated phase, an `exp`); an
infinite gain (exact inputs, wrong output) marks a record where error *enters*. Bundles without an op graph
(a port's dump) use the previous record as the input. A record whose graph shows no input, or only exact
ones, while an earlier record already carries error, takes the latest erroneous record as its input: its
real input was made outside any captured record (code between the modules of a module-level capture).

Each failing record then gets a cause (`noise.CAUSE_*`): its own error, a weight it reads, amplified noise,
random draws, or inherited from an earlier divergence (`origin`). The first divergence is the first record
whose error is its own (or comes from a weight); failing that, the first amplifier, then the first random
draw. The words are in `summary.py`.
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

from ..ops import canonical_op
from ..record import (KIND_MODEL_INPUT, KIND_MODEL_OUTPUT, KIND_OUTPUT, KIND_RNG, NAME_RE, TAG_DERIVED, TAG_DRAWS_RANDOM,
                      TAG_INTEGER_DOMAIN, TAG_OWN_CODE,
                      TAG_QUANTIZED, WEIGHT_KINDS, Record, module_label, short_op)
from .align import Pair, declared_outputs, in_model_order, made_from_weights, parse_rule
from .evidence import made_in, with_uncompared_inputs
from .renames import suggest as suggest_renames
from .draws import DrawFindings, is_draw_finding
from .compat import rms
from .explain import HUGE_GAIN, explain, family, gain_inputs, is_recurrent, predicted_gain
from .fusion import folded_note, folded_predecessors, judge_weight_readers, missing_weights, readers_of
from .fusion import weights_behind_unpaired
from .port_ops import changed_by_port_ops
from ..stats.sketch import ESTIMATE_MARGIN
from .quantization import FAR as QUANT_FAR, QuantizedInput, integer_domain_note, judged as judged_quantized, quantized_inputs
from .quantization import scaled_weights
from .summary import summarize
from .conditioning import measured_norm_causes
from .views import every_record, hidden_records
from .noise import (CAUSE_AMPLIFIED, CAUSE_INHERITED, CAUSE_OWN, CAUSE_QUANTIZED, CAUSE_RANDOM, CAUSE_WEIGHTS,
                    LOCAL_UNITS, OUTPUT_MIN_CORR, OUTPUT_MIN_SNR, OUTPUT_REL_MAX, OUTPUT_WORDS, OWN_MARGIN, Noise, is_model_output, measured_floor,
                    sensitivity)
from .result import (MATCH_SUGGESTED, METHOD_DIGEST, METHOD_ELEMENTWISE, METHOD_EXACT, METHOD_STATS, STATUS_FAIL,
                     STATUS_NOT_COMPARABLE, STATUS_NOT_PROVEN, STATUS_PASS, STATUS_SHAPE, TAG_BEYOND_INT8, TAG_FUSED,
                     TAG_FUSED_WITH, TAG_INPUT_UNSEEN, TAG_PORT_OP, TAG_READS_QUANTIZED, Amplifier, CallSeries, Criteria,
                     DiffReport, PairResult)

TAG_UNREAD = "unread"   # a failing integer result no recorded op reads: reported, never a divergence
TAG_OUTPUT_QUANTIZED = "output_quantized"   # a model output judged by the output criterion of a quantized port
MAX_AMPLIFIERS = 10
MIN_GAIN = 2.0      # a record must at least double the relative error to count as an amplifier
INPUTS_DIFFER = 0.3  # relative error of an input beyond which a record's error is never called its own
# Ops whose amplification depends on their input's values (statistics of the input are needed to bound it).
_DATA_CONDITIONED = frozenset({"norm", "sin", "exp", "log", "div", "angle", "softmax", "pow"})
_CALL_RE = re.compile(r"^([^@/:]*)@(\d+)(.*)$")


def build_report(*, ref: str, cand: str, criteria: Criteria, results: list[PairResult],
                 ref_records: Sequence[Record], ref_only: list[str], cand_only: list[str],
                 notes: list[str], ref_bundle: Any = None, cand_bundle: Any = None,
                 environment_notes: Sequence[str] = (), incomplete: Sequence[str] = (),
                 noise: Mapping[str, Noise] | None = None, reduced: str | None = None,
                 compare: Callable[..., PairResult] | None = None) -> DiffReport:
    """Assemble a `DiffReport` from the compared pairs (in reference execution order). `noise`: the noise
    model of each reference record (to lift a floor where a measurement backs it); `reduced`: why the
    candidate is not a same-precision port, or None; `compare`: how to compare one more `Pair` (`core.compare_pair`,
    passed in so that this module does not import the one that imports it), for weights paired by a suggested
    rename."""

    results = sorted(results, key=lambda p: p.order)
    weights = scaled_weights([p for p in results if p.kind in WEIGHT_KINDS], ref_bundle, cand_bundle)
    forward = [p for p in results if p.kind not in WEIGHT_KINDS]
    by_name = {r.name: r for r in ref_records}
    findings = DrawFindings(ref_bundle, cand_bundle)     # draws of another kind, or consumed in another order
    forward = findings.judge(forward)
    forward = _weights_only_values(forward, weights, by_name)
    quantized = quantized_inputs(cand_bundle, results)
    forward, graph_note = with_gains(forward, weights, ref_records, quantized)
    draws = UnpairedDraws(ref_bundle, cand_bundle, results)
    unread = unread_indices(ref_records)
    forward = classify(forward, weights, by_name, criteria.noise, quantized,
                       noise=noise, reduced=reduced, draws=draws, unread=unread, swapped=findings)
    forward = measured_norm_causes(forward, by_name, ref_bundle, cand_bundle)   # a norm's own, measured on values
    forward = judged_quantized(forward, ref_bundle, cand_bundle)   # beyond what int8 explains, or coarse steps
    forward = judged_as_quantized_outputs(forward, reduced, criteria)
    forward = with_nonfinite_diagnoses(forward, ref_bundle, cand_bundle)
    forward = with_uncompared_inputs(forward, weights, ref_records, cand_bundle)   # what "inputs identical" rests on
    if cand_bundle is not None:
        forward = missing_weights(forward, weights, ref_records, every_record(cand_bundle))   # a bias the port lacks
    forward = weights_behind_unpaired(forward, weights, ref_records)   # a module the port has no value of
    forward = folded_predecessors(forward, ref_records)     # the port has no value of the record before it
    if compare is not None and ref_bundle is not None and cand_bundle is not None:   # an op only the port has
        forward = changed_by_port_ops(forward, ref_bundle, cand_bundle, criteria, compare, noise)
    forward = [with_spectral_magnitude(p, ref_bundle, cand_bundle) for p in forward]
    forward, weights = judge_weight_readers(forward, weights, ref_records)   # folded, or unseen by statistics
    # a module view's op records are unpaired too: its integer values count as left out
    left_out = [*cand_only, *(r.name for r in hidden_records(cand_bundle))]
    notes = list(notes) + [n for n in (graph_note, integer_domain_note(left_out, cand_bundle), folded_note(weights)) if n]
    failing = [p for p in forward if p.failed]
    declared = declared_outputs(getattr(ref_bundle, "manifest", None) or {})   # the graph's output order
    output = model_output(forward, declared)
    outs = in_model_order([p for p in forward if p.kind == KIND_MODEL_OUTPUT], declared) or \
        ([output] if output is not None else [])
    if not any(o.failed and o.cause == CAUSE_RANDOM for o in outs):
        failing = [p for p in failing if p.cause != CAUSE_RANDOM]   # noise that never reaches an output leads nothing
    failing = [p for p in failing if TAG_UNREAD not in p.tags]      # nor do flipped indices nothing reads
    if unread_notes := [p.name for p in forward if TAG_UNREAD in p.tags]:
        notes.append(f"{len(unread_notes):,} integer result{'s' if len(unread_notes) > 1 else ''} that no recorded op reads "
                     f"differ{'s' if len(unread_notes) == 1 else ''} ({', '.join(unread_notes[:3])}): indices flipped by "
                     "rounding (argmax, max-pool indices); they cannot reach the outputs, so the run does not diverge by them")
    first = first_divergence(failing, outs, forward)
    compared = [p for p in forward if p.rel_err is not None]
    worst = max(compared, key=lambda p: p.rel_err, default=None)
    worst = worst if worst is not None and worst.rel_err > 0 else None
    amps = amplifiers(forward, criteria, by_name)
    outputs = tuple(p.name for p in outs if p.kind == KIND_MODEL_OUTPUT)
    series = call_series(forward)
    rng = rng_note(first, ref_records, ref_bundle, cand_bundle) if first else None
    notes += angle_notes(forward)
    if ref_only and not results:
        notes.append("no record of the candidate lines up with the reference: is it the same model? "
                     "map names with --map PATTERN=REPLACEMENT or --rules FILE")
    renames = suggest_renames(ref_bundle, cand_bundle, results, ref_only, cand_only)
    w_ref_only, ref_only = _split_weights(ref_only, ref_bundle)
    w_cand_only, cand_only = _split_weights(cand_only, cand_bundle)
    renamed = weights_by_suggestion(renames.rules if renames else (), w_ref_only, w_cand_only, ref_bundle,
                                    cand_bundle, criteria, compare) if compare else []
    if renamed:    # a renamed weight that differs is a finding, not an unpaired record: never a match over it
        weights = sorted(weights + renamed, key=lambda p: p.order)
        w_ref_only = [n for n in w_ref_only if n not in {p.name for p in renamed}]
        w_cand_only = [n for n in w_cand_only if n not in {p.cand_name for p in renamed}]
    levels = level_mismatch(ref_bundle, cand_bundle, forward, ref_only, cand_only)
    report = DiffReport(ref=ref, cand=cand, criteria=criteria, pairs=tuple(forward), ref_only=tuple(ref_only),
                        cand_only=tuple(cand_only), first_divergence=first.name if first else None,
                        worst=worst.name if worst else None, amplifiers=tuple(amps),
                        output=output.name if output else None, call_series=tuple(series), rng_note=rng,
                        notes=tuple(notes), summary="", weights=tuple(weights), weights_ref_only=tuple(w_ref_only),
                        weights_cand_only=tuple(w_cand_only), outputs=outputs,
                        first_difference=failing[0].name if failing and first is not failing[0] else None,
                        environment_notes=tuple(environment_notes), incomplete=tuple(incomplete),
                        rng_differs=tuple(p.name for p in forward if p.kind == KIND_RNG and p.cause == CAUSE_RANDOM),
                        rng_replayed=_replayed(cand_bundle), reduced_precision=reduced, levels=levels, renames=renames and renames.sentence,
                        suggested_rules=renames.rules if renames else (),
                        model_class=_model_class(ref_bundle),
                        first_source=next((x.source for x in ref_records if first is not None and x.name == first.name),
                                          None))
    return replace(report, summary=summarize(report))


def _model_class(bundle: Any) -> str | None:
    """The class of the model a bundle was captured from (its top-level module), if the bundle says."""
    model = (getattr(bundle, "manifest", None) or {}).get("model") or {}
    return (model.get("module_types") or {}).get("") or model.get("class") or None


def level_mismatch(ref_bundle: Any, cand_bundle: Any, forward: Sequence[PairResult], ref_only: Sequence[str],
                   cand_only: Sequence[str]) -> str | None:
    """A sentence when the two bundles' records can't line up because they were captured at different levels
    (module-level names never meet op-level ones), or when nothing but the model's inputs and outputs lines up."""
    inner = [p for p in forward if p.kind not in (KIND_MODEL_INPUT, KIND_MODEL_OUTPUT)]
    unmatched = f"{len(ref_only):,} reference-only, {len(cand_only):,} candidate-only records"
    lr, lc = _capture_level(ref_bundle), _capture_level(cand_bundle)
    if {lr, lc} == {"module", "op"}:
        lined = "only the model's inputs and outputs line up" if not inner else \
            f"only {len(inner):,} of their intermediate records line up"
        return (f"The reference was captured at {lr} level and the candidate at {lc} level: {lined} ({unmatched}); "
                "capture both at --level op to compare the intermediates.")
    if not inner and ref_only and cand_only and forward:
        return (f"Only the model's inputs and outputs line up ({unmatched}): map the candidate's names onto the "
                "reference's with --map/--rules, or capture both the same way (--level), to compare the intermediates.")
    return None


def _capture_level(bundle: Any) -> str | None:
    manifest = getattr(bundle, "manifest", None) or {}
    return (manifest.get("capture") or {}).get("level")


def weights_by_suggestion(rules: Sequence[str], ref_only: Sequence[str], cand_only: Sequence[str], ref_bundle: Any,
                          cand_bundle: Any, criteria: Criteria, compare: Callable[..., PairResult]) -> list[PairResult]:
    """The unpaired weights that the suggested rename rules pair, compared (match "rule (suggested)"). Weights
    with the same content already pair by digest, so these are the renamed weights whose content differs: a
    weight bug in a renamed block, which the model output may hide (a norm after it cancels a scale)."""
    if not rules or not ref_only or not cand_only:
        return []
    parsed = [parse_rule(r) for r in rules]
    refs = set(ref_only)
    out = []
    for c in cand_only:
        name = next((n for rule in parsed if (n := rule.apply(c)) is not None), None)
        rr, cr = ref_bundle.get(name) if name in refs else None, cand_bundle.get(c)
        if rr is not None and cr is not None:
            refs.discard(name)
            out.append(compare(ref_bundle, cand_bundle, Pair(rr, cr, MATCH_SUGGESTED), criteria))
    return out


def _split_weights(names: list[str], bundle: Any) -> tuple[list[str], list[str]]:
    if bundle is None:
        return [], list(names)
    weights = [n for n in names if (r := bundle.get(n)) is not None and r.kind in WEIGHT_KINDS]
    wset = set(weights)
    return weights, [n for n in names if n not in wset]


def _replayed(bundle: Any) -> bool:
    """Was this bundle captured replaying another's random draws (`capture --replay-rng`)?"""
    return bool(((getattr(bundle, "manifest", None) or {}).get("capture") or {}).get("replay_rng"))


def error_of(p: PairResult, passed_on: bool = False) -> float | None:
    """The relative error a pair is known to have: measured, or (statistics) its proven lower bound. With
    `passed_on`, what its consumers receive: the raw error of an angle compared modulo 2π (a branch-cut flip
    is the same angle, but a conv reading the raw phase sees a jump of 2π)."""
    if passed_on and p.angle is not None and p.angle.flips and p.angle.raw_rel_err is not None:
        return p.angle.raw_rel_err
    if p.rel_err is not None:
        return p.rel_err
    if p.method != METHOD_STATS:
        return None
    estimate = p.metrics.get("rel_l2_err_estimate") if p.failed else None   # the evidence it failed on
    return max(p.rel_err_lower or 0.0, estimate) if estimate is not None else p.rel_err_lower


def _passed_on_error(p: PairResult) -> float | None:
    e = error_of(p, passed_on=True)
    if p.failed and p.kind in WEIGHT_KINDS and not e:
        return math.inf   # a weight whose fingerprint differs while its statistics agree (a permutation): unbounded
    return math.inf if e is None and p.failed and nonfinite_differs(p) else e


def _weights_only_values(forward: list[PairResult], weights: Sequence[PairResult],
                         by_name: dict[str, Record]) -> list[PairResult]:
    """A failing record the reference computes from weights alone (an instance norm's `repeat` of its weight),
    every one of them paired and agreeing: the port computes that value otherwise (a static int8 file's
    DequantizeLinear of a constant it made), so the pair compares two different things, not a divergence."""
    agree = {w.name for w in weights if w.passed}
    out = []
    for p in forward:
        rec = by_name.get(p.name)
        if p.failed and rec is not None and rec.inputs and all(i in agree for i in rec.inputs):
            p = replace(p, status=STATUS_NOT_COMPARABLE, cause=None, origin=None, reasons=(
                f"not comparable: the reference computes it from weights alone ({', '.join(rec.inputs)}), which "
                f"agree, so the port's {p.cand_name} paired with it holds something else",))
        out.append(p)
    return out


def with_gains(results: list[PairResult], weights: Sequence[PairResult] = (),
               ref_records: Sequence[Record] = (),
               quantized: Mapping[str, QuantizedInput] | None = None) -> tuple[list[PairResult], str | None]:
    """Fill `input_rel_err`, `input_name` and `gain` of every pair compared by value (`quantized`: the int8
    rounding on the way to each record, `quantization.quantized_inputs`, which its data inputs bring too)."""
    # a value finite on one side only carries unbounded error: its consumers inherit it (NaN spreads)
    rel = {p.name: _passed_on_error(p) for p in list(weights) + list(results) if _passed_on_error(p) is not None}
    sources = _InputSources(results, weights, ref_records)
    # carrier: the latest record (not a random draw) whose error is comparable to the largest so far: the
    # main data path, not a side computation (a style projection carries 1e-7 where the signal carries 1e-4)
    out, prev, carrier, largest = [], None, None, 0.0
    for p in results:
        e = error_of(p)
        known = sources.errors(p, rel, carrier, prev) if p.kind not in (KIND_RNG, KIND_MODEL_INPUT) else []
        if e is not None and len(known) > 1:
            q = (quantized or {}).get(p.name)
            known = sources.shown(p, known, e, q.chain if q is not None else 0.0)
        passed_on = rel.get(p.name)
        if passed_on is not None:
            prev = p.name
            if passed_on > 0 and p.kind != KIND_RNG and passed_on >= 0.1 * largest:
                carrier, largest = p.name, max(largest, passed_on)
        if not known:
            # A random draw or a model input consumes nothing: its error is made there, not amplified.
            out.append(p)
            continue
        if e is None:
            # no element finite on both sides: no gain, but what it was computed from still tells a
            # non-finite value it inherited from one born here
            out.append(replace(p, input_rel_err=max(known)[0], input_name=max(known)[1]))
            continue
        rin, name = max(known)
        gain = e / rin if rin > 0 else (math.inf if e > 0 else None)
        out.append(replace(p, input_rel_err=rin, input_name=name, gain=gain if p.method != METHOD_STATS else None))
    note = None if sources.has_graph or not results else (
        "the reference bundle has no op graph (Record.inputs): error gain uses the previous record as input")
    return out, note


class _InputSources:
    """What a record was computed from, as far as the bundles tell, in order of evidence: its op graph
    inputs (weights included; a module-level record also reads its module's weights), the records computed
    inside its module call, then, when none of those carry error, its data's path through code no record
    shows (the main path's latest error), then the noise drawn inside its call."""

    def __init__(self, results: Sequence[PairResult], weights: Sequence[PairResult], ref_records: Sequence[Record]):
        self.graph = {r.name: r.inputs for r in ref_records}
        self.derived = _derived_weights(ref_records)
        self.has_graph = any(r.inputs for r in ref_records if r.kind not in WEIGHT_KINDS)
        self.own_weights = _module_weights(weights, ref_records)
        self.weight_names = {w.name for w in weights}
        self.children, self.draws = _inside_calls(results)
        self.drawn_otherwise = {p.name for p in results if is_draw_finding(p)}   # the port's draw, not noise
        self.forward = {r.name for r in ref_records if r.kind in (KIND_OUTPUT, KIND_RNG)}
        # modules that ran in the reference and have no counterpart: the candidate computed them some other way
        # (the root's own F.linear on a classifier's weights), so their weights are read by the module around them
        paired = {p.module for p in results if p.op.startswith("module:")}
        self.unpaired = {r.module for r in ref_records if r.op.startswith("module:")} - paired
        # ...unless a compared record reads its value: then its weights' error shows there (a conv an exporter
        # folded with the BatchNorm after it: the norm's record carries both, and the folded weights differ
        # by design)
        compared = {p.name for p in results}
        outputs_of = {r.name: r.module for r in ref_records if r.op.startswith("module:") and r.module in self.unpaired}
        self.unpaired -= {outputs_of[i] for r in ref_records if r.name in compared for i in r.inputs if i in outputs_of}
        # a module-level record whose input a parent's own code made (`self.post(self.conv(x) * self.scale)`)
        # reads that parent's weights through it: a changed buffer of the parent is named as its cause
        self.made_in = {r.name: m for r in ref_records if (m := made_in(r.tags, r.module)) is not None}

    def errors(self, p: PairResult, rel: dict[str, float], carrier: str | None,
               prev: str | None) -> list[tuple[float, str]]:
        """(relative error, name) of the inputs of `p` whose error is known."""
        inputs = self._compared_ancestors(p.name, rel) if self.has_graph else ([prev] if prev else [])
        module_level = p.op.startswith("module:")
        if module_level:
            inputs += self.own_weights.get(p.module, []) + self.children.get(p.name, [])
            inputs += [w for m in self.unpaired if m != p.module and (not p.module or m.startswith(f"{p.module}."))
                       for w in self.own_weights.get(m, [])]
            if p.name in self.made_in:
                inputs += self.own_weights.get(self.made_in[p.name], [])
        known = [(rel[i], i) for i in inputs if i in rel]
        if module_level and carrier and not any(i in self.forward for i in self.graph.get(p.name, ())):
            known.append((rel[carrier], carrier))   # its data came through functional code
        if not any(e for e, _ in known):
            known += [(rel[i], i) for i in self.draws.get(p.name, ()) if i in rel]
        else:
            known += [(rel[i], i) for i in self.draws.get(p.name, ()) if i in rel and i in self.drawn_otherwise]
        if error_of(p) and not any(e for e, _ in known) and (carrier or prev):
            # only exact inputs while error is already present upstream: the tensor that carried it was made
            # outside any captured record (code between the modules of a module-level capture)
            src = carrier or prev
            known = [(rel[src], src)]
        return known

    def shown(self, p: PairResult, known: list[tuple[float, str]], e: float,
              int8: float = 0.0) -> list[tuple[float, str]]:
        """`known` without the weights `p` reads only through a record the port has no value of, when its data
        inputs (and the int8 rounding on their way, `int8`) explain its error within OWN_MARGIN: the port folded
        that record and its weights (a conv with the BatchNorm after it), whose difference then shows in no
        value. A weight whose difference shows stays."""
        direct = set(self.graph.get(p.name, ()))
        data = [err for err, n in known if n not in self.weight_names]
        if p.op.startswith("module:") or not data or e > OWN_MARGIN * max(*data, int8):   # (a module reads its own)
            return known
        return [(err, n) for err, n in known if n not in self.weight_names or n in direct]

    def _compared_ancestors(self, name: str, rel: dict[str, float], limit: int = 10_000) -> list[str]:
        """`name`'s graph inputs, each one the candidate has no record of replaced by what it was computed
        from, until a compared record (or a weight) is reached: the error of an LSTM's weights reaches the
        Squeeze after it through the LSTM op, which a module-level candidate never recorded."""
        found: list[str] = []
        seen: set[str] = set()
        todo = list(self.graph.get(name, ()))
        while todo and len(seen) < limit:
            i = todo.pop()
            if i in seen:
                continue
            seen.add(i)
            if i in rel:
                found.append(i)
            elif self.derived.get(i) in rel:    # the parametrization's op value: its derived weight was compared
                found.append(self.derived[i])
            else:
                todo.extend(self.graph.get(i, ()))
        return found


def _derived_weights(ref_records: Sequence[Record]) -> dict[str, str]:
    """An op-level capture's value that a parametrization computes from weights alone (weight_norm's
    `up.parametrizations.weight.0/_weight_norm_interface.0:0`) -> the derived weight recorded for it (`up.weight`,
    tag `derived`): the same value, which the port's folded constant is paired with."""
    derived = {(r.module, tuple(r.shape)): r.name for r in ref_records if TAG_DERIVED in r.tags}
    if not derived:
        return {}
    by_name = {r.name: r for r in ref_records}
    out = {}
    for r in ref_records:
        if r.kind in WEIGHT_KINDS or ".parametrizations." not in r.module or not made_from_weights(r, by_name):
            continue
        owner = r.module.split(".parametrizations.")[0]
        if (owner, tuple(r.shape)) in derived:
            out[r.name] = derived[(owner, tuple(r.shape))]
    return out


def _inside_calls(results: Sequence[PairResult]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """For each module-level record, what ran inside its module call: the module records of its subtree
    (children of a `ModuleList` are grandchildren), and the random draws made there (a module-level graph
    shows neither). Every output of one call (`m:0`, `m:1`) gets them."""
    children: dict[str, list[str]] = {}
    draws: dict[str, list[str]] = {}
    last: dict[str, tuple[int, int, list[str], list[str]]] = {}   # path -> (call, order, children, draws)
    rngs = [p for p in results if p.kind == KIND_RNG]
    mods = [p for p in results if p.op.startswith("module:")]
    for p in mods:
        prev = last.get(p.module)
        if prev is not None and prev[0] == p.call:
            kids, inside = prev[2], prev[3]
        else:
            lo = prev[1] if prev is not None else -1
            prefix = f"{p.module}." if p.module else ""
            inside = [d.name for d in rngs if lo < d.order < p.order
                      and (d.module == p.module or d.module.startswith(prefix))]
            kids = [m.name for m in mods if lo < m.order < p.order and m.module.startswith(prefix)
                    and m.module != p.module]
        if kids:
            children[p.name] = kids
        if inside:
            draws[p.name] = inside
        last[p.module] = (p.call, p.order, kids, inside)
    return children, draws


def _module_weights(weights: Sequence[PairResult], ref_records: Sequence[Record]) -> dict[str, list[str]]:
    """module path -> the weights a module-level record reads: its own, and those of descendants that never
    ran as modules (MultiheadAttention reads out_proj.weight without calling out_proj)."""
    return readers_of(weights, {r.module for r in ref_records if r.op.startswith("module:")})


def classify(results: list[PairResult], weights: Sequence[PairResult], by_name: dict[str, Record],
             noise_rule: bool = True, quantized: dict[str, QuantizedInput] | None = None, *,
             noise: Mapping[str, Noise] | None = None, reduced: str | None = None,
             draws: "UnpairedDraws | None" = None, unread: frozenset[str] = frozenset(),
             swapped: DrawFindings | None = None) -> list[PairResult]:
    """Give every failing pair its cause, origin and (for amplifiers) explanation (`noise` module docstring).

    Under the noise rule a pair that fails only its floor passes when a measurement backs a larger one
    (`_measured`: its input, compared value by value, differs by enough that its op's cancellation explains
    it). A pair within its noise floor also fails when its error is its own: more than `OWN_MARGIN` x what
    its inputs' error (times the gain its op may have) and its own rounding explain. The floor of a deep record
    under a coarse arithmetic (TF32, float16) is loose; a bug is not. Normalisations are left out of this
    test: their conditioning is per channel, which tensor statistics underestimate. A failing pair computed
    from a random draw the other side has no counterpart of (`UnpairedDraws`) has cause `random`."""
    done: dict[str, PairResult] = {w.name: w for w in weights}
    out = []
    for p in results:
        q_input = (quantized or {}).get(p.name)
        if q_input is not None:
            p = replace(p, tags=p.tags + (TAG_READS_QUANTIZED,))
        if noise_rule and noise is not None and p.beyond_floor:
            p = _measured(p, done, by_name, noise, reduced)
        if noise_rule and p.beyond_floor and reduced is None:
            p = _decomposed_upstream(p, done, by_name)
        if noise_rule and not p.failed and q_input is None and TAG_QUANTIZED not in p.tags:
            p = _own_within_floor(p, done, by_name)
        p = _classified(p, done, by_name, q_input.source if q_input else None)
        if q_input is not None and q_input.chain and p.failed and p.cause == CAUSE_OWN:
            p = _quantized_on_the_way(p, done, by_name, q_input)
        if draws is not None and p.failed and p.cause in (CAUSE_OWN, CAUSE_AMPLIFIED) and p.kind != KIND_MODEL_INPUT:
            p = draws.blame(p)
        if swapped is not None and p.failed:
            p = swapped.blame(p)
        if p.name in unread and p.failed and p.cause == CAUSE_AMPLIFIED:
            p = replace(p, tags=p.tags + (TAG_UNREAD,))
        done[p.name] = p
        out.append(p)
    return _promote_amplifiers(out, by_name)


def _quantized_on_the_way(p: PairResult, done: dict[str, PairResult], by_name: dict[str, Record],
                          q: QuantizedInput) -> PairResult:
    """A record called its own while the port quantizes values on its way from its compared input, in code no
    compared record shows (a static int8 file puts a QDQ pair after every op of a front end: |X| = sqrt(re² + im²)
    of quantized squares loses the quiet bins): when that code may amplify those roundings without bound (a sqrt,
    log or division the reference ran unpaired), or the error is within FAR x what they and its input bring, int8
    is the cause, unproven, and an op-level capture shows where."""
    src = done.get(p.input_name or "")
    e = error_of(p)
    if src is None or not src.failed or e is None:
        return p
    origin, steps = src, 0
    while origin.cause == CAUSE_INHERITED and origin.input_name in done and steps < 10_000:
        origin, steps = done[origin.input_name], steps + 1
    if origin.cause != CAUSE_QUANTIZED:
        return p
    conditioned = _unpaired_conditioned(p.name, done, by_name)
    rec, src_rec = by_name.get(p.name), by_name.get(src.name)
    cancel = 1.0
    if rec is not None and src_rec is not None and TAG_OWN_CODE in p.tags:
        # the module's own code may sum what it reads into a value near zero (a flow's log-determinant): k
        # independent roundings per output add up to sqrt(k) of one, against the sum's size
        k = max(1.0, math.prod(src_rec.shape or (1,)) / max(1, math.prod(rec.shape or (1,))))
        cancel = max(1.0, min(HUGE_GAIN, math.sqrt(k) * (rms(src_rec.stats) or 0.0) / max(rms(rec.stats) or 0.0,
                                                                                              1e-300)))
    if conditioned is None and e > QUANT_FAR * cancel * math.hypot(q.chain, p.input_rel_err or 0.0):
        return p
    where = f"a {conditioned} the reference computes there turns small rounding near zero into large error" \
        if conditioned else "which that code may amplify"
    return replace(p, cause=CAUSE_QUANTIZED, origin=q.source, explanation=(
        f"the candidate computes {p.cand_name} from {q.source}, made from {src.name} through code no compared record "
        f"shows, in which the port quantizes {q.copies} value{'s' if q.copies > 1 else ''} (int8 rounding of about "
        f"{q.chain:.2g} there; {where}): its error is int8's as far as this capture tells; "
        "capture at --level op to see where it grows" if p.op.startswith("module:") else
        f"the candidate computes {p.cand_name} from {q.source}, made from {src.name} through values no record pairs, "
        f"{q.copies} of them quantized (int8 rounding of about {q.chain:.2g} there; {where}): its error is int8's "
        "as far as these records tell"))


_NEAR_ZERO_UNBOUNDED = frozenset({"sqrt", "Sqrt"})


def _unpaired_conditioned(name: str, done: dict[str, PairResult], by_name: dict[str, Record],
                          limit: int = 64) -> str | None:
    """The op of the first reference record between `name` and its compared inputs (records the port has no
    counterpart of) whose conditioning near zero is unbounded: sqrt, log, a division; None when there is none."""
    rec = by_name.get(name)
    todo, seen = list(rec.inputs if rec is not None else ()), set()
    while todo and len(seen) < limit:
        i = todo.pop()
        if i in seen or i in done:
            continue
        seen.add(i)
        r = by_name.get(i)
        if r is None or r.kind in WEIGHT_KINDS:
            continue
        op = canonical_op(r.op)
        if op in _NEAR_ZERO_UNBOUNDED or family(r.op) in ("log", "div", "pow"):
            return op
        todo.extend(r.inputs)
    return None


def unread_indices(ref_records: Sequence[Record]) -> frozenset[str]:
    """Integer op results no recorded op reads (max-pool's indices beside its values, an argmax kept for
    nothing): flips there cannot reach the outputs. Empty without an op graph (nothing is known to be unread)."""
    if not any(r.inputs for r in ref_records if r.kind not in WEIGHT_KINDS):
        return frozenset()
    read = {i for r in ref_records for i in r.inputs}
    return frozenset(r.name for r in ref_records if r.kind == KIND_OUTPUT and "/" in r.name and r.name not in read
                     and r.stats.kind in ("int", "bool"))


def _measured(p: PairResult, done: dict[str, PairResult], by_name: dict[str, Record],
              noise: Mapping[str, Noise], reduced: str | None = None) -> PairResult:
    """A pair that fails only its floor, capped at the rounding ceiling, passes when a measurement backs the
    modelled one: its input was compared value by value and passes, and that input's error times its op's
    cancellation (`noise.sensitivity`) explains its error (`noise.measured_floor`)."""
    n, rec, src = noise.get(p.name), by_name.get(p.name), done.get(p.input_name or "")
    e, e_in = error_of(p), p.input_rel_err
    if n is None or rec is None or src is None or e is None or not math.isfinite(e) or src.failed:
        return p
    if src.method == METHOD_STATS:
        # statistics bound an input's error from below; its sketch estimates it (reading low by up to ~2), and
        # one value's statistics are the value (a flow's log-determinant per item: a sum near zero of such terms)
        estimate = src.metrics.get("rel_l2_err_estimate")
        e_in = ESTIMATE_MARGIN * estimate if estimate is not None and math.isfinite(estimate) else \
            (e_in if math.prod(src.shape or (0,)) == 1 else None)
    elif src.method not in (METHOD_ELEMENTWISE, METHOD_EXACT, METHOD_DIGEST):
        return p
    if not e_in:
        return p
    ins = [by_name[i] for i in rec.inputs if i in by_name]
    k = max([1.0, *sensitivity(rec, ins, _output_index(p.name))])
    src_rec = by_name.get(src.name)
    if reduced is not None and TAG_OWN_CODE in rec.tags and src_rec is not None and src_rec not in ins:
        # a module's own code, which no record shows, sums what it reads into a value near zero (a flow's
        # log-determinant): the measured input's error grows by that cancellation, rms in / out
        k = max(k, min(HUGE_GAIN, (rms(src_rec.stats) or 0.0) / max(rms(rec.stats) or 0.0, 1e-300)))
    floor = measured_floor(n, rec, k, e_in, src.name, reduced)
    if e > floor.value:
        return p
    status = STATUS_NOT_PROVEN if p.method == METHOD_STATS else STATUS_PASS
    return replace(p, status=status, reasons=(), floor=floor.value, floor_reason=floor.reason, beyond_floor=False)


QUANTIZED_OUTPUT_WORDS = (f"the output criterion of a quantized port (SNR >= {OUTPUT_MIN_SNR:g} dB, correlation >= "
                          f"{OUTPUT_MIN_CORR:g}): its records carry int8's error by design")


def judged_as_quantized_outputs(forward: list[PairResult], reduced: str | None, criteria: Criteria) -> list[PairResult]:
    """In a quantized port (some record computed with quantized arithmetic, cause `quantized`), a model output
    that fails only the float rounding floor is judged by the output criterion alone (SNR >= 20 dB and
    correlation >= 0.99), as the summary's "judge the port by its outputs" asks: a faithful int8 port whose
    output is 46 dB from the float model passes, one at 9.6 dB fails (issue 29 item 2). A failure with another
    cause (a weight bug, the code) stays one."""
    if not criteria.noise or not any(p.failed and p.cause == CAUSE_QUANTIZED for p in forward):
        return forward
    if any(p.failed and p.cause in (CAUSE_OWN, CAUSE_WEIGHTS, CAUSE_RANDOM) for p in forward):
        return forward      # a finding of another kind: the outputs are not int8's alone
    out = []
    for p in forward:
        snr, corr = p.metrics.get("snr_db"), p.metrics.get("pearson")
        from_int8 = p.cause in (CAUSE_QUANTIZED, CAUSE_INHERITED, CAUSE_AMPLIFIED)
        is_output = p.kind == KIND_MODEL_OUTPUT or p.name.split(":")[0] == "<root>"
        if (is_output and p.failed and p.method == METHOD_ELEMENTWISE and from_int8
                and not any(r.endswith("the output criterion") for r in p.reasons)
                and snr is not None and snr >= OUTPUT_MIN_SNR and (corr is None or corr >= OUTPUT_MIN_CORR)):
            # (no correlation for a single value, DNSMOS's score: its SNR judges it)
            p = replace(p, status=STATUS_PASS, reasons=(), floor_reason=QUANTIZED_OUTPUT_WORDS, beyond_floor=False,
                        tags=p.tags + (TAG_OUTPUT_QUANTIZED,))
        out.append(p)
    return out


def _decomposed_upstream(p: PairResult, done: dict[str, PairResult], by_name: dict[str, Record]) -> PairResult:
    """A model output held to a zero floor ('same arithmetic, same bits') although a record before it was
    computed another way (not comparable: the two sides decompose the code differently, or failing): a
    re-associated sum changes the output's last bits, so it gets the same-precision output limit instead
    (`noise.OUTPUT_REL_MAX`), said as such. Without this an output 146 dB from the reference failed."""
    rec = by_name.get(p.name)
    e = error_of(p)
    if p.floor != 0.0 or rec is None or not is_model_output(rec) or e is None or e > OUTPUT_REL_MAX:
        return p
    first = next((d for d in done.values() if d.kind not in WEIGHT_KINDS
                  and (d.status == STATUS_NOT_COMPARABLE or d.failed)), None)
    if first is None:
        return p
    status = STATUS_NOT_PROVEN if p.method == METHOD_STATS else STATUS_PASS
    return replace(p, status=status, reasons=(), floor=OUTPUT_REL_MAX, beyond_floor=False,
                   floor_reason=f"{OUTPUT_WORDS}: the two sides compute differently before it (first: {first.name})")


class UnpairedDraws:
    """Random draws one side makes and the other has no counterpart of: a train-mode dropout in the reference
    against its export (which drops it), noise a port adds. What is computed from one differs by that draw,
    not by the port's arithmetic: such a draw is named as the cause of the first record it reaches."""

    def __init__(self, ref_bundle: Any, cand_bundle: Any, results: Sequence[PairResult], limit: int = 10_000):
        self.limit = limit
        self.sides = []
        for side, bundle, paired in (("reference", ref_bundle, {p.name for p in results}),
                                     ("candidate", cand_bundle, {p.cand_name for p in results})):
            recs = {r.name: r for r in (bundle.records if bundle is not None else ())}
            draws = {n for n, r in recs.items() if r.kind == KIND_RNG and n not in paired}
            if draws:
                self.sides.append((side, recs, draws, paired))

    def blame(self, p: PairResult) -> PairResult:
        """`p` with cause `random` and the draw as its origin, when one of the sides' unpaired draws is among
        what `p` was computed from; else `p` unchanged."""
        for side, recs, draws, paired in self.sides:
            draw = self._reached(recs, draws, paired, p.name if side == "reference" else p.cand_name)
            if draw is not None:
                d = recs[draw]
                other = "candidate" if side == "reference" else "reference"
                return replace(p, cause=CAUSE_RANDOM, origin=draw, explanation=(
                    f"the {side} draws random numbers at {draw} ({short_op(d.op)} in {module_label(d.module)}) that "
                    f"the {other} has no counterpart of (a dropout left in train mode, or noise the "
                    f"{'export left out' if side == 'reference' else 'port adds'}): {p.name} differs by that draw, "
                    f"not by the port's arithmetic. Capture the {side} without it (model.eval(), or the noise "
                    "off) to compare the arithmetic"))
        return p

    def _reached(self, recs: dict[str, Record], draws: set[str], paired: set[str], start: str) -> str | None:
        """The unpaired draw `start` was computed from, walking back through records the other side has no
        counterpart of; a module-level record with no recorded input also counts the draws made inside it."""
        rec = recs.get(start)
        if rec is None:
            return None
        todo, seen = [start], {start}
        while todo and len(seen) < self.limit:
            r = recs.get(todo.pop())
            if r is None:
                continue
            found = [i for i in r.inputs if i in draws]
            if r.op.startswith("module:") and (r.name == start or not r.inputs):
                found += self._inside(recs, draws, r)
            if r.op.startswith("module:") and not r.inputs:
                found += self._just_before(recs, draws, r)
            if found:
                return max(found, key=lambda n: recs[n].order)
            for i in r.inputs:
                if i not in seen and i not in paired:
                    seen.add(i)
                    todo.append(i)
        return None

    @staticmethod
    def _just_before(recs: dict[str, Record], draws: set[str], r: Record) -> list[str]:
        """Draws made between the last computed record before `r` and `r`: a module-level record whose input
        came through functional code (`F.dropout` in a parent's forward) records no input."""
        lo = max((x.order for x in recs.values() if x.order < r.order and x.kind == KIND_OUTPUT), default=-1)
        return [d for d in draws if lo < recs[d].order < r.order]

    @staticmethod
    def _inside(recs: dict[str, Record], draws: set[str], r: Record) -> list[str]:
        """Draws made inside module record `r`'s call: under its module, after its module's previous record."""
        prefix = f"{r.module}." if r.module else ""
        before = [x.order for x in recs.values() if x.module == r.module and x.order < r.order and x.name != r.name
                  and x.op.startswith("module:")]
        lo = max(before, default=-1)
        return [d for d in draws if lo < recs[d].order < r.order
                and (recs[d].module == r.module or recs[d].module.startswith(prefix))]


def with_nonfinite_diagnoses(results: list[PairResult], ref_bundle: Any, cand_bundle: Any) -> list[PairResult]:
    """Words for each pair whose NaN/Inf is born here (cause `own`, values finite on one side only): which
    side, how many elements, and `tensorprobe.nan`'s diagnosis of the op on that side."""
    out = []
    origins: dict[str, Any] = {}
    for p in results:
        if p.cause == CAUSE_OWN and nonfinite_differs(p) and p.method in (METHOD_ELEMENTWISE, METHOD_STATS):
            p = replace(p, explanation=_born_here(p, ref_bundle, cand_bundle, origins))
        out.append(p)
    return out


def _born_here(p: PairResult, ref_bundle: Any, cand_bundle: Any, origins: dict[str, Any]) -> str:
    from ..nan import find_nonfinite_in_bundle

    cand_side = (p.metrics.get("cand_finite_frac") or 0.0) < (p.metrics.get("ref_finite_frac") or 0.0)
    side, bundle, name = ("candidate", cand_bundle, p.cand_name) if cand_side else ("reference", ref_bundle, p.name)
    rec = bundle.get(name) if bundle is not None else None
    words = f"NaN/Inf born here, on the {side} side: its inputs are finite and agree"
    if rec is not None and not rec.inputs and rec.op.startswith("module:"):
        words = (f"NaN/Inf first appears here, on the {side} side: the recorded values before it are finite and "
                 "agree, and its input came through code no record shows")
    if bundle is None:
        return words
    if side not in origins:
        origins[side] = find_nonfinite_in_bundle(bundle)
    origin = origins[side]
    if origin.found and origin.record == name and origin.diagnosis:
        return f"{words}. {' '.join(origin.diagnosis)}"
    if rec is None:
        return words
    from ..nan.diagnose import diagnose_from_stats

    ins = [bundle.get(i) for i in rec.inputs]
    found = diagnose_from_stats(rec.op, rec.op if rec.op.startswith("module:") else "",
                                [i.stats for i in ins if i is not None], rec.stats)
    return f"{words}. {' '.join(found)}" if found else words


def _promote_amplifiers(results: list[PairResult], by_name: dict[str, Record]) -> list[PairResult]:
    """A record within its own noise (relative to near-zero values, say) can pass on more absolute error
    than the records after it can explain: the divergence starts there. It fails, as the amplifier."""
    sources = {p.origin: p.name for p in results if p.cause == CAUSE_AMPLIFIED and p.origin != p.name
               and TAG_UNREAD not in p.tags}
    out = []
    for p in results:
        flips = p.angle is not None and p.angle.flips
        if p.name in sources and not p.failed and not flips:   # an angle's flips are told at its consumer
            rec = by_name.get(p.name)
            ins = [by_name[i] for i in (rec.inputs if rec else ()) if i in by_name]
            words = _explained(p, rec, ins, by_name, p.input_rel_err, p.rel_err) if rec is not None else None
            p = replace(p, status=STATUS_FAIL, cause=CAUSE_AMPLIFIED, origin=p.name, explanation=words, reasons=(
                f"relative error {p.rel_err:.3g} is within its own rounding noise, but the error it passes on "
                f"makes {sources[p.name]} diverge",))
        out.append(p)
    return out


def _own_within_floor(p: PairResult, done: dict[str, PairResult], by_name: dict[str, Record]) -> PairResult:
    if p.method != METHOD_ELEMENTWISE or p.rel_err is None or p.input_name is None or not p.rounding:
        return p
    rec = by_name.get(p.name)
    if rec is None or p.kind in (KIND_RNG, KIND_MODEL_INPUT) or done.get(p.input_name) is None:
        return p
    if family(rec.op) == "norm":
        return p  # a normalisation's conditioning is per channel: tensor-level statistics underestimate it
    if is_recurrent(rec.op):
        # A recurrent cell's record holds gate matmuls and squashing gates whose own rounding is not modelled
        # (its rounding here is one op's): on Silero VAD's LSTMCell (inputs of rms 513 into the gates) ONNX
        # Runtime's faithful export differs by 2.6e-6, 44 units, inside the floor 4.7e-6, and was called
        # "its own" error. Its floor still judges it: a gate bug is far beyond it.
        return p
    if not rec.op.startswith("module:") and p.input_name not in rec.inputs:
        return p  # ops the candidate has no record of ran in between: their rounding is not this op's
    ins = [by_name[i] for i in rec.inputs if i in by_name]
    gain = predicted_gain(rec, ins, _output_index(p.name))
    e_in = p.input_rel_err or 0.0
    src = done[p.input_name]
    if src.method == METHOD_STATS:
        # statistics bound an input's error from below: "its inputs differ by at most" needs its sketch's
        # estimate (which may read low by a factor ~2), or it cannot be said
        estimate = src.metrics.get("rel_l2_err_estimate")
        if estimate is None:
            return p
        e_in = max(e_in, ESTIMATE_MARGIN * estimate)
    limit = OWN_MARGIN * max(p.rounding * LOCAL_UNITS, gain * e_in)
    if p.rel_err <= limit or e_in >= INPUTS_DIFFER:
        return p
    words = (f"relative error {p.rel_err:.3g} is its own: its inputs differ by at most {e_in:.2g} and its own "
             f"rounding is ~{p.rounding:.2g}, which explain at most {limit:.2g} (within the accumulated noise "
             f"floor {p.floor:.2g}, but not made by rounding)")
    return replace(p, status=STATUS_FAIL, reasons=p.reasons + (words,))


def _classified(p: PairResult, done: dict[str, PairResult], by_name: dict[str, Record],
                quantized_input: str | None = None) -> PairResult:
    if not p.failed:
        return p
    if p.status == STATUS_SHAPE and sorted(p.shape) == sorted(p.cand_shape):
        # its dimensions reordered (an exporter moved a transpose) and a weight of its own differs: that weight
        bad = next((w for w in done.values() if w.kind in WEIGHT_KINDS and w.failed and w.module == p.module
                    and p.module), None)
        if bad is not None:
            return replace(p, cause=CAUSE_WEIGHTS, origin=bad.name)
    if p.status == STATUS_SHAPE or p.kind == KIND_MODEL_INPUT:
        return replace(p, cause=CAUSE_OWN, origin=p.name)
    if TAG_FUSED in p.tags and TAG_QUANTIZED not in p.tags:
        # its input is the record the port fused it with: no value of the port shows it (a fused value computed
        # with quantized arithmetic, a norm folded into an int8 conv, is judged as quantized below)
        partner = next((t[len(TAG_FUSED_WITH):] for t in p.tags if t.startswith(TAG_FUSED_WITH)), "the record before it")
        return replace(p, cause=CAUSE_OWN, origin=p.name, explanation=(
            f"the port computes it in one value with {partner} (fused), so the difference is made in one of the two"))
    if p.kind == KIND_RNG:   # noise, unless it draws otherwise than the reference (`draws.py`): the port's
        return replace(p, cause=CAUSE_OWN if is_draw_finding(p) else CAUSE_RANDOM, origin=p.name)
    src = done.get(p.input_name) if p.input_name else None
    if TAG_DRAWS_RANDOM in p.tags and (src is None or not src.failed):
        return replace(p, cause=CAUSE_RANDOM, origin=p.name, explanation=(
            f"the candidate computes {p.cand_name} from random draws of its own (not replayed from the "
            "reference): replay them (`tensorprobe rng`, --replay-rng) to compare the arithmetic"))
    if TAG_QUANTIZED in p.tags or quantized_input is not None:
        # (a weight of the record the port fused it with differs by the folding itself: no evidence)
        folded_in = TAG_FUSED in p.tags and src is not None and src.kind in WEIGHT_KINDS
        if src is None or not src.failed or src.cause == CAUSE_QUANTIZED and TAG_QUANTIZED in p.tags or folded_in:
            own_q = TAG_QUANTIZED in p.tags
            return replace(p, cause=CAUSE_QUANTIZED, origin=p.name if own_q else quantized_input, explanation=(
                f"the candidate computes {p.cand_name} with quantized arithmetic" if own_q else
                f"the candidate computes {p.cand_name} from {quantized_input}, a value made with quantized arithmetic")
                + ": its error is quantization error, expected of an int8 port")
    e = error_of(p)
    rec = by_name.get(p.name)
    ins = gain_inputs(rec, by_name.get) if rec is not None else []
    gain = predicted_gain(rec, ins, _output_index(p.name)) if rec is not None else 2.0
    e_in = p.input_rel_err or 0.0
    src_rec = by_name.get(p.input_name) if p.input_name else None
    if rec is not None and TAG_OWN_CODE in p.tags and src_rec is not None and src_rec not in ins and \
            src is not None and src.failed:    # (an input within its floor brings rounding only: no error to cancel)
        # the model's own code, which no record shows, may sum what it reads into a value near zero (a flow's
        # log-determinant over its steps): its input's error is multiplied by that cancellation, rms in / out
        cancel = (rms(src_rec.stats) or 0.0) / max(rms(rec.stats) or 0.0, 1e-300)
        gain = max(gain, min(HUGE_GAIN, cancel))
    unseen = rec is not None and not ins and family(rec.op) in _DATA_CONDITIONED
    if unseen:
        gain = HUGE_GAIN   # its input came through code no record shows: its conditioning is unknown
    local = (p.rounding or 0.0) * LOCAL_UNITS * _reduction_rounding(rec)
    if rec is not None and rec.op.startswith("module:") and p.floor is not None and _inside_unpaired(rec, done, by_name):
        # A module's own rounding is everything modelled inside its call, cancellations the floor refuses unless
        # measured (Silero's LSTM gates: x4,600) among it. With nothing inside compared (a wrapper renamed every
        # module: none paired), no measurement backs it, and an error beyond the floor cannot be called rounding
        # it amplifies: a port's clamp after conv1 read "amplified" rounding noise at the model's output.
        local = min(local, p.floor)
    # Inputs that already differ by more than INPUTS_DIFFER carry other data: nothing downstream of them can
    # be told apart from what they bring (a record whose reference is ~0 would otherwise "own" a huge error).
    if e is None and src is not None and src.failed and nonfinite_differs(src):
        return replace(p, cause=CAUSE_INHERITED, origin=src.origin or src.name)   # NaN/Inf came in with its input
    if e is None or src is None or (e > OWN_MARGIN * max(local, gain * e_in) and e_in < INPUTS_DIFFER):
        # an input compared by statistics carries only a lower bound of its error: it can't clear this record
        own = src is None or not src.failed or (p.method != METHOD_STATS and src.method != METHOD_STATS)
        if own:
            return replace(p, cause=CAUSE_OWN, origin=p.name)
    if rec is not None and _beyond_int8_input(p, rec, src):
        return replace(p, cause=CAUSE_OWN, origin=p.name, tags=p.tags + (TAG_BEYOND_INT8,), explanation=(
            f"relative error at least {p.rel_err_lower:.3g}, proven by the statistics, is "
            f"{p.rel_err_lower / src_estimate(src):,.0f}x what its input {src.name} brings (int8's error, about "
            f"{src_estimate(src):.2g} by its sketch): a float {rec.op.removeprefix('module:')} does not grow int8's "
            "error that much" + _unseen_code(p)))
    if src.kind in WEIGHT_KINDS and src.failed:
        return replace(p, cause=CAUSE_WEIGHTS, origin=src.name)
    if src.angle is not None and src.angle.flips and not src.failed:
        return replace(p, cause=CAUSE_AMPLIFIED, origin=src.name, explanation=(
            f"branch-cut flips: {src.angle.flips:,} values of the angle {src.name} lie near ±π and came out on "
            f"the other side of the cut (a jump of 2π); it matches modulo 2π, but {p.name} uses the raw angle "
            "(feed the network cos/sin of the phase, or the unwrapped phase, to make it continuous)"))
    if not src.failed:
        if p.gain is not None and p.gain < 1.0 and src.kind not in WEIGHT_KINDS and not (src.angle and src.angle.flips):
            # it carries less relative error than its input: the amplification happened in that input
            return replace(p, cause=CAUSE_AMPLIFIED, origin=src.name)
        flips = int(p.metrics.get("mismatches") or 0) if p.method == METHOD_EXACT else None
        words = _explained(p, rec, ins, by_name, e_in, e, flips) if rec is not None else None
        tags = p.tags + (TAG_INPUT_UNSEEN,) if unseen else p.tags   # the gain rests on an input no record shows
        return replace(p, cause=CAUSE_AMPLIFIED, origin=p.name, explanation=words, tags=tags)
    if src.cause == CAUSE_RANDOM:
        return replace(p, cause=CAUSE_RANDOM, origin=src.origin)
    return replace(p, cause=CAUSE_INHERITED, origin=src.origin or src.name)


def src_estimate(src: PairResult) -> float:
    """An input's relative error: measured, or what its sketches estimate (statistics)."""
    if src.rel_err is not None:
        return src.rel_err
    estimate = src.metrics.get("rel_l2_err_estimate")
    return estimate if estimate is not None and math.isfinite(estimate) else math.inf


def _unseen_code(p: PairResult) -> str:
    code = made_in(p.tags, p.module)
    if code is None:
        return ""
    return f" (or {code or 'the model'}'s own code that made its input, which no record shows)"


def _beyond_int8_input(p: PairResult, rec: Record, src: PairResult) -> bool:
    """A float linear op (or an activation of slope at most 1), compared by statistics, reading int8's error
    (its input computed with quantized arithmetic) whose proven error is FAR x that input's estimated error,
    the estimate taken ESTIMATE_MARGIN high: `_linear_beyond`'s rule where values were not kept."""
    if p.method != METHOD_STATS or not src.failed or src.cause != CAUSE_QUANTIZED or TAG_QUANTIZED in p.tags:
        return False
    return _credited_no_growth(rec.op) and (p.rel_err_lower or 0.0) >= QUANT_FAR * ESTIMATE_MARGIN * src_estimate(src)


def _inside_unpaired(rec: Record, done: Mapping[str, PairResult], by_name: Mapping[str, Record]) -> bool:
    """Does the reference hold forward records made inside `rec`'s module call (its own ops, its submodules'
    outputs), none of them compared? (A leaf module captured at module level has none: not this case.)"""
    m = rec.module or ""
    inside = False
    for r in by_name.values():
        if r.name == rec.name or r.kind in (KIND_MODEL_INPUT, KIND_MODEL_OUTPUT, *WEIGHT_KINDS) or r.order > rec.order:
            continue
        rm = r.module or ""
        if (rm == m and not r.op.startswith("module:")) or (rm.startswith(m + ".") if m else rm != ""):
            q = done.get(r.name)
            if q is not None and q.compared:
                return False
            inside = True
    return inside


def nonfinite_differs(p: PairResult) -> bool:
    """True when some elements are finite on one side only (a NaN or Inf the other side does not have)."""
    r, c = p.metrics.get("ref_finite_frac"), p.metrics.get("cand_finite_frac")
    return r is not None and c is not None and r != c


def _reduction_rounding(rec: Record | None) -> float:
    """A normalisation's mean over n values accumulates ~sqrt(n) roundings (and it is then divided by the
    channel's spread): the factor its own rounding may reach over one op's."""
    if rec is None or family(rec.op) != "norm" or not rec.shape:
        return 1.0
    return math.sqrt(max(1, rec.shape[-1]))


def _output_index(name: str) -> int:
    m = NAME_RE.match(name)
    out = m.group("output") if m else None
    return int(out) if out and out.isdigit() else 0


def first_divergence(failing: Sequence[PairResult], outputs: Sequence[PairResult] = (),
                     forward: Sequence[PairResult] = ()) -> PairResult | None:
    """Where it goes wrong. When a model output fails, the record its error came from (its `origin`); else the
    first failing record whose error is its own or a weight's, then quantization's (an int8 port has quantization
    error everywhere: a wrong scale after it is still the port's bug); then the first amplifier that makes
    NaN/Inf, the first amplifier, the first random draw, the first failing record."""
    quantized = [p for p in failing if p.cause == CAUSE_QUANTIZED]
    bugs = [p for p in failing if _port_bug(p, quantized[0] if quantized else None)]
    by_name = {p.name: p for p in forward}
    first_own = min(bugs[:1] + quantized[:1], key=lambda p: p.order, default=None)
    for o in outputs:
        src = by_name.get(o.origin or "") if o.failed else None
        # an earlier error of its own (a bug) still comes first: the output's error may come through it too
        if src is not None and src in failing and (first_own is None or first_own.order >= src.order) \
                and not (bugs and src.cause == CAUSE_QUANTIZED):
            return src
    amplified = [p for p in failing if p.cause == CAUSE_AMPLIFIED]
    # an amplifier that turns rounding into NaN/Inf is where a port breaks; earlier finite amplified rounding
    # is the expected price of a different kernel
    nonfinite = [p for p in amplified if nonfinite_differs(p)]
    for hits in (bugs, quantized, nonfinite, amplified, [p for p in failing if p.cause == CAUSE_RANDOM]):
        if hits:
            return hits[0]
    return failing[0] if failing else None


def _port_bug(p: PairResult, first_quantized: PairResult | None) -> bool:
    """A weight that differs, or an error of its own. After quantization error has entered, "its own" is sure only
    at a random op that draws otherwise (`draws`), far beyond what int8 explains at a quantized op
    (`quantization.judged`), or at a float linear op that multiplies its input's error (`_linear_beyond`):
    elsewhere it may be quantization error its op amplifies beyond what statistics credit (a log of values near
    1, a division by values rounded to 0)."""
    if p.cause == CAUSE_WEIGHTS:
        return True
    if p.cause != CAUSE_OWN:
        return False
    return first_quantized is None or p.order < first_quantized.order or is_draw_finding(p) or \
        (p.quantization is not None and p.quantization.finding is not None) or _linear_beyond(p) or \
        TAG_BEYOND_INT8 in p.tags


# activations whose slope is at most 1: the error they pass on is at most what they read
_CONTRACTING = frozenset({"relu", "leaky_relu", "tanh", "hardtanh", "clamp", "Relu", "LeakyRelu", "Tanh", "Clip",
                          "ReLU", "LeakyReLU", "Hardtanh"})


def _credited_no_growth(op: str) -> bool:
    """A float linear op (its conditioning is credited from its weights and inputs) or an activation of slope at
    most 1 (none to credit); not a recurrent cell, whose gates' tails amplify."""
    base = canonical_op(op)
    contracting = op.removeprefix("module:") in _CONTRACTING or base in _CONTRACTING
    return not is_recurrent(op) and (family(op) == "linear" or contracting)


def _linear_beyond(p: PairResult) -> bool:
    """A float convolution or matmul (not quantized itself), or an activation of slope at most 1, that multiplies
    its measured input error by FAR or more: a linear op's conditioning is credited from its weights and inputs
    (`explain.dot_cancellation`), and such an activation has none, so quantization error it reads cannot grow
    that much in it: the error is its own (a gain past frame N). Not a recurrent cell: its gates' tails amplify."""
    return TAG_QUANTIZED not in p.tags and _credited_no_growth(p.op) and \
        p.method == METHOD_ELEMENTWISE and p.gain is not None and math.isfinite(p.gain) and p.gain >= QUANT_FAR


def amplifiers(results: list[PairResult], criteria: Criteria, by_name: dict[str, Record] | None = None
               ) -> list[Amplifier]:
    """Records with the largest finite error gain whose output error matters (beyond the noise floor under
    the noise rule, else large enough for the criteria), each with an explanation where one applies."""
    floor = criteria.significant_rel_err() / 10

    def matters(p: PairResult) -> bool:
        if criteria.noise:
            return p.failed
        return p.rel_err is not None and p.rel_err >= floor

    values = (METHOD_ELEMENTWISE, METHOD_EXACT, METHOD_DIGEST)
    pairs = {p.name: p for p in results}
    readers: dict[str, list[str]] = {}
    for rec in (by_name or {}).values():
        for i in rec.inputs:
            readers.setdefault(i, []).append(rec.name)

    def measured_input(p: PairResult) -> bool:   # a statistics lower bound makes no gain
        src = pairs.get(p.input_name or "")
        return src is None or src.method in values

    cands = [p for p in results if p.gain is not None and math.isfinite(p.gain) and p.gain >= MIN_GAIN
             and p.rel_err is not None and matters(p) and p.kind not in (KIND_MODEL_INPUT, KIND_RNG)
             and p.cause != CAUSE_QUANTIZED and TAG_QUANTIZED not in p.tags and TAG_INTEGER_DOMAIN not in p.tags
             and TAG_PORT_OP not in p.tags     # its gain is of the reference's input; the port's op read another
             and p.method in values and measured_input(p) and not _near_zero_gain_only(p, by_name, pairs, readers)]
    cands.sort(key=lambda p: p.gain, reverse=True)
    out = []
    for p in cands[:MAX_AMPLIFIERS]:
        words = p.explanation
        if words is None and by_name is not None and p.name in by_name:
            rec = by_name[p.name]
            ins = [by_name[i] for i in rec.inputs if i in by_name]
            flips = int(p.metrics.get("mismatches") or 0) if p.method == METHOD_EXACT else None
            words = _explained(p, rec, ins, by_name, p.input_rel_err, p.rel_err, flips)
        out.append(Amplifier(p.name, p.op, p.gain, p.input_rel_err, p.rel_err, words))
    return out


NEAR_ZERO_REF = 1e-3   # a result whose rms is under 1/1000 of its input's is "near zero" against it
CANCELLING = frozenset({"sum", "linear", "other"})   # op families whose tiny result is a cancellation


def _near_zero_gain_only(p: PairResult, by_name: Mapping[str, Record] | None,
                         pairs: Mapping[str, PairResult], readers: Mapping[str, list[str]]) -> bool:
    """Whether `p`'s gain is only that of a relative error taken against near-zero reference values: its result
    is tiny next to its input (a difference of two nearly equal values), its absolute error is no larger than its
    input's, and nothing that reads it brings it back to its input's scale with the error (a norm or a division
    by its own spread would: then the cancellation is the amplifier). Such a record amplifies no error anyone
    hears (issue 29: a pair whose gain comes from near-zero reference values never ranks)."""
    if by_name is None or p.input_rel_err is None or p.rel_err is None:
        return False
    rec, src = by_name.get(p.name), by_name.get(p.input_name or "")
    # only sums and products cancel: a sin's output is small next to a phase of 1e4 rad by nature, not by
    # cancellation, and its gain is the phase accumulation to name
    if rec is None or src is None or family(rec.op) not in CANCELLING:
        return False
    out_rms, in_rms = rms(rec.stats), rms(src.stats)
    if not out_rms or not in_rms or out_rms >= NEAR_ZERO_REF * in_rms:
        return False
    if p.rel_err * out_rms > 2.0 * p.input_rel_err * in_rms:
        return False
    for name in readers.get(p.name, ()):
        reader, result = by_name.get(name), pairs.get(name)
        if (reader is not None and result is not None and result.rel_err is not None
                and (rms(reader.stats) or 0.0) >= NEAR_ZERO_REF * in_rms and result.rel_err >= 0.1 * p.rel_err):
            return False
    return True


SPECTRAL_MIN_SAMPLES = 2048   # a waveform long enough for a few STFT frames


def with_spectral_magnitude(p: PairResult, ref_bundle: Any, cand_bundle: Any) -> PairResult:
    """A failing model output that is a waveform (one float signal) gets the STFT magnitude comparison too
    (metrics `spec_mag_rel_err`, `log_spec_corr`): a sine source whose phase drifts changes the waveform but not
    what is heard, and the summary says which it is (issue 29)."""
    if (p.kind != KIND_MODEL_OUTPUT or not p.failed or p.method != METHOD_ELEMENTWISE or ref_bundle is None
            or cand_bundle is None or "spec_mag_rel_err" in p.metrics):
        return p
    try:
        ref, cand = ref_bundle.numpy(p.name), cand_bundle.numpy(p.cand_name)
    except Exception:   # noqa: BLE001 — a tensor that cannot be read is judged elsewhere; no note then
        return p
    figures = spectral_magnitude(ref, cand)
    return replace(p, metrics={**p.metrics, **figures}) if figures else p


def spectral_magnitude(ref: Any, cand: Any) -> dict[str, float]:
    """{'spec_mag_rel_err': relative L2 error of the STFT magnitudes, 'log_spec_corr': correlation of the
    log-magnitudes}, of two waveforms of the same shape (a single signal: [T], [1, T], [1, 1, T]); {} otherwise."""
    import numpy as np
    r, c = np.asarray(ref, dtype=np.float64), np.asarray(cand, dtype=np.float64)
    if r.shape != c.shape or r.size < SPECTRAL_MIN_SAMPLES or max(r.shape) != r.size:
        return {}
    r, c = r.reshape(-1), c.reshape(-1)
    if not (np.isfinite(r).all() and np.isfinite(c).all()):
        return {}
    n_fft = min(1024, 1 << int(np.log2(r.size // 4)))
    mr, mc = _stft_magnitude(r, n_fft), _stft_magnitude(c, n_fft)
    norm = float(np.linalg.norm(mr))
    if norm == 0.0:
        return {}
    floor = 1e-6 * float(mr.max())
    lr, lc = np.log(mr + floor).ravel(), np.log(mc + floor).ravel()
    corr = float(np.corrcoef(lr, lc)[0, 1]) if lr.std() > 0 and lc.std() > 0 else 1.0
    return {"spec_mag_rel_err": float(np.linalg.norm(mc - mr)) / norm, "log_spec_corr": corr}


def _stft_magnitude(x: Any, n_fft: int) -> Any:
    import numpy as np
    hop = n_fft // 4
    frames = np.lib.stride_tricks.sliding_window_view(x, n_fft)[::hop]
    return np.abs(np.fft.rfft(frames * np.hanning(n_fft), axis=-1))


def _explained(p: PairResult, rec: Record, ins: list[Record], by_name: dict[str, Record], e_in: float | None,
               e: float | None, flips: int | None = None) -> str | None:
    """`explain` for pair `p`, with the running sum behind a sin/cos and how far its output decorrelates."""
    acc = _accumulator(rec, by_name) if family(rec.op) == "sin" else None
    return explain(rec, ins, p.gain, e_in, e, flips, accumulator=acc, corr=p.metric("pearson"))


def _accumulator(rec: Record, by_name: dict[str, Record], depth: int = 6) -> Record | None:
    """The running sum (cumsum) a sin/cos's phase comes from, a few data ops upstream (a scale by 2π, an
    interpolation between them), or None."""
    seen, frontier = set(), [rec]
    for _ in range(depth):
        nxt = []
        for r in frontier:
            for i in r.inputs:
                src = by_name.get(i)
                if src is None or i in seen or src.kind in WEIGHT_KINDS:
                    continue
                if "cumsum" in src.op.lower():
                    return src
                seen.add(i)
                nxt.append(src)
        frontier = nxt
    return None


def model_output(results: list[PairResult], declared: Sequence[str] = ()) -> PairResult | None:
    """The model's first own output (a model-output record, in the model's order: `declared`, else as recorded)
    that fails, else its first output, else the root module's output, else the last output record in
    execution order."""
    outs = in_model_order([p for p in results if p.kind == KIND_MODEL_OUTPUT], declared)
    failing = [p for p in outs if p.failed]
    if outs:
        return failing[0] if failing else outs[0]
    roots = [p for p in results if p.module == "" and p.op.startswith("module:")]
    if roots:
        return roots[-1]
    outs = [p for p in results if p.kind == KIND_OUTPUT]
    return outs[-1] if outs else None


def call_key(name: str) -> tuple[str, int]:
    """'dec.step@3/addmm.0' -> ('dec.step/addmm.0', 3); names without @ are call 0."""
    m = _CALL_RE.match(name)
    return (m.group(1) + m.group(3), int(m.group(2))) if m else (name, 0)


def call_series(results: list[PairResult]) -> list[CallSeries]:
    """Per-call comparison of every record whose module ran more than once (loops, ODE steps)."""
    groups: dict[str, list[tuple[int, PairResult]]] = {}
    for p in results:
        key, call = call_key(p.name)
        groups.setdefault(key, []).append((call, p))
    out = []
    for key, items in groups.items():
        if len({c for c, _ in items}) < 2:
            continue
        items.sort(key=lambda t: t[0])
        rel = tuple(p.rel_err for _, p in items)
        first_fail = next((c for c, p in items if p.failed), None)
        nonzero = [r for r in rel if r]
        growth = rel[-1] / nonzero[0] if nonzero and rel[-1] is not None else None
        out.append(CallSeries(key=key, calls=tuple(c for c, _ in items), rel_err=rel,
                              snr_db=tuple(p.metric("snr_db") for _, p in items),
                              passed=tuple(not p.failed for _, p in items), first_failing_call=first_fail,
                              growth=growth))
    return out


def rng_note(first: PairResult, ref_records: Sequence[Record], ref_bundle: Any = None,
             cand_bundle: Any = None) -> str | None:
    """Words for a first divergence that is a random op, or comes right after one whose noise differs.

    Uses `tensorprobe.rng.unreplayed_rng_before` (op-graph ancestry, noise really compared) when both
    bundles are at hand; else the simple rule: the divergent record is, consumes, or directly follows
    a random op.
    """
    if is_draw_finding(first):
        return None      # a port difference at a random op: nothing to replay
    if cand_bundle is not None:
        try:
            from ..rng import unreplayed_rng_before
        except ImportError:
            pass
        else:
            s = unreplayed_rng_before(cand_bundle, first.cand_name, ref=ref_bundle, cand=cand_bundle)
            if s is None:
                return None
            if s.replayed:
                return s.sentence()
            corr = f"; noise correlation {s.pearson:.4f}" if s.pearson is not None else ""
            where = "is" if s.rng == s.divergent else ("sits right after" if s.direct else "sits after")
            return (f"random op {s.rng} was not replayed; use --replay-rng (the first divergence "
                    f"{first.name} {where} that random op{corr})")
    if first.kind == KIND_RNG:
        return f"random op {first.name} was not replayed; use --replay-rng (the first divergence is that op)"
    by_name = {r.name: r for r in ref_records}
    rec = by_name.get(first.name)
    rngs = [i for i in (rec.inputs if rec else ()) if i in by_name and by_name[i].kind == KIND_RNG]
    if not rngs and rec is not None:
        before = [r for r in ref_records if r.order < rec.order]
        if before and before[-1].kind == KIND_RNG:
            rngs = [before[-1].name]
    if not rngs:
        return None
    return (f"random op {rngs[0]} was not replayed; use --replay-rng (the first divergence {first.name} "
            "sits right after that random op)")


def angle_notes(results: list[PairResult]) -> list[str]:
    notes = []
    for p in results:
        if p.angle is not None and p.angle.flips:
            verdict = ("this explains its raw divergence: modulo 2π it matches" if p.angle.explained else
                       "compared modulo 2π")
            notes.append(f"{p.name}: {p.angle.flips:,} branch-cut flips (differences of ±2π) in an angle; "
                         f"{verdict}")
    return notes
