"""Bugs planted in one module of a candidate, each as a port or a hand conversion has it, with the causes a right
verdict may give (`Bug.causes`, in `DiffReport` pair causes) and whether it is visible to full-tensor statistics.

A planter changes a freshly built copy of the model in place: `plant(model, path, strength)`. `strength` is the
relative size of a numeric change (a weight scaled by 1 + strength): a case picks it so that the bug stands far
above the port's own rounding (`cases.strength_for`), since a bug smaller than the port's noise has no truth to find.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F

WEIGHTS, OWN, AMPLIFIED = "weights", "own", "amplified"


@dataclass(frozen=True)
class Bug:
    name: str
    plant: Callable[[nn.Module, str, float], None]
    causes: tuple[str, ...]
    numeric: bool = True          # its size follows `strength` (False: a structural change, one size)
    statistics_see_it: bool = True   # False: a permutation keeps every full-tensor statistic of the weight


def _module(model: nn.Module, path: str) -> nn.Module:
    return model.get_submodule(path)


def _weight_param(m: nn.Module) -> torch.nn.Parameter:
    """The parameter a weight bug changes: weight_norm's magnitude g where the weight is parametrized (scaling
    its direction v would change nothing), the first input weight of an RNN, the input projection of attention."""
    if hasattr(m, "parametrizations") and "weight" in m.parametrizations:
        return m.parametrizations.weight.original0
    for name in ("weight", "weight_ih_l0", "in_proj_weight", "alpha"):
        if isinstance(getattr(m, name, None), torch.nn.Parameter):
            return getattr(m, name)
    raise ValueError(f"{type(m).__name__} has no weight to plant a bug in")


@torch.no_grad()
def scale_weight(model: nn.Module, path: str, strength: float) -> None:
    _weight_param(_module(model, path)).mul_(1 + strength)


@torch.no_grad()
def permute_out(model: nn.Module, path: str, strength: float) -> None:
    """Output channels 0 and 1 swapped (weight rows and bias), as a wrong channel order in a converter."""
    m = _module(model, path)
    w = m.weight if not (hasattr(m, "parametrizations") and "weight" in m.parametrizations) else None
    if w is None:
        raise ValueError("permute_out on a weight-normed module")
    w[[0, 1]] = w[[1, 0]].clone()
    if getattr(m, "bias", None) is not None:
        m.bias[[0, 1]] = m.bias[[1, 0]].clone()


@torch.no_grad()
def drop_bias(model: nn.Module, path: str, strength: float) -> None:
    _module(model, path).bias.zero_()


@torch.no_grad()
def flip_kernel(model: nn.Module, path: str, strength: float) -> None:
    """A convolution kernel reversed in time (cross-correlation vs convolution)."""
    m = _module(model, path)
    p = _weight_param(m) if hasattr(m, "parametrizations") else m.weight
    if p.dim() < 3:
        raise ValueError("flip_kernel on a weight without a time axis")
    p.copy_(p.flip(-1))


@torch.no_grad()
def transpose_weight(model: nn.Module, path: str, strength: float) -> None:
    w = _module(model, path).weight
    w.copy_(w.t().clone())


def eps(model: nn.Module, path: str, strength: float) -> None:
    """The norm's epsilon changed: 1e-3 (Keras' default) where PyTorch's is 1e-5, larger for a stronger bug."""
    m = _module(model, path)
    m.eps = max(1e-3, strength * 1e-2)


def approx_activation(model: nn.Module, path: str, strength: float) -> None:
    m = _module(model, path)
    if not isinstance(m, nn.GELU):
        raise ValueError("approx_activation on a module that is not a GELU")
    m.approximate = "tanh"


