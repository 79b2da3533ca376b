"""The one-pass metrics against a float64 NumPy computation, on random and large data."""

import math

import numpy as np
import pytest
import torch

from tensorprobe.diff import metrics as M
from tensorprobe.diff.db import db_error
from tensorprobe.diff.explain import sigmoid_gain
from tensorprobe.stats import compute_stats


def reference(r, c):
    """The obvious float64 NumPy computation (one pass per metric)."""
    r, c = r.astype(np.float64).ravel(), c.astype(np.float64).ravel()
    d = c - r
    return {
        "max_abs_err": np.abs(d).max(), "mean_abs_err": np.abs(d).mean(),
        "cosine": float(r @ c / math.sqrt((r @ r) * (c @ c))), "pearson": float(np.corrcoef(r, c)[0, 1]),
        "snr_db": 10 * math.log10((r @ r) / (d @ d)), "rel_l2_err": math.sqrt((d @ d) / (r @ r)),
    }


def check(r, c, rtol=1e-10, **kw):
    got = M.compare(r, c, shift_r=float(r.mean()), shift_c=float(c.mean()), floor=1e-30, **kw)
    for k, v in reference(r, c).items():
        assert got[k] == pytest.approx(v, rel=rtol), k
    return got


@pytest.mark.parametrize("offset,scale", [(0.0, 1e-3), (100.0, 1e-5), (-3.0, 1.0)])
def test_random_float32_matches_float64_numpy(offset, scale):
    g = np.random.default_rng(1)
    r = (g.standard_normal(300_001) + offset).astype(np.float32)
    c = (r + scale * g.standard_normal(r.size)).astype(np.float32)
    check(r, c)


def test_large_tensor_exact_where_float32_sums_are_not():
    # 2^24 elements with a large mean: float32 accumulation drifts; the float64 block sums do not.
    g = np.random.default_rng(2)
    n = 1 << 24
    r = (1000.0 + g.standard_normal(n, dtype=np.float32))
    c = r + np.float32(1e-3) * g.standard_normal(n, dtype=np.float32)
    got = check(r, c, rtol=1e-9)
    assert got["cosine"] <= 1.0


def test_numpy_fallback_gives_the_same_sums(monkeypatch):
    g = np.random.default_rng(3)
    r = g.standard_normal(50_000).astype(np.float32)
    c = r + 1e-4 * g.standard_normal(r.size).astype(np.float32)
    c[7] = np.nan
    monkeypatch.setattr(M, "KERNEL_MIN_ELEMENTS", 0)   # the compiled pass even for small pairs
    assert M._kernel() is not None
    fast = M.compare(r, c, floor=1e-30)
    monkeypatch.setattr(M, "_KERNEL", None)
    slow = M.compare(r, c, floor=1e-30)
    assert fast.keys() == slow.keys()
    for k, v in slow.items():
        # None: undefined with a non-finite element (an output holding NaN has no cosine or Pearson)
        assert fast[k] == v if v is None else fast[k] == pytest.approx(v, rel=1e-10), k
    assert slow["cosine"] is None and slow["pearson"] is None


@pytest.mark.parametrize("n", [1, 2047, 2049, 70_001, 3_000_000])  # sub-block, block and thread edges
def test_vectorized_finite_path_matches_the_numpy_pass(monkeypatch, n):
    g = np.random.default_rng(n)
    r = g.standard_normal(n).astype(np.float32)
    r[::5] = 0.0  # relative error over exact zeros: the floor decides
    c = r + (1e-3 * g.standard_normal(n)).astype(np.float32)
    kw = dict(floor=1e-6, atol=1e-3, rtol=1e-2, shift_r=0.1, shift_c=-0.2)
    monkeypatch.setattr(M, "KERNEL_MIN_ELEMENTS", 0)   # the compiled pass even for small pairs
    fast = M.accumulate(r, c, **kw)
    monkeypatch.setattr(M, "_KERNEL", None)
    slow = M.accumulate(r, c, **kw)
    assert fast.violations == slow.violations and (n < 100 or fast.violations > 0)
    assert (fast.max_abs, fast.max_rel) == (slow.max_abs, slow.max_rel)
    got = M.evaluate(fast)
    for k, v in M.evaluate(slow).items():
        assert got[k] == v if v is None else got[k] == pytest.approx(v, rel=1e-10), k  # None: undefined for n=1


