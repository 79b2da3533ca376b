"""Emulate a backend's reduced-precision arithmetic in PyTorch, on any device.

`tf32()` rounds the float32 operands of every convolution and matmul to TF32 (10 explicit mantissa bits,
round to nearest even), which is what cuDNN and cuBLAS do with `allow_tf32` on an Ampere-or-newer GPU
(they accumulate in float32). A capture taken inside records the emulation in its numerics environment,
so `diff` knows the arithmetic it is looking at:

    >>> import tensorprobe as tp
    >>> from tensorprobe.emulate import tf32
    >>> with tf32():                                                        # doctest: +SKIP
    ...     cand = tp.capture(model, x, level="op", keep="full", out="tf32")
    >>> tp.diff("ref", "tf32").verdict                                      # doctest: +SKIP
    'match'
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .environment import CONV, MATMUL, emulating

_CONV_OPS = frozenset({"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                       "conv_transpose2d", "conv_transpose3d", "mkldnn_convolution", "cudnn_convolution"})
_MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addbmm", "dot", "mv", "addmv"})


def round_to_tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 values rounded to TF32 precision (10 mantissa bits, nearest even); other dtypes unchanged.

        >>> round_to_tf32(torch.tensor([1.0 + 2 ** -11, 1.0 + 3 * 2 ** -11])).tolist()
        [1.0, 1.001953125]
    """
    if t.dtype != torch.float32:
        return t
    bits = t.contiguous().view(torch.int32)
    lsb = (bits >> 13) & 1                                   # round half to even on the kept bits
    rounded = (bits + 0x0FFF + lsb) & ~0x1FFF
    finite = torch.isfinite(t)
    return torch.where(finite, rounded.view(torch.float32), t).view(t.shape)


class _RoundOperands(TorchDispatchMode):
    def __init__(self, ops: frozenset[str]):
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if func._schema.name.split("::")[-1] in self.ops:
            args = tuple(round_to_tf32(a) if isinstance(a, torch.Tensor) else a for a in args)
        return func(*args, **(kwargs or {}))


class tf32:
    """Context manager: convolutions and matmuls see TF32-rounded float32 operands (see module docstring).

    Args:
        conv: round convolution operands (cuDNN's `allow_tf32`, on by default in PyTorch).
        matmul: round matmul operands (`torch.backends.cuda.matmul.allow_tf32`, off by default).
    """

    def __init__(self, conv: bool = True, matmul: bool = True):
        ops = (_CONV_OPS if conv else frozenset()) | (_MATMUL_OPS if matmul else frozenset())
        self._mode = _RoundOperands(ops)
        self._mark = emulating({**({CONV: "tf32"} if conv else {}), **({MATMUL: "tf32"} if matmul else {})})

    def __enter__(self) -> "tf32":
        self._mark.__enter__()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)
        self._mark.__exit__(*exc)


_LOW = {"float16": torch.float16, "bfloat16": torch.bfloat16}


