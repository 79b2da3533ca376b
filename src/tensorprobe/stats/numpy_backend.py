"""The NumPy backend of `stats`: statistics and fingerprints of arrays, without torch."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

import numpy as np

from .core import (BOOL_KIND, CANCELLATION_RATIO, COMPLEX_KIND, FLOAT_KIND, INT_KIND, KERNEL_MIN_ELEMENTS,
                   MAX_CHANNEL_IDX, TensorStats, bool_stats, channel_count, kernel, resolve_channel_dim)


def numpy_digest(a: np.ndarray) -> str:
    """`tensor_digest` of an array."""
    x, y = kernel().fingerprint_words(_words(a))
    return f"{x:016x}{y:016x}"


def numpy_stats(a: np.ndarray, channel_dim: int | None) -> TensorStats:
    n = a.size
    if n == 0:
        return TensorStats(numel=0, kind=_numpy_kind(a.dtype))
    if a.dtype == np.bool_:
        return bool_stats(int(np.count_nonzero(a)), n)
    if a.dtype.kind == "c":
        return _numpy_complex_stats(a, channel_dim)
    if a.dtype.kind in "iu":
        mn, mx = int(a.min()), int(a.max())
        ad = a.astype(np.float64)
        return TensorStats(numel=n, kind=INT_KIND, min=mn, max=mx, mean=float(ad.mean()), std=float(ad.std()),
                           absmax=max(abs(mn), abs(mx)))
    return _numpy_float_stats(a, channel_dim)


def _numpy_float_stats(a: np.ndarray, channel_dim: int | None) -> TensorStats:
    n = a.size
    # float16 is summed in float32, as torch does; the one compiled pass covers float32/float64
    x = np.ascontiguousarray(a if a.dtype in (np.float32, np.float64) else a.astype(np.float32)).reshape(-1)
    total, sumsq, mn, mx = kernel().moments(x) if x.size >= KERNEL_MIN_ELEMENTS else _small_moments(x)
    return float_stats_from_moments(a, x, total, sumsq, mn, mx, channel_dim)


def float_stats_from_moments(a: np.ndarray, x: np.ndarray, total: float, sumsq: float, mn: float, mx: float,
                             channel_dim: int | None) -> TensorStats:
    """The statistics of float array `a` (`x`: its elements, flat) from one pass's (Σx, Σx², min, max);
    the figures that pass cannot give (non-finite elements, a spread the mean dwarfs) from `a` itself."""
    n = a.size
    if not math.isfinite(total):
        return _numpy_nonfinite_stats(a.astype(np.float64, copy=False) if a.dtype == np.float64
                                      else a.astype(np.float32, copy=False), channel_dim)
    mean = total / n
    var = sumsq / n - mean * mean
    if not math.isfinite(sumsq) or var < CANCELLATION_RATIO * mean * mean:
        xd = x.astype(np.float64)
        var = float(np.mean(np.square(xd - xd.mean())))
    return TensorStats(numel=n, min=mn, max=mx, mean=mean, std=math.sqrt(max(var, 0.0)),
                       absmax=max(abs(mn), abs(mx)), **channel_count(a.shape, channel_dim))


def _small_moments(x: np.ndarray) -> tuple[float, float, float, float]:
    """(Σx, Σx², min, max) of a small flat float array with NumPy (min/max meaningful only if Σx is finite)."""
    xd = x.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        total, sumsq = float(xd.sum()), float(np.dot(xd, xd))
    if not np.isfinite(total):
        return total, sumsq, math.nan, math.nan
    return total, sumsq, float(x.min()), float(x.max())


def _numpy_nonfinite_stats(x: np.ndarray, channel_dim: int | None) -> TensorStats:
    n = x.size
    finite = np.isfinite(x)
    n_finite = int(np.count_nonzero(finite))
    nan = int(np.count_nonzero(np.isnan(x)))
    posinf = int(np.count_nonzero(x == math.inf))
    figures: dict[str, Any] = {}
    if n_finite:
        vals = x[finite].astype(np.float64)
        mn, mx = float(vals.min()), float(vals.max())
        figures = dict(min=mn, max=mx, mean=float(vals.mean()), std=float(vals.std()), absmax=max(abs(mn), abs(mx)))
    return TensorStats(numel=n, nan=nan, posinf=posinf, neginf=n - n_finite - nan - posinf, finite_frac=n_finite / n,
                       **figures, **_channel_analysis(finite, channel_dim))


def _numpy_complex_stats(a: np.ndarray, channel_dim: int | None) -> TensorStats:
    # Magnitude carries the figures; a NaN in either part makes the element non-finite.
    finite = np.isfinite(a.real) & np.isfinite(a.imag)
    mag = _numpy_float_stats(np.abs(a), channel_dim)
    nan = int(np.count_nonzero(np.isnan(a.real) | np.isnan(a.imag)))
    n = a.size
    n_finite = int(np.count_nonzero(finite))
    return TensorStats(**{**asdict(mag), "kind": COMPLEX_KIND, "nan": nan, "posinf": n - n_finite - nan,
                          "neginf": 0, "finite_frac": n_finite / n, "nonfinite_channel_idx": mag.nonfinite_channel_idx})


def _channel_analysis(finite: np.ndarray, channel_dim: int | None) -> dict[str, Any]:
    """Channels entirely / partly non-finite, from a boolean `finite` mask."""
    cd = resolve_channel_dim(finite.shape, channel_dim)
    if cd is None:
        return {}
    per_channel = np.moveaxis(finite, cd, 0).reshape(finite.shape[cd], -1)
    any_finite = per_channel.any(axis=1)
    all_finite = per_channel.all(axis=1)
    dead = np.flatnonzero(~any_finite)
    return {
        "channel_dim": cd,
        "channels": finite.shape[cd],
        "nonfinite_channels": int(dead.size),
        "partial_nonfinite_channels": int(np.count_nonzero(any_finite & ~all_finite)),
        "nonfinite_channel_idx": tuple(int(i) for i in dead[:MAX_CHANNEL_IDX]),
    }


def _numpy_kind(dtype: np.dtype) -> str:
    if dtype == np.bool_:
        return BOOL_KIND
    return {"c": COMPLEX_KIND, "i": INT_KIND, "u": INT_KIND}.get(dtype.kind, FLOAT_KIND)


def _words(a: np.ndarray) -> np.ndarray:
    """The array's bytes as uint32 words (zero-padded to a multiple of 4 bytes)."""
    flat = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
    if flat.size % 4:
        flat = np.concatenate([flat, np.zeros(4 - flat.size % 4, np.uint8)])
    return flat.view(np.uint32)