class _OnePassNorm(nn.Module):
    """What a one-pass lowering of instance/group/layer norm computes: E[x²] − E[x]², accumulated in float16."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.inner = norm

    def forward(self, x):
        n = self.inner
        if isinstance(n, nn.LayerNorm):
            xs, dims = x, (-1,)
        elif isinstance(n, nn.GroupNorm):
            xs, dims = x.reshape(x.shape[0], n.num_groups, -1), (-1,)
        else:
            xs, dims = x, (-1,)
        h = xs.half()
        mean = h.mean(dims, keepdim=True).float()
        var = (h * h).mean(dims, keepdim=True).float() - mean * mean
        y = ((xs - mean) / torch.sqrt(var.clamp_min(0) + n.eps)).reshape(x.shape)
        if isinstance(n, nn.LayerNorm) and n.elementwise_affine:
            y = y * n.weight + n.bias
        elif isinstance(n, nn.GroupNorm) and n.affine:
            y = y * n.weight[:, None] + n.bias[:, None]
        elif isinstance(n, nn.InstanceNorm1d) and n.affine:
            y = y * n.weight[:, None] + n.bias[:, None]
        return y


def one_pass_variance(model: nn.Module, path: str, strength: float) -> None:
    _replace(model, path, _OnePassNorm(_module(model, path)))


class _Half(nn.Module):
    """A module computed in float16 inside a float32 model (a precision a backend picks for one region)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner.half()

    def forward(self, x):
        return self.inner(x.half()).float()


def fp16_module(model: nn.Module, path: str, strength: float) -> None:
    _replace(model, path, _Half(_module(model, path)))


def late_frames(model: nn.Module, path: str, strength: float, frame: int = 20) -> None:
    """The module's output scaled by 1 - strength from `frame` on only (a bug that bites on some frames: a gain
    applied past a buffer's length, a cache past its size). Its forward is replaced, so the change runs inside
    the module, and stays one graph every exporter takes."""
    m = _module(model, path)
    forward = m.forward

    def late(x):
        out = forward(x)
        return torch.cat([out[..., :frame], out[..., frame:] * (1 - strength)], dim=-1)
    m.forward = late


@torch.no_grad()
def gate_order(model: nn.Module, path: str, strength: float) -> None:
    """The first two gates of layer 0 swapped in every weight and bias (PyTorch's i,f,g,o against a converter's
    i,g,f,o or TF's order; GRU's r,z)."""
    m = _module(model, path)
    h = m.hidden_size
    for name in ("weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0"):
        p = getattr(m, name)
        first, second = p[:h].clone(), p[h:2 * h].clone()
        p[:h], p[h:2 * h] = second, first


def uniform_for_normal(model: nn.Module, path: str, strength: float) -> None:
    """The noise drawn with rand_like where the reference draws randn_like."""
    m = _module(model, path)
    m.forward = lambda x: x + m.scale * torch.rand_like(x)


def _replace(model: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, new)


BUGS: dict[str, Bug] = {b.name: b for b in (
    Bug("scale_weight", scale_weight, (WEIGHTS,)),
    Bug("permute_out", permute_out, (WEIGHTS,), numeric=False, statistics_see_it=False),
    Bug("drop_bias", drop_bias, (WEIGHTS,), numeric=False),
    Bug("flip_kernel", flip_kernel, (WEIGHTS,), numeric=False, statistics_see_it=False),
    Bug("transpose_weight", transpose_weight, (WEIGHTS,), numeric=False, statistics_see_it=False),
    Bug("eps", eps, (OWN, AMPLIFIED)),
    Bug("approx_activation", approx_activation, (OWN,), numeric=False),
    Bug("one_pass_variance", one_pass_variance, (OWN,), numeric=False),
    Bug("fp16_module", fp16_module, (OWN,), numeric=False),
    Bug("late_frames", late_frames, (OWN,)),
    Bug("gate_order", gate_order, (WEIGHTS,), numeric=False, statistics_see_it=False),
    # the port's own difference at a random op (no replay makes a uniform draw a normal one), not noise
    Bug("uniform_for_normal", uniform_for_normal, (OWN,), numeric=False),
)}
