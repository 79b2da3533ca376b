"""The fused comparison pass, compiled with Numba (imported lazily by `metrics.py`).

Every element is read once, widened to float64, and feeds all sums at the same time; each block of
`BLOCK` elements has its own float64 partials (one thread per block range), and the block partials are
added pairwise by NumPy. Field order matches `metrics._SUM_FIELDS` / `metrics._MAX_FIELDS`.

All-finite pairs (the common case) take `_fast_block`, which LLVM vectorizes: ~6 GB/s per side per
core, against ~2 GB/s for the careful `_block` that non-finite data falls back to.
"""

from __future__ import annotations

import math

import numba
import numpy as np

BLOCK = 1 << 16          # elements per float64 partial sum

_TWO_PI = 2.0 * math.pi
_FM = {"reassoc", "contract", "nsz", "arcp"}  # no "nnan"/"ninf": NaN must stay detectable
_BIG = 1e300
PARALLEL_MIN = 1 << 21  # elements: below this one thread is faster than waking the pool


@numba.njit(fastmath=_FM, cache=True, nogil=True, error_model="numpy")
def _block(r, c, lo, hi, shift_r, shift_c, floor, atol, rtol, angle, out_s, out_m, b):
    nfr = nfc = nboth = mism = 0.0
    sabs = sr = sc = srr = scc = src = sdd = rawdd = flips = viol = 0.0
    mabs = mrel = rawmax = 0.0
    for i in range(lo, hi):
        x = np.float64(r[i])
        y = np.float64(c[i])
        fx = (x - x) == 0.0
        fy = (y - y) == 0.0
        nfr += fx
        nfc += fy
        ok = fx and fy
        mism += fx != fy
        raw = (y - x) if ok else 0.0
        x = x if ok else shift_r
        d = raw
        if angle:
            d = raw - _TWO_PI * np.round(raw / _TWO_PI)
            flips += abs(raw) > math.pi
        ad = abs(d)
        ax = abs(x)
        xs = x - shift_r
        ys = x + d - shift_c if ok else 0.0
        nboth += ok
        sabs += ad
        sr += xs if ok else 0.0
        sc += ys
        srr += xs * xs if ok else 0.0
        scc += ys * ys
        src += xs * ys if ok else 0.0
        sdd += d * d
        rawdd += raw * raw
        viol += ad > atol + rtol * ax
        mabs = max(mabs, ad)
        rel = ad / (ax + floor)
        mrel = max(mrel, rel) if ad > 0.0 else mrel
        rawmax = max(rawmax, abs(raw))
    out_s[b, 0] = nfr
    out_s[b, 1] = nfc
    out_s[b, 2] = nboth
    out_s[b, 3] = mism
    out_s[b, 4] = sabs
    out_s[b, 5] = sr
    out_s[b, 6] = sc
    out_s[b, 7] = srr
    out_s[b, 8] = scc
    out_s[b, 9] = src
    out_s[b, 10] = sdd
    out_s[b, 11] = rawdd
    out_s[b, 12] = flips
    out_s[b, 13] = viol
    out_m[b, 0] = mabs
    out_m[b, 1] = mrel
    out_m[b, 2] = rawmax


SUB = 2048  # elements per vectorized sub-block: its two float64 buffers stay in L1/L2


