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


@numba.njit(fastmath=_FM, nogil=True, cache=True, error_model="numpy")
def _block32_rows(x, bits, y, t):
    """`_block32`, and the block's elements added into `y` times the block's sign `t` (`stats.sketch`)."""
    s = np.float32(0.0)
    ss = np.float32(0.0)
    lo = _I32_HIGH
    hi = _I32_LOW
    for i in range(x.shape[0]):
        v = x[i]
        s += v
        ss += v * v
        y[i] += t * np.float64(v)
        b = bits[i]
        k = b ^ ((b >> 31) & np.int32(0x7FFFFFFF))
        lo = min(lo, k)
        hi = max(hi, k)
    return s, ss, lo, hi


@numba.njit(fastmath=_FM, nogil=True, cache=True, error_model="numpy")
def _moments32_rows(x, bits, y, t):
    n = x.shape[0]
    total = 0.0
    total_sq = 0.0
    lo = _I32_HIGH
    hi = _I32_LOW
    for r, start in enumerate(range(0, n, BLOCK)):
        stop = min(n, start + BLOCK)
        s, ss, bl, bh = _block32_rows(x[start:stop], bits[start:stop], y[:stop - start], t[r])
        total += s
        total_sq += ss
        lo = min(lo, bl)
        hi = max(hi, bh)
    return total, total_sq, lo, hi


