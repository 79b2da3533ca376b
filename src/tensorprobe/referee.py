"""Run the reference model once in float64 and capture it: the referee `diff --referee fp64` judges both sides by.

A copy of the model is converted to float64 (parameters and buffers), float inputs are widened to float64, and
the copy is captured at the reference bundle's level with every value kept, so record names are the reference's.
The judgement itself (`tensorprobe.diff.referee`) reads bundles with NumPy only.

    >>> import torch, tensorprobe as tp
    >>> from tensorprobe.referee import capture_fp64
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh())
    >>> x = torch.randn(2, 4)
    >>> ref = tp.capture(model, x, keep="full")
    >>> fp64 = capture_fp64(model, x)
    >>> fp64["0"].dtype
    'float64'
"""

from __future__ import annotations

import copy
import os
from typing import Any

import torch

from .bundle import Bundle
from .errors import InputError
from .record import KIND_RNG


def _widen(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to(torch.float64) if value.is_floating_point() else value
    if isinstance(value, tuple):
        return tuple(_widen(v) for v in value)
    if isinstance(value, list):
        return [_widen(v) for v in value]
    if isinstance(value, dict):
        return {k: _widen(v) for k, v in value.items()}
    return value


def capture_fp64(model: torch.nn.Module, *inputs: Any, level: str = "module", out: str | os.PathLike | None = None,
                 replay_rng: Any = None, **kwinputs: Any) -> Bundle:
    """Capture a float64 copy of `model` on `inputs` widened to float64, every value kept (`keep="full"`).

    The model itself is left as it is. A model that draws random numbers needs `replay_rng` (the reference
    bundle): the float64 run then draws the reference's tensors, widened, instead of its own (a bundle that
    drew nothing is not replayed). A model that
    cannot run in float64 (an op without a float64 kernel, a dtype fixed inside its code) raises `InputError`
    saying so."""
    from .capture import capture

    if isinstance(replay_rng, Bundle) and not any(r.kind == KIND_RNG for r in replay_rng.records):
        replay_rng = None   # a reference that drew nothing: nothing to replay
    twin = copy.deepcopy(model).to(torch.float64).eval()
    try:
        return capture(twin, *_widen(inputs), level=level, keep="full", out=out, replay_rng=replay_rng,
                       **_widen(kwinputs))
    except RuntimeError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"the float64 referee could not run the model in float64: {first}") from None


__all__ = ["capture_fp64"]
