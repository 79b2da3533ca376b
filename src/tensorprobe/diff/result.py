"""The findings of a diff, as frozen dataclasses with `to_dict()` (JSON schema: docs/json-diff.md).

Renderers (`report/terminal.py`, `report/html.py`), the CLI and `testing.assert_parity` all read these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

from ..numbers import json_number

STATUS_PASS = "pass"
STATUS_FAIL = "fail"
STATUS_SHAPE = "shape_mismatch"
STATUS_NO_DATA = "no_data"
STATUS_NOT_COMPARABLE = "not_comparable"
STATUS_NOT_PROVEN = "not_proven"    # compared by statistics only, which show no difference: not a proven match

# How a pair was compared: every element (floats), exactly (integers, bools), by content fingerprint
# (weights), or by statistics alone (a side kept no tensor: divergences are proven, a match is not).
METHOD_ELEMENTWISE, METHOD_EXACT, METHOD_DIGEST, METHOD_STATS = "elementwise", "exact", "digest", "statistics"
# a pair whose candidate record reads a value made with quantized arithmetic that has no reference counterpart
# (the rescale after ConvInteger): computed from quantized arithmetic though not tagged quantized itself
TAG_READS_QUANTIZED = "reads_quantized"
# an amplifier credited with a gain its input cannot show: that input was made by code no record shows
TAG_INPUT_UNSEEN = "input_unseen"
TAG_FUSED = "fused"     # a record the port holds in one value with the one before it (diff.fusion)
TAG_FUSED_WITH = "fused_with:"   # ... and the record it was fused with (`fused_with:blocks.0.0`)
TAG_WEIGHT_UNSEEN = "weight_unseen"   # a reader failed on a weight its statistics cannot show (diff.fusion)
TAG_WEIGHT_BEHIND = "weight_behind"   # weights: a module the port has no value of, before it, reads one that differs
TAG_NORM_MEASURED = "norm_measured"   # own: beyond what its input's error, measured on values, makes (conditioning)
TAG_PORT_OP = "port_op"   # the value it reads differs already: an op only the port has changed it (diff.port_ops)
TAG_WEIGHT_MISSING = "weight_missing"   # a reader failed, and a weight it reads has no counterpart (diff.fusion)
TAG_BEYOND_INT8 = "beyond_int8_input"   # own: statistics prove FAR x what its int8 input's sketch estimates (analysis)
TAG_FOLDED = "folded"   # a weight that differs while what its reader computes agrees (diff.fusion): a note
MATCH_SUGGESTED = "rule (suggested)"   # a weight paired by the rename rules diff offers, not by the user

VERDICT_MATCH = "match"
VERDICT_DIVERGED = "diverged"
VERDICT_CONSISTENT = "consistent"       # nothing compared element-wise; the statistics show no divergence
VERDICT_EMPTY = "nothing_compared"
VERDICT_INCOMPLETE = "incomplete"     # no divergence in what was compared, but a bundle stops early



jfloat = json_number   # JSON has no Inf/NaN: "inf", "-inf", "nan" (tensorprobe.numbers)


def _jdict(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: jfloat(v) for k, v in d.items()}


@dataclass(frozen=True)
class Criteria:
    """Pass/fail thresholds. A pair fails when any given criterion fails.

    atol/rtol: element-wise, |cand - ref| <= atol + rtol·|ref| for every element (as `numpy.allclose`).
    min_corr: minimum Pearson correlation. min_snr: minimum SNR in dB (reference energy over error energy).
    With none given, `noise` is True: the noise-or-divergence rule of `tensorprobe.diff.noise` decides.
    """

    atol: float | None = None
    rtol: float | None = None
    min_corr: float | None = None
    min_snr: float | None = None

    @property
    def noise(self) -> bool:
        """No threshold given: differences are judged against each record's rounding-noise floor."""
        return all(v is None for v in (self.atol, self.rtol, self.min_corr, self.min_snr))

    @property
    def elementwise(self) -> bool:
        return self.atol is not None or self.rtol is not None

    def significant_rel_err(self) -> float:
        """A relative L2 error large enough to matter under these criteria (used to rank amplifiers)."""
        if self.noise:
            return 0.0  # each record's own noise floor decides
        if self.min_snr is not None:
            return 10 ** (-self.min_snr / 20)
        if self.min_corr is not None:
            return math.sqrt(max(2 * (1 - self.min_corr), 1e-16))
        return max(self.rtol or 0.0, 1e-6)

    def to_dict(self) -> dict[str, Any]:
        return {"atol": self.atol, "rtol": self.rtol, "min_corr": self.min_corr, "min_snr": self.min_snr,
                "rule": "noise" if self.noise else "thresholds"}

    def describe(self) -> str:
        """'noise rule' or 'min_snr = 60, atol = 1e-05': how pairs are judged, in words."""
        if self.noise:
            return "noise rule (differences within rounding pass)"
        return ", ".join(f"{k} = {v:g}" for k, v in (("atol", self.atol), ("rtol", self.rtol),
                                                     ("min_corr", self.min_corr), ("min_snr", self.min_snr))
                         if v is not None)


