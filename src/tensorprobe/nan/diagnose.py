"""Plain-words diagnosis of an op that turned finite inputs into NaN/Inf, chosen from the evidence.

Each rule is a small function `(evidence) -> list[str]` in `RULES`; `diagnose()` runs them in order, most
specific first. Evidence is the op (any producer's name: `aten.rsqrt.default`, ONNX `Sqrt`, a TVM kernel;
rules see `ops.canonical_op` of it), the module type around it, and its input/output values as NumPy
arrays (torch tensors are converted), or only their statistics, for a bundle captured elsewhere.
A new rule is one function added to `RULES`.

    >>> import numpy as np
    >>> ev = Evidence(op="Sqrt", module_type="InstanceNorm1d",
    ...               inputs=[np.array([[[0.5], [-0.2]]])], output=np.array([[[0.7], [np.nan]]]))
    >>> diagnose(ev)[0]
    'Sqrt of 1 negative value (input min -0.2).'
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from ..arrays import as_numpy
from ..ops import canonical_op
from ..record import dtype_name
from ..stats import TensorStats, compute_stats
from .computation import OpNode, chain_text, statistic_of
from .masks import mask_nan_text, new_infinities, new_infinities_text

# Largest finite value of each float dtype (by name: bfloat16 has no NumPy dtype).
FLOAT_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38, "float32": 3.4028234663852886e38,
             "float64": 1.7976931348623157e308}

_NEG_DOMAIN_OPS = {"rsqrt", "sqrt", "log", "log2", "log10", "pow", "acosh", "lgamma", "digamma"}
_LOG_OPS = {"log", "log2", "log10", "log1p"}
_UNIT_DOMAIN_OPS = {"acos", "asin", "atanh"}
_EXP_OPS = {"exp", "exp2", "expm1", "sinh", "cosh", "_softmax", "softmax"}
_DIV_OPS = {"div", "reciprocal", "remainder", "fmod", "true_divide", "floor_divide"}
_NORM_OPS = {"native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
             "native_layer_norm", "native_group_norm", "instance_norm", "batch_norm", "layer_norm", "group_norm"}
_ACCUM_OPS = {"add", "sub", "sum", "mean", "cumsum", "mm", "bmm", "addmm", "baddbmm", "matmul", "convolution",
              "conv1d", "conv2d", "linear", "mul", "var", "std", "var_mean", "norm", "linalg_vector_norm", "pow"}


@dataclass
class Evidence:
    """What is known about one op: its name, module type, values (NumPy) and statistics, and how each of its
    inputs was computed as far as that was recorded (`computation`, one `OpNode` or None per input).

    `module_type` is the class of the module the op runs in (`InstanceNorm1d`); where no class is known (a
    runtime's or a port's bundle), `module` is its path, whose last name (`norm`) is a weaker hint."""

    op: str
    module_type: str = ""
    inputs: list[Any] = field(default_factory=list)
    output: Any = None
    input_stats: list[TensorStats] = field(default_factory=list)
    output_stats: TensorStats | None = None
    input_dtypes: list[str] = field(default_factory=list)
    output_dtype: str | None = None
    computation: tuple[OpNode | None, ...] = ()
    module: str = ""
    running_var: TensorStats | None = None   # the norm's stored running variance (eval-mode batch norms)
    op_name: str = ""   # how the text names the op: the producer's own name (`op_label`), from `op` by default
    masks_in: str = ""  # the deliberate masks (±Inf from a constant) its inputs carry, as a finding names them

    def __post_init__(self) -> None:
        self.op_name = self.op_name or op_label(self.op)
        self.op = canonical_op(self.op)
        if self.inputs and not self.input_dtypes:
            self.input_dtypes = [dtype_name(getattr(t, "dtype", "")) for t in self.inputs]
        if self.output is not None and self.output_dtype is None:
            self.output_dtype = dtype_name(self.output.dtype)
        self.inputs = [as_numpy(t) for t in self.inputs]
        self.output = as_numpy(self.output) if self.output is not None else None
        if not self.input_stats and self.inputs:
            self.input_stats = [compute_stats(t) for t in self.inputs]
        if self.output_stats is None and self.output is not None:
            self.output_stats = compute_stats(self.output)

    @property
    def float_inputs(self) -> list[tuple[np.ndarray, str]]:
        """(values, dtype name) of the floating-point inputs with elements."""
        return [(t, d) for t, d in zip(self.inputs, self.input_dtypes) if t.dtype.kind == "f" and t.size]


def op_label(op: str) -> str:
    """How a finding names an op: aten's base name for a PyTorch op (`rsqrt`), a module's class for a module-level
    record, and the producer's own name for any other (ONNX `Pad`, `Sqrt`, a TVM kernel): rules match on
    `canonical_op`, the text keeps what the user's runtime calls it.

        >>> op_label("aten.rsqrt.default"), op_label("Pad"), op_label("module:InstanceNorm1d")
        ('rsqrt', 'Pad', 'InstanceNorm1d')
    """
    if op.startswith(("aten.", "aten::", "aten_", "prims.", "quantized.", "module:")):
        return canonical_op(op)
    return op


def exp_overflow_threshold(dtype: Any) -> float:
    """Largest x with exp(x) finite: ~88.7 for float32/bfloat16, ~11.1 for float16."""
    return math.log(FLOAT_MAX.get(dtype_name(dtype), FLOAT_MAX["float32"]))


# A normalization module's class: InstanceNorm1d, LayerNorm, FaultyInstanceNorm1d, AdaLayerNorm, RMSNorm,
# LayerNormalization. Not `Normalize` (a division by a peak) nor a weight-norm parametrization.
_NORM_TYPE = re.compile(r"Norm(\d[dD])?$|Normalization$")
# Where no class is known, a module whose own name says norm (`norm`, `norm1`, `layer_norm`).
_NORM_NAME = re.compile(r"(^|_)(norm|ln|bn)\d*$", re.IGNORECASE)


def is_norm_type(module_type: str) -> bool:
    """`module_type` names a normalization class (`module:InstanceNorm1d` or `InstanceNorm1d`)."""
    return bool(_NORM_TYPE.search(module_type.removeprefix("module:")))


def normalization_reason(ev: Evidence) -> str | None:
    """Why the op counts as part of a normalization, from what was recorded; None when nothing shows it.

    The op itself is a normalization kernel, or its module's class is a normalization (module level), or,
    where no class was recorded, its module is named like one."""
    if ev.op in _NORM_OPS:
        return f"{ev.op_name} is a normalization kernel"
    if is_norm_type(ev.module_type):
        return f"it runs in {ev.module_type.removeprefix('module:')}"
    if not ev.module_type and ev.module and _NORM_NAME.search(ev.module.rsplit(".", 1)[-1]):
        return f"it runs in a module named {ev.module.rsplit('.', 1)[-1]!r} (its class was not recorded)"
    return None


def in_normalization(ev: Evidence) -> bool:
    """The recorded computation shows a normalization: see `normalization_reason`."""
    return normalization_reason(ev) is not None


VARIANCE_ADVICE = (
    "A normalization's variance came out negative (or zero): typically var = E[x²] − E[x]² with cancellation "
    "on channels whose mean is large against their spread, made worse by reduced precision. Compute the "
    "variance as E[(x − mean)²] in float32, or avoid the backend's lowering of this normalization."
)


def running_variance_cause(ev: Evidence) -> str | None:
    """An eval-mode batch norm divides by sqrt(running_var + eps), a stored buffer: negative entries there are
    NaN channels that no arithmetic of the forward made (a broken checkpoint or conversion)."""
    rv = ev.running_var
    if rv is None or rv.min is None or not rv.min < 0:
        return None
    where = f"{ev.module}.running_var" if ev.module else "the running variance"
    return (f"{where} holds negative values (min {rv.min:.4g}): in eval mode the normalization divides by "
            "sqrt(running_var + eps), a stored buffer, so every channel whose running variance is negative is "
            "NaN. Nothing in this forward computed a variance: the buffer itself is wrong — check the checkpoint "
            "and its conversion (running_mean and running_var swapped, a sign or a log-variance stored as a "
            "variance).")


def statistic_cause(ev: Evidence) -> str | None:
    """The sentence that names a negative statistic as the cause, when the recorded computation shows one:
    the op's input computed as a variance (`computation.statistic_of`), or a normalization op or module."""
    producer = ev.computation[0] if ev.computation else None
    stat = statistic_of(producer)
    reason = normalization_reason(ev)
    if stat is None:
        return f"{VARIANCE_ADVICE} (Evidence: {reason}.)" if reason else None
    return (f"Its input is {stat}, computed by {chain_text(producer)}{f' ({reason})' if reason else ''}: the "
            "variance came out negative where it cancels — on values whose mean is large against their spread, "
            "E[x²] and E[x]² agree to within their rounding, which has either sign. Compute the variance as "
            "E[(x − mean)²] (two passes, or Welford) in float32, or use the framework's normalization.")


