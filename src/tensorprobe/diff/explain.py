"""Why an op amplifies error: predicted gains and plain-words explanations, from statistics alone.

An op turns a relative error e at its inputs into roughly G·e at its output. For most ops G is about 1;
for some, the data make it large, and the reference's own statistics say how large:

    family      predicted gain G                               why
    sin, cos    rms(x) / rms(out)                              a relative error of a phase is e·|x| radians
    exp         max|x|                                         relative output error = absolute input error
    log         1 / rms(out)                                   absolute output error = relative input error
    div         rms(b) / min|b|  (huge if b crosses zero)      division by values near zero
    angle       rms|z| / min|z|                                the phase of values near zero is undefined
    norm        rms(x) / std(x)                                subtracting a mean that dwarfs the spread
    add, sub,   sum of rms(inputs) / rms(out)                  cancellation
    reductions
    matmul,     sqrt(K)·rms(W)·rms(x) / rms(out)               cancellation inside the dot products
    conv,       (a recurrent cell's output is its gates' matmul
    LSTM, GRU    squashed: small outputs mean saturated gates)
    sigmoid     |min x|·(1 − σ(min x))  (min x < 0)            a probability near 0 is exp(x): relative
                                                               output error = absolute input error
    threshold   unbounded                                      comparisons, rounding, argmax: elements flip

`diff` uses G to tell an op that *amplifies* its inputs' error (expected, and explained here) from one
that *adds error of its own* (a port bug, another algorithm, other weights).

    >>> family("aten.sin.default"), family("Atan"), family("module:InstanceNorm1d")
    ('sin', 'angle', 'norm')
"""

from __future__ import annotations

import re

import math
from typing import Any, Callable, Sequence

from ..ops import canonical_op
from ..record import Record
from .compat import rms

HUGE_GAIN = 1e12

_FAMILIES: dict[str, tuple[str, ...]] = {
    "sin": ("sin", "cos", "Sin", "Cos"),
    "exp": ("exp", "exp2", "expm1", "Exp", "softplus", "Softplus", "sinh", "cosh"),
    "log": ("log", "log2", "log10", "log1p", "Log"),
    "pow": ("pow", "Pow", "float_power"),
    "div": ("div", "Div", "reciprocal", "Reciprocal", "true_divide", "floor_divide", "remainder", "fmod", "Mod"),
    "angle": ("angle", "atan2", "atan", "Atan", "arctan2"),
    "norm": ("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
             "native_layer_norm", "native_group_norm", "instance_norm", "batch_norm", "layer_norm", "group_norm",
             "rms_norm", "_fused_rms_norm", "InstanceNormalization", "LayerNormalization", "BatchNormalization",
             "GroupNormalization", "SimplifiedLayerNormalization", "InstanceNorm1d", "InstanceNorm2d", "LayerNorm",
             "BatchNorm1d", "BatchNorm2d", "GroupNorm", "RMSNorm", "rsqrt", "Rsqrt", "var", "std", "var_mean"),
    "sum": ("add", "sub", "rsub", "Add", "Sub", "sum", "mean", "ReduceSum", "ReduceMean", "cumsum", "CumSum",
            "addcmul", "lerp"),
    "linear": ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "_convolution", "MatMul",
               "Gemm", "Conv", "ConvTranspose", "Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d", "Linear",
               "einsum", "MatMulInteger", "ConvInteger", "QLinearConv", "QLinearMatMul", "dot",
               # recurrent cells: gate matmuls, then sigmoid/tanh gates whose tails amplify like a cancellation
               "LSTM", "GRU", "RNN", "lstm", "gru", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
               "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "LSTMCell", "GRUCell", "RNNCell"),
    "threshold": ("gt", "lt", "ge", "le", "eq", "ne", "sign", "round", "floor", "ceil", "trunc", "argmax", "argmin",
                  "topk", "sort", "Greater", "Less", "GreaterOrEqual", "LessOrEqual", "Equal", "Sign", "Round",
                  "Floor", "Ceil", "ArgMax", "ArgMin", "TopK", "heaviside", "bucketize", "searchsorted"),
    "softmax": ("softmax", "_softmax", "log_softmax", "_log_softmax", "Softmax", "LogSoftmax", "Softmax"),
    "sigmoid": ("sigmoid", "Sigmoid"),
}
_BY_NAME = {name: fam for fam, names in _FAMILIES.items() for name in names}


