"""A sketch of a value: eight numbers that see what statistics cannot, and estimate an error.

Statistics of a whole tensor (Σx, Σx², min, max) are the same for any reordering of its elements: two output
channels swapped, a kernel reversed in time, a value transposed. A capture that keeps statistics only (the
default) then finds a port's permutation one layer late, or not at all. A *sketch* hashes every element into one
of `SKETCH_SIZE` buckets with a random sign and keeps the buckets' signed sums (a count sketch). For two captures
of the same value, `a` and `b`, the sum over buckets of `(z_k(a) − z_k(b))²` has expectation ‖a − b‖² for any
difference whatever its structure (the signs are pairwise independent), so it estimates the relative L2 error
between two statistics-only captures (`estimate_rel_err`): within a factor ~2, and a permutation reads as the
large error it is. The buckets are stored scaled by √SKETCH_SIZE, so that the mean of squared differences is
the estimate, as for random projections.

Element i, seen as row i div BLOCK and column i mod BLOCK, goes to bucket `bucket[column]` with sign
`s[column] · t[row]` (seeded hash tables; the row signs make any two elements' signs independent, whatever the
layout's strides): the signed sum of the value's rows (on the CPU in the statistics kernel's own pass,
`_kernel.moments_rows`; on another device one matrix-vector product there, `torch_sketch`), then a sum of
BLOCK numbers into the buckets, in float64.

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
# an estimate reads low or high by less than this factor but with negligible odds (its square is a mean of 8
# squares): `diff` fails a pair on it only above this many times its limit, and credits an input with this much
ESTIMATE_MARGIN = 3.0
BLOCK = 4096                 # the statistics kernel's block: one pass gives the moments and the row sums
_SEED_S, _SEED_T, _SEED_B = 0x243F6A8885A308D3, 0x13198A2E03707344, 0xA4093822299F31D0


def _hashed(seed: int, count: int) -> np.ndarray:
    """splitmix64 of (seed, index) for index < count, as uint64."""
    with np.errstate(over="ignore"):
        z = np.arange(count, dtype=np.uint64) + np.uint64(seed)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _signs(seed: int, count: int) -> np.ndarray:
    return np.where((_hashed(seed, count) >> np.uint64(63)) == 1, 1.0, -1.0)


@lru_cache(maxsize=1)
def _buckets() -> tuple[np.ndarray, np.ndarray]:
    """Each column's bucket, and its sign scaled by √SKETCH_SIZE."""
    bucket = (_hashed(_SEED_B, BLOCK) % np.uint64(SKETCH_SIZE)).astype(np.int64)
    return bucket, _signs(_SEED_S, BLOCK) * math.sqrt(SKETCH_SIZE)


@lru_cache(maxsize=1)
def _columns() -> np.ndarray:
    """(SKETCH_SIZE, BLOCK) float64: column l's scaled sign in its bucket's row, 0 elsewhere (for a device)."""
    bucket, sign = _buckets()
    m = np.zeros((SKETCH_SIZE, BLOCK))
    m[bucket, np.arange(BLOCK)] = sign
    return m


def _rows(count: int, dtype: Any = np.float64) -> np.ndarray:
    """The row signs `t` of at least `count` rows (tables grow by powers of two and are kept), in `dtype`."""
    return _row_table(max(64, 1 << (count - 1).bit_length()), np.dtype(dtype).str)


@lru_cache(maxsize=16)
def _row_table(count: int, dtype: str = "<f8") -> np.ndarray:
    return _signs(_SEED_T, count).astype(dtype)


def row_signs(count: int) -> np.ndarray:
    """The row signs of a value of `count` rows (float64), for `_kernel.moments_rows`."""
    return _rows(count)


def from_row_sums(y: np.ndarray) -> tuple[float, ...]:
    """The sketch from the signed sum of a value's rows (BLOCK float64s: `_kernel.moments_rows`). A bincount,
    not a matrix product: NumPy's BLAS threads would spin between the model's ops."""
    bucket, sign = _buckets()
    return tuple(np.bincount(bucket, weights=sign * y, minlength=SKETCH_SIZE).tolist())


def cpu_sketch(flat: np.ndarray) -> tuple[float, ...]:
    """The sketch of a flat, contiguous, finite float32/float64 array, by the statistics kernel (one pass, float64
    row sums: what a capture computes on the way to its statistics)."""
    from ._kernel import moments_rows

    return from_row_sums(moments_rows(flat, row_signs(-(-flat.size // BLOCK)))[4])


def numpy_sketch(flat: np.ndarray) -> tuple[float, ...]:
    """The sketch of a flat, finite float32/float64 array (the rows' signed sums in the array's precision, the
    buckets in float64)."""
    n = flat.size
    whole = n // BLOCK
    t = _rows(whole + 1, flat.dtype)
    y = np.zeros(BLOCK)
    if whole:
        y += t[:whole] @ flat[:whole * BLOCK].reshape(whole, BLOCK)
    if whole * BLOCK < n:
        y[:n - whole * BLOCK] += float(t[whole]) * flat[whole * BLOCK:].astype(np.float64)
    return from_row_sums(y)


def torch_sketch(flat: Any) -> tuple[float, ...]:
    """`numpy_sketch` of a flat, finite float32/float64 torch tensor, with torch on its own device (one transfer of
    8 numbers). On the CPU too: NumPy's BLAS threads spin after each product and starve the model's own threads
    between its ops."""
    import torch

    n = flat.numel()
    whole = n // BLOCK
    y = torch.zeros(BLOCK, dtype=torch.float64, device=flat.device)
    if whole:
        t = _device_table(_rows(whole + 1), flat.device, flat.dtype)[:whole]
        y += (t @ flat[:whole * BLOCK].reshape(whole, BLOCK)).double()
    if whole * BLOCK < n:
        y[:n - whole * BLOCK] += float(_rows(whole + 1)[whole]) * flat[whole * BLOCK:].double()
    return tuple((_device_table(_columns(), flat.device, torch.float64) @ y).tolist())


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


__all__ = ["BLOCK", "ESTIMATE_MARGIN", "SKETCH_SIZE", "cpu_sketch", "estimate_rel_err", "from_row_sums", "numpy_sketch", "row_signs",
           "torch_sketch"]