def _domain_text(op: str) -> str:
    return "x > 0" if op in _LOG_OPS else "x ≥ 0"


def unexplained_negative_input(ev: Evidence, low: float, high: float, negative: str) -> str:
    """What is known of a negative input when nothing recorded shows it to be a statistic: the op, the
    input's sign and range, the ops that made it; and what to do."""
    producer = ev.computation[0] if ev.computation else None
    made = chain_text(producer)
    origin = (f"made by {made}" if made else "not made by a recorded op (a model input, a weight or a constant)"
              if ev.computation else "of unrecorded origin")
    return (f"Its input ranges over [{low:.4g}, {high:.4g}] ({negative}), {origin}: nothing recorded computes it "
            f"as a variance or another statistic that cannot be negative, so the values are negative as "
            f"computed. {ev.op_name} is defined for {_domain_text(ev.op)}: keep its input in the domain "
            f"(clamp(min=eps), abs, softplus, or exp of a log-domain value), or find why it goes negative.")


def _rule_negative_domain(ev: Evidence) -> list[str]:
    if ev.op not in _NEG_DOMAIN_OPS and ev.op not in _LOG_OPS or not ev.float_inputs:
        return []
    x = ev.float_inputs[0][0]
    if ev.op == "pow" and len(ev.inputs) > 1:
        return []  # pow(tensor, tensor): handled by the generic rule
    neg = int(np.count_nonzero(x < 0))
    zero = int(np.count_nonzero(x == 0))
    out = []
    if neg and ev.op != "log1p":
        out.append(f"{ev.op_name} of {neg} negative value{'s' if neg > 1 else ''} (input min {float(x.min()):.3g}).")
        finite = x[np.isfinite(x)]
        out.append(statistic_cause(ev) or unexplained_negative_input(
            ev, float(finite.min()), float(finite.max()), f"{neg:,} of {x.size:,} values negative"))
    if zero and ev.op in ("rsqrt", *_LOG_OPS):
        what = "1/sqrt(0) = Inf" if ev.op == "rsqrt" else "log(0) = -Inf"
        out.append(f"{ev.op_name} of {zero} exact zero{'s' if zero > 1 else ''}: {what}. Add an epsilon or a floor "
                   f"(e.g. clamp(min=1e-5)) before {ev.op_name}.")
    if ev.op == "log1p" and np.count_nonzero(x < -1):
        out.append(f"{ev.op_name} of {int(np.count_nonzero(x < -1))} values below -1.")
    return out


