"""A model's weights as records: every parameter and buffer by state-dict name, plus derived weights.

The most common porting bug is a wrong weight conversion (transposed, scaled, a wrong eps, weight norm folded
along the wrong dim), so captures record the weights themselves and `diff` compares them before the forward.

A *derived* weight is what a module computes from its parameters before using them: `weight_norm`'s
`weight` from `weight_g` and `weight_v`, a `torch.nn.utils.parametrize` parametrization's value. A port that
folded the parametrization holds exactly that tensor under that name, so recording it lets the two line up.
A quantized module of `torch.ao` (dynamic `Linear` and `LSTM`, static `Linear`) keeps its weights packed: they are
recorded dequantized, under the float module's names (`proj.weight`, `lstm.weight_ih_l0`), tagged like an int8
ONNX file's (`dequantized:qint8`, `qstep:<scale>`), so `diff` against the float original judges them within a step.

    >>> [(name, kind) for name, _, _, kind, _ in named_weights(torch.nn.Linear(2, 3))]
    [('weight', 'param'), ('bias', 'param')]
"""

from __future__ import annotations

from typing import Iterator

import torch

from .record import KIND_BUFFER, KIND_PARAM, TAG_DERIVED, TAG_QSTEP

OP_PARAM, OP_BUFFER = "param", "buffer"


def named_weights(model: torch.nn.Module) -> Iterator[tuple[str, str, torch.Tensor, str, tuple[str, ...]]]:
    """(state-dict name, owning module path, tensor, kind, tags) for every parameter, buffer and derived
    weight of `model`, parameters and buffers in state-dict order, each derived weight after them.

    Tied weights appear under every name the state dict uses; non-persistent buffers are included
    (they change the numbers as much as persistent ones).
    """
    params = {id(p) for p in model.parameters()}
    seen: set[str] = set()
    for path, module in model.named_modules(remove_duplicate=False):
        prefix = f"{path}." if path else ""
        for name, t in list(module._parameters.items()) + list(module._buffers.items()):
            if t is None or f"{prefix}{name}" in seen:
                continue
            full = f"{prefix}{name}"
            seen.add(full)
            yield full, path, t, KIND_PARAM if id(t) in params else KIND_BUFFER, ()
    for path, module in model.named_modules():
        for attr, value in _derived(module):
            name = f"{path}.{attr}" if path else attr
            if name not in seen:
                seen.add(name)
                yield name, path, value, KIND_PARAM, (TAG_DERIVED,)
        for attr, value, tags in _dequantized(module):
            name = f"{path}.{attr}" if path else attr
            if name not in seen:
                seen.add(name)
                yield name, path, value, KIND_PARAM, tags


def _derived(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """Weights a module computes from its parameters: old-style `weight_norm` hooks and parametrizations."""
    from torch.nn.utils import parametrize
    from torch.nn.utils.weight_norm import WeightNorm

    with torch.no_grad():
        for hook in list(module._forward_pre_hooks.values()):
            if isinstance(hook, WeightNorm):
                # computed now: the attribute holds the value of the last forward, stale after a weight edit
                yield hook.name, hook.compute_weight(module).detach()
        if parametrize.is_parametrized(module):
            for attr in module.parametrizations:
                yield attr, getattr(module, attr).detach()


def is_quantized_module(module: torch.nn.Module) -> bool:
    """A module of `torch.ao.nn.quantized` (static or dynamic): it computes with int8 weights."""
    return type(module).__module__.startswith("torch.ao.nn.quantized")


def _dequantized(module: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor, tuple[str, ...]]]:
    """The packed weights of a `torch.ao` quantized module, dequantized, under the float module's names."""
    if not is_quantized_module(module):
        return
    weights, biases = {}, {}
    if callable(getattr(module, "get_weight", None)):          # dynamic LSTM / GRU: {"weight_ih_l0": qtensor}
        weights, biases = module.get_weight(), module.get_bias()
    elif callable(getattr(module, "weight", None)):            # Linear (dynamic or static)
        weights, biases = {"weight": module.weight()}, {"bias": module.bias()}
    with torch.no_grad():
        for attr, q in weights.items():
            if q is not None and q.is_quantized:
                scale = q.q_scale() if q.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric) \
                    else float(q.q_per_channel_scales().max())
                dtype = str(q.dtype).removeprefix("torch.")
                yield attr, q.dequantize(), (f"dequantized:{dtype}", f"{TAG_QSTEP}{scale:.6g}")
        for attr, b in biases.items():
            if isinstance(b, torch.Tensor):
                yield attr, b.detach(), ()


__all__ = ["named_weights", "is_quantized_module", "OP_PARAM", "OP_BUFFER"]
