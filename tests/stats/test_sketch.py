"""Sketches (stats/sketch.py): 8 signed sums of hashed elements that see what full-tensor statistics cannot
(a permutation, a kernel reversed in time) and estimate the error between two statistics-only captures."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tensorprobe.stats import TensorStats, compute_stats
from tensorprobe.stats.sketch import BLOCK, estimate_rel_err


def _sumsq(x: np.ndarray) -> float:
    return float((x.astype(np.float64) ** 2).sum())


@pytest.mark.parametrize("shape", [(7,), (2, 16, 64), (3, BLOCK + 5), (5, 300_001)])
def test_both_backends_give_the_same_projections(shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    a = compute_stats(x, sketch=True).sketch
    b = compute_stats(torch.from_numpy(x), sketch=True).sketch
    assert a is not None and len(a) == 8
    assert np.allclose(a, b, rtol=0, atol=1e-6 * np.sqrt(_sumsq(x)))


@pytest.mark.parametrize("n", [64 * 16, BLOCK * 3 + 11, 400_000])
def test_the_estimate_follows_the_true_error_whatever_its_structure(n):
    rng = np.random.default_rng(n)
    x = rng.standard_normal(n).astype(np.float32)
    diffs = {"noise": rng.standard_normal(n) * 1e-3, "offset": np.full(n, 1e-3),   # a constant offset: every
             "one element": np.eye(1, n, n // 2)[0] * 0.3}                             # row alike (biased if periodic)
    for what, d in diffs.items():
        y = (x + d).astype(np.float32)
        true = float(np.linalg.norm(y.astype(np.float64) - x) / np.sqrt(_sumsq(x)))
        est = estimate_rel_err(compute_stats(x, sketch=True).sketch, compute_stats(y, sketch=True).sketch, _sumsq(x))
        assert true / 3 < est < true * 3, (what, est, true)


def test_a_permutation_keeps_every_statistic_but_not_the_sketch():
    x = np.random.default_rng(2).standard_normal((1, 16, 64)).astype(np.float32)
    swapped, flipped = x[:, [1, 0, *range(2, 16)]], x[..., ::-1].copy()
    a = compute_stats(x, sketch=True)
    for y in (swapped, flipped):
        b = compute_stats(y, sketch=True)
        assert (a.min, a.max, a.mean) == (b.min, b.max, b.mean)
        true = float(np.linalg.norm(y - x) / np.linalg.norm(x))
        assert estimate_rel_err(a.sketch, b.sketch, _sumsq(x)) > true / 3 > 0.1


def test_identical_values_estimate_zero_and_half_precision_is_read_exactly():
    x = torch.randn(4, 33, 70)
    assert estimate_rel_err(compute_stats(x, sketch=True).sketch, compute_stats(x.clone(), sketch=True).sketch,
                            float((x.double() ** 2).sum())) == 0.0
    h = x.half()
    assert np.allclose(compute_stats(h, sketch=True).sketch, compute_stats(h.float().numpy(), sketch=True).sketch)


def test_only_finite_float_values_get_one_and_it_survives_the_manifest():
    assert compute_stats(torch.tensor([1.0, float("nan"), 2.0]), sketch=True).sketch is None
    assert compute_stats(torch.arange(10), sketch=True).sketch is None
    assert compute_stats(torch.randn(8)).sketch is None                 # only when asked: a capture asks
    s = compute_stats(torch.randn(3, 5), sketch=True)
    assert TensorStats.from_dict(s.to_dict()) == s
    assert "sketch" not in compute_stats(torch.randn(3)).to_dict()


@pytest.mark.parametrize("n", [50, BLOCK * 2 + 7])
def test_the_device_path_gives_the_numpy_figures(n):
    """The torch computation a CUDA value takes (run here on the CPU) equals the NumPy one."""
    from tensorprobe.stats.sketch import numpy_sketch, torch_sketch as _on_device

    x = torch.randn(n, dtype=torch.float64)
    assert np.allclose(_on_device(x), numpy_sketch(x.numpy()), rtol=1e-9, atol=1e-9)
    x32 = x.float()
    assert np.allclose(_on_device(x32), numpy_sketch(x32.numpy()), rtol=0, atol=1e-5 * float(x.norm()))


def test_the_statistics_pass_makes_the_same_sketch_and_uses_the_kernels_block():
    """A contiguous float CPU tensor gets its sketch from the compiled statistics pass (one read)."""
    from tensorprobe.stats import _kernel
    from tensorprobe.stats.sketch import numpy_sketch

    assert BLOCK == _kernel.BLOCK
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(3, 70_001, dtype=dtype)
        fused = compute_stats(x, sketch=True).sketch
        assert np.allclose(fused, numpy_sketch(x.reshape(-1).numpy()), rtol=0, atol=1e-6 * float(x.norm()))
        assert np.allclose(fused, compute_stats(x[:, ::1].T.contiguous().T, sketch=True).sketch)  # strided: torch
