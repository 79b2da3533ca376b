"""Rewrites of torch functions called inside a model's forward (not modules): `atan2` guarded at its
branch cut and at (0, 0), random draws replaced by recorded buffers.

A rewritten model keeps its class, module paths and state; its class is swapped for a subclass whose
`forward` runs the original under a `TorchFunctionMode` that routes the named torch functions to their
replacements. `torch.export` traces through the mode, so the exported program holds the replacements
(a recorded draw becomes a buffer of the program), and `copy.deepcopy` keeps working.

    >>> model = guard_atan2(model)[0]                      # doctest: +SKIP
"""

from __future__ import annotations

import math
from typing import Any, Callable

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from ..errors import InputError

# The functions that draw random numbers, as torch functions (the ops are in `tensorprobe.ops.RNG_OPS`).
RANDOM_FUNCTIONS = (torch.rand, torch.randn, torch.rand_like, torch.randn_like, torch.randint, torch.randint_like,
                    torch.normal, torch.bernoulli, torch.Tensor.normal_, torch.Tensor.uniform_,
                    torch.Tensor.bernoulli_, torch.Tensor.random_, torch.Tensor.exponential_)
_NOISE_PREFIX = "tensorprobe_noise_"


def guarded_atan2(y: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """`torch.atan2` with its branch cut and origin written out, so that every runtime agrees with PyTorch:
    ±π by the sign of y (±0 included) where y = 0 and x < 0 (ONNX Runtime gives −π at +0), and 0 with a
    finite gradient at (0, 0).

        >>> guarded_atan2(torch.tensor([0.0, -0.0, 0.0]), torch.tensor([-1.0, -1.0, 0.0])).tolist()
        [3.1415927410125732, -3.1415927410125732, 0.0]
    """
    origin = (x == 0) & (y == 0)
    angle = torch.atan2(y, torch.where(origin, torch.ones_like(x), x))     # no NaN gradient at the origin
    on_cut = (y == 0) & (x < 0)
    signed_pi = torch.where(torch.reciprocal(y) < 0, -math.pi, math.pi)     # 1/−0 = −inf: the sign of zero
    return torch.where(on_cut, signed_pi.to(angle.dtype), angle)


def _atan2(call: "_Swaps", func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    return guarded_atan2(args[0], args[1])


def _angle(call: "_Swaps", func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    z = args[0]
    return guarded_atan2(z.imag, z.real) if z.is_complex() else func(*args, **kwargs)


class _Swaps(TorchFunctionMode):
    """One forward of a swapped model: `owner` is the model, `draws` counts replayed random draws."""

    def __init__(self, owner: nn.Module, swaps: dict[Any, Callable]):
        super().__init__()
        self.owner, self.swaps = owner, swaps
        self.draws = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        impl = self.swaps.get(func)
        if impl is None:
            return func(*args, **(kwargs or {}))
        return impl(self, func, args, kwargs or {})


def swap_functions(model: nn.Module, swaps: dict[Any, Callable]) -> nn.Module:
    """Make `model.forward` route the torch functions in `swaps` to their replacements (see module doc).
    A replacement is called as `impl(call, func, args, kwargs)`, with `call.owner` the model."""
    table = {**getattr(model, "_tensorprobe_swaps", {}), **swaps}
    object.__setattr__(model, "_tensorprobe_swaps", table)     # a plain attribute, not a submodule
    if not getattr(type(model), "_tensorprobe_swapped", False):
        base = type(model)

        def forward(self, *args, **kwargs):
            with _Swaps(self, self._tensorprobe_swaps):
                return base.forward(self, *args, **kwargs)

        model.__class__ = type(base.__name__, (base,), {"forward": forward, "_tensorprobe_swapped": True,
                                                         "__module__": base.__module__})
    return model


def guard_atan2(model: nn.Module, *inputs: Any) -> tuple[nn.Module, list[str]]:
    """`atan2` and `angle` -> `guarded_atan2` throughout the forward."""
    return swap_functions(model, {torch.atan2: _atan2, torch.Tensor.atan2: _atan2, torch.angle: _angle,
                                  torch.Tensor.angle: _angle}), ["<forward>: atan2, angle"]


def record_random(model: nn.Module, *inputs: Any) -> tuple[nn.Module, list[str]]:
    """Random draws -> buffers recorded on `inputs`, replayed in call order: the model computes what it
    computed on that draw (for inputs of the same shapes), and exports with no random op.

    The draws are taken from the global generator as it stands: seed it first to choose them.
    """
    if getattr(model, "_tensorprobe_swaps", {}).get(torch.randn) is _replay:
        return model, []            # already replays a recorded draw
    recorded: list[torch.Tensor] = []
    where: list[str] = []

    def record(call, func, args, kwargs):
        out = func(*args, **kwargs)
        # contiguous: a draw shaped like a transposed tensor keeps its strides, and ExecuTorch cannot
        # lower a constant whose dim order is not a memory format ([0, 2, 1] in Kokoro's source)
        recorded.append(out.detach().clone(memory_format=torch.contiguous_format))
        where.append(getattr(func, "__name__", str(func)))
        return out

    probe = swap_functions(_shallow(model), {f: record for f in RANDOM_FUNCTIONS})
    with torch.no_grad():
        probe(*inputs)
    if not recorded:
        return model, []
    for i, t in enumerate(recorded):
        model.register_buffer(f"{_NOISE_PREFIX}{i}", t)
    swap_functions(model, {f: _replay for f in RANDOM_FUNCTIONS})
    return model, [f"{_NOISE_PREFIX}{i} ({w}, shape {tuple(t.shape)})" for i, (w, t) in enumerate(zip(where, recorded))]


def _replay(call: _Swaps, func: Any, args: tuple, kwargs: dict) -> torch.Tensor:
    name = f"{_NOISE_PREFIX}{call.draws}"
    call.draws += 1
    buf = getattr(call.owner, name, None)
    if buf is None:
        raise InputError(f"the model draws more random numbers than were recorded ({call.draws - 1}): record them "
                         "again on inputs like these")
    if func.__name__.endswith("_") and args and isinstance(args[0], torch.Tensor):    # in place: fill the tensor
        target = args[0]
        _check_shape(name, buf, target.shape)
        return target.copy_(buf)
    out = buf.clone()     # the caller may write into it (Kokoro zeroes a column of its draw)
    like = args[0] if func.__name__.endswith("_like") and args else None
    if like is not None:
        _check_shape(name, buf, like.shape)
    return out


def _check_shape(name: str, buf: torch.Tensor, shape: torch.Size) -> None:
    if tuple(buf.shape) != tuple(shape):
        raise InputError(f"recorded draw {name} has shape {tuple(buf.shape)} but the model now asks for "
                         f"{tuple(shape)}: the randomness was recorded on inputs of another size")


def _shallow(model: nn.Module) -> nn.Module:
    """A copy that shares parameters and buffers (recording must not touch the model's own class)."""
    import copy

    clone = copy.copy(model)
    clone.__dict__ = dict(model.__dict__)
    return clone