@numba.njit(fastmath=True, cache=True, nogil=True, error_model="numpy")
def _fast_sub(r, c, shift_r, shift_c, floor, atol, rtol, abs_buf, rel_buf):
    """Sums of one sub-block; |d| and |d|/(|r|+floor) go to buffers, whose maxima the caller takes as
    integer bit patterns (for non-negative floats those order like the values). Float max-reductions
    and an offset loop index (its wrap-around check) both keep LLVM from vectorizing, so neither is
    used here: r and c are slices starting at 0."""
    sabs = sr = sc = srr = scc = src = sdd = viol = 0.0
    for i in range(r.shape[0]):
        x = np.float64(r[i])
        y = np.float64(c[i])
        d = y - x
        ad = abs(d)
        ax = abs(x)
        xs = x - shift_r
        ys = y - shift_c
        sabs += ad
        sr += xs
        sc += ys
        srr += xs * xs
        scc += ys * ys
        src += xs * ys
        sdd += d * d
        viol += ad > atol + rtol * ax
        abs_buf[i] = ad
        rel_buf[i] = ad / (ax + floor)
    return sabs, sr, sc, srr, scc, src, sdd, viol


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _max_bits(bits):
    m = np.int64(0)
    for i in range(bits.shape[0]):
        m = max(m, bits[i])
    return m


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _fast_block(r, c, lo, hi, shift_r, shift_c, floor, atol, rtol, out_s, out_m, b):
    """All-finite data, no angle: no finiteness tests, no wrapping (~6 GB/s per side per core).
    Non-finite data make the sums non-finite, and the caller then reruns the careful kernel."""
    abs_buf = np.empty(SUB)
    rel_buf = np.empty(SUB)
    abs_bits = abs_buf.view(np.int64)
    rel_bits = rel_buf.view(np.int64)
    tot = np.zeros(8)
    mabs = np.int64(0)
    mrel = np.int64(0)
    for start in range(lo, hi, SUB):
        stop = min(hi, start + SUB)
        m = stop - start
        part = _fast_sub(r[start:stop], c[start:stop], shift_r, shift_c, floor, atol, rtol,
                         abs_buf[:m], rel_buf[:m])
        for k in range(8):
            tot[k] += part[k]
        mabs = max(mabs, _max_bits(abs_bits[:m]))
        mrel = max(mrel, _max_bits(rel_bits[:m]))
    maxima = np.empty(2, np.int64)
    maxima[0] = mabs
    maxima[1] = mrel
    as_float = maxima.view(np.float64)
    n = hi - lo
    out_s[b, 0] = n
    out_s[b, 1] = n
    out_s[b, 2] = n
    out_s[b, 4] = tot[0]
    out_s[b, 5] = tot[1]
    out_s[b, 6] = tot[2]
    out_s[b, 7] = tot[3]
    out_s[b, 8] = tot[4]
    out_s[b, 9] = tot[5]
    out_s[b, 10] = tot[6]
    out_s[b, 11] = tot[6]
    out_s[b, 13] = tot[7]
    out_m[b, 0] = as_float[0]
    out_m[b, 1] = as_float[1]
    out_m[b, 2] = as_float[0]


@numba.njit(parallel=True, cache=True, nogil=True, error_model="numpy")
def _blocks(r, c, shift_r, shift_c, floor, atol, rtol, angle, fast, out_s, out_m):
    n = r.shape[0]
    nb = out_s.shape[0]
    for b in numba.prange(nb):
        lo = b * BLOCK
        hi = min(n, lo + BLOCK)
        if fast:
            _fast_block(r, c, lo, hi, shift_r, shift_c, floor, atol, rtol, out_s, out_m, b)
        else:
            _block(r, c, lo, hi, shift_r, shift_c, floor, atol, rtol, angle, out_s, out_m, b)


@numba.njit(cache=True, nogil=True, error_model="numpy")
def _blocks_serial(r, c, shift_r, shift_c, floor, atol, rtol, angle, fast, out_s, out_m):
    n = r.shape[0]
    nb = out_s.shape[0]
    for b in range(nb):
        lo = b * BLOCK
        hi = min(n, lo + BLOCK)
        if fast:
            _fast_block(r, c, lo, hi, shift_r, shift_c, floor, atol, rtol, out_s, out_m, b)
        else:
            _block(r, c, lo, hi, shift_r, shift_c, floor, atol, rtol, angle, out_s, out_m, b)


def pair_pass(r: np.ndarray, c: np.ndarray, shift_r: float, shift_c: float, floor: float, atol: float,
              rtol: float, angle: bool) -> tuple[np.ndarray, np.ndarray]:
    """Sums (pairwise over blocks) and maxima of one pass over 1-D float32/float64 arrays."""
    nb = max(1, -(-r.shape[0] // BLOCK))
    out_s = np.zeros((nb, 14), np.float64)
    out_m = np.zeros((nb, 3), np.float64)
    atol = min(atol, _BIG)  # fastmath code must never see an infinity
    run = _blocks if r.shape[0] >= PARALLEL_MIN else _blocks_serial  # threads cost ~ms to wake
    if not angle:
        run(r, c, shift_r, shift_c, floor, atol, rtol, False, True, out_s, out_m)
        sums, maxes = out_s.sum(axis=0), out_m.max(axis=0)
        if np.isfinite(sums).all() and np.isfinite(maxes).all() and maxes[0] < _BIG:
            return sums, maxes
        out_s[:] = 0.0
        out_m[:] = 0.0
    run(r, c, shift_r, shift_c, floor, atol, rtol, angle, False, out_s, out_m)
    return out_s.sum(axis=0), out_m.max(axis=0)