@dataclass(frozen=True)
class AngleResult:
    """Comparison modulo 2π of a record holding angles (atan2/angle output or marked by the user)."""

    flips: int                 # elements whose raw difference exceeds π: branch-cut flips
    raw_max_abs_err: float     # before wrapping
    raw_snr_db: float | None
    explained: bool            # the raw comparison fails, the modulo-2π one passes: flips explain it
    raw_rel_err: float | None = None   # relative L2 error before wrapping: what a consumer of the raw angle sees

    def to_dict(self) -> dict[str, Any]:
        return _jdict(self.__dict__)


@dataclass(frozen=True)
class DbResult:
    """Error in decibels of a spectrogram / log-magnitude record (as seed 004 reported by hand)."""

    scale: str                 # how values became dB: mag (20·log10), power (10·log10), ln, db
    mean_abs_db: float
    median_abs_db: float
    max_abs_db: float

    def to_dict(self) -> dict[str, Any]:
        return _jdict(self.__dict__)


@dataclass(frozen=True)
class QuantNoise:
    """What int8 quantization is expected to add at a record the candidate computes with quantized arithmetic: the
    step of the quantized value it reads (the activation; `weight_step` for the weight) against that value's range
    and rms, and the relative error those steps give (`tensorprobe.diff.quantization`). `finding` says why the
    record's error is beyond what the steps explain, or why the steps are coarse, and what to change."""

    step: float                        # the activation's quantization step (its scale)
    low: float                         # the range that step covers: what the quantized value can hold
    high: float
    rms: float                         # rms of the value quantized: how many steps its typical value spans
    expected: float                    # relative error the steps are expected to give here
    weight_step: float | None = None   # the weight's largest step, when a weight was quantized too
    weight_rms: float | None = None
    clipped: float = 0.0               # fraction of the range beyond what the scale holds (static scales)
    finding: str | None = None

    @property
    def levels(self) -> float:
        """The activation's typical value (rms) in steps."""
        return self.rms / self.step if self.step > 0 else math.inf

    @property
    def weight_levels(self) -> float | None:
        """The weight's typical value (rms) in steps."""
        return self.weight_rms / self.weight_step if self.weight_step and self.weight_rms else None

    @property
    def coarse(self) -> bool:
        """Steps too coarse for the values (the rms spans fewer than 8 steps), or a scale that clips them."""
        return self.clipped > 0 or self.levels < 8 or (self.weight_levels or math.inf) < 8

    def words(self) -> str:
        """'activation step 0.0039 over [0, 1] (rms 54 steps), weight step 0.00098: int8 is expected to add 0.8%'"""
        w = f", weight step {self.weight_step:.2g}" if self.weight_step else ""
        return (f"activation step {self.step:.2g} over [{self.low:.3g}, {self.high:.3g}] (its rms is {self.levels:,.3g} "
                f"steps){w}: int8 is expected to add a relative error of about {self.expected:.2g}")

    def to_dict(self) -> dict[str, Any]:
        return {**_jdict({k: v for k, v in self.__dict__.items() if k != "finding"}), "finding": self.finding}