@numba.njit(fastmath=_FM, nogil=True, cache=True, error_model="numpy")
def _moments64_rows(x, bits, y, t):
    s = 0.0
    ss = 0.0
    lo = _I64_HIGH
    hi = _I64_LOW
    n = x.shape[0]
    for start in range(0, n, BLOCK):
        stop = min(n, start + BLOCK)
        sign = t[start // BLOCK]
        xb, bb, yb = x[start:stop], bits[start:stop], y[:stop - start]
        for i in range(xb.shape[0]):
            v = xb[i]
            s += v
            ss += v * v
            yb[i] += sign * v
            b = bb[i]
            k = b ^ ((b >> 63) & np.int64(0x7FFFFFFFFFFFFFFF))
            lo = min(lo, k)
            hi = max(hi, k)
    return s, ss, lo, hi


def moments_rows(flat: np.ndarray, signs: np.ndarray) -> tuple[float, float, float, float, np.ndarray]:
    """`moments`, and in the same pass the signed sum of the array's rows of BLOCK elements (row r times
    `signs[r]`; the last row may be short): what `stats.sketch` hashes into its buckets. `signs`: a float64 per
    row; the row sums are float64.

        >>> s, ss, lo, hi, y = moments_rows(np.arange(5, dtype=np.float32), np.array([-1.0]))
        >>> (s, lo, hi), y[:5].tolist()
        ((10.0, 0.0, 4.0), [0.0, -1.0, -2.0, -3.0, -4.0])
    """
    if flat.dtype == np.float32:
        y = np.zeros(BLOCK, np.float64)     # float64: rows add up over a long value without rounding
        s, ss, lo, hi = _moments32_rows(flat, flat.view(np.int32), y, signs)
        kind = np.float32
    else:
        y = np.zeros(BLOCK, np.float64)
        s, ss, lo, hi = _moments64_rows(flat, flat.view(np.int64), y, signs)
        kind = np.float64
    return float(s), float(ss), _key_to_float(lo, kind), _key_to_float(hi, kind), y


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _moments32_many(x, bits, starts, stops, sums, keys):
    for j in range(starts.shape[0]):
        s, ss, lo, hi = _moments32(x[starts[j]:stops[j]], bits[starts[j]:stops[j]])
        sums[j, 0] = s
        sums[j, 1] = ss
        keys[j, 0] = lo
        keys[j, 1] = hi


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _moments64_many(x, bits, starts, stops, sums, keys):
    for j in range(starts.shape[0]):
        s, ss, lo, hi = _moments64(x[starts[j]:stops[j]], bits[starts[j]:stops[j]])
        sums[j, 0] = s
        sums[j, 1] = ss
        keys[j, 0] = lo
        keys[j, 1] = hi


def moments_many(flat: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`moments` of each span `flat[starts[j]:stops[j]]` in one call (no Python per span; the GIL is
    released): float64 arrays of (Σx, Σx²) and of (min, max), one row per span, equal to `moments` of
    each span. The spans of one runtime's output buffer are a capture's values.

        >>> sums, ranges = moments_many(np.array([1.0, -2.0, 4.0], np.float32), np.array([0, 1]), np.array([1, 3]))
        >>> sums.tolist(), ranges.tolist()
        ([[1.0, 1.0], [2.0, 20.0]], [[1.0, 1.0], [-2.0, 4.0]])
    """
    k = starts.shape[0]
    sums = np.empty((k, 2), np.float64)
    if flat.dtype == np.float32:
        keys = np.empty((k, 2), np.int32)
        _moments32_many(flat, flat.view(np.int32), starts, stops, sums, keys)
        mask, kind = np.int32(0x7FFFFFFF), np.float32
    else:
        keys = np.empty((k, 2), np.int64)
        _moments64_many(flat, flat.view(np.int64), starts, stops, sums, keys)
        mask, kind = np.int64(0x7FFFFFFFFFFFFFFF), np.float64
    ranges = (keys ^ ((keys >> (8 * keys.itemsize - 1)) & mask)).view(kind).astype(np.float64)
    return sums, ranges


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


# ---- content fingerprint --------------------------------------------------------------------------------
# Two 32-bit lanes per element (murmur-style finalizers of the word xor a position key), summed per block of
# FP_BLOCK words, and the block sums folded into two 64-bit lanes in order. Any change of one word changes
# both lane sums (each finalizer is a bijection); a permutation changes them through the position keys.
# Everything is computed in 32-bit integers that wrap, cast back after every operation: Numba widens integer
# arithmetic to 64 bits, which AVX2 cannot vectorize (2.5 GB/s); truncated, LLVM narrows it (5.5 GB/s).
# `stats.tensor_digest` has the same computation in torch for tensors on other devices.
FP_BLOCK = 4096
FP_M1, FP_M2, FP_M3, FP_M4 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D, 0x27D4EB2F
FP_SALT = 0x5BD1E995
FP_FOLD_A, FP_FOLD_B = 0x100000001B3, 0x9E3779B97F4A7C15
_U = np.uint32
_M1, _M2, _M4 = _U(FP_M1), _U(FP_M2), _U(FP_M4)
FP_POSITIONS = (np.arange(FP_BLOCK, dtype=np.uint32) * _U(FP_M3)) ^ _U(FP_SALT)


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _fp_block(w, pos):
    a = _U(0)
    b = _U(0)
    for i in range(w.shape[0]):
        x = _U(_U(w[i] ^ pos[i]) * _M1)
        x = _U(x ^ _U(x >> _U(15)))
        y = _U(x * _M2)
        z = _U(x * _M4)
        a = _U(a + _U(y ^ _U(y >> _U(13))))
        b = _U(b + _U(z ^ _U(z >> _U(16))))
    return a, b


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _fp_sums(w, pos, out):
    n = w.shape[0]
    for k in range(out.shape[0]):
        start = k * FP_BLOCK
        stop = min(n, start + FP_BLOCK)
        a, b = _fp_block(w[start:stop], pos[:stop - start])
        out[k, 0] = a
        out[k, 1] = b


@numba.njit(nogil=True, cache=True, error_model="numpy")
def fold_block_sums(sums):
    """Fold per-block lane sums (uint32, shape (blocks, 2)) into two 64-bit lanes, in block order."""
    a = np.uint64(0)
    b = np.uint64(0)
    for k in range(sums.shape[0]):
        step = np.uint64(k + 1)
        a = (a ^ np.uint64(sums[k, 0])) * np.uint64(FP_FOLD_A) + step
        b = (b ^ np.uint64(sums[k, 1])) * np.uint64(FP_FOLD_B) + step
    return a, b


def fingerprint_words(words: np.ndarray) -> tuple[int, int]:
    """Two 64-bit lanes fingerprinting a 1-D uint32 array (the data's bytes as little-endian words).

        >>> a = np.arange(10, dtype=np.uint32)
        >>> fingerprint_words(a) == fingerprint_words(a.copy()), fingerprint_words(a) == fingerprint_words(a[::-1].copy())
        (True, False)
    """
    blocks = -(-words.shape[0] // FP_BLOCK)
    sums = np.empty((blocks, 2), dtype=np.uint32)
    _fp_sums(words, FP_POSITIONS, sums)
    a, b = fold_block_sums(sums)
    return int(a), int(b)
