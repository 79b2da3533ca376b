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
  precision flags: `environment.same_arithmetic`) and a record has the same dtype on both sides, its own
  roundoff is 0: identical inputs give identical bits, so any difference was caused by something else.
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
from ..record import (KIND_MODEL_INPUT, KIND_MODEL_OUTPUT, KIND_RNG, NAME_RE, TAG_DERIVED, TAG_QSTEP, WEIGHT_KINDS,
                      Record)
from .compat import rms
from .explain import HUGE_GAIN, dot_cancellation, family, norm_gain, sigmoid_gain

NOISE_UNITS = 32
LOCAL_UNITS = 8
OWN_MARGIN = 4.0
WEIGHT_UNITS = 2

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
        it the same way (same environment and dtype): identical inputs then give identical bits."""
        if self.identical and c is not None and c.dtype == r.dtype:
            return 0.0
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
    computed from) and `rounding`, the part its own op adds."""

    expected: float
    rounding: float
    unjudged: bool = False    # an all-zero reference: no relative error can be judged against it

    @property
    def floor(self) -> float:
        return math.inf if self.unjudged else NOISE_UNITS * self.expected


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
    op graph each record takes the largest seen so far."""
    refs = list(refs)
    has_graph = any(r.inputs for r in refs if r.kind not in WEIGHT_KINDS)
    by_name: dict[str, Record] = {}
    out: dict[str, Noise] = {}
    inside: dict[str, float] = {}      # module path -> largest absolute expected error inside its current call
    taken: dict[str, tuple[int, float]] = {}  # module path -> (call, inside) of its last module record
    running = latest = 0.0
    for r in refs:
        by_name[r.name] = r
        own = prec.own(r, cand_of.get(r.name))
        if r.kind in WEIGHT_KINDS or r.kind in (KIND_MODEL_INPUT, KIND_RNG) or r.stats.kind in ("int", "bool"):
            c = cand_of.get(r.name)
            # a dequantised weight is judged within one quantisation step, but passes on only rounding: what its
            # quantisation does to the forward is the quantized port's error, reported as such
            conv = weight_floor(r, c, quantization=False) if (c is not None and r.kind in WEIGHT_KINDS) else \
                (own if c is not None and c.dtype != r.dtype else 0.0)
            out[r.name] = Noise(conv, conv)
            continue
        if r.stats.kind == "float" and rms(r.stats) == 0.0:
            # An all-zero reference (1 - uv on voiced frames, x * 0): it passes on no relative error, and a
            # candidate's rounding there is judged where it shows, downstream. A model output is judged as is.
            out[r.name] = Noise(0.0, 0.0, unjudged=r.kind != KIND_MODEL_OUTPUT)
            continue
        ins = [by_name[i] for i in r.inputs if i in by_name]
        factors = sensitivity(r, ins, _output_index(r.name))
        k0 = max([1.0, *factors]) if family(r.op) in ("sum", "norm", "linear") else 1.0
        rounding = own * min(k0, HUGE_GAIN)
        terms = [f * out[i.name].expected for f, i in zip(factors, ins) if i.name in out]
        if not has_graph:   # a port's dump: the records before it are all we know of its inputs
            terms = [running]
        elif not r.inputs and r.op.startswith("module:"):
            terms = [latest]  # its input came through functional code between modules: from what ran just before
        if r.op.startswith("module:"):  # every output of one call (`m:0`, `m:1`) sees what ran inside it
            if taken.get(r.module, (None,))[0] != r.call:
                taken[r.module] = (r.call, inside.pop(r.module, 0.0))
            within = taken[r.module][1] / (rms(r.stats) or 1.0)   # relative to this output's size
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
        statistic = family(r.op) == "norm" and _output_index(r.name) > 0
        out[r.name] = Noise(expected, rounding, unjudged=statistic)
        running, latest = max(running, expected), expected
        parts = r.module.split(".") if r.module else []
        level = len(parts) - (1 if r.op.startswith("module:") else 0)
        size = expected * (rms(r.stats) or 0.0)
        for k in range(level, -1, -1):   # the record is inside every enclosing module's call
            path = ".".join(parts[:k])
            inside[path] = max(inside.get(path, 0.0), size)
    return out


def _magnitude_weighted(r: Record, ins: list[Record], noise: Mapping[str, "Noise"]) -> float | None:
    """sqrt(sum (rms(i) · expected(i))^2) / rms(r): the inputs' absolute errors carried at unit gain."""
    out = rms(r.stats)
    if not out:
        return None
    terms = [(rms(i.stats) or 0.0) * noise[i.name].expected for i in ins if i.name in noise]
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
        return [sigmoid_gain(i.stats) if i.kind not in WEIGHT_KINDS else 1.0 for i in inputs]
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
           "LOCAL_UNITS",
           "NOISE_UNITS", "OWN_MARGIN", "Noise", "Precision", "dequantized_floor", "dtype_roundoff", "expected_noise",
           "sensitivity", "weight_floor"]