def _rule_unit_domain(ev: Evidence) -> list[str]:
    if ev.op not in _UNIT_DOMAIN_OPS or not ev.float_inputs:
        return []
    x = ev.float_inputs[0][0]
    bad = int(np.count_nonzero(np.abs(x) > 1))
    return [f"{ev.op_name} of {bad} values outside [-1, 1] (|x| max {float(np.abs(x).max()):.4g}); clamp the input."] if bad else []


def _rule_exp_overflow(ev: Evidence) -> list[str]:
    if ev.op not in _EXP_OPS or not ev.float_inputs:
        return []
    x, dtype = ev.float_inputs[0]
    limit = exp_overflow_threshold(dtype)
    mx = float(np.nanmax(x)) if np.isfinite(x).any() else math.nan
    if not mx > limit:
        return []
    over = int(np.count_nonzero(x > limit))
    return [f"{ev.op_name} overflow: input max {mx:.4g} exceeds {limit:.1f}, the largest exponent {dtype} can "
            f"hold ({over} value{'s' if over > 1 else ''} over it); exp(x) multiplies any upstream error by its "
            "output. Check the scale of the values feeding it (seed 000's spec = exp(x_post))."]


def _rule_division(ev: Evidence) -> list[str]:
    if ev.op not in _DIV_OPS or not ev.float_inputs:
        return []
    divisor = ev.inputs[0] if ev.op == "reciprocal" else (ev.inputs[1] if len(ev.inputs) > 1 else None)
    if divisor is None:
        return []
    zeros = int(np.count_nonzero(divisor == 0))
    if not zeros:
        return []
    msg = f"division by zero: the divisor holds {zeros} exact zero{'s' if zeros > 1 else ''}"
    if ev.op != "reciprocal":
        num, den = np.broadcast_arrays(ev.inputs[0], divisor)
        both = int(np.count_nonzero((num == 0) & (den == 0)))
        if both:
            msg += f", {both} of them 0/0 (NaN)"
    return [msg + ". Guard the divisor (e.g. normalising silent audio by its peak: use max(peak, eps))."]