def test_an_element_finite_on_one_side_only_is_total_error():
    """The other eight elements agree exactly: metrics over them alone would say SNR inf, correlation 1."""
    r = np.arange(1, 11, dtype=np.float32)
    c = r.copy()
    c[2] = np.nan
    c[5] = np.inf
    s = M.accumulate(r, c, floor=1e-30)
    assert s.nonfinite_mismatch == 2 and s.n_both == 8
    m = M.evaluate(s)
    assert m["cand_finite_frac"] == pytest.approx(0.8) and m["ref_finite_frac"] == 1.0
    assert m["nonfinite_cand_only"] == 2 and m["nonfinite_ref_only"] == 0
    assert m["snr_db"] == -math.inf and m["rel_l2_err"] == math.inf and m["max_abs_err"] == math.inf
    assert m["pearson"] is None and m["cosine"] is None
    back = M.evaluate(M.accumulate(c, r, floor=1e-30))          # the other way round: the reference's side
    assert back["nonfinite_ref_only"] == 2 and back["nonfinite_cand_only"] == 0 and back["snr_db"] == -math.inf


def test_non_finite_on_both_sides_at_the_same_places_is_left_out():
    r = np.arange(1, 11, dtype=np.float32)
    r[3] = np.nan
    m = M.compare(r, r.copy())
    assert m["snr_db"] == math.inf and m["nonfinite_cand_only"] == 0 and m["nonfinite_ref_only"] == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int32])
def test_other_dtypes(dtype):
    r = torch.arange(-500, 500).to(dtype)
    c = (r.double() * 1.01).to(dtype)
    got = M.compare(r, c, floor=1e-30)
    want = reference(r.double().numpy(), c.double().numpy())
    assert got["snr_db"] == pytest.approx(want["snr_db"], rel=1e-9)


def test_complex_compared_as_real_pairs():
    r = torch.randn(100, dtype=torch.complex64)
    got = M.compare(r, r * 1.001)
    assert got["snr_db"] == pytest.approx(60.0, abs=1e-3)


def test_angles_wrap_and_count_flips():
    r = np.array([3.14, -3.14, 0.5, 1.0], np.float64)
    c = np.array([-3.14, 3.14, 0.5, 1.0], np.float64)  # same angles across the branch cut (±π)
    s = M.accumulate(r, c, angle=True, floor=1e-30)
    assert s.flips == 2
    assert M.evaluate(s)["max_abs_err"] == pytest.approx(2 * math.pi - 6.28, abs=1e-9)
    assert s.raw_max_abs == pytest.approx(6.28)


def test_allclose_violations_counted():
    r = np.ones(10, np.float32)
    c = r.copy()
    c[:3] += 1e-3
    s = M.accumulate(r, c, atol=1e-5, rtol=1e-4, floor=1e-30)
    assert s.violations == 3


def test_metric_registry_is_extensible():
    M.metric("energy_ratio_test")(lambda s: s.energy_cand() / s.energy_ref())
    try:
        assert M.compare(np.ones(4), 2 * np.ones(4))["energy_ratio_test"] == pytest.approx(4.0)
    finally:
        del M.METRICS["energy_ratio_test"]


def test_db_error_like_seed_004():
    r = torch.tensor([1.0, 10.0, 100.0])
    d = db_error(r, r * 10 ** (1 / 20), "mag")  # every bin 1 dB louder
    assert (d.mean_abs_db, d.median_abs_db, d.max_abs_db) == pytest.approx((1.0, 1.0, 1.0))
    logmel = torch.log(r)
    assert db_error(logmel, logmel + 0.1, "auto").scale == "mag"  # all >= 0 here
    neg = -logmel - 1
    assert db_error(neg, neg + 0.1).scale == "ln"


def test_the_sigmoid_gain_counts_only_what_the_output_can_show():
    """A pitch classifier's logits reach −2,000, where σ underflows to 0 and carries no error: the gain for the
    whole tensor's relative error is bounded by 0.224/rms(σ), not by the most negative logit."""
    rng = np.random.default_rng(0)
    logits = np.concatenate([rng.uniform(-2000, -20, 350), rng.uniform(-2, 2, 10)]).astype(np.float32)
    probs = 1 / (1 + np.exp(-logits.astype(np.float64)))
    x, y = compute_stats(logits), compute_stats(probs)
    bound = 0.224 / math.sqrt(float(np.mean(probs ** 2)))
    assert sigmoid_gain(x) > 1000                       # the input alone: the tail's |x|
    assert sigmoid_gain(x, y) == pytest.approx(bound, rel=1e-3)
    # measured: a relative error e of the logits, element by element, moves the output by at most gain·e
    e = 1e-3
    moved = 1 / (1 + np.exp(-(logits.astype(np.float64) * (1 + e))))
    assert np.linalg.norm(moved - probs) / np.linalg.norm(probs) <= sigmoid_gain(x, y) * e
    # a single probability after a logit of −7 (Silero's case): the tail's own bound, |x|·(1 − σ(x)), is the tighter
    one = np.array([-7.0], np.float32)
    assert sigmoid_gain(compute_stats(one), compute_stats(1 / (1 + np.exp(-one)))) == pytest.approx(7.0, rel=1e-2)
