"""Random projections of a value: eight numbers that see what statistics cannot, and estimate an error.

Statistics of a whole tensor (Σx, Σx², min, max) are the same for any reordering of its elements: two output
channels swapped, a kernel reversed in time, a value transposed. A capture that keeps statistics only (the
default) then finds a port's permutation one layer late, or not at all. A *sketch* is the value's dot products
with `SKETCH_SIZE` fixed random ±1 vectors, `p_j = r_j · x`. For two captures of the same value, `a` and `b`,
`(p_j(a) − p_j(b))²` has expectation ‖a − b‖² for any difference whatever its structure (the signs are pairwise
independent), so the mean over the projections estimates the relative L2 error between two statistics-only
captures (`estimate_rel_err`): within a factor ~2 for 8 projections, and a permutation reads as the large
error it is.

The signs are `s_j[i mod BLOCK] · t_j[i div BLOCK]` (two seeded hash tables): any two positions get
independent products, and the projection is one matrix product of the value, seen as rows of BLOCK elements,
with the table `t` (`numpy_sketch`, `torch_sketch` on the value's own device), the columns summed in float64.

    >>> import numpy as np
    >>> x = np.random.default_rng(0).standard_normal((16, 64)).astype(np.float32)
    >>> y = x[[1, 0, *range(2, 16)]]               # two channels swapped: every statistic is the same
    >>> a, b = numpy_sketch(x.reshape(-1)), numpy_sketch(y.reshape(-1))
    >>> round(estimate_rel_err(a, b, float((x.astype(np.float64) ** 2).sum())), 1) > 0.1
    True
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

SKETCH_SIZE = 8
BLOCK = 4093                 # a prime: no common layout's stride is a multiple of it
_SEED_S, _SEED_T = 0x243F6A8885A308D3, 0x13198A2E03707344


def _signs(seed: int, count: int) -> np.ndarray:
    """`count` ±1.0 values per projection, (SKETCH_SIZE, count), from splitmix64 of (seed, projection, index)."""
    i = np.arange(count, dtype=np.uint64)[None, :] + (np.arange(SKETCH_SIZE, dtype=np.uint64)[:, None] << np.uint64(40))
    with np.errstate(over="ignore"):
        z = i + np.uint64(seed)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return np.where((z >> np.uint64(63)) == 1, 1.0, -1.0)


@lru_cache(maxsize=1)
def _within_block() -> np.ndarray:
    return _signs(_SEED_S, BLOCK)


def _per_block(rows: int, dtype: Any = np.float64) -> np.ndarray:
    """The signs `t` of at least `rows` rows (tables grow by powers of two and are kept), in `dtype`."""
    return _block_table(max(64, 1 << (rows - 1).bit_length()), np.dtype(dtype).str)


@lru_cache(maxsize=16)
def _block_table(rows: int, dtype: str = "<f8") -> np.ndarray:
    return _signs(_SEED_T, rows).astype(dtype)


def numpy_sketch(flat: np.ndarray) -> tuple[float, ...]:
    """The projections of a flat, finite float32/float64 array. Rows are combined in the array's own precision
    (a float32 matrix product: rows add at most a few thousand terms each), the columns in float64."""
    n = flat.size
    if n <= BLOCK:       # most values of a capture: one row, one small product
        return tuple((_first_row()[:, :n] @ flat.astype(np.float64)).tolist())
    rows = -(-n // BLOCK)
    whole = n // BLOCK
    t = _per_block(rows, flat.dtype)
    acc = (t[:, :whole] @ flat[:whole * BLOCK].reshape(whole, BLOCK)).astype(np.float64)
    if whole < rows:
        acc[:, :n - whole * BLOCK] += t[:, whole:whole + 1] * flat[whole * BLOCK:].astype(np.float64)
    return tuple((acc * _within_block()).sum(axis=1).tolist())


@lru_cache(maxsize=1)
def _first_row() -> np.ndarray:
    return _within_block() * _per_block(1)[:, :1]


def torch_sketch(flat: Any) -> tuple[float, ...]:
    """`numpy_sketch` of a flat, finite float32/float64 torch tensor, on its own device (one transfer of 8
    numbers); a CPU tensor is read through NumPy (no copy)."""
    if flat.device.type == "cpu":
        try:
            return numpy_sketch(flat.contiguous().numpy())
        except (RuntimeError, TypeError):   # tensor subclasses NumPy cannot view
            pass
    return _on_device(flat)


def _on_device(flat: Any) -> tuple[float, ...]:
    """The projections computed with torch on the tensor's device (a CUDA value is reduced there)."""
    import torch

    n = flat.numel()
    rows = -(-n // BLOCK)
    whole = n // BLOCK
    t = _device_table(_per_block(rows), flat.device, flat.dtype)[:, :rows]
    s = _device_table(_within_block(), flat.device, torch.float64)
    acc = torch.zeros((SKETCH_SIZE, BLOCK), dtype=torch.float64, device=flat.device)
    if whole:
        acc += (t[:, :whole] @ flat[:whole * BLOCK].reshape(whole, BLOCK)).double()
    if whole < rows:
        acc[:, :n - whole * BLOCK] += t[:, whole:whole + 1].double() * flat[whole * BLOCK:].double()
    return tuple((acc * s).sum(dim=1).tolist())


def _device_table(table: np.ndarray, device: Any, dtype: Any) -> Any:
    key = (id(table), str(device), str(dtype))
    found = _ON_DEVICE.get(key)
    if found is None or found[0] is not table:
        import torch

        found = _ON_DEVICE[key] = (table, torch.from_numpy(table).to(device=device, dtype=dtype))
    return found[1]


_ON_DEVICE: dict[tuple, tuple[np.ndarray, Any]] = {}


def estimate_rel_err(a: Sequence[float], b: Sequence[float], ref_sumsq: float) -> float | None:
    """The relative L2 error between two values, estimated from their sketches (`ref_sumsq`: Σx² of the
    reference value); None when there is nothing to estimate."""
    if len(a) != len(b) or not a or not ref_sumsq > 0:
        return None
    mean_sq = sum((x - y) ** 2 for x, y in zip(a, b)) / len(a)
    return math.sqrt(mean_sq / ref_sumsq) if math.isfinite(mean_sq) else None


__all__ = ["BLOCK", "SKETCH_SIZE", "estimate_rel_err", "numpy_sketch", "torch_sketch"]