@dataclass(frozen=True)
class PairResult:
    """One compared pair: a reference record and its candidate, metrics and verdict."""

    name: str
    cand_name: str
    module: str
    op: str
    kind: str
    call: int
    order: int
    shape: tuple[int, ...]
    cand_shape: tuple[int, ...]
    dtype: str
    cand_dtype: str
    match: str
    status: str
    reasons: tuple[str, ...] = ()
    metrics: Mapping[str, float | None] = field(default_factory=dict)
    angle: AngleResult | None = None
    db: DbResult | None = None
    input_rel_err: float | None = None
    gain: float | None = None
    tags: tuple[str, ...] = ()
    method: str | None = None           # METHOD_*: how the pair was compared (None: it was not)
    floor: float | None = None          # the relative error rounding explains here (noise rule)
    rounding: float | None = None       # the part of it this record's own op adds
    cause: str | None = None            # own, weights, amplified, random, inherited (diverging pairs)
    origin: str | None = None           # the record where this pair's error entered
    explanation: str | None = None      # why its op amplifies (diff.explain), or why it is not comparable
    input_name: str | None = None       # the input whose error `input_rel_err` is
    floor_reason: str | None = None     # why the floor is what it is (noise rule): rounding, measured, capped
    modelled_floor: float | None = None  # what the noise model alone would allow (the floor may be lower)
    beyond_floor: bool = False          # fails only because its error exceeds `floor` (a measurement may lift it)
    # inputs of a failing record whose error is its own that were not paired and compared: (name, why), why
    # "unpaired" or "not compared" (diff.evidence); while any is listed, "its inputs are identical" is unproven
    uncompared_inputs: tuple[tuple[str, str], ...] = ()
    quantization: QuantNoise | None = None    # what int8 is expected to add here (quantized records)

    @property
    def passed(self) -> bool:
        """Not failing: a pass, a pair compared by statistics that show no difference (`not_proven`), nothing
        to compare, or values that can't be compared."""
        return self.status in (STATUS_PASS, STATUS_NOT_PROVEN, STATUS_NO_DATA, STATUS_NOT_COMPARABLE)

    @property
    def failed(self) -> bool:
        return self.status in (STATUS_FAIL, STATUS_SHAPE)

    def metric(self, name: str) -> float | None:
        return self.metrics.get(name)

    @property
    def rel_err(self) -> float | None:
        """Relative L2 error, when the values were compared (element-wise or exactly)."""
        return self.metrics.get("rel_l2_err")

    @property
    def rel_err_lower(self) -> float | None:
        """The proven lower bound of the relative error, for pairs compared by statistics."""
        return self.metrics.get("rel_l2_err_lower")

    @property
    def compared(self) -> bool:
        return self.method is not None and self.status != STATUS_NOT_COMPARABLE

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "cand_name": self.cand_name, "module": self.module, "op": self.op,
            "kind": self.kind, "call": self.call, "order": self.order, "shape": list(self.shape),
            "cand_shape": list(self.cand_shape), "dtype": self.dtype, "cand_dtype": self.cand_dtype,
            "match": self.match, "status": self.status, "reasons": list(self.reasons),
            "metrics": _jdict(self.metrics), "angle": self.angle.to_dict() if self.angle else None,
            "db": self.db.to_dict() if self.db else None, "input_rel_err": jfloat(self.input_rel_err),
            "gain": jfloat(self.gain), "tags": list(self.tags), "method": self.method,
            "floor": jfloat(self.floor), "floor_reason": self.floor_reason, "floor_modelled": jfloat(self.modelled_floor),
            "rounding": jfloat(self.rounding), "cause": self.cause, "origin": self.origin,
            "explanation": self.explanation, "input_name": self.input_name,
            "uncompared_inputs": [{"name": n, "why": why} for n, why in self.uncompared_inputs],
            "quantization": self.quantization.to_dict() if self.quantization else None,
        }