class _RoundEverything(TorchDispatchMode):
    """Every float32 operand and result rounded to `dtype` (beyond its range: ±inf, as the format does)."""

    def __init__(self, dtype: torch.dtype):
        super().__init__()
        self.dtype = dtype

    def _round(self, t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
            return t.to(self.dtype).to(torch.float32)
        return t

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        args = tuple(self._round(a) for a in args)
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            return self._round(out)
        if isinstance(out, (tuple, list)):
            return type(out)(self._round(o) for o in out)
        return out


ACCUMULATE_BLOCK = 32   # values summed in float32 before a partial sum is rounded to the low format


def _tree_sum(partials: torch.Tensor, low: torch.dtype) -> torch.Tensor:
    """Sum dim 0 pairwise, every partial sum rounded to `low`: what a device that accumulates in float16
    (or bfloat16) does with the partial sums of a reduction, as a tree."""
    p = partials.to(low).to(partials.dtype)
    while p.shape[0] > 1:
        if p.shape[0] % 2:
            p = torch.cat([p, torch.zeros_like(p[:1])])
        p = (p[0::2] + p[1::2]).to(low).to(partials.dtype)
    return p[0]


def _blocked_sum(x: torch.Tensor, dims: Any, keepdim: bool, low: torch.dtype) -> torch.Tensor:
    if x.dim() == 0:
        return x
    dims = [dims] if isinstance(dims, int) else dims
    dims = list(range(x.dim())) if not dims else [d % x.dim() for d in dims]
    kept = [d for d in range(x.dim()) if d not in dims]
    flat = x.permute(*kept, *dims).reshape(*[x.shape[d] for d in kept], -1)
    pad = (-flat.shape[-1]) % ACCUMULATE_BLOCK
    flat = torch.nn.functional.pad(flat, (0, pad))
    partials = flat.reshape(*flat.shape[:-1], -1, ACCUMULATE_BLOCK).sum(-1)
    total = _tree_sum(partials.movedim(-1, 0), low)
    if keepdim:
        for d in sorted(dims):
            total = total.unsqueeze(d)
    return total


def _blocked_conv(args: tuple, low: torch.dtype, func: Any) -> torch.Tensor | None:
    x, w, bias, stride, padding, dilation, transposed, output_padding, groups = args
    if groups != 1:
        return None
    step = max(1, ACCUMULATE_BLOCK // max(1, w[0, 0].numel()))   # input channels per partial sum
    channels = x.shape[1]
    if channels <= step:
        return None
    parts = []
    for c in range(0, channels, step):
        wc = w[c:c + step] if transposed else w[:, c:c + step]
        parts.append(func(x[:, c:c + step], wc, None, stride, padding, dilation, transposed, output_padding, 1))
    out = _tree_sum(torch.stack(parts), low)
    return out if bias is None else (out + bias.view(1, -1, *([1] * (out.dim() - 2)))).to(low).to(out.dtype)


def _blocked_matmul(a: torch.Tensor, b: torch.Tensor, low: torch.dtype) -> torch.Tensor:
    k = a.shape[-1]
    parts = [a[..., i:i + ACCUMULATE_BLOCK] @ b[..., i:i + ACCUMULATE_BLOCK, :] for i in range(0, k, ACCUMULATE_BLOCK)]
    return _tree_sum(torch.stack(parts), low)


class _AccumulateLow(_RoundEverything):
    """`_RoundEverything`, and the partial sums of sums, means, convolutions and matmuls rounded to the low
    format as well (blocks of `ACCUMULATE_BLOCK` values, then a tree of rounded partial sums)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = func._schema.name.split("::")[-1]
        kwargs = kwargs or {}
        args = tuple(self._round(a) for a in args)
        out = None
        if name in ("sum", "mean") and args[0].dtype == torch.float32 and not kwargs.get("dtype"):
            dims = args[1] if len(args) > 1 else kwargs.get("dim")
            keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
            out = _blocked_sum(args[0], dims, keepdim, self.dtype)
            if name == "mean":
                out = out / (args[0].numel() / max(1, out.numel()))
        elif name == "convolution" and args[0].dtype == torch.float32:
            out = _blocked_conv(args, self.dtype, func)
        elif name in ("mm", "bmm") and args[0].dtype == torch.float32:
            out = _blocked_matmul(args[0], args[1], self.dtype)
        elif name == "addmm" and args[1].dtype == torch.float32 and not kwargs:
            out = (args[0] + self._round(_blocked_matmul(args[1], args[2], self.dtype)))
        if out is None:
            out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor):
            return self._round(out)
        if isinstance(out, (tuple, list)):
            return type(out)(self._round(o) for o in out)
        return out


class reduced_precision:
    """Context manager: every op of a float32 model sees operands and gives results rounded to float16 or
    bfloat16 (computed in float32 between): a model's values as a float16/bfloat16 port stores them,
    overflow to ±inf included, on any device and for ops that have no float16 CPU kernel. With
    `accumulate=True` the partial sums of sums, means, convolutions and matmuls are rounded too (blocks of
    32 values, then a tree): a device that accumulates in float16 (GPUs' fp16 GEMMs, the Neural Engine).

        >>> with reduced_precision("float16"):                              # doctest: +SKIP
        ...     origin = tp.find_first_nonfinite(model, x)
    """

    def __init__(self, dtype: str = "float16", accumulate: bool = False):
        if dtype not in _LOW:
            raise ValueError(f"reduced_precision takes float16 or bfloat16, not {dtype!r}")
        self._mode = (_AccumulateLow if accumulate else _RoundEverything)(_LOW[dtype])

    def __enter__(self) -> "reduced_precision":
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._mode.__exit__(*exc)


__all__ = ["reduced_precision", "round_to_tf32", "tf32"]