def _rule_normalization(ev: Evidence) -> list[str]:
    if ev.op not in _NORM_OPS:
        return []
    stored = running_variance_cause(ev)
    if stored:
        return [stored]
    return ["The normalization produced non-finite per-channel statistics: variance negative or zero with eps "
            "too small, or squares overflowing the dtype."]


def _rule_norm_module(ev: Evidence) -> list[str]:
    """A module-level record of a normalization (by class or name) whose output is NaN from finite inputs:
    the variance came out negative or exactly zero. Rows of its input constant along the last axis (a silent
    frame, a padded step) have a variance of exactly zero: (x − mean) / sqrt(var) there is 0/0."""
    if ev.op in _NORM_OPS or ev.op in _DIV_OPS or not (ev.output_stats and ev.output_stats.nan):
        return []
    if ev.op != ev.module_type.removeprefix("module:"):
        return []       # an op inside the norm: its own rules (a one-pass variance, a division) speak for it
    reason = normalization_reason(ev)
    if reason is None:
        return []
    constant = next((int(np.count_nonzero(np.ptp(x.reshape(-1, x.shape[-1]), axis=-1) == 0))
                     for x, _ in ev.float_inputs if x.ndim and x.shape[-1] > 1 and np.isfinite(x).all()), 0)
    if not constant:
        return [f"{VARIANCE_ADVICE} (Evidence: {reason}.)"]
    return [f"zero variance: {constant} row{'s' if constant > 1 else ''} of its input "
            f"{'are' if constant > 1 else 'is'} constant along the last axis (a silent frame, a padded step), so "
            f"its variance there is exactly zero and (x − mean) / sqrt(var) is 0/0 unless eps is added inside the "
            f"square root (Evidence: {reason})."]


def _rule_overflow(ev: Evidence) -> list[str]:
    st = ev.output_stats
    if st is None or ev.op not in _ACCUM_OPS or (st.posinf + st.neginf) == 0:
        return []
    dt = ev.output_dtype or "float32"
    mx = FLOAT_MAX.get(dt, FLOAT_MAX["float32"])
    return [f"{ev.op_name} overflowed the {dt} range (max {mx:.4g}): {st.posinf + st.neginf} results are ±Inf. "
            "Accumulate in float32, or rescale the values before this op."]


