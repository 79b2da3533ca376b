"""Lint from the numbers: run the model once on the user's inputs and find the values the target's
arithmetic turns into failures, each with its evidence and margin.

- normalisations (instance, group, layer norm) whose input units have mean² ≫ variance: a one-pass
  variance E[x²] − E[x]² in float32 cancels there to rounding noise of either sign, and rsqrt(variance +
  eps) of a negative one is NaN (seeds 000, 001). A unit is at risk when that noise can exceed
  variance + eps (`tensorprobe.nan.diagnose.one_pass_variance_score`);
- what the op watch sees (`watch.py`): exp overflow, float16 range, atan2 branch cuts, singular ops near
  zero, phase accumulated by cumsum, dynamic range below the smallest normal.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from ..hooks import ModuleStack, module_hooks
from ..nan.diagnose import ONE_PASS_BACKENDS, one_pass_variance_score
from ..numbers import fmt_number
from .findings import ERROR, INFO, WARNING, Finding, Target
from .watch import OpWatch

_UNIT_NAMES = {"instance": "channels", "group": "groups", "layer": "normalised rows"}


def lint_numbers(model: nn.Module, inputs: tuple, target: Target) -> list[Finding]:
    """Run `model(*inputs)` once (float32, on its device) and return the numerical risks for `target`."""
    norms: dict[str, dict[str, Any]] = {}
    watch = OpWatch(target)
    stack = ModuleStack()
    # the library's norms, which backends lower with their own variance (a two-pass rewrite is plain ops)
    norm_kinds = {p: k for p, m in model.named_modules() if (k := _norm_kind(m))}

    def enter(path: str):
        def hook(module, args):
            stack.enter(path)     # returns None: a pre-hook's return value would replace the inputs
        return hook

    def leave(path: str):
        def hook(module, args, output):
            stack.exit(path)
            if path in norm_kinds and args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
                watch.paused = True       # our own analysis ops are not the model's
                try:
                    _norm_input(path, norm_kinds[path], module, args[0], norms)
                finally:
                    watch.paused = False
        return hook

    watch.stack = stack
    with module_hooks(model.named_modules(), pre=enter, post=leave), torch.no_grad(), watch:
        model(*inputs)
    return _norm_findings(norms, target) + watch.findings(target)


def _norm_kind(m: nn.Module) -> str | None:
    if isinstance(m, nn.modules.instancenorm._InstanceNorm):
        return "instance"
    if isinstance(m, nn.GroupNorm):
        return "group"
    if isinstance(m, nn.LayerNorm):
        return "layer"
    return None


def _units(kind: str, module: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """The input as [batch, units, values]: each unit is one set of values the norm takes a variance of."""
    if kind == "instance":
        return x.reshape(x.shape[0], x.shape[1], -1) if x.dim() >= 3 else None
    if kind == "group":
        return x.reshape(x.shape[0], module.num_groups, -1)
    k = len(module.normalized_shape)
    return x.reshape(1, -1, math.prod(x.shape[-k:]))


def _norm_input(path: str, kind: str, module: nn.Module, x: torch.Tensor, out: dict[str, dict[str, Any]]) -> None:
    units = _units(kind, module, x.detach())
    if units is None:
        return
    eps = float(getattr(module, "eps", 1e-5))
    score = one_pass_variance_score(units, eps)
    prev = out.get(path)
    out[path] = {"score": score if prev is None else np.maximum(prev["score"], score), "n": units.shape[-1],
                 "eps": eps, "kind": kind}


def _norm_findings(norms: dict[str, dict[str, Any]], target: Target) -> list[Finding]:
    out = []
    for path, info in norms.items():
        score = info["score"]
        risky = [int(c) for c in np.argsort(-score) if score[c] > 1.0]
        if not risky:
            continue
        measured = info["kind"] == "instance"     # the one-pass kernels were measured for instance norm
        severity = {True: ERROR if measured else WARNING, False: INFO, None: WARNING}[target.one_pass_variance]
        how = {True: f"{target.name} computes the variance that way ({target.note}): these can come out NaN"
                     + ("" if measured else " if its layer/group norm kernels do as its instance norm does"),
               False: f"{target.name} computes it in two passes: safe there, but not on TVM or ExecuTorch",
               None: f"whether {target.name} computes it that way is not known"}[target.one_pass_variance]
        units = _UNIT_NAMES[info["kind"]]
        shown = ", ".join(map(str, risky[:12])) + ("…" if len(risky) > 12 else "")
        out.append(Finding(
            "one_pass_variance", severity,
            f"{len(risky)} of {score.size} {units} of its input are nearly constant: a one-pass variance "
            f"E[x²] − E[x]² over {info['n']:,} float32 values can carry rounding up to "
            f"{fmt_number(float(score.max()), 2)}x their variance + eps (most at risk first: {shown}); {how}",
            module=path, evidence={"channels": sorted(risky), "worst_first": risky, "max_score": float(score.max()),
                                   "units": units, "values_per_channel": info["n"], "eps": info["eps"],
                                   "one_pass_backends": ONE_PASS_BACKENDS},
            fix="compute the variance as E[(x − mean)²] (two passes, or Welford), or subtract the mean before "
                "this layer", rule="stable_norm"))
    return out
