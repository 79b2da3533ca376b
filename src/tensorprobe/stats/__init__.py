"""Full-tensor statistics in as few passes as possible.

Probes that look at head/tail slices mislead (seed 000 blamed the wrong layer that way): every
statistic here covers every element. The common case, a finite float32/float64 tensor, costs one
compiled pass (`stats/_kernel.py`) giving Σx, Σx², min and max; a finite Σx is proof that every element is
finite, so it doubles as the finiteness check. Only a tensor that holds NaN/Inf pays for masks and the
per-channel analysis.

Two backends give the same figures: torch tensors are reduced with torch on their own device
(`torch_backend`, imported only for them), NumPy arrays with NumPy, so reading a bundle or a port's
`.npz` dump never imports torch.

    >>> import torch
    >>> x = torch.ones(1, 4, 3); x[0, 1] = float("nan")
    >>> s = compute_stats(x)
    >>> s.nan, s.nonfinite_channels, s.nonfinite_channel_idx
    (3, 1, (1,))
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from ..arrays import is_torch_tensor as _is_torch
from .core import FLOAT_KIND, MAX_CHANNEL_IDX, TensorStats
from .numpy_backend import numpy_digest, numpy_stats
from .sketch import cpu_sketch

def compute_stats(tensor: Any, channel_dim: int | None = 1, sketch: bool = False) -> TensorStats:
    """Statistics of every element of `tensor` (torch or NumPy), in one or two passes.

    Args:
        tensor: any dtype, any shape, including zero elements.
        channel_dim: the dimension whose slices are analysed for being entirely non-finite
            (the fingerprint of a broken per-channel normalization). Used for tensors of rank >= 2;
            `None` disables the analysis.
        sketch: also its sketch (`stats.sketch`: 8 signed sums of its hashed elements), for a finite float
            value: what a capture records, so that two statistics-only captures see a permutation and estimate
            their error.

    Returns:
        A `TensorStats`.
    """
    if _is_torch(tensor):
        from .torch_backend import torch_stats

        stats = torch_stats(tensor, channel_dim, sketch)
    else:
        tensor = np.asarray(tensor)
        stats = numpy_stats(tensor, channel_dim)
    return with_sketch(stats, tensor) if sketch else stats


def with_sketch(stats: TensorStats, tensor: Any) -> TensorStats:
    """`stats` with the sketch of `tensor` (its value), when it is a finite float value of 2 or more elements. On
    the CPU the statistics kernel's pass makes it (float64 row sums, as `compute_stats` does on the way); a value
    on another device is reduced there by torch."""
    if stats.kind != FLOAT_KIND or not stats.all_finite or stats.numel < 2 or stats.sketch is not None:
        return stats
    if _is_torch(tensor):
        import torch

        t = tensor.detach()
        if t.device.type != "cpu":
            from .sketch import torch_sketch

            flat = t.reshape(-1) if t.dtype in (torch.float32, torch.float64) else t.reshape(-1).float()
            return replace(stats, sketch=torch_sketch(flat))
        tensor = t.contiguous().numpy() if t.dtype in (torch.float32, torch.float64) else t.float().numpy()
    a = np.asarray(tensor)
    flat = np.ascontiguousarray(a.reshape(-1) if a.dtype in (np.float32, np.float64) else a.reshape(-1).astype(np.float32))
    return replace(stats, sketch=cpu_sketch(flat))


def tensor_digest(tensor: Any) -> str:
    """A 128-bit fingerprint of a tensor's bytes (32 hex digits): equal for bit-identical data on any device,
    different (with overwhelming probability) for any change, a transpose or a permutation included.

    Not cryptographic: it tells "same weights" from "changed weights" at memory speed (~5 GB/s per core;
    SHA-256 runs at ~1.2 GB/s here). Shape and dtype are not part of it: records carry those.

        >>> w = np.arange(16, dtype=np.float32).reshape(4, 4)
        >>> tensor_digest(w) == tensor_digest(w.copy()), tensor_digest(w) == tensor_digest(w.T.copy())
        (True, False)
    """
    if _is_torch(tensor):
        from .torch_backend import torch_digest

        return torch_digest(tensor)
    return numpy_digest(np.asarray(tensor))




__all__ = ["MAX_CHANNEL_IDX", "TensorStats", "compute_stats", "tensor_digest", "with_sketch"]