_MODULE_SUFFIXES = ("Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d", "Linear", "LSTMCell",
                    "GRUCell", "LSTM", "GRU", "LayerNorm",
                    "GroupNorm", "RMSNorm", "InstanceNorm1d", "InstanceNorm2d", "BatchNorm1d", "BatchNorm2d")


def family(op: str) -> str:
    """Op family of an aten op (`aten.sin.default`), an ONNX/runtime op type (`Sin`) or a module
    (`module:InstanceNorm1d`, also subclasses named after their base: `ParametrizedConv1d`,
    `NonDynamicallyQuantizableLinear`); 'other' when unknown."""
    raw, base = op.removeprefix("module:"), canonical_op(op)
    fam = _BY_NAME.get(raw) or _BY_NAME.get(base) or _BY_NAME.get(base.rstrip("_"))
    if fam is None and op.startswith("module:"):
        fam = next((_BY_NAME[s] for s in _MODULE_SUFFIXES if base.endswith(s)), None)
    return fam or "other"


_RECURRENT_NAME = re.compile(r"(LSTM|GRU|RNN|lstm|gru|rnn_tanh|rnn_relu|rnn_layer)")


def is_recurrent(op: str) -> bool:
    """A recurrent layer or cell, as a module (`module:LSTM`), an aten op (`aten.mkldnn_rnn_layer.default`) or an
    ONNX op (`DynamicQuantizeLSTM`).

        >>> is_recurrent("module:GRU"), is_recurrent("aten.mkldnn_rnn_layer.default"), is_recurrent("Conv")
        (True, True, False)
    """
    return bool(_RECURRENT_NAME.search(op))


# PyTorch's default epsilon of its normalisations: a channel whose variance is below it is divided by
# sqrt(eps) instead of its own std, which leaves it near zero and turns its rounding into its content.
NORM_EPS = 1e-5


def norm_gain(x: Any, y: Any, output_index: int = 0) -> float:
    """How much a normalisation multiplies its input's relative error, from the input's and the output's
    statistics: rms(x)/std(x) (subtracting a mean that dwarfs the spread), and for an output mostly near zero
    (channels whose variance is below epsilon) rms(x)/(rms(y)·sqrt(eps)); for the mean and inverse-std
    outputs of a native norm (`output_index` > 0), rms(x)/rms(output)."""
    rx, ry = rms(x), rms(y)
    if not rx or ry is None:
        return 1.0
    gain = rx / max(float(x.std or 0.0), 1e-300)
    if output_index:
        gain = max(gain, rx / max(ry, 1e-300))
    elif ry < 0.5:
        gain = max(gain, rx / max(ry * math.sqrt(NORM_EPS), 1e-300))
    return max(1.0, min(HUGE_GAIN, gain))


def gain_inputs(rec: Record, lookup: Callable[[str], Record | None]) -> list[Record]:
    """The records `predicted_gain` reads for `rec`: its inputs, and for a BatchNorm module (whose record names
    its data input only) its running variance and weight, which bound its gain (`_frozen_batchnorm_gain`)."""
    names = list(rec.inputs)
    if rec.op.startswith("module:BatchNorm"):
        names += [f"{rec.module}.running_var", f"{rec.module}.weight"]
    return [r for r in map(lookup, names) if r is not None]