def _rule_reduced_precision(ev: Evidence) -> list[str]:
    low = {d for _, d in ev.float_inputs if d in ("float16", "bfloat16")}
    return [f"Inputs are {', '.join(sorted(low))}: reduced precision makes cancellation and overflow far more "
            "likely; rerun the op in float32 to confirm."] if low else []


def _rule_channel_pattern(ev: Evidence) -> list[str]:
    st = ev.output_stats
    if st is None or not st.nonfinite_channels or not st.channels or st.nonfinite_channels == st.channels:
        return []
    return [f"Pattern: {st.nonfinite_channels} of {st.channels} channels entirely non-finite — whole channels, not "
            "scattered elements: something computed per channel (a statistic, a scale, a bias) is out of range "
            "for them. The next op that mixes channels (a convolution) will make every channel non-finite."]


def _rule_mask(ev: Evidence) -> list[str]:
    """An op that read a deliberate mask (±Inf from a constant) and made NaN of it, or ±Inf of its own beside it."""
    if not ev.masks_in or ev.output_stats is None:
        return []
    if ev.output_stats.nan:
        return [mask_nan_text(ev.op_name, ev.op, ev.masks_in, ev.inputs, ev.output)]
    count = new_infinities(ev.output, ev.inputs) if ev.output is not None else None
    return [new_infinities_text(ev.op_name, ev.masks_in, count)]


RULES: list[Callable[[Evidence], list[str]]] = [
    _rule_mask, _rule_negative_domain, _rule_unit_domain, _rule_exp_overflow, _rule_division, _rule_normalization,
    _rule_norm_module, _rule_overflow, _rule_channel_pattern, _rule_reduced_precision,
]


def diagnose(ev: Evidence) -> list[str]:
    """Plain-words findings for the op in `ev`, most specific first; never empty."""
    out: list[str] = []
    for rule in RULES:
        out.extend(rule(ev))
    if not out or all(r in _rule_reduced_precision(ev) + _rule_channel_pattern(ev) for r in out):
        st = ev.output_stats
        what = f"{st.nan} NaN and {st.posinf + st.neginf} ±Inf values" if st else "non-finite values"
        out.insert(0, f"{ev.op_name} produced {what} from finite inputs.")
    return out


def diagnose_from_stats(op: str, module_type: str, input_stats: list[TensorStats],
                        output_stats: TensorStats, *, computation: tuple[OpNode | None, ...] = (),
                        module: str = "", subject: str | None = None,
                        running_var: TensorStats | None = None, masks_in: str = "",
                        output_dtype: str | None = None) -> list[str]:
    """Diagnosis when only statistics are known (a bundle captured elsewhere, statistics only).

    `module_type` is the class of the op's module (`module:InstanceNorm1d` for a module-level record), ""
    when unknown; `computation` how its inputs were made (`Evidence.computation`); `module` its path;
    `subject` how the text names the record (default: the op); `running_var` the statistics of the module's
    stored running variance, where the bundle holds it; `masks_in` the deliberate masks its inputs carry;
    `output_dtype` the record's dtype (a half-precision output at the edge of its range has overflowed)."""
    label = op_label(op)
    op = canonical_op(op) if not op.startswith("module:") else op.removeprefix("module:")
    ev = Evidence(op=op, module_type=module_type, output_stats=output_stats, computation=computation, module=module,
                  running_var=running_var, op_name=label, masks_in=masks_in)
    out = _rule_mask(ev) + _negative_domain_from_stats(ev, input_stats)
    stored = running_variance_cause(ev) if in_normalization(ev) else None
    if stored:
        out.insert(0, stored)
    elif not out and output_stats.nonfinite_channels and in_normalization(ev):
        out.append(f"{VARIANCE_ADVICE} (Evidence: {normalization_reason(ev)}.)")
    if any(op.lower().startswith(p) or p in op.lower() for p in ("exp",)) and input_stats:
        mx = input_stats[0].max
        if mx is not None and mx > exp_overflow_threshold("float16"):
            out.append(f"exp input max {mx:.4g}: overflows float16 above ~11.1 and float32 above ~88.7.")
    if not out:
        out.extend(_overflow_from_stats(output_stats, output_dtype, subject or label))
    out.extend(_rule_channel_pattern(ev))
    if not out:
        out.append(f"{subject or label} is the first record holding non-finite values ({output_stats.nan} NaN, "
                   f"{output_stats.posinf + output_stats.neginf} ±Inf); capture with level='op', keep='full' "
                   "for a finer diagnosis.")
    return out