@dataclass(frozen=True)
class Amplifier:
    """A record that turns a small relative error at its inputs into a larger one at its output."""

    name: str
    op: str
    gain: float
    input_rel_err: float
    output_rel_err: float
    explanation: str | None = None     # why (phase accumulation, near-zero division, ...), when known

    def to_dict(self) -> dict[str, Any]:
        return _jdict(self.__dict__)


@dataclass(frozen=True)
class CallSeries:
    """A module (or op inside it) called several times, compared call by call (ODE / decoding steps)."""

    key: str                          # the record name with its @call part removed
    calls: tuple[int, ...]
    rel_err: tuple[float | None, ...]
    snr_db: tuple[float | None, ...]
    passed: tuple[bool, ...]
    first_failing_call: int | None
    growth: float | None              # relative error at the last call over the first non-zero one

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "calls": list(self.calls), "rel_err": [jfloat(v) for v in self.rel_err],
                "snr_db": [jfloat(v) for v in self.snr_db], "passed": list(self.passed),
                "first_failing_call": self.first_failing_call, "growth": jfloat(self.growth)}


@dataclass(frozen=True)
class DiffReport:
    """Everything `tensorprobe.diff` found. `summary` is the plain-words paragraph printed first.

    `pairs` are the forward's records (model inputs and outputs included), in execution order; `weights`
    the parameter and buffer pairs, compared first. `outputs` names the model's own outputs among `pairs`.
    """

    ref: str
    cand: str
    criteria: Criteria
    pairs: tuple[PairResult, ...]
    ref_only: tuple[str, ...]
    cand_only: tuple[str, ...]
    first_divergence: str | None
    worst: str | None
    amplifiers: tuple[Amplifier, ...]
    output: str | None
    call_series: tuple[CallSeries, ...]
    rng_note: str | None
    notes: tuple[str, ...]
    summary: str
    weights: tuple[PairResult, ...] = ()
    weights_ref_only: tuple[str, ...] = ()
    weights_cand_only: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()
    first_difference: str | None = None     # first failing record in execution order, when not the divergence
    environment_notes: tuple[str, ...] = ()
    rng_differs: tuple[str, ...] = ()       # random draws that differ (not replayed)
    rng_replayed: bool = False              # the candidate was captured replaying the reference's draws
    incomplete: tuple[str, ...] = ()        # "the candidate bundle is incomplete: its capture stopped after ..."
    reduced_precision: str | None = None    # why the candidate is not a same-precision port ("float16"), or None
    levels: str | None = None               # "the reference was captured at module level and the candidate at op level: ..."
    renames: str | None = None              # "... the candidate's blocks.N look like the reference's layers.N ...: try --map ..."
    suggested_rules: tuple[str, ...] = ()   # the mapping rules `renames` offers (candidate name -> reference name)
    model_class: str | None = None          # the reference model's class: its top-level module's own ops are
    # "the model's own forward (Class.forward, file:line)", never the loss
    first_source: str | None = None         # the reference's source line of the first divergence's op

    @property
    def verdict(self) -> str:
        """match: everything compared agrees (up to rounding, under the noise rule); diverged: something
        decisive fails; incomplete: nothing diverges, but a bundle stops early (the rest was never compared);
        consistent: nothing was compared element-wise and the statistics show no divergence;
        nothing_compared: no pair could be compared at all."""
        everything = self.pairs + self.weights
        by_int8 = self.judged_by_int8_outputs     # once per verdict, not once per failing pair
        if any(self._decisive(p, by_int8) for p in everything):
            return VERDICT_DIVERGED
        if self.incomplete:
            return VERDICT_INCOMPLETE
        methods = {p.method for p in everything if p.compared}
        if methods - {None, METHOD_STATS}:
            return VERDICT_MATCH
        return VERDICT_CONSISTENT if METHOD_STATS in methods else VERDICT_EMPTY

    def _decisive(self, p: PairResult, by_int8_outputs: bool) -> bool:
        """A failure that makes the run diverge: anything but random draws that differ without reaching
        the model's outputs (noise multiplied by zero, a dropout mask in eval), integer results that no
        recorded op reads (tag "unread": max-pool indices flipped by rounding), and int8's error in a quantized
        port judged by its outputs (`by_int8_outputs`: `judged_by_int8_outputs`)."""
        if not p.failed or "unread" in p.tags:    # flipped indices no recorded op reads (diff.analysis)
            return False
        if TAG_FOLDED in p.tags:    # a weight that differs while what reads it agrees (diff.fusion)
            return False
        if p.cause in ("quantized", "inherited", "amplified") and by_int8_outputs:
            return False
        return p.cause != "random" or p.name in self.outputs or p.name == self.output

    @property
    def judged_by_int8_outputs(self) -> bool:
        """A quantized port whose every model output meets the output criterion of a quantized port (tag
        `output_quantized`, diff.analysis) while its failing records carry int8's error and nothing else: its
        records' errors are by design, the outputs decide (issue 29 item 2)."""
        outs = [p for p in self.pairs if p.name in self.outputs or p.name == self.output]
        return bool(outs) and all(not p.failed for p in outs) and any("output_quantized" in p.tags for p in outs)

    @property
    def passed(self) -> bool:
        return self.verdict == VERDICT_MATCH

    @property
    def shape_mismatches(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.pairs + self.weights if p.status == STATUS_SHAPE)

    @property
    def not_comparable(self) -> tuple[PairResult, ...]:
        return tuple(p for p in self.pairs + self.weights if p.status == STATUS_NOT_COMPARABLE)

    @property
    def weights_differ(self) -> tuple[PairResult, ...]:
        """Weights that differ, but those the port folded (what reads them agrees: diff.fusion)."""
        return tuple(p for p in self.weights if p.failed and TAG_FOLDED not in p.tags)

    @property
    def strongest_amplifier(self) -> Amplifier | None:
        return self.amplifiers[0] if self.amplifiers else None

    def pair(self, name: str) -> PairResult:
        p = self.get(name)
        if p is None:
            raise KeyError(name)
        return p

    def get(self, name: str | None) -> PairResult | None:
        """The pair (forward or weight) of reference record `name`; None when there is none, or `name` is None
        (so `report.get(report.first_divergence)` is None on a match)."""
        if not name:
            return None
        return next((p for p in self.pairs if p.name == name), None) or \
            next((p for p in self.weights if p.name == name), None)

    @property
    def first_place(self) -> str | None:
        """The module the verdict names as where the error enters: the first divergence's own; where that record
        reads a value an op only the port has changed (`port_op`), that op's module; where it reads a weight
        that differs of a module with no value compared (the port has none of its own), that module. None on a
        match. ('' is the model's own code.)

            >>> report.first_divergence, report.first_place     # doctest: +SKIP
            ('norm1/native_layer_norm.0:0', 'mix')
        """
        from ..record import parse_name

        p = self.get(self.first_divergence)
        if p is None:
            return None
        own = "" if p.kind in ("model_output", "model_input") else parse_name(p.name)[0]
        if TAG_PORT_OP in p.tags and p.origin:
            return parse_name(p.origin)[0]
        w = next((w for w in self.weights if w.name == p.origin), None) if p.cause == "weights" else None
        # ... a module the reference ran (records of its own, none paired: the port has no value there), not one
        # whose weight a parent reads without calling it (MultiheadAttention's out_proj)
        # (a value it judges nothing by, an all-zero mask, is not one of its values)
        if w is not None and w.module and not _within(own, w.module) and not any(
                q.compared and _within(q.module, w.module) and q.floor != math.inf for q in self.pairs) and any(
                _within(parse_name(n)[0], w.module) for n in self.ref_only):
            return w.module
        return own

    def fused_with(self, name: str | None) -> str | None:
        """The record the port fused pair `name` with (it holds both in one value), or None."""
        p = self.get(name)
        return next((t[len(TAG_FUSED_WITH):] for t in p.tags if t.startswith(TAG_FUSED_WITH)), None) if p else None

    @property
    def output_persists(self) -> bool | None:
        """Does the divergence reach the model output (True) or wash out before it (False)?"""
        out = self.get(self.output)
        if out is None or self.first_divergence is None:
            return None
        return out.failed

    def to_dict(self) -> dict[str, Any]:
        return {
            "ref": self.ref, "cand": self.cand, "verdict": self.verdict, "summary": self.summary,
            "criteria": self.criteria.to_dict(), "first_divergence": self.first_divergence,
            "first_difference": self.first_difference,
            "worst": self.worst, "output": self.output, "outputs": list(self.outputs),
            "output_persists": self.output_persists,
            "strongest_amplifier": self.amplifiers[0].to_dict() if self.amplifiers else None,
            "amplifiers": [a.to_dict() for a in self.amplifiers], "rng_note": self.rng_note,
            "rng_differs": list(self.rng_differs), "environment_notes": list(self.environment_notes),
            "notes": list(self.notes), "incomplete": list(self.incomplete), "counts": self.counts(),
            "reduced_precision": self.reduced_precision, "levels": self.levels, "renames": self.renames,
            "suggested_rules": list(self.suggested_rules),
            "ref_only": list(self.ref_only), "cand_only": list(self.cand_only),
            "shape_mismatches": list(self.shape_mismatches),
            "not_comparable": [{"name": p.name, "dtype": p.dtype, "cand_name": p.cand_name,
                                "cand_dtype": p.cand_dtype, "reason": "; ".join(p.reasons)} for p in self.not_comparable],
            "weights_differ": [p.name for p in self.weights_differ],
            "weights_ref_only": list(self.weights_ref_only), "weights_cand_only": list(self.weights_cand_only),
            "call_series": [c.to_dict() for c in self.call_series],
            "weights": [p.to_dict() for p in self.weights],
            "pairs": [p.to_dict() for p in self.pairs],
        }

    def counts(self) -> dict[str, int]:
        """How many records were compared, and how: `elementwise` (every value), `exact` (integers and
        bools), `statistics` (a side kept no tensor), `not_comparable` (values of different kinds), plus the
        same for the weights (`weights_*`) and the pass/fail tallies of the forward's pairs."""
        c = {"pairs": len(self.pairs), "failed": sum(p.failed for p in self.pairs),
             "ref_only": len(self.ref_only), "cand_only": len(self.cand_only)}
        for st in (STATUS_PASS, STATUS_FAIL, STATUS_SHAPE, STATUS_NO_DATA, STATUS_NOT_COMPARABLE, STATUS_NOT_PROVEN):
            c[st] = sum(p.status == st for p in self.pairs)
        for m in (METHOD_ELEMENTWISE, METHOD_EXACT, METHOD_STATS):
            c[m] = sum(p.method == m and p.status != STATUS_NOT_COMPARABLE for p in self.pairs)
        c["weights"] = len(self.weights)
        c["weights_failed"] = sum(p.failed for p in self.weights)
        for m in (METHOD_ELEMENTWISE, METHOD_DIGEST, METHOD_STATS):
            c[f"weights_{m}"] = sum(p.method == m for p in self.weights)
        return c


def _within(module: str, outer: str) -> bool:
    return module == outer or module.startswith(outer + ".")