def _frozen_batchnorm_gain(rec: Record, inputs: Sequence[Record], rx: float, out: float) -> float | None:
    """An eval-mode BatchNorm is a fixed affine map per channel, y = γ (x - μ) / sqrt(σ² + eps) + β: it multiplies
    an error by at most max|γ| / sqrt(min σ² + eps), so its relative error grows at most that times rms(x) / rms(y)
    (its running variance and weight among `inputs`: an op-level record's own inputs, a module's buffers). None
    for other norms, or without the running variance."""
    if "batch_norm" not in rec.op.lower() and "BatchNorm" not in rec.op:
        return None
    var = next((i for i in inputs if i.name.endswith("running_var") and i.stats.min is not None), None)
    if var is None:
        return None
    weight = next((i for i in inputs if i.name.endswith(".weight") and i.kind == "param" and i.stats.absmax is not None
                   and i.module == var.module), None)
    scale = (float(weight.stats.absmax) if weight is not None else 1.0) / math.sqrt(max(float(var.stats.min), 0.0)
                                                                                  + NORM_EPS)
    return max(1.0, min(HUGE_GAIN, scale * rx / max(out, 1e-300)))


def predicted_gain(rec: Record, inputs: Sequence[Record], output_index: int = 0) -> float:
    """How much `rec`'s op may legitimately amplify its inputs' relative error, from the statistics of the
    reference record and its input records (>= 1; `HUGE_GAIN` when unbounded)."""
    fam = family(rec.op)
    out = rms(rec.stats)
    data = [i for i in inputs if i.kind not in ("param", "buffer")] or list(inputs)
    if fam == "threshold" or rec.stats.kind in ("int", "bool") and any(i.stats.kind == "float" for i in inputs):
        return HUGE_GAIN
    if out is None or not data:
        return 1.0
    tiny = 1e-300
    x = data[0].stats
    rx = rms(x) or 0.0
    if fam == "sin":
        return max(1.0, rx / max(out, tiny))
    if fam == "exp":
        return max(1.0, float(x.absmax or 0.0))
    if fam == "log":
        return max(1.0, 1.0 / max(out, tiny))
    if fam == "pow":
        return 4.0
    if fam == "div":
        den = data[-1].stats if len(data) > 1 else x
        return max(2.0, _near_zero_gain(den))
    if fam == "angle":
        return max(1.0, min(HUGE_GAIN, max(_near_zero_gain(d.stats) for d in data)))
    if fam == "norm":   # per channel, the conditioning can reach max|x|/sqrt(eps): blame nothing below it
        frozen = _frozen_batchnorm_gain(rec, inputs, rx, out)
        if frozen is not None and not output_index:
            return frozen
        return max(norm_gain(x, rec.stats, output_index),
                   min(HUGE_GAIN, float(x.absmax or 0.0) / math.sqrt(NORM_EPS)))
    if fam == "sum":
        return max(1.0, min(HUGE_GAIN, sum(rms(d.stats) or 0.0 for d in data) / max(out, tiny)))
    if fam == "linear":
        k = dot_cancellation(rec, inputs)
        return 2.0 * k if k is not None else 2.0
    if fam == "softmax":
        return max(1.0, float(x.absmax or 0.0))
    if fam == "sigmoid":
        return max(2.0, sigmoid_gain(x, rec.stats))
    return 2.0  # mul, activations, copies: input errors add at most


def sigmoid_gain(x: Any, y: Any = None) -> float:
    """Condition number of the sigmoid for a relative error of its input, |x|·(1 − σ(x)) at the input's most
    negative value: in its lower tail σ(x) ≈ exp(x), so a relative error e of x becomes e·|x| in the output (a
    VAD's probability of 1e-3 after a logit of −7 carries 7× its logit's relative error). Bounded by |x|; 1 where
    the input is positive. With the output's statistics `y`, also bounded by what the whole tensor can show:
    each element's error is e·|x|·σ(x)·σ(−x) <= 0.224·e, so the relative L2 error of the output is at most
    0.224·e/rms(y) (a pitch classifier's logits of −2,000 underflow to 0 and carry no error at all)."""
    lo = float(x.min) if x.min is not None else 0.0
    if not math.isfinite(lo) or lo >= 0:
        return 1.0
    gain = -lo * (1.0 - 1.0 / (1.0 + math.exp(-max(lo, -700.0))))
    out = rms(y) if y is not None else None
    if out:
        gain = min(gain, _SIGMOID_ELEMENT_GAIN / out)
    return max(1.0, min(HUGE_GAIN, gain))


