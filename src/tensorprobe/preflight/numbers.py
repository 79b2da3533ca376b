"""Lint from the numbers: run the model once on the user's inputs and find the values the target's
arithmetic turns into failures, each with its evidence and margin.

- instance norms whose input channels have mean² ≫ variance: a one-pass variance E[x²] − E[x]² in float32
  cancels there to rounding noise of either sign, and rsqrt(variance + eps) of a negative one is NaN (seeds
  000, 001). A channel is at risk when that noise can exceed variance + eps: mean² · n · u > var + eps, with
  n the values summed per channel (float32 sums of n terms carry up to n·u relative error) and u = 2⁻²⁴;
- `exp`-family inputs within a margin of overflow in the target's float format (float16: 11.09);
- linear, convolution and reduction outputs beyond the float16 range, on float16 targets.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..hooks import ModuleStack, module_hooks, op_base_name, op_tensors, user_source_line
from ..numbers import fmt_number
from ..nan.diagnose import FLOAT_MAX, ONE_PASS_BACKENDS
from .findings import ERROR, INFO, WARNING, Finding, Target

_EXP_OPS = {"exp", "exp2", "expm1", "sinh", "cosh", "softplus"}
_RANGE_OPS = {"convolution", "addmm", "mm", "bmm", "matmul", "linear", "sum", "cumsum"}
UNIT_ROUNDOFF_F32 = 2.0 ** -24
EXP_MARGIN = 2.0    # an exp input within this of the overflow limit is a warning (e^2: 7x headroom)


def lint_numbers(model: torch.nn.Module, inputs: tuple, target: Target) -> list[Finding]:
    """Run `model(*inputs)` once (float32, on its device) and return the numerical risks for `target`."""
    norms: dict[str, dict[str, Any]] = {}
    watch = _Watch(target.dtype)
    stack = ModuleStack()
    # the library's instance norms, which backends lower with their own variance (a two-pass rewrite is plain ops)
    norm_types = {p: m for p, m in model.named_modules() if isinstance(m, torch.nn.modules.instancenorm._InstanceNorm)}

    def enter(path: str):
        def hook(module, args):
            stack.enter(path)     # returns None: a pre-hook's return value would replace the inputs
        return hook

    def leave(path: str):
        def hook(module, args, output):
            stack.exit(path)
            if path in norm_types and args and isinstance(args[0], torch.Tensor):
                watch.paused = True       # our own analysis ops are not the model's
                try:
                    _norm_input(path, args[0], float(getattr(module, "eps", 1e-5)), norms)
                finally:
                    watch.paused = False
        return hook

    watch.stack = stack
    with module_hooks(model.named_modules(), pre=enter, post=leave), torch.no_grad(), watch:
        model(*inputs)
    return _norm_findings(norms, target) + watch.findings(target)


def _norm_input(path: str, x: torch.Tensor, eps: float, out: dict[str, dict[str, Any]]) -> None:
    """Per channel of an instance norm's input: the worst-case rounding noise of a float32 one-pass
    variance over its normalised axes, relative to variance + eps (float64; > 1: it can come out negative)."""
    if x.dim() < 3 or not x.is_floating_point():
        return
    xd = x.detach().to(torch.float64)
    axes = tuple(range(2, x.dim()))
    n = math.prod(x.shape[2:])
    var = xd.var(dim=axes, unbiased=False)
    noise = xd.mean(dim=axes) ** 2 * n * UNIT_ROUNDOFF_F32
    score = (noise / (var + eps)).amax(dim=0).cpu().numpy()             # the worst over the batch
    prev = out.get(path)
    out[path] = {"score": score if prev is None else np.maximum(prev["score"], score), "n": n, "eps": eps}


def _norm_findings(norms: dict[str, dict[str, Any]], target: Target) -> list[Finding]:
    out = []
    for path, info in norms.items():
        score = info["score"]
        risky = [int(c) for c in np.argsort(-score) if score[c] > 1.0]
        if not risky:
            continue
        severity = ERROR if target.one_pass_variance else (INFO if target.one_pass_variance is False else WARNING)
        how = {True: f"{target.name} computes the variance that way ({target.note}): these channels can come out NaN",
               False: f"{target.name} computes it in two passes: safe there, but not on TVM or ExecuTorch",
               None: f"whether {target.name} computes it that way is not known"}[target.one_pass_variance]
        shown = ", ".join(map(str, risky[:12])) + ("…" if len(risky) > 12 else "")
        out.append(Finding(
            "one_pass_variance", severity,
            f"{len(risky)} of {score.size} channels of its input are nearly constant: a one-pass variance "
            f"E[x²] − E[x]² over {info['n']:,} float32 values can carry rounding up to "
            f"{fmt_number(float(score.max()), 2)}x their variance + eps (most at risk first: {shown}); {how}",
            module=path, evidence={"channels": sorted(risky), "worst_first": risky, "max_score": float(score.max()),
                                   "values_per_channel": info["n"], "eps": info["eps"],
                                   "one_pass_backends": ONE_PASS_BACKENDS},
            fix="compute the variance as E[(x − mean)²] (two passes, or Welford), or subtract the channel mean "
                "before this layer", rule="stable_norm"))
    return out


class _Watch(TorchDispatchMode):
    """Largest exp-family input and largest linear/reduction output per (module, op, source line)."""

    def __init__(self, dtype: str):
        super().__init__()
        self.dtype = dtype
        self.stack: ModuleStack | None = None
        self.exp: dict[tuple, float] = {}
        self.ranges: dict[tuple, float] = {}
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        base = op_base_name(func)
        if not self.paused and (base in _EXP_OPS or base in _RANGE_OPS):
            module = self.stack.current[0] if self.stack else ""
            key = (module, base, user_source_line())
            if base in _EXP_OPS:
                ins = [t for t in op_tensors(args) if t.is_floating_point() and t.numel()]
                if ins:
                    self.exp[key] = max(self.exp.get(key, -math.inf), _finite_max(ins[0]))
            elif self.dtype in ("float16", "bfloat16"):
                outs = [t for t in op_tensors(out) if t.is_floating_point() and t.numel()]
                if outs:
                    self.ranges[key] = max(self.ranges.get(key, 0.0), _finite_max(outs[0].abs()))
        return out

    def findings(self, target: Target) -> list[Finding]:
        limit = math.log(FLOAT_MAX.get(target.dtype, FLOAT_MAX["float32"]))
        out = []
        for (module, op, source), mx in self.exp.items():
            if mx >= limit - EXP_MARGIN:
                sev = ERROR if mx >= limit else WARNING
                out.append(Finding("overflow", sev, f"{op} input reaches {mx:.4g}; {target.dtype} overflows above "
                                   f"{limit:.2f} (margin {limit - mx:.2f})", module=module, source=source, op=op,
                                   evidence={"max_input": mx, "limit": limit},
                                   fix="bound the input (clamp before exp) or compute this op in float32"))
        fmax = FLOAT_MAX.get(target.dtype)
        for (module, op, source), mx in self.ranges.items():
            if fmax and mx >= fmax / 2:
                sev = ERROR if mx >= fmax else WARNING
                out.append(Finding("overflow", sev, f"{op} output reaches |x| = {mx:.4g}; {target.dtype} holds at "
                                   f"most {fmax:.4g}", module=module, source=source, op=op,
                                   evidence={"max_abs": mx, "limit": fmax},
                                   fix="rescale the values before this op, or keep it in float32"))
        return out


def _finite_max(t: torch.Tensor) -> float:
    t = t.detach()
    finite = t[torch.isfinite(t)]
    return float(finite.max()) if finite.numel() else -math.inf
