"""The fused statistics pass, compiled with Numba (imported lazily by `stats.py`).

One read of a float32/float64 array gives Σx, Σx², min and max. Two details make LLVM vectorize it
(~55 GB/s per core in cache, against ~20 GB/s for torch's sum + aminmax + norm, three passes):

- min/max run on integer keys of the float bit patterns (`bits ^ ((bits >> 31) & 0x7fffffff)` orders
  like the floats). Float min/max must honour NaN, and that keeps the loop scalar (~7 GB/s).
- each block is sliced before its loop: an index that starts at an offset could be negative as far as
  Numba knows, and its wrap-around check also keeps the loop scalar.

Sums are float32 within a block of `BLOCK` elements (in many vector lanes) and float64 across blocks:
exact to ~1e-8 relative at any size. The keys are only meaningful when the sum is finite, which proves
every element finite; callers check that first.
"""

from __future__ import annotations

import numba
import numpy as np

BLOCK = 4096
_FM = {"reassoc", "contract", "nsz", "arcp"}  # no "nnan"/"ninf": a NaN must still reach the sum

_I32_LOW, _I32_HIGH = np.int32(-(2**31)), np.int32(2**31 - 1)
_I64_LOW, _I64_HIGH = np.int64(-(2**63)), np.int64(2**63 - 1)


@numba.njit(fastmath=_FM, nogil=True, cache=True, error_model="numpy")
def _block32(x, bits):
    s = np.float32(0.0)
    ss = np.float32(0.0)
    lo = _I32_HIGH
    hi = _I32_LOW
    for i in range(x.shape[0]):
        v = x[i]
        s += v
        ss += v * v
        b = bits[i]
        k = b ^ ((b >> 31) & np.int32(0x7FFFFFFF))
        lo = min(lo, k)
        hi = max(hi, k)
    return s, ss, lo, hi


@numba.njit(fastmath=_FM, nogil=True, cache=True, error_model="numpy")
def _moments32(x, bits):
    n = x.shape[0]
    total = 0.0
    total_sq = 0.0
    lo = _I32_HIGH
    hi = _I32_LOW
    for start in range(0, n, BLOCK):
        stop = min(n, start + BLOCK)
        s, ss, bl, bh = _block32(x[start:stop], bits[start:stop])
        total += s
        total_sq += ss
        lo = min(lo, bl)
        hi = max(hi, bh)
    return total, total_sq, lo, hi


@numba.njit(fastmath=_FM, nogil=True, cache=True, error_model="numpy")
def _moments64(x, bits):
    s = 0.0
    ss = 0.0
    lo = _I64_HIGH
    hi = _I64_LOW
    for i in range(x.shape[0]):
        v = x[i]
        s += v
        ss += v * v
        b = bits[i]
        k = b ^ ((b >> 63) & np.int64(0x7FFFFFFFFFFFFFFF))
        lo = min(lo, k)
        hi = max(hi, k)
    return s, ss, lo, hi


_UNKEY = {np.float32: (np.int32, 0x7FFFFFFF), np.float64: (np.int64, 0x7FFFFFFFFFFFFFFF)}


def _key_to_float(key: int, float_dtype: type) -> float:
    int_dtype, mask = _UNKEY[float_dtype]
    k = int_dtype(key)
    return float((k ^ ((k >> (8 * k.itemsize - 1)) & int_dtype(mask))).view(float_dtype))


def moments(flat: np.ndarray) -> tuple[float, float, float, float]:
    """(Σx, Σx², min, max) of a 1-D contiguous float32/float64 array, in one pass. min and max are
    valid only when Σx is finite.

        >>> moments(np.array([1.0, -2.0, 4.0], dtype=np.float32))
        (3.0, 21.0, -2.0, 4.0)
    """
    if flat.dtype == np.float32:
        s, ss, lo, hi = _moments32(flat, flat.view(np.int32))
        kind = np.float32
    else:
        s, ss, lo, hi = _moments64(flat, flat.view(np.int64))
        kind = np.float64
    return float(s), float(ss), _key_to_float(lo, kind), _key_to_float(hi, kind)