_SIGMOID_ELEMENT_GAIN = 0.224   # max over t of |t|·σ(t)·σ(−t), at |t| = 1.54


def dot_cancellation(rec: Record, inputs: Sequence[Record]) -> float | None:
    """sqrt(K)·rms(w)·rms(x)/rms(out) of a matmul or convolution (K its contraction length): about 1 for
    unrelated data, large when the products cancel. None when the operands are not known."""
    out = rms(rec.stats)
    ops = [i for i in inputs if len(i.shape) >= 2 and rms(i.stats)]
    if not out or len(ops) < 2:
        return None
    weights = [i for i in ops if i.kind == "param"]
    w = weights[0] if weights else max(ops[1:], key=lambda i: i.stats.numel)
    x = next(i for i in ops if i is not w)
    conv = "onv" in rec.op and len(w.shape) >= 3
    k = math.prod(w.shape[1:]) if conv else x.shape[-1]
    return max(1.0, min(HUGE_GAIN, math.sqrt(k) * (rms(w.stats) or 0.0) * (rms(x.stats) or 0.0) / out))


def _near_zero_gain(s: object) -> float:
    """rms / min|v| of a record's values (statistics): unbounded when they cross or touch zero."""
    mn, mx = getattr(s, "min", None), getattr(s, "max", None)
    r = rms(s)  # type: ignore[arg-type]
    if mn is None or mx is None or not r:
        return 1.0
    mn, mx = float(mn), float(mx)
    if getattr(s, "kind", "float") == "complex":   # statistics of a complex tensor are of its magnitude
        closest = mn
    elif mn <= 0.0 <= mx:
        return HUGE_GAIN
    else:
        closest = min(abs(mn), abs(mx))
    return min(HUGE_GAIN, r / max(closest, 1e-300))


# rms/std of a norm's input from which "near-constant values" is said: subtracting the mean then multiplies a
# relative error by that much (at ~1 the mean is small against the spread, and the sentence would be false)
NEAR_CONSTANT_OFFSET = 2.0