def _overflow_from_stats(st: TensorStats, dtype: str | None, subject: str) -> list[str]:
    """±Inf in a half-precision output whose finite values reach half its range: an overflow, read from the
    statistics alone (a module-level record of an fp16 port, whose op and inputs were not recorded)."""
    limit = FLOAT_MAX.get(dtype or "")
    if limit is None or dtype not in ("float16", "bfloat16") or not (st.posinf + st.neginf) or st.nan:
        return []
    reach = max(abs(v) for v in (st.min, st.max) if v is not None) if (st.min, st.max) != (None, None) else 0.0
    if reach < 0.5 * limit:
        return []
    return [f"{subject} overflowed the {dtype} range (max {limit:.4g}; its finite values reach {reach:.3g}): "
            f"{st.posinf + st.neginf} results are ±Inf. Compute it in float32, or rescale its input."]


def _negative_domain_from_stats(ev: Evidence, input_stats: list[TensorStats]) -> list[str]:
    """A domain op (sqrt, log, ...) whose recorded input statistics hold negative values."""
    st = input_stats[0] if input_stats else None
    if ev.op not in _NEG_DOMAIN_OPS or ev.op == "log1p" or st is None or st.min is None or not st.min < 0:
        return []
    head = f"{ev.op_name} of negative values (input min {st.min:.3g})."
    return [head, statistic_cause(ev) or unexplained_negative_input(ev, st.min, st.max, "some values negative")]


# A one-pass variance E[x²] − E[x]² of n float32 values carries rounding noise up to about mean²·n·u
# (u = 2^-24; the sums of n terms are each good to n·u), of either sign. Where that noise can reach the
# variance + eps, rsqrt(variance + eps) can be of a negative number: NaN (seeds 000 and 001).
UNIT_ROUNDOFF_F32 = 2.0 ** -24
ONE_PASS_BACKENDS = "TVM 0.27 and ExecuTorch 1.5.1 compute it that way; ONNX Runtime and PyTorch do not"


def one_pass_variance_score(units: Any, eps: float = 1e-5) -> np.ndarray:
    """Per unit (dim 1 of a `[batch, units, values]` array): the worst-case rounding noise of a float32
    one-pass variance over its values, relative to its variance + eps, worst over the batch, in float64.
    Above 1 the computed variance can come out negative.

        >>> x = np.random.default_rng(0).standard_normal((1, 3, 4096)); x[:, 1] = 300 + 1e-3 * x[:, 1]
        >>> (one_pass_variance_score(x) > 1).tolist()
        [False, True, False]
    """
    xd = as_numpy(units).astype(np.float64)
    n = xd.shape[-1]
    noise = xd.mean(axis=-1) ** 2 * n * UNIT_ROUNDOFF_F32
    return (noise / (xd.var(axis=-1) + eps)).max(axis=0)


def one_pass_negative_channels(units: np.ndarray, dtype: Any, eps: float = 1e-5) -> list[int]:
    """The units (dim 1 of `[batch, units, values]`) whose variance, computed in one pass as E[x²] − E[x]² with
    every value rounded to `dtype` (means accumulated in float32, as PyTorch does for half precision), comes
    out below −eps or non-finite in any batch row: where rsqrt(variance + eps) is NaN. An experiment on the
    recorded input, not a bound.

        >>> x = np.random.default_rng(0).standard_normal((1, 3, 80)); x[:, 1] = 10 + 0.03 * x[:, 1]
        >>> one_pass_negative_channels(x, np.float32), one_pass_negative_channels(x, np.float16)
        ([], [1])
    """
    xd = np.asarray(units).astype(dtype)
    mean = xd.mean(axis=-1, dtype=np.float32).astype(dtype)
    mean_sq = (xd * xd).mean(axis=-1, dtype=np.float32).astype(dtype)
    with np.errstate(over="ignore", invalid="ignore"):
        var = (mean_sq - mean * mean).astype(np.float32) + np.float32(eps)
    return [int(c) for c in np.flatnonzero((~np.isfinite(var) | (var < 0)).any(axis=0))]


