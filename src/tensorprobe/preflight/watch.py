"""The op-level half of the numbers lint: one forward under a dispatch mode that keeps, per (module, op,
source line), the evidence each numerical risk needs, and turns it into findings for a target's format.

Risks watched (thresholds are constants below, each with its reason):

- overflow: `exp`-family inputs within `EXP_MARGIN` of the format's log(max); linear, reduction and
  division outputs beyond half the format's max (float16/bfloat16 targets);
- atan2: points on the branch cut (y = +0 or |y| within rounding of 0, x < 0), where the result jumps
  between +π and −π with the sign of a rounding error (ONNX Runtime, measured: atan2(+0, −1) = −π where
  PyTorch gives +π), and the point (0, 0), whose derivative is undefined;
- near zero: `log`/`rsqrt`/`reciprocal`/`div` (and `sqrt`, `pow` with exponent < 1) inputs below the
  format's smallest normal, which float16 cannot hold and flush-to-zero kernels (common on mobile CPUs)
  turn into 0, and the op's output into ±Inf;
- phase accumulation: `sin`/`cos` of a phase built by `cumsum`, whose magnitude leaves the phase known
  only to ±(1 + √n)·u·|phase| radians (u the format's unit roundoff, n the steps summed);
- dynamic range: outputs whose significant values (within the format's precision of the largest) fall
  below its smallest normal (float16/bfloat16 targets).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakTensorKeyDictionary

from ..hooks import ModuleStack, op_base_name, op_tensors, user_source_line
from ..nan.diagnose import FLOAT_MAX
from ..ops import ALIAS_OPS, SKIP_OPS
from .findings import ERROR, INFO, WARNING, Finding, Target

EXP_MARGIN = 2.0            # an exp input within this of the overflow limit is a warning (e^2: 7x headroom)
PHASE_WARN, PHASE_ERROR = 0.01, 0.1     # radians of phase uncertainty: ~−40 dB, ~−20 dB of harmonic error
UNDERFLOW_SHARE = 0.01      # a tensor with more than 1% of its values below the smallest normal

_EXP_OPS = {"exp", "exp2", "expm1", "sinh", "cosh", "softplus"}
_RANGE_OPS = {"convolution", "addmm", "mm", "bmm", "matmul", "linear", "sum", "cumsum", "div", "reciprocal",
              "rsqrt", "pow"}
_SINGULAR_AT_ZERO = {"log", "log2", "log10", "rsqrt", "reciprocal", "div"}    # → ±Inf at 0
_STEEP_AT_ZERO = {"sqrt", "pow"}                                             # finite at 0, infinite slope
# Ops through which a cumsum's output stays "a phase" (scaled, shifted, wrapped, resampled or reshaped).
_PHASE_CARRIERS = ALIAS_OPS | {"mul", "add", "sub", "div", "remainder", "fmod", "neg", "cat", "slice", "select",
                               "index", "_to_copy", "upsample_linear1d", "upsample_nearest1d", "_upsample_linear1d",
                               "upsample_bilinear2d", "upsample_nearest2d", "repeat", "repeat_interleave"}


@dataclass(frozen=True)
class FloatFormat:
    """What a float format can hold: largest finite value, smallest normal, unit roundoff (2^-precision)."""

    name: str
    max: float
    tiny: float
    unit: float

    @staticmethod
    def of(name: str) -> "FloatFormat":
        info = torch.finfo(getattr(torch, name))
        return FloatFormat(name, FLOAT_MAX[name], float(info.tiny), float(info.eps) / 2)


class OpWatch(TorchDispatchMode):
    """Collects per-(module, op, source) evidence during one forward; `findings(target)` judges it."""

    def __init__(self, target: Target):
        super().__init__()
        self.fmt = FloatFormat.of(target.dtype)
        self.reduced = target.dtype in ("float16", "bfloat16")
        self.stack: ModuleStack | None = None
        self.paused = False
        self.seen: dict[tuple, dict[str, Any]] = {}
        self._phase = WeakTensorKeyDictionary()       # tensor → steps of the cumsum it comes from
        self.nonfinite_seen = False                   # a watched op, a module output or a model input held NaN/Inf
        self.broken: dict[tuple, int] = {}            # (module, op, source) → non-finite values in its operands
        self._operands: tuple = ((), None)            # the op call being observed, and its non-finite count
        self._operands_bad: int | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.paused:
            return out
        base = op_base_name(func)
        if base in SKIP_OPS:
            return out
        self.paused = True       # the watch's own reductions are not the model's ops
        try:
            self._operands, self._operands_bad = (args, out), None
            self._observe(base, args, out)
        finally:
            self.paused = False
            self._operands = ((), None)      # hold no tensor of the model's past the op
        return out

    def note_nonfinite(self, tensors: Any) -> None:
        """Check tensors the watch does not see as op outputs (module outputs, model inputs): one sum each,
        until the first non-finite value is seen."""
        if self.nonfinite_seen:
            return
        paused, self.paused = self.paused, True      # the check's own sums are not the model's ops
        try:
            self.nonfinite_seen = any(nonfinite_count(t) for t in tensors if isinstance(t, torch.Tensor))
        finally:
            self.paused = paused

    # -- evidence -----------------------------------------------------------------------------------------
    def _where(self, op: str) -> tuple[str, str, str | None]:
        return (self.stack.current[0] if self.stack else "", op, user_source_line())

    def _slot(self, check: str, op: str) -> dict[str, Any]:
        self._mark_operands(op)
        return self.seen.setdefault((check, *self._where(op)), {})

    def _mark_operands(self, op: str) -> None:
        """Count the non-finite values among this op call's inputs and outputs, once per call, and only for
        the ops a check measures."""
        if self._operands_bad is not None:
            return
        self._operands_bad = sum(nonfinite_count(t) for t in op_tensors(*self._operands))
        if self._operands_bad:
            self.nonfinite_seen = True
            where = self._where(op)
            self.broken[where] = self.broken.get(where, 0) + self._operands_bad

    def _observe(self, base: str, args: tuple, out: Any) -> None:
        ins = [t for t in op_tensors(args) if t.is_floating_point() and t.numel()]
        outs = [t for t in op_tensors(out) if t.is_floating_point() and t.numel()]
        if base in _EXP_OPS and ins:
            _keep_max(self._slot("exp", base), "max_input", _finite_max(ins[0]))
        if self.reduced and base in _RANGE_OPS and outs:
            _keep_max(self._slot("range", base), "max_abs", _finite_max(outs[0].abs()))
        if base == "atan2" and len(ins) == 2:
            self._atan2(base, ins[0], ins[1])
        elif base == "angle" and ins and ins[0].is_complex():
            self._atan2(base, ins[0].imag, ins[0].real)
        if base in _SINGULAR_AT_ZERO or base in _STEEP_AT_ZERO:
            self._near_zero(base, args)
        self._track_phase(base, args, ins, outs)
        if self.reduced and outs and base not in ALIAS_OPS:
            self._range_floor(base, outs[0])

    def _atan2(self, op: str, y: torch.Tensor, x: torch.Tensor) -> None:
        y, x = torch.broadcast_tensors(y.detach(), x.detach())
        left = x < 0
        on_cut = left & (y == 0) & ~torch.signbit(y)          # +0: PyTorch +π, ONNX Runtime −π
        near_cut = left & (y != 0) & (y.abs() <= self.fmt.unit * x.abs())
        s = self._slot("atan2", op)
        for key, mask in (("on_cut", on_cut), ("near_cut", near_cut), ("origin", (x == 0) & (y == 0))):
            s[key] = s.get(key, 0) + int(mask.sum())
        s["values"] = s.get("values", 0) + y.numel()

    def _near_zero(self, base: str, args: tuple) -> None:
        operand = args[1] if base == "div" else args[0]
        if base == "pow" and not (isinstance(args[1], (int, float)) and args[1] < 1):
            return
        if not isinstance(operand, torch.Tensor) or not operand.is_floating_point() or not operand.numel():
            return
        x = operand.detach()
        a = x.abs()
        tiny = (a > 0) & (a < self.fmt.tiny)
        s = self._slot("near_zero", base)
        s["tiny"] = s.get("tiny", 0) + int(tiny.sum())
        s["vanish"] = s.get("vanish", 0) + int(((a > 0) & (a < self.fmt.tiny * self.fmt.unit)).sum())
        s["zeros"] = s.get("zeros", 0) + int((a == 0).sum())
        s["negative"] = s.get("negative", 0) + int((x < 0).sum())
        s["values"] = s.get("values", 0) + a.numel()
        nonzero = a[a > 0]
        if nonzero.numel():
            s["min_abs"] = min(s.get("min_abs", math.inf), float(nonzero.min()))
        low, high = _finite_extent(x)
        s["min"], s["max"] = min(s.get("min", math.inf), low), max(s.get("max", -math.inf), high)

    def _track_phase(self, base: str, args: tuple, ins: list, outs: list) -> None:
        if base == "cumsum" and outs:
            dim = args[1] if len(args) > 1 and isinstance(args[1], int) else -1
            self._phase[outs[0]] = outs[0].shape[dim] if outs[0].dim() else 1
            return
        steps = max((self._phase.get(t, 0) for t in ins), default=0)
        if not steps:
            return
        if base in ("sin", "cos"):
            s = self._slot("phase", base)
            _keep_max(s, "max_abs", _finite_max(ins[0].abs()))
            s["steps"] = max(s.get("steps", 0), steps)
        elif base in _PHASE_CARRIERS:
            for t in outs:
                self._phase[t] = steps

    def _range_floor(self, base: str, t: torch.Tensor) -> None:
        self._mark_operands(base)     # a call that meets NaN/Inf here leaves out what finite calls found
        a = t.detach().abs()
        top = _finite_max(a)
        if not math.isfinite(top) or top <= 0 or top * self.fmt.unit >= self.fmt.tiny:
            return      # the significant values all sit above the smallest normal
        low = int(((a >= top * self.fmt.unit) & (a < self.fmt.tiny)).sum())
        if low > UNDERFLOW_SHARE * a.numel():
            s = self._slot("range_floor", base)
            if low / a.numel() > s.get("share", 0.0):
                s.update(share=low / a.numel(), max_abs=top)

    # -- findings -----------------------------------------------------------------------------------------
    def findings(self, target: Target) -> tuple[list[Finding], list[Finding]]:
        """(findings for `target`, findings left out because their op already met NaN/Inf in float32: their
        figures would come from the finite values only, and the failure is not the target's)."""
        kept, left_out = [], []
        for (check, module, op, source), ev in self.seen.items():
            judged = getattr(self, f"_judge_{check}")(ev, op, target)
            if judged is not None:
                severity, kind, message, fix = judged
                bad = self.broken.get((module, op, source), 0)
                evidence = {**ev, "nonfinite": bad} if bad else dict(ev)
                (left_out if bad else kept).append(Finding(
                    kind, severity, message, module=module, source=source, op=op, evidence=evidence, fix=fix,
                    rule="guard_atan2" if check == "atan2" else None))
        return kept, left_out

    def _judge_exp(self, ev, op, target):
        limit, mx = math.log(self.fmt.max), ev["max_input"]
        if mx < limit - EXP_MARGIN:
            return None
        ev["limit"] = limit
        return (ERROR if mx >= limit else WARNING, "overflow",
                f"{op} input reaches {mx:.4g}; {self.fmt.name} overflows above {limit:.2f} (margin {limit - mx:.2f})",
                "bound the input (clamp before exp)" + (" or compute this op in float32" if self.reduced else ""))

    def _judge_range(self, ev, op, target):
        mx = ev["max_abs"]
        if mx < self.fmt.max / 2:
            return None
        ev["limit"] = self.fmt.max
        return (ERROR if mx >= self.fmt.max else WARNING, "overflow",
                f"{op} output reaches |x| = {mx:.4g}; {self.fmt.name} holds at most {self.fmt.max:.4g}",
                "rescale the values before this op, or keep it in float32")

    def _judge_atan2(self, ev, op, target):
        if ev["on_cut"] and target.name == "onnx":
            return (WARNING, "branch_cut",
                    f"{op} is evaluated on its branch cut at {ev['on_cut']:,} points (y = +0, x < 0): PyTorch returns "
                    "+π there and ONNX Runtime −π, so the phases differ by 2π (harmless to sin/cos, a divergence to "
                    "anything that uses the phase itself)",
                    "guard it (tensorprobe rewrite --rules guard_atan2), or compare phases modulo 2π")
        cut = ev["on_cut"] + ev["near_cut"]
        if cut or ev["origin"]:
            parts = [f"{cut:,} points on or within rounding of the branch cut (y ≈ 0, x < 0), where ±π follows "
                     "the sign of a rounding error"] if cut else []
            if ev["origin"]:
                parts.append(f"{ev['origin']:,} at (0, 0), where its derivative is undefined (NaN gradients in "
                             "training; atan(y/x) formulations give NaN)")
            return (INFO, "branch_cut", f"{op}: " + "; ".join(parts),
                    "guard it (tensorprobe rewrite --rules guard_atan2); compare phases modulo 2π")
        return None

    def _judge_near_zero(self, ev, op, target):
        if not ev["tiny"]:
            return None
        singular = op in _SINGULAR_AT_ZERO
        what = "its denominator" if op == "div" else "its input"
        result = "the output there becomes ±Inf" if singular else "the steep part of the curve is lost"
        if ev["vanish"]:    # below half the smallest subnormal: the format itself rounds them to 0
            severity, fate = (ERROR if singular else WARNING), f"{ev['vanish']:,} of them round to 0 in {self.fmt.name}"
        else:
            severity, fate = WARNING, "kernels that flush subnormals to zero (common on mobile CPUs and GPUs) make them 0"
        # signed: an input that also holds negative values says so (for log, sqrt, rsqrt they are NaN already)
        spread = f"smallest |x| {ev.get('min_abs', 0.0):.3g}, values from {ev['min']:.3g} to {ev['max']:.3g}"
        return (severity, "near_zero",
                f"{ev['tiny']:,} values of {what} lie in magnitude below {self.fmt.name}'s smallest normal "
                f"{self.fmt.tiny:.3g} ({spread}): {fate}, and {result}",
                f"add an epsilon or clamp_min({self.fmt.tiny:.0e}) before {op}, or keep it in float32")

    def _judge_phase(self, ev, op, target):
        err = (1 + math.sqrt(ev["steps"])) * self.fmt.unit * ev["max_abs"]
        ev["phase_error_rad"] = err
        if ev["max_abs"] >= self.fmt.max:
            severity = ERROR
        elif err < PHASE_WARN:
            return None
        else:
            severity = ERROR if err >= PHASE_ERROR else WARNING
        return (severity, "phase_accumulation",
                f"{op} of a phase accumulated by cumsum over {ev['steps']:,} steps reaches {ev['max_abs']:.4g} rad: "
                f"in {self.fmt.name} it is known only to about ±{err:.2g} rad",
                "wrap the phase while accumulating (cumsum of the per-step increment in cycles, then % 1 before "
                "× 2π), or accumulate in float64")

    def _judge_range_floor(self, ev, op, target):
        return (WARNING, "dynamic_range",
                f"{op} output needs more dynamic range than {self.fmt.name} has: {ev['share']:.0%} of its significant "
                f"values (largest |x| {ev['max_abs']:.3g}) are below its smallest normal {self.fmt.tiny:.3g}",
                "rescale this tensor (e.g. work in log space, or multiply by a power of two) or keep it in float32")


def _keep_max(slot: dict[str, Any], key: str, value: float) -> None:
    slot[key] = max(slot.get(key, -math.inf), value)


def _finite_max(t: torch.Tensor) -> float:
    """The largest finite value (a finding at an op that met NaN/Inf is left out: see `OpWatch.findings`)."""
    return _finite_extent(t)[1]


def _finite_extent(t: torch.Tensor) -> tuple[float, float]:
    """Smallest and largest finite value, signed ((inf, -inf) when there is none)."""
    t = t.detach()
    if nonfinite_count(t):
        t = t[torch.isfinite(t)]
    if not t.numel():
        return math.inf, -math.inf
    low, high = torch.aminmax(t)
    return float(low), float(high)


def nonfinite_count(t: torch.Tensor) -> int:
    """NaN and ±Inf values in `t` (0 for non-float tensors). One sum when there are none: a finite sum
    proves every value finite; only an infinite or NaN sum pays for the exact count."""
    if not (t.is_floating_point() or t.is_complex()) or not t.numel():
        return 0
    total = t.detach().sum(dtype=torch.float32) if t.dtype in (torch.float16, torch.bfloat16) else t.detach().sum()
    if bool(torch.isfinite(total)):
        return 0
    return int((~torch.isfinite(t.detach())).sum())
