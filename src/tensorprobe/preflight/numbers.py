"""Lint from the numbers: run the model once on the user's inputs and find the values the target's
arithmetic turns into failures, each with its evidence and margin.

- normalisations (instance, group, layer norm) whose input units have mean² ≫ variance: a one-pass
  variance E[x²] − E[x]² in float32 cancels there to rounding noise of either sign, and rsqrt(variance +
  eps) of a negative one is NaN (seeds 000, 001). A unit is at risk when that noise can exceed
  variance + eps (`tensorprobe.nan.diagnose.one_pass_variance_score`);
- what the op watch sees (`watch.py`): exp overflow, float16 range, atan2 branch cuts, singular ops near
  zero, phase accumulated by cumsum, dynamic range below the smallest normal.

Before any of that is judged, the same run says whether float32 PyTorch itself already makes NaN or Inf on
these inputs (`Float32Check`): if so, `nan`'s live finder locates where it is born, that is the first finding,
and no target finding is made at an op or norm that already met a non-finite value in float32.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from torch.utils._pytree import tree_flatten

from ..hooks import ModuleStack, module_hooks
from ..nan.diagnose import ONE_PASS_BACKENDS, one_pass_variance_score
from ..numbers import fmt_number
from .findings import ERROR, INFO, WARNING, Finding, Float32Check, Target
from .rewrite import forward_errors, seeded
from .watch import OpWatch, nonfinite_count

_UNIT_NAMES = {"instance": "channels", "group": "groups", "layer": "normalised rows"}


def lint_numbers(model: nn.Module, inputs: tuple, target: Target) -> tuple[list[Finding], Float32Check]:
    """Run `model(*inputs)` once (float32, on its device): the numerical risks for `target`, and whether
    float32 itself already fails on these inputs (with `nan`'s answer for where, when it does)."""
    norms: dict[str, dict[str, Any]] = {}
    watch = OpWatch(target)
    watch.note_nonfinite(list(inputs) + [t.detach() for t in list(model.parameters()) + list(model.buffers())])
    outputs = _watched_forward(model, inputs, watch, norms)
    outputs_finite = not any(nonfinite_count(t) for t in tree_flatten(outputs)[0] if isinstance(t, torch.Tensor))
    norm_kept, norm_left = _norm_findings(norms, target)
    op_kept, op_left = watch.findings(target)
    check = Float32Check(finite=True, outputs_finite=True)
    if watch.nonfinite_seen or not outputs_finite:     # NaN/Inf somewhere: nan's finder says where it is born
        check = _float32_origin(model, inputs, outputs_finite, tuple(norm_left + op_left))
    return norm_kept + op_kept, check


def _watched_forward(model: nn.Module, inputs: tuple, watch: OpWatch, norms: dict[str, dict[str, Any]]) -> Any:
    """One forward under the op watch, with hooks that keep the module stack, check each module output for
    NaN/Inf and score the inputs of the library's norms (which backends lower with their own variance)."""
    stack = ModuleStack()
    norm_kinds = {p: k for p, m in model.named_modules() if (k := _norm_kind(m))}

    def enter(path: str):
        def hook(module, args):
            stack.enter(path)     # returns None: a pre-hook's return value would replace the inputs
        return hook

    def leave(path: str):
        def hook(module, args, output):
            stack.exit(path)
            watch.note_nonfinite(tree_flatten(output)[0])     # one sum per output until the first NaN/Inf
            if path in norm_kinds and args and isinstance(args[0], torch.Tensor) and args[0].is_floating_point():
                watch.paused = True       # our own analysis ops are not the model's
                try:
                    _norm_input(path, norm_kinds[path], module, args[0], norms)
                finally:
                    watch.paused = False
        return hook

    watch.stack = stack
    with forward_errors(), module_hooks(model.named_modules(), pre=enter, post=leave), torch.no_grad(), seeded(), \
            watch:
        return model(*inputs)


def _float32_origin(model: nn.Module, inputs: tuple, outputs_finite: bool, left_out: tuple) -> Float32Check:
    """Where float32 makes its first non-finite value: `nan`'s live finder, on the same random draws."""
    from ..nan.live import find_first_nonfinite

    with seeded():
        origin = find_first_nonfinite(model, *inputs)
    return Float32Check(finite=False, outputs_finite=outputs_finite, origin=origin, left_out=left_out)


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
    bad = nonfinite_count(units)
    if bad:          # scored on the finite units only; the finding is then left out (float32 fails here)
        units = torch.where(torch.isfinite(units), units, torch.zeros((), dtype=units.dtype))
    score = one_pass_variance_score(units, eps)
    prev = out.get(path)
    out[path] = {"score": score if prev is None else np.maximum(prev["score"], score), "n": units.shape[-1],
                 "eps": eps, "kind": kind, "nonfinite": bad + (prev["nonfinite"] if prev else 0)}


def _norm_findings(norms: dict[str, dict[str, Any]], target: Target) -> tuple[list[Finding], list[Finding]]:
    """(one-pass-variance findings, those left out because the norm's float32 input held NaN/Inf)."""
    kept: list[Finding] = []
    left_out: list[Finding] = []
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
        (left_out if info["nonfinite"] else kept).append(Finding(
            "one_pass_variance", severity,
            f"{len(risky)} of {score.size} {units} of its input are nearly constant: a one-pass variance "
            f"E[x²] − E[x]² over {info['n']:,} float32 values can carry rounding up to "
            f"{fmt_number(float(score.max()), 2)}x their variance + eps (most at risk first: {shown}); {how}",
            module=path, evidence={"channels": sorted(risky), "worst_first": risky, "max_score": float(score.max()),
                                   "units": units, "values_per_channel": info["n"], "eps": info["eps"],
                                   "one_pass_backends": ONE_PASS_BACKENDS,
                                   **({"nonfinite": info["nonfinite"]} if info["nonfinite"] else {})},
            fix="compute the variance as E[(x − mean)²] (two passes, or Welford), or subtract the mean before "
                "this layer", rule="stable_norm"))
    return kept, left_out