def explain(rec: Record, inputs: Sequence[Record], gain: float | None, in_err: float | None,
            out_err: float | None, flips: int | None = None, *, accumulator: Record | None = None,
            corr: float | None = None) -> str | None:
    """A sentence on why `rec` amplifies error, when its op and the statistics support one. `accumulator`: the
    running sum (cumsum) upstream of a sin/cos, which integrates its input into the phase; `corr`: the correlation
    of `rec`'s output with the reference's (how far a sin decorrelates)."""
    fam = family(rec.op)
    data = [i for i in inputs if i.kind not in ("param", "buffer")] or list(inputs)
    g = f"x{gain:,.3g}" if gain is not None and math.isfinite(gain) else "unbounded"
    if fam == "threshold" and flips is not None:
        n = rec.stats.numel
        return (f"threshold op ({_op(rec)}): {flips:,} of {n:,} elements changed side, because its inputs differ "
                f"by {_e(in_err)} (relative): a comparison, rounding or argmax turns small input differences into "
                "flips")
    if not data:
        return None
    x = data[0].stats
    rx = rms(x)
    if fam == "sin" and rx:
        phase_err = (in_err or 0.0) * rx
        verdict = (" — the phase is effectively random there" if phase_err > math.pi / 4 else
                   " — the waveform's phase drifts" if phase_err > 1e-3 else "")
        by = (f", integrated by {_op(accumulator)} ({accumulator.name})" if accumulator is not None else "")
        dec = f", and {_op(rec)} decorrelates (correlation {corr:.2g})" if corr is not None and corr < 0.99 else ""
        return (f"phase accumulation into {_op(rec)}: its input (the phase, {data[0].name}{by}) reaches "
                f"{_g(x.absmax)} rad (rms {_g(rx)}); a relative error of {_e(in_err)} there is ~{_g(phase_err)} rad "
                f"of absolute phase error{dec}: a relative error of {_e(out_err)} ({g}){verdict}. "
                "Accumulate the phase in float64 or wrap it (mod 2π) before it grows")
    if fam == "exp":
        return (f"{_op(rec)} of arguments up to {_g(x.absmax)}: a relative error e of the argument becomes a "
                f"relative error of e·|x| in the output ({_e(in_err)} -> {_e(out_err)}, {g})")
    if fam == "angle":
        m = x.min
        return (f"the phase ({_op(rec)}) of values near zero: the magnitude goes down to {_g(m)} against rms "
                f"{_g(rx)}; where it is ~0 the angle is decided by rounding ({_e(in_err)} -> {_e(out_err)}, {g})")
    if fam == "div":
        den = data[-1]
        s = den.stats
        where = (f"crosses zero ([{_g(s.min)}, {_g(s.max)}])" if s.min is not None and s.max is not None
                 and float(s.min) <= 0.0 <= float(s.max) else f"comes down to {_g(min(abs(float(s.min or 0)), abs(float(s.max or 0))))}")
        return (f"division by values near zero: the divisor {den.name} {where} against rms {_g(rms(s))} "
                f"({_e(in_err)} -> {_e(out_err)}, {g})")
    if fam == "norm" and x.std is not None:
        ry = rms(rec.stats) or 0.0
        if ry < 0.5:
            return (f"normalisation of near-constant channels ({_op(rec)}): its output's rms is only {_g(ry)} "
                    f"(a normalised channel has ~1), so most channels' variance is below the norm's epsilon and "
                    f"what is left of them is their rounding, divided by sqrt(eps) ({_e(in_err)} -> {_e(out_err)}, "
                    f"{g}). A one-pass variance E[x²]−E[x]² (TVM, ExecuTorch) can turn these channels into NaN")
        offset = (rx or 0) / max(float(x.std), 1e-300)
        if offset < NEAR_CONSTANT_OFFSET:   # the tensor as a whole is not near-constant: do not say it is
            return (f"normalisation ({_op(rec)}): each group (channel) is divided by its own spread, so one whose "
                    f"spread is small against its error passes that error on enlarged ({_e(in_err)} -> "
                    f"{_e(out_err)}, {g}); the input as a whole has mean {_g(x.mean)} against std {_g(x.std)}, not "
                    "near-constant: the channels' own spread is what to look at")
        return (f"normalisation of near-constant values ({_op(rec)}): its input has mean {_g(x.mean)} against std "
                f"{_g(x.std)}; subtracting the mean multiplies a relative error by ~{_g(offset)} "
                f"({_e(in_err)} -> {_e(out_err)}). A one-pass variance E[x²]−E[x]² (TVM, ExecuTorch) loses these "
                "channels entirely")
    if fam == "sum":
        k = sum(rms(d.stats) or 0.0 for d in data) / max(rms(rec.stats) or 1e-300, 1e-300)
        return (f"cancellation in {_op(rec)}: the result's rms {_g(rms(rec.stats))} is {_g(k)}x smaller than its "
                f"operands'; their relative errors are multiplied by that ({_e(in_err)} -> {_e(out_err)})")
    if fam == "softmax":
        return (f"{_op(rec)} of logits up to {_g(x.absmax)}: logit errors become relative output errors scaled by "
                f"the logits' size ({_e(in_err)} -> {_e(out_err)})")
    return None


def _op(rec: Record) -> str:
    return canonical_op(rec.op)


def _g(v: object) -> str:
    return f"{float(v):.3g}" if isinstance(v, (int, float)) else "?"


def _e(v: float | None) -> str:
    return "?" if v is None else f"{v:.2g}"


__all__ = ["HUGE_GAIN", "explain", "family", "is_recurrent", "predicted_gain"]