def _one_pass_in_half(units: np.ndarray, bad_channels: tuple[int, ...], source: str, eps: float) -> list[str]:
    """Where float32 rounding cannot explain the NaN channels: whether a one-pass variance in float16 (a
    half-precision lowering of the norm) does, by computing it on the recorded input. Said only when it
    makes NaN in some of the NaN channels and float32 makes none."""
    bad = set(bad_channels)
    if not bad or one_pass_negative_channels(units, np.float32, eps):
        return []
    neg = one_pass_negative_channels(units, np.float16, eps)
    if not bad & set(neg):
        return []
    listed = ", ".join(map(str, neg[:8])) + (" …" if len(neg) > 8 else "")
    text = (f"Computed on the normalization input ({source}) in one pass, E[x²] − E[x]², with its values rounded to "
            f"float16, the variance + eps comes out negative (or overflows) in {len(neg)} of {units.shape[1]} "
            f"channels ({listed}) and rsqrt of it is NaN; in float32 the same computation stays positive: the "
            f"port most likely accumulates this norm's statistics in half precision.")
    if bad == set(neg):
        text += " These are exactly the NaN channels: compute the statistics in float32, in two passes."
    elif bad <= set(neg):
        text += " Every NaN channel is one of them: compute the statistics in float32, in two passes."
    else:
        text += f" The NaN channels ({', '.join(map(str, sorted(bad)))}) are not all among them."
    return [text]


def normalization_input_evidence(x: Any, bad_channels: tuple[int, ...], source: str, eps: float = 1e-5) -> list[str]:
    """What the input of a normalization says about NaN in its output channels `bad_channels`: the channels
    (dim 1) whose one-pass variance can cancel to a negative number (`one_pass_variance_score` > 1).

        >>> x = np.random.default_rng(0).standard_normal((1, 4, 64)); x[:, 2] = 50 + 1e-4 * x[:, 2]
        >>> normalization_input_evidence(x, (2,), "conv")[0][:60]
        'The normalization input (conv) has 1 of 4 channels nearly co'
    """
    x = as_numpy(x)
    if x.ndim < 3 or x.dtype.kind != "f" or not np.isfinite(x).all():
        return []
    units = x.reshape(x.shape[0], x.shape[1], -1)
    score = one_pass_variance_score(units, eps)
    risky = [int(c) for c in np.flatnonzero(score > 1.0)]
    if not risky:
        return _one_pass_in_half(units, bad_channels, source, eps)
    shown = "; ".join(f"channel {c}: {float(score[c]):.1e}" for c in risky[:8]) + (" …" if len(risky) > 8 else "")
    text = (f"The normalization input ({source}) has {len(risky)} of {x.shape[1]} channels nearly constant: a one-pass "
            f"variance E[x²] − E[x]² in float32 can carry rounding noise larger than their variance + eps (noise / "
            f"(variance + eps) — {shown}), negative as often as not, and rsqrt(variance + eps) of a negative value "
            f"is NaN; {ONE_PASS_BACKENDS}.")
    bad = set(bad_channels)
    if bad and bad <= set(risky):
        text += (f" Every NaN channel ({', '.join(map(str, sorted(bad)))}) is one of them: compute the variance as "
                 f"E[(x − mean)²] (two passes, or Welford), or subtract the channel mean before this layer.")
    elif bad:
        text += f" The NaN channels ({', '.join(map(str, sorted(bad)))}) are not all among them."
    return [text]


