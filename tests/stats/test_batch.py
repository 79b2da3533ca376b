"""`float_stats_many`: the statistics of arrays sharing one buffer, in one compiled call, equal to what
`compute_stats` gives each array as a torch tensor (the compiled pass at every size; NumPy arrays under
64K elements are summed in float64 instead), whatever the sizes, dtypes, placement and non-finite values."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorprobe.stats import compute_stats
from tensorprobe.stats import batch
from tensorprobe.stats.batch import float_stats_many


def _pooled(shapes, dtype, rng, nan_at=()):
    """Arrays of `shapes` placed 64-byte aligned in one byte buffer, as `_OutputPool` places a run's outputs."""
    sizes = [int(np.prod(s)) * np.dtype(dtype).itemsize for s in shapes]
    offsets = np.cumsum([0] + [-(-n // 64) * 64 for n in sizes])
    buf = np.empty(int(offsets[-1]) + 64, np.uint8)
    out = []
    for k, (shape, off, n) in enumerate(zip(shapes, offsets, sizes)):
        a = buf[off:off + n].view(dtype).reshape(shape)
        a[...] = rng.standard_normal(shape) * (10.0 ** rng.integers(-3, 4)) + rng.integers(-2, 3)
        if k in nan_at and a.size:
            a.reshape(-1)[rng.integers(a.size)] = np.nan
        out.append(a)
    return out


def _reference(a):
    return compute_stats(torch.from_numpy(np.ascontiguousarray(a)))


def _same(got, want):
    """Equal, but for the figures that bypass the one pass (a non-finite array's masked reductions, the
    two-pass variance of a spread its mean dwarfs), which NumPy and torch round apart: those to 1e-12."""
    for f in got.__dataclass_fields__:
        x, y = getattr(got, f), getattr(want, f)
        if not (x == y or (isinstance(x, float) and math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-300))):
            return False
    return True


@settings(deadline=None)
@given(st.lists(st.lists(st.integers(1, 40), min_size=1, max_size=3), min_size=1, max_size=12),
       st.sampled_from([np.float32, np.float64]), st.integers(0, 2**31 - 1))
def test_equals_compute_stats_of_each_array(shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    arrays = _pooled([tuple(s) for s in shapes], dtype, rng, nan_at=(0, 3))
    got = float_stats_many(arrays)
    assert all(_same(g, _reference(a)) for g, a in zip(got, arrays))
    assert [g.nan for g in got] == [int(np.isnan(a).sum()) for a in arrays]


def test_large_runs_split_over_threads_give_the_same_figures(monkeypatch):
    rng = np.random.default_rng(1)
    arrays = _pooled([(1, 64, 20000), (3, 7), (1, 8, 50000), (1, 1000), (2, 300000)], np.float32, rng, nan_at=(2,))
    one_thread = float_stats_many(arrays)
    monkeypatch.setattr(batch, "_threads", lambda: 4)
    calls = []
    real = batch._pool

    def counting_pool():
        calls.append(1)
        return real()
    monkeypatch.setattr(batch, "_pool", counting_pool)
    got = float_stats_many(arrays)
    assert calls, "a run of 1.8M elements is split over threads"
    assert got == one_thread
    assert all(_same(g, _reference(a)) for g, a in zip(got, arrays))
    assert got[2].nan == 1 and got[2].partial_nonfinite_channels == 1


def test_arrays_it_does_not_batch_are_none():
    base = np.arange(40, dtype=np.float32)
    arrays = [base[::2], np.arange(5), np.ones(3, np.float16), np.empty((0, 3), np.float32), np.ones((2, 2), bool),
              base[:4]]
    got = float_stats_many(arrays)
    assert got[:5] == [None] * 5
    assert got[5] == _reference(base[:4])


def test_separate_arrays_and_misaligned_views_are_each_reduced_alone():
    raw = np.arange(64, dtype=np.uint8)
    odd = raw[1:9].view(np.float32)        # a view at an offset that is not a multiple of 4 from its neighbour
    even = raw[16:24].view(np.float32)
    own = np.linspace(-1, 1, 7)
    got = float_stats_many([odd, even, own])
    assert got == [_reference(odd), _reference(even), _reference(own)]
