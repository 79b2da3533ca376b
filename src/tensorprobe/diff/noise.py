"""Noise or divergence: which differences the arithmetic explains, and where the others come from.

Two correct runs of one model differ by rounding: float32 against float64, another runtime's op order, a
GPU's TF32 convolutions. `diff`'s default verdict separates that noise from real divergences:

**The rule.** A record's relative L2 error is rounding noise when it is at most

    NOISE_UNITS x u_acc x κ

- `u_acc` is the rounding accumulated along the computation that produced the record: each record adds
  the unit roundoff of its own arithmetic (the coarser dtype of the two sides: float64 2^-53, float32 2^-24,
  float16 and TF32 2^-11, bfloat16 2^-8; TF32 for convolutions and matmuls where a side's environment ran
  them so, `tensorprobe.environment.arithmetic`) in quadrature to the largest `u_acc` of the records it was
  computed from (independent rounding errors add like a random walk): a float32 record k ops deep has
  `u_acc` = 2^-24·sqrt(k), one behind k TF32 matmuls about 2^-11·sqrt(k). Integers and booleans have
  `u_acc` = 0: they must agree exactly.
- Where both runs used the same arithmetic deterministically (same runtime and version, device, threads,
  precision flags: `environment.same_arithmetic`) and a record is the same op with the same dtype on both
  sides, its own roundoff is 0: identical inputs give identical bits, so any difference was caused by
  something else. A module's output is not covered: a port's module may compute the same thing with other
  ops (a fused conv and norm, `hypot` for a square root of squares), whose rounding differs.
- A normalisation's saved mean and inverse std (outputs 1 and 2 of the native norms, which only the
  backward pass reads) are compared and shown, never judged.
- `κ` >= 1 is the cancellation factor of sums, differences, means, normalisations and dot products (how
  much larger the operands are than the result): the mean of zero-mean data has a huge *relative* error
  that is tiny against the data it came from. A sigmoid in its lower tail counts too: there σ(x) ≈ exp(x),
  so its output's relative error is its logit's absolute error, |x|·(1 − σ(x)) times the logit's relative
  error (a VAD's "no speech" probability of 1e-3 after a logit of −7). That gain is bounded by |x| and
  only spreads rounding, unlike sin, exp or division (below).
- `NOISE_UNITS` = 32 was calibrated on float32-vs-float64 and TF32-vs-float32 runs of a transformer encoder,
  a conv/LSTM stack and a VITS TTS model (op and module level), whose records stay within 6.2 units of
  `u_acc` (records up to 3,200 ops deep): a margin of 5.
- A sigmoid kernel is accurate to about one unit of its output's *range* (ONNX Runtime's: 1.2e-7 absolute,
  so 1e-3 relative at an output of 1e-4): its own rounding, relative to an output of rms y < 1, is u/y.

**The floor explains, never hides.** κ is modelled from statistics, and a model can be wrong (Silero's LSTM,
fed inputs of rms 513, models a cancellation of 4,600 that the runs never show). For a *same-precision*
port (float32 or finer arithmetic on both sides: no float16, bfloat16, TF32 or quantized records) the floor
is therefore at most the **rounding ceiling**, max(NOISE_UNITS x u_plain, CEILING_UNITS x u): u_plain is
`u_acc` without any cancellation credit (the exact conditioning of a sigmoid's tail and its range rounding
are kept: they are facts of the reference's values), CEILING_UNITS x 2^-24 = 1.2e-4 what float32 rounding
produces through a deep path. A floor above the ceiling is allowed only when **measured**: the record's
inputs were compared value by value and their measured error, times the cancellation κ of its op, explains
its error (`analysis`). A model output of a same-precision port never passes beyond `OUTPUT_REL_MAX`
(5e-4, SNR 66 dB: half of 1e-3, so that an output off by 1e-3 fails whatever rounding it also carries).
For a port that is not same-precision (float16, bfloat16, TF32, int8) the ceiling is its own arithmetic's
rounding along the path, NOISE_UNITS x u_plain (REDUCED_NOISE_UNITS for a value either side holds in float16
or bfloat16), and its model outputs must also meet `OUTPUT_MIN_SNR` (20 dB)
and `OUTPUT_MIN_CORR` (0.99). Every judged floor carries its reason (`Floor`).

Weights are data, not arithmetic: they are noise within 2 units of the coarser dtype's roundoff (a float16
conversion), or within one quantisation step (the scale) for weights dequantised from integers.

**Causes.** A record beyond the noise floor is a divergence, and its cause is one of

- `own`: its error is more than `OWN_MARGIN` x (its own rounding + its inputs' error x the gain its op can
  legitimately have, `explain.predicted_gain`): the error enters here (a port bug, another algorithm);
- `weights`: it is explained by a weight it reads that differs;
- `amplified`: its inputs differ only by noise, and its op amplifies that by design (phase accumulation,
  near-zero division, normalising near-constant channels: `explain.explain` says which);
- `random`: it is computed from random draws that differ (not replayed);
- `quantized`: the candidate computes it with quantized arithmetic (an int8 kernel, a QuantizeLinear →
  DequantizeLinear pair): quantization error, expected of an int8 port;
- `inherited`: from an earlier divergence (named in `origin`).

With `--atol/--rtol/--min-corr/--min-snr` the thresholds decide pass/fail instead; causes are still given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping

from ..environment import CONV, MATMUL, UNIT_ROUNDOFF, arithmetic, same_arithmetic
from ..ops import canonical_op
from ..record import (KIND_MODEL_INPUT, KIND_MODEL_OUTPUT, KIND_OUTPUT, KIND_RNG, NAME_RE, ROOT, TAG_DERIVED, TAG_OWN_CODE, TAG_QSTEP,
                      TAG_QUANTIZED,
                      WEIGHT_KINDS, Record)
from .compat import rms
from .explain import HUGE_GAIN, dot_cancellation, family, norm_gain, sigmoid_gain

NOISE_UNITS = 32
# A float16/bfloat16 port's records stay within 2.3 units of their modelled rounding (~300 faithful ports of the
# accuracy benchmark's architectures, every level): 12 units keeps a margin of 5 (NOISE_UNITS' own), where 32
# let a frame gain of 0.4 pass as bfloat16 rounding (a floor of 0.43 four ops deep)
REDUCED_NOISE_UNITS = 12
LOCAL_UNITS = 8
OWN_MARGIN = 4.0
WEIGHT_UNITS = 2
# A module of the model's own class (tag `own_code`: not a torch type), whose call no record shows inside (its
# own code: a custom leaf at module level), rounds like this many ops: PESTO's log-magnitude front end (20·log10 of CQT magnitudes down to
# 1e-10) in a faithful ONNX export differs by 4.6e-6 from float32 PyTorch, where one op's rounding models 1.9e-6:
# a log turns each small element's relative rounding into absolute error. --level op models its ops one by one.
UNSEEN_CODE_UNITS = 8
CEILING_UNITS = 2048          # x 2^-24 = 1.2e-4: float32 rounding through a deep path, without amplification
OUTPUT_REL_MAX = 5e-4         # a same-precision port's model output (SNR 66 dB): half of 1e-3 (60 dB)
OUTPUT_MIN_SNR, OUTPUT_MIN_CORR = 20.0, 0.99   # model outputs of a reduced-precision port (issue 29's default)
SAME_PRECISION_ROUNDOFF = UNIT_ROUNDOFF["float32"]

CAUSE_OWN, CAUSE_WEIGHTS, CAUSE_AMPLIFIED, CAUSE_RANDOM, CAUSE_INHERITED, CAUSE_QUANTIZED = (
    "own", "weights", "amplified", "random", "inherited", "quantized")

_INT_PREFIXES = ("int", "uint", "bool")


def dtype_roundoff(dtype: str) -> float:
    """Unit roundoff of a dtype name (0 for integers and bools; float32's for unknown names)."""
    if dtype.startswith(_INT_PREFIXES):
        return 0.0
    if dtype.startswith("complex"):
        return UNIT_ROUNDOFF["float64"] if dtype == "complex128" else UNIT_ROUNDOFF["float32"]
    return UNIT_ROUNDOFF.get(dtype, UNIT_ROUNDOFF["float32"])


def _arith_family(op: str) -> str | None:
    fam = family(op)
    if fam != "linear":
        return None
    base = op.removeprefix("module:")
    return CONV if "onv" in base else MATMUL


@dataclass(frozen=True)
class Precision:
    """The arithmetic each side ran in, per op family (from the two environments)."""

    ref: Mapping[str, str]
    cand: Mapping[str, str]
    identical: bool = False   # both runs used the same arithmetic, deterministically

    @classmethod
    def of(cls, ref_env: dict | None, cand_env: dict | None) -> "Precision":
        return cls(arithmetic(ref_env), arithmetic(cand_env), same_arithmetic(ref_env, cand_env))

    def own(self, r: Record, c: Record | None) -> float:
        """Unit roundoff of the arithmetic of this one record (no inheritance); 0 when both sides computed
        it the same way (same environment, op and dtype): identical inputs then give identical bits."""
        if self.identical and c is not None and c.dtype == r.dtype and c.op == r.op and not r.op.startswith("module:"):
            return 0.0
        return self.unit(r, c)

    def unit(self, r: Record, c: Record | None) -> float:
        """The coarser unit roundoff of the two sides' arithmetic for this record (dtypes, TF32)."""
        u = dtype_roundoff(r.dtype)
        if c is not None:
            u = max(u, dtype_roundoff(c.dtype))
        fam = _arith_family(r.op)
        if fam is not None and (r.stats.kind == "float"):
            for arith in (self.ref.get(fam), self.cand.get(fam)):
                if arith:
                    u = max(u, UNIT_ROUNDOFF.get(arith, u))
        return u


@dataclass(frozen=True)
class Noise:
    """What rounding explains for one record: `expected` relative error (propagated from everything it was
    computed from, cancellation credited), `rounding`, the part its own op adds, `plain`, the expected error
    without any cancellation credit, and `depth`, the ops along its longest path."""

    expected: float
    rounding: float
    unjudged: bool = False    # an all-zero reference: no relative error can be judged against it
    plain: float | None = None
    depth: int = 0
    unit: float = 0.0         # the coarser unit roundoff of the two sides' arithmetic here
    half: bool = False        # either side holds it in float16 or bfloat16 (not TF32: float32 values)

    @property
    def units(self) -> int:
        """REDUCED_NOISE_UNITS where either side holds the value in float16 or bfloat16, else NOISE_UNITS (its
        calibration, TF32 included)."""
        return REDUCED_NOISE_UNITS if self.half else NOISE_UNITS

    @property
    def floor(self) -> float:
        """The modelled floor: `units` x expected (inf when not judged)."""
        return math.inf if self.unjudged else self.units * self.expected

    @property
    def ceiling(self) -> float:
        """The rounding ceiling: what rounding produces along the path without amplification credit, and at
        least what float32 rounding produces through a deep path (CEILING_UNITS x 2^-24)."""
        plain = self.expected if self.plain is None else self.plain
        return max(self.units * plain, CEILING_UNITS * min(self.unit, SAME_PRECISION_ROUNDOFF))


@dataclass(frozen=True)
class Floor:
    """The floor a record is judged against under the noise rule, the modelled one it may stand for, and why."""

    value: float
    modelled: float
    reason: str


def reduced_precision(ref: Iterable[Record], cand: Iterable[Record], prec: Precision) -> str | None:
    """Why the candidate is not a same-precision port ("float16", "TF32 convolutions", "int8 quantized"), or
    None when both sides compute in float32 or finer: the float dtypes of the forward's records, the TF32
    flags of the two environments, and records the candidate computes with quantized arithmetic."""
    cand = list(cand)
    if any(TAG_QUANTIZED in c.tags for c in cand):
        return "int8 quantized"
    for recs in (ref, cand):
        for r in recs:
            if r.kind not in WEIGHT_KINDS and r.stats.kind == "float" and \
                    dtype_roundoff(r.dtype) > SAME_PRECISION_ROUNDOFF:
                return r.dtype
    for side in (prec.ref, prec.cand):
        for fam, arith in side.items():
            if UNIT_ROUNDOFF.get(arith, 0.0) > SAME_PRECISION_ROUNDOFF:
                return f"{arith.upper() if arith == 'tf32' else arith} {'convolutions' if fam == CONV else 'matmuls'}"
    return None


def judged_floor(noise: Noise, r: Record, reduced: str | None) -> Floor:
    """The floor `r` is judged against, with its reason: the modelled floor for a reduced-precision port;
    for a same-precision port at most the rounding ceiling (a larger one needs a measurement: `measured_floor`),
    and at most `OUTPUT_REL_MAX` for a model output."""
    modelled = noise.floor
    if noise.unjudged:
        return Floor(math.inf, math.inf, "not judged: an all-zero reference, or a normalisation's saved statistic")
    path = f"{_unit_name(noise.unit)} rounding along {noise.depth:,} op{'s' if noise.depth != 1 else ''}"
    if reduced is not None:
        path += f" of a {reduced} port"
    if modelled == 0.0:
        return Floor(0.0, 0.0, "none: both runs used the same arithmetic, and the same op on the same inputs gives "
                               "the same bits")
    ceiling = noise.ceiling
    floor = Floor(modelled, modelled, path) if modelled <= ceiling else Floor(
        ceiling, modelled, f"{path}, capped at the rounding ceiling: the modelled amplification (floor "
                           f"{modelled:.2g}) is allowed only where its inputs' error is measured")
    if reduced is None and is_model_output(r) and floor.value > OUTPUT_REL_MAX:
        return Floor(OUTPUT_REL_MAX, modelled, OUTPUT_WORDS)
    return floor


MEASURED = "measured"    # the first word of a floor a measurement backs (`measured_floor`)
OUTPUT_WORDS = f"the most a model output of a same-precision port may differ (SNR {-20 * math.log10(OUTPUT_REL_MAX):.0f} dB)"


def is_model_output(r: Record) -> bool:
    """A model output, or the root module's output (`<root>`, `<root>:0`): the same values, as the root made them."""
    if r.kind == KIND_MODEL_OUTPUT:
        return True
    m = NAME_RE.match(r.name)
    return r.kind == KIND_OUTPUT and m is not None and m.group("module") == ROOT and not m.group("op")


def measured_floor(noise: Noise, r: Record, k: float, e_in: float, input_name: str,
                   reduced: str | None = None) -> Floor:
    """A floor above the rounding ceiling, backed by a measurement: `input_name` (compared value by value)
    differs by `e_in`, and `r`'s op multiplies that by up to `k` (cancellation, from the reference's statistics).
    Never above the modelled floor, nor above `OUTPUT_REL_MAX` for a model output."""
    value = min(noise.floor, max(noise.ceiling, OWN_MARGIN * k * e_in))
    if reduced is None and is_model_output(r) and value > OUTPUT_REL_MAX:
        return Floor(OUTPUT_REL_MAX, noise.floor, OUTPUT_WORDS)
    return Floor(value, noise.floor, f"{MEASURED}: its input {input_name} differs by {e_in:.2g} (compared value by "
                                     f"value), which its op can amplify up to x{k:,.3g} (cancellation)")


def _unit_name(u: float) -> str:
    return next((name for name in ("float64", "float32", "float16", "bfloat16", "tf32") if UNIT_ROUNDOFF[name] == u),
                "float")


def expected_noise(refs: Iterable[Record], cand_of: Mapping[str, Record], prec: Precision) -> dict[str, Noise]:
    """The rounding noise each reference record should carry, in execution order (first-order forward
    error analysis on the reference's statistics):

        expected(r)^2 = (u_own · k_0)^2 + sum over inputs i of (k_i · expected(i))^2

    where u_own is the unit roundoff of r's own arithmetic and k_i how a relative error of input i shows in
    r's output (`sensitivity`): rms(i)/rms(r) through a sum or difference, the cancellation of a
    normalisation or a dot product, 1 otherwise. Amplifying ops (sin, exp, angle, division) are deliberately
    not credited with their amplification: what they amplify is reported as a divergence and explained, not
    hidden. Weights, model inputs and random draws carry the rounding of a dtype conversion when the two
    sides' dtypes differ, else nothing. A module-level record also takes in the records computed inside its
    call, and one whose input came through functional code what ran just before it; in a bundle without an
    op graph each record takes the largest seen so far. The same propagation without cancellation credit
    (k_i <= 1, k_0 = 1; a sigmoid's exact tail conditioning kept) gives `Noise.plain`."""
    refs = list(refs)
    credited = _propagate(refs, cand_of, prec, credit=True)
    plain = _propagate(refs, cand_of, prec, credit=False)
    half = {r.name for r in refs if _half(r) or _half(cand_of.get(r.name))}
    return {name: Noise(e, rnd, unjudged, plain[name][0], depth, unit, name in half)
            for name, (e, rnd, unjudged, depth, unit) in credited.items()}


def _half(r: Record | None) -> bool:
    return r is not None and r.dtype in ("float16", "bfloat16")


def _propagate(refs: list[Record], cand_of: Mapping[str, Record], prec: Precision, credit: bool
               ) -> dict[str, tuple[float, float, bool, int, float]]:
    """name -> (expected, rounding, unjudged, depth, unit): one pass of `expected_noise`."""
    has_graph = any(r.inputs for r in refs if r.kind not in WEIGHT_KINDS)
    by_name: dict[str, Record] = {}
    out: dict[str, tuple[float, float, bool, int, float]] = {}
    inside: dict[str, float] = {}      # module path -> largest absolute expected error inside its current call
    taken: dict[str, tuple[int, float]] = {}  # module path -> (call, inside) of its last module record
    unseen: dict[str, bool] = {}       # module path -> its last call ran code no record shows (`UNSEEN_CODE_UNITS`)
    running = latest = 0.0
    deepest = last_depth = 0
    for r in refs:
        by_name[r.name] = r
        c = cand_of.get(r.name)
        own, unit = prec.own(r, c), prec.unit(r, c)
        if r.kind in WEIGHT_KINDS or r.kind in (KIND_MODEL_INPUT, KIND_RNG) or r.stats.kind in ("int", "bool"):
            # a dequantised weight is judged within one quantisation step, but passes on only rounding: what its
            # quantisation does to the forward is the quantized port's error, reported as such. What it passes on is
            # its expected rounding (one unit of the conversion), not the WEIGHT_UNITS margin it is judged with:
            # the margin is applied once, at the record judged (NOISE_UNITS), not once per weight on the way
            conv = weight_floor(r, c, quantization=False) / WEIGHT_UNITS if (c is not None and r.kind in WEIGHT_KINDS) \
                else (own if c is not None and c.dtype != r.dtype else 0.0)
            out[r.name] = (conv, conv, False, 0, unit)
            continue
        if r.stats.kind == "float" and rms(r.stats) == 0.0:
            # An all-zero reference (1 - uv on voiced frames, x * 0): it passes on no relative error, and a
            # candidate's rounding there is judged where it shows, downstream. A model output is judged as is.
            out[r.name] = (0.0, 0.0, r.kind != KIND_MODEL_OUTPUT, 0, unit)
            continue
        ins = [by_name[i] for i in r.inputs if i in by_name]
        factors = sensitivity(r, ins, _output_index(r.name))
        fam = family(r.op)
        if not credit and fam != "sigmoid":
            factors = [min(f, 1.0) for f in factors]   # rounding only: no cancellation credit
        k0 = max([1.0, *factors]) if credit and fam in ("sum", "norm", "linear") else 1.0
        rounding = own * min(k0, HUGE_GAIN) * (_range_rounding(r) if unit <= SAME_PRECISION_ROUNDOFF else 1.0)
        terms = [f * out[i.name][0] for f, i in zip(factors, ins) if i.name in out]
        depth = 1 + max((out[i.name][3] for i in ins if i.name in out), default=0)
        if not has_graph:   # a port's dump: the records before it are all we know of its inputs
            terms, depth = [running], deepest + 1
        elif not r.inputs and r.op.startswith("module:"):
            terms, depth = [latest], last_depth + 1  # its input came through functional code: what ran just before
        if r.op.startswith("module:"):  # every output of one call (`m:0`, `m:1`) sees what ran inside it
            depth = max(depth, last_depth + 1)    # what ran just before it ran inside its call
            if taken.get(r.module, (None,))[0] != r.call:
                unseen[r.module] = r.module not in inside and fam == "other" and bool(r.module) and \
                    TAG_OWN_CODE in r.tags
                taken[r.module] = (r.call, inside.pop(r.module, 0.0))
            if unseen.get(r.module) and unit <= SAME_PRECISION_ROUNDOFF:   # its code, unseen, rounds more than one op
                rounding = max(rounding, own * UNSEEN_CODE_UNITS)
            # relative to this output's size; the ceiling (no credit) takes the largest relative error inside
            # instead: an inner record's absolute error over a smaller output (a classifier's logits under
            # its probabilities) is a unit mismatch, not rounding
            within = taken[r.module][1] / (rms(r.stats) or 1.0) if credit else taken[r.module][1]
            terms.append(within)
            rounding = max(rounding, within)  # a composite's own arithmetic is what ran inside it
        if _adds(r):
            prop = math.sqrt(sum(t * t for t in terms))
        else:
            # an op or composite module of unknown arithmetic keeps its inputs' relative error (a product, a
            # copy) or their absolute error (x·(1+γ) + β around a near-zero x): whichever is smaller
            absolute = _magnitude_weighted(r, ins, out) if r.op.startswith("module:") else None
            prop = max(terms, default=0.0)
            if absolute is not None:
                prop = min(prop, absolute)
        expected = min(math.sqrt(rounding * rounding + prop * prop), HUGE_GAIN)
        # A normalisation's mean and inverse std (native norms' outputs 1 and 2) are kept for the backward pass
        # and read by nothing in the forward; their per-channel conditioning is beyond tensor statistics.
        statistic = fam == "norm" and _output_index(r.name) > 0
        out[r.name] = (expected, rounding, statistic, depth, unit)
        running, latest = max(running, expected), expected
        deepest, last_depth = max(deepest, depth), depth
        parts = r.module.split(".") if r.module else []
        level = len(parts) - (1 if r.op.startswith("module:") else 0)
        size = expected * (rms(r.stats) or 0.0) if credit else expected
        for k in range(level, -1, -1):   # the record is inside every enclosing module's call
            path = ".".join(parts[:k])
            inside[path] = max(inside.get(path, 0.0), size)
    return out


def _range_rounding(r: Record) -> float:
    """A float32 sigmoid kernel is accurate to a unit of its output's range (1), not of its value: relative to
    an output of rms y < 1 its own rounding is 1/y units (ONNX Runtime's: 1.2e-7 absolute, 1e-3 relative at 1e-4)."""
    if family(r.op) != "sigmoid" or r.stats.kind != "float":
        return 1.0
    y = rms(r.stats) or 0.0
    return min(HUGE_GAIN, 1.0 / y) if 0.0 < y < 1.0 else 1.0


def _magnitude_weighted(r: Record, ins: list[Record], noise: Mapping[str, tuple]) -> float | None:
    """sqrt(sum (rms(i) · expected(i))^2) / rms(r): the inputs' absolute errors carried at unit gain."""
    out = rms(r.stats)
    if not out:
        return None
    terms = [(rms(i.stats) or 0.0) * noise[i.name][0] for i in ins if i.name in noise]
    return math.sqrt(sum(t * t for t in terms)) / out if terms else None


_PRODUCTS = frozenset({"mul", "div", "Mul", "Div", "prod", "true_divide", "addcmul", "addcdiv"})


def _adds(r: Record) -> bool:
    """Do the inputs' errors add up (arithmetic), or does the output take one input's (copies, cat)?"""
    return family(r.op) in ("sum", "norm", "linear", "div") or canonical_op(r.op) in _PRODUCTS


def sensitivity(r: Record, inputs: list[Record], output_index: int = 0) -> list[float]:
    """k_i for each input: the factor between input i's relative error and the relative error it causes in
    r's output, to first order, from the reference statistics (1 where nothing better is known)."""
    fam = family(r.op)
    if fam == "sigmoid" and r.stats.kind == "float":   # bounded by |x|, and the error it amplifies is rounding
        return [sigmoid_gain(i.stats, r.stats) if i.kind not in WEIGHT_KINDS else 1.0 for i in inputs]
    if fam not in ("sum", "norm", "linear") or r.stats.kind != "float":
        return [1.0] * len(inputs)
    out = rms(r.stats)
    if not out:
        return [HUGE_GAIN if rms(i.stats) else 1.0 for i in inputs]
    if fam == "sum":
        return [min(HUGE_GAIN, (rms(i.stats) or 0.0) / out) for i in inputs]
    if fam == "norm":   # subtracting the mean: cancellation; an output near zero: channels below epsilon
        data = [i for i in inputs if i.kind not in WEIGHT_KINDS]
        k = norm_gain(data[0].stats, r.stats, output_index) if data else 1.0
        return [k if i.kind not in WEIGHT_KINDS else 1.0 for i in inputs]
    k = dot_cancellation(r, inputs) or 1.0
    return [k] * len(inputs)


def _output_index(name: str) -> int:
    m = NAME_RE.match(name)
    o = m.group("output") if m else None
    return int(o) if o and o.isdigit() else 0


def weight_floor(r: Record, c: Record, quantization: bool = True) -> float:
    """What conversion explains in a weight: `WEIGHT_UNITS` roundoffs of the coarser dtype, or one
    quantisation step of a dequantised int8 weight. A derived weight (weight_norm's g·v/‖v‖) is computed,
    so its own rounding is allowed even between runs of the same arithmetic."""
    computed = TAG_DERIVED in r.tags or TAG_DERIVED in c.tags
    u = max(dtype_roundoff(r.dtype), dtype_roundoff(c.dtype)) if (r.dtype != c.dtype or computed) else 0.0
    if computed:
        u *= 4
    q = (dequantized_floor(c) or dequantized_floor(r) or 0.0) if quantization else 0.0
    return max(q, WEIGHT_UNITS * u)


def dequantized_floor(r: Record) -> float | None:
    """One quantisation step relative to the rms, for a weight dequantised from integers (tag
    `qstep:<step>`, the scale); None for other records."""
    step = next((float(t[len(TAG_QSTEP):]) for t in r.tags if t.startswith(TAG_QSTEP)), None)
    if step is None:
        return None
    return step / max(rms(r.stats) or 1e-300, 1e-300)


__all__ = ["CAUSE_AMPLIFIED", "CAUSE_INHERITED", "CAUSE_OWN", "CAUSE_QUANTIZED", "CAUSE_RANDOM", "CAUSE_WEIGHTS",
           "CEILING_UNITS", "LOCAL_UNITS", "NOISE_UNITS", "OUTPUT_MIN_CORR", "OUTPUT_MIN_SNR", "OUTPUT_REL_MAX",
           "OWN_MARGIN", "Floor", "Noise", "Precision", "dequantized_floor", "dtype_roundoff", "expected_noise",
           "judged_floor", "measured_floor", "reduced_precision", "sensitivity", "weight_floor"]
