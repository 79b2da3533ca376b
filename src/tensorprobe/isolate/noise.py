"""Noise or divergence for `isolate`: how much of a module's local error its own rounding explains.

`diff` judges each record against the rounding its computation should carry (`tensorprobe.diff.noise`).
`isolate` sees module boundaries only, not the ops inside, so it *measures* that rounding instead:

- **Local error.** The candidate's module ran on the reference's exact inputs. A relative L2 error within
  `NOISE_UNITS` roundoffs `u` (`REDUCED_NOISE_UNITS` where either side holds it in float16 or bfloat16, as in
  `diff`; `u` of the coarser dtype of the two outputs; TF32 for a CUDA float32 module that
  convolves or multiplies matrices) passes at once. Above it, the reference module is run once more on the
  same inputs in float64 (float32 for a float64 reference): the relative error of the reference against
  that run, divided by the reference's roundoff, is how many roundoffs this module's arithmetic
  accumulates on these inputs (its depth and conditioning, measured, not guessed). The floor is then
  `NOISE_UNITS x u x max(1, measured units)`. A tanh-approximated GELU (relative error ~1e-4) is far
  beyond float32 rounding (~1e-7 per op) and fails; a float16 port's conv (~1e-3) is within float16's.
- **Accumulated error** (two full runs) is judged against `NOISE_UNITS x u x max(sqrt(k), largest measured
  units so far)` at the k-th module call: independent roundings grow like a random walk. It only decides
  which layers are called "inherited" and where isolate starts looking above the leaves; a real port bug
  is found by its local error.
- With `--atol/--rtol/--min-corr/--min-snr` those thresholds decide instead, as in `diff`.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import torch
from torch.utils._pytree import tree_flatten, tree_map

from ..diff.noise import NOISE_UNITS, REDUCED_NOISE_UNITS, dtype_roundoff
from ..diff.result import Criteria
from ..environment import UNIT_ROUNDOFF

_TF32_MODULES = (torch.nn.modules.conv._ConvNd, torch.nn.Linear, torch.nn.RNNBase, torch.nn.MultiheadAttention,
                 torch.nn.Bilinear)


def dtype_str(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


class RoundingFloors:
    """The rounding-noise floors of one `isolate` run (None everywhere when thresholds were given).

    Example:
        >>> floors = RoundingFloors(Criteria())
        >>> floors.accumulated(0, torch.ones(3), torch.ones(3)) == 32 * 2.0 ** -24
        True
    """

    def __init__(self, criteria: Criteria):
        self.enabled = criteria.noise
        self.units_seen = 1.0     # the most roundoffs a module was measured to accumulate, so far
        self.probes = 0           # modules re-run in float64 to measure their rounding
        self.failed_probes: list[str] = []

    def unit(self, ref: torch.Tensor, cand: torch.Tensor, module: torch.nn.Module | None = None) -> float:
        """Unit roundoff of the coarser side (TF32 for a CUDA float32 conv/matmul module)."""
        u = max(dtype_roundoff(dtype_str(ref)), dtype_roundoff(dtype_str(cand)))
        if cand.device.type == "cuda" and cand.dtype == torch.float32 and _may_use_tf32(module):
            u = max(u, UNIT_ROUNDOFF["tf32"])
        return u

    def local(self, rel: float | None, ref: torch.Tensor, cand: torch.Tensor, module: torch.nn.Module | None,
              measure: Callable[[], float | None]) -> float | None:
        """The floor for one local comparison; `measure()` (run only when needed) returns the roundoffs the
        reference module accumulates on these inputs."""
        if not self.enabled:
            return None
        base = noise_units(ref, cand) * self.unit(ref, cand, module)
        if rel is None or not math.isfinite(rel) or rel <= base:
            return base
        units = measure()
        if units is None:
            return base
        self.units_seen = max(self.units_seen, units)
        return base * max(1.0, units)

    def accumulated(self, order: int, ref: torch.Tensor, cand: torch.Tensor) -> float | None:
        """The floor for the k-th module call's accumulated error (k = `order`, from 0)."""
        if not self.enabled:
            return None
        return noise_units(ref, cand) * self.unit(ref, cand) * max(math.sqrt(order + 1), self.units_seen)


