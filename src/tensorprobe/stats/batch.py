"""Statistics of many arrays at once: what a runtime capture needs for the values of one run.

A runtime writes a run's values into one buffer (ONNX Runtime's outputs are bound into `_OutputPool`).
`float_stats_many` finds the arrays that are views of one buffer and reduces all of them in one compiled
call per dtype (`_kernel.moments_many`), split over threads for large runs: the per-array cost is then a
few microseconds of Python instead of ~15 (torch conversion, dispatch, one kernel call each), and the data
pass, which does not hold the GIL, uses every core. The figures equal `compute_stats` of each array.

    >>> buf = np.arange(8, dtype=np.float32)
    >>> [s.max for s in float_stats_many([buf[:3], buf[3:].reshape(1, 5)])]
    [2.0, 7.0]
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

import numpy as np

from .core import CANCELLATION_RATIO, TensorStats, channel_count, kernel
from .numpy_backend import float_stats_from_moments

_FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
PARALLEL_MIN_ELEMENTS = 1 << 20   # below this, one thread: handing work to others costs more than it saves
_MAX_THREADS = 8                  # the pass is bound by memory bandwidth, which a few cores fill


def float_stats_many(arrays: Sequence[np.ndarray], channel_dim: int | None = 1) -> list[TensorStats | None]:
    """`compute_stats(a, channel_dim)` of each C-contiguous float32/float64 array of `arrays`, None for the
    others (the caller computes those one by one)."""
    groups: dict[tuple[int, np.dtype], tuple[np.ndarray, list[tuple[int, int]]]] = {}
    addresses: dict[int, int] = {}   # root buffer -> its address
    for i, a in enumerate(arrays):
        if not isinstance(a, np.ndarray) or a.dtype not in _FLOATS or not a.flags.c_contiguous or a.size == 0:
            continue
        root, offset = _place(a, addresses)
        groups.setdefault((id(root), a.dtype), (root, []))[1].append((i, offset))
    out: list[TensorStats | None] = [None] * len(arrays)
    for (_, dtype), (root, members) in groups.items():
        base = min(off for _, off in members)
        if any((off - base) % dtype.itemsize for _, off in members):
            members_list = [[m] for m in members]   # not on one grid of elements: one span each
        else:
            members_list = [members]
        for group in members_list:
            _reduce_group(arrays, root, dtype, group, channel_dim, out)
    return out


def _place(a: np.ndarray, addresses: dict[int, int]) -> tuple[np.ndarray, int]:
    """The buffer `a` views (its contiguous root array, else `a` itself) and `a`'s byte offset in it."""
    root = a
    while isinstance(root.base, np.ndarray):
        root = root.base
    if root is a or not root.flags.c_contiguous:
        return a, 0
    start = addresses.get(id(root))
    if start is None:
        start = addresses[id(root)] = root.__array_interface__["data"][0]
    offset = a.__array_interface__["data"][0] - start   # (a.ctypes.data: ~2 µs)
    if offset < 0 or offset + a.nbytes > root.nbytes:
        return a, 0
    return root, offset


def _reduce_group(arrays: Sequence[np.ndarray], root: np.ndarray, dtype: np.dtype, members: list[tuple[int, int]],
                  channel_dim: int | None, out: list[TensorStats | None]) -> None:
    base = min(off for _, off in members)
    end = max(off + arrays[i].nbytes for i, off in members)
    flat = root.reshape(-1).view(np.uint8)[base:end].view(dtype)
    starts = np.array([(off - base) // dtype.itemsize for _, off in members], dtype=np.int64)
    stops = starts + np.array([arrays[i].size for i, _ in members], dtype=np.int64)
    sums, ranges = _moments(flat, starts, stops)
    # the figures of every array at once; the arrays one pass cannot settle (non-finite elements, a spread
    # the mean dwarfs) are finished one by one, as `compute_stats` finishes them
    n = (stops - starts).astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):   # an array with -inf (a mask): finished one by one below
        mean = sums[:, 0] / n
        var = sums[:, 1] / n - mean * mean
        settled = np.isfinite(sums).all(axis=1) & ~(var < CANCELLATION_RATIO * mean * mean)
    std = np.sqrt(np.maximum(var, 0.0))
    absmax = np.abs(ranges).max(axis=1)
    rows = zip(members, settled.tolist(), mean.tolist(), std.tolist(), ranges.tolist(), absmax.tolist(),
               sums.tolist(), starts.tolist(), stops.tolist())
    for (i, _), ok, mu, sd, (mn, mx), amax, (total, sumsq), lo, hi in rows:
        a = arrays[i]
        if ok:
            out[i] = TensorStats.finite(a.size, mn, mx, mu, sd, amax, channel_count(a.shape, channel_dim))
        else:
            out[i] = float_stats_from_moments(a, flat[lo:hi], total, sumsq, mn, mx, channel_dim)


def _moments(flat: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`moments_many`, the spans split over threads by element count when the run is large."""
    k = kernel()
    sizes = stops - starts
    total = int(sizes.sum())
    threads = min(_threads(), len(starts), max(1, total // PARALLEL_MIN_ELEMENTS))
    if threads < 2:
        return k.moments_many(flat, starts, stops)
    # contiguous runs of spans of about equal element counts: each thread one compiled call
    edges = np.searchsorted(np.cumsum(sizes), [total * t // threads for t in range(1, threads)], side="right")
    bounds = [0, *sorted(set(int(e) for e in edges if 0 < e < len(starts))), len(starts)]
    parts = list(zip(bounds[:-1], bounds[1:]))
    done = list(_pool().map(lambda p: k.moments_many(flat, starts[p[0]:p[1]], stops[p[0]:p[1]]), parts))
    return np.concatenate([d[0] for d in done]), np.concatenate([d[1] for d in done])


def _threads() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return min(n, _MAX_THREADS)


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=_MAX_THREADS, thread_name_prefix="tensorprobe-stats")
        return _POOL


__all__ = ["PARALLEL_MIN_ELEMENTS", "float_stats_many"]