def noise_units(ref: torch.Tensor, cand: torch.Tensor) -> int:
    """Roundoffs a floor allows, as `diff` allows them (`diff.noise.Noise.units`): REDUCED_NOISE_UNITS where either
    side holds the value in float16 or bfloat16 (32 of bfloat16's would pass a dropped bias: 12.5%), else
    NOISE_UNITS."""
    half = {ref.dtype, cand.dtype} & {torch.float16, torch.bfloat16}
    return REDUCED_NOISE_UNITS if half else NOISE_UNITS


def _may_use_tf32(module: torch.nn.Module | None) -> bool:
    if module is None:
        return True
    if not (torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32):
        return False
    return any(isinstance(m, _TF32_MODULES) for m in module.modules())


# ---------------------------------------------------------------------------------------------------
# Measuring a module's rounding


def rounding_units(module: torch.nn.Module, args: tuple, kwargs: dict, refs: list[torch.Tensor],
                   noise: list[torch.Tensor] | None = None) -> list[float | None]:
    """For each output of `module(*args, **kwargs)` (the reference outputs `refs`): its relative error
    against the same module run in float64 (float32 for float64 outputs), in units of the output dtype's
    roundoff. None where that cannot be measured (a non-float output, a module that fails in float64).

    `noise`: the random tensors the call drew, replayed (cast) into the float64 run.
    """
    wide = any(r.dtype == torch.float64 for r in refs if r.is_floating_point())
    probe = torch.float32 if wide else torch.float64
    try:
        with _in_dtype(module, probe), torch.no_grad():
            a, k = tree_map(lambda t: _to(t, probe), (args, kwargs))
            if noise:
                from ..rng import RngReplay
                with RngReplay(list(noise), cast=True):
                    out = module(*a, **k)
            else:
                out = module(*a, **k)
    except Exception:   # ops without a float64 kernel, dtype checks in user code: no measurement
        return [None] * len(refs)
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    if len(outs) != len(refs):
        return [None] * len(refs)
    return [_units(r, p, probe) for r, p in zip(refs, outs)]


def _units(ref: torch.Tensor, probe: torch.Tensor, probe_dtype: torch.dtype) -> float | None:
    if not (ref.is_floating_point() or ref.is_complex()) or probe.shape != ref.shape:
        return None
    r, p = ref.detach().cpu().to(torch.complex128 if ref.is_complex() else torch.float64), \
        probe.detach().cpu().to(torch.complex128 if probe.is_complex() else torch.float64)
    finite = torch.isfinite(r) & torch.isfinite(p)
    r, p = r[finite], p[finite]
    energy = float((r.abs() ** 2).sum())
    if energy == 0.0:
        return None
    rel = math.sqrt(float(((r - p).abs() ** 2).sum()) / energy)
    u = max(dtype_roundoff(dtype_str(ref)), dtype_roundoff(str(probe_dtype).removeprefix("torch.")))
    return rel / u if u else None


def _to(t: Any, dtype: torch.dtype) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    if t.is_floating_point():
        return t.to(dtype)
    if t.is_complex():
        return t.to(torch.complex128 if dtype == torch.float64 else torch.complex64)
    return t


@contextmanager
def _in_dtype(module: torch.nn.Module, dtype: torch.dtype) -> Iterator[None]:
    """Run `module` with its floating parameters, buffers and tensor attributes in `dtype`, then put back
    the very tensors it had (exact: no conversion back)."""
    saved: list[tuple[Any, str, Any, str]] = []   # (owner, name, original, how)
    try:
        for m in module.modules():
            for name, p in m._parameters.items():
                if p is not None and p.is_floating_point() and p.dtype != dtype:
                    saved.append((p, "data", p.data, "data"))
                    p.data = p.data.to(dtype)
            for name, b in m._buffers.items():
                if b is not None and b.is_floating_point() and b.dtype != dtype:
                    saved.append((m._buffers, name, b, "item"))
                    m._buffers[name] = b.to(dtype)
            for name, v in list(vars(m).items()):   # weight_norm's computed weight and other plain attributes
                if isinstance(v, torch.Tensor) and not isinstance(v, torch.nn.Parameter) and v.is_floating_point() \
                        and v.dtype != dtype:
                    saved.append((m, name, v, "attr"))
                    object.__setattr__(m, name, v.to(dtype))
        yield
    finally:
        for owner, name, original, how in reversed(saved):
            if how == "data":
                owner.data = original
            elif how == "item":
                owner[name] = original
            else:
                object.__setattr__(owner, name, original)


__all__ = ["NOISE_UNITS", "RoundingFloors", "noise_units", "rounding_units"]
