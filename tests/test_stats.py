import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from tensorprobe.stats import TensorStats, compute_stats


def test_finite_float_matches_numpy():
    x = torch.randn(3, 5, 7, dtype=torch.float64)
    s = compute_stats(x)
    a = x.numpy()
    assert s.all_finite and s.finite_frac == 1.0
    assert s.min == pytest.approx(a.min()) and s.max == pytest.approx(a.max())
    assert s.mean == pytest.approx(a.mean()) and s.std == pytest.approx(a.std())
    assert s.absmax == pytest.approx(np.abs(a).max())
    assert s.channels == 5 and s.nonfinite_channels == 0


def test_exactly_ten_of_256_channels_nonfinite():
    x = torch.randn(1, 256, 50)
    dead = [3, 17, 40, 41, 99, 128, 200, 201, 250, 255]
    x[0, dead] = float("nan")
    x[0, 7, 10] = float("inf")  # one partly broken channel
    s = compute_stats(x)
    assert s.nonfinite_channels == 10
    assert s.partial_nonfinite_channels == 1
    assert list(s.nonfinite_channel_idx) == dead
    assert s.nan == 10 * 50 and s.posinf == 1 and s.neginf == 0
    assert s.finite_frac == pytest.approx(246 / 256 - 1 / (256 * 50))
    assert "10 of 256 channels entirely non-finite" in s.channel_pattern()
    # figures cover the finite elements only
    finite = x[torch.isfinite(x)]
    assert s.max == pytest.approx(float(finite.max()))


def test_neg_inf_counted():
    s = compute_stats(torch.tensor([1.0, -math.inf, -math.inf, math.nan]))
    assert (s.nan, s.posinf, s.neginf) == (1, 0, 2)
    assert s.min == 1.0 and s.max == 1.0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reduced_precision(dtype):
    x = torch.full((2, 4, 8), 3.0, dtype=dtype)
    x[0, 2, 0] = float("nan")
    s = compute_stats(x)
    assert s.nan == 1 and s.partial_nonfinite_channels == 1 and s.nonfinite_channels == 0
    assert s.max == 3.0


def test_int_bool_complex_empty():
    si = compute_stats(torch.tensor([[1, 5], [-3, 2]]))
    assert si.kind == "int" and (si.min, si.max, si.absmax) == (-3, 5, 5) and si.mean == pytest.approx(1.25)
    sb = compute_stats(torch.tensor([True, False, True, True]))
    assert sb.kind == "bool" and sb.mean == 0.75
    c = torch.tensor([3 + 4j, complex(float("nan"), 0)], dtype=torch.complex64)
    sc = compute_stats(c)
    assert sc.kind == "complex" and sc.nan == 1 and sc.max == pytest.approx(5.0)
    se = compute_stats(torch.empty(0, 3))
    assert se.numel == 0 and se.all_finite and se.min is None


def test_overflowing_squares_still_give_finite_std():
    s = compute_stats(torch.tensor([3e38, -3e38], dtype=torch.float32))
    assert s.all_finite and math.isfinite(s.std) and s.std == pytest.approx(3e38, rel=1e-6)


def test_roundtrip_dict_with_nonfinite_figures():
    s = compute_stats(torch.tensor([float("nan")] * 4).reshape(1, 4, 1))
    d = s.to_dict()
    assert TensorStats.from_dict(d) == s


@settings(max_examples=60, deadline=None)
@given(arrays(np.float32, st.tuples(st.integers(1, 4), st.integers(1, 6), st.integers(1, 5)),
              elements=st.one_of(st.floats(-1e6, 1e6, width=32), st.just(np.nan), st.just(np.inf), st.just(-np.inf))))
def test_counts_match_numpy(a):
    s = compute_stats(a)
    assert s.nan == int(np.isnan(a).sum())
    assert s.posinf == int(np.isposinf(a).sum()) and s.neginf == int(np.isneginf(a).sum())
    dead = (~np.isfinite(a)).reshape(a.shape[0], a.shape[1], -1).transpose(1, 0, 2).reshape(a.shape[1], -1).all(1)
    if a.shape[1] > 1:
        assert s.nonfinite_channels == int(dead.sum())
    fin = a[np.isfinite(a)]
    if fin.size:
        assert s.min == pytest.approx(float(fin.min())) and s.max == pytest.approx(float(fin.max()))


def test_std_of_a_large_tensor_is_exact_to_float32_rounding():
    # One float32 vector_norm over 16M elements is off by ~1e-3; the std must not inherit that.
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 64, (1 << 18) + 123, generator=g) * 3 + 0.5
    ref = x.double()
    s = compute_stats(x)
    assert s.std == pytest.approx(ref.std(unbiased=False).item(), rel=1e-6)
    assert s.mean == pytest.approx(ref.mean().item(), rel=1e-6)


@settings(max_examples=60, deadline=None)
@given(arrays(dtype=st.sampled_from([np.float32, np.float64]), shape=st.integers(1, 9000),
              elements=st.floats(-2.0**50, 2.0**50, width=32)))
def test_fused_pass_matches_float64_reference(a):
    s = compute_stats(a)
    ref = a.astype(np.float64)
    assert (s.min, s.max) == (float(ref.min()), float(ref.max()))
    assert s.mean == pytest.approx(float(ref.mean()), rel=1e-5, abs=1e-5 * float(np.abs(ref).max()))
    assert s.absmax == float(np.abs(ref).max())


def test_non_contiguous_and_half_tensors_take_the_torch_path_with_the_same_figures():
    x = torch.randn(64, 300, generator=torch.Generator().manual_seed(1))
    a, b, c = compute_stats(x), compute_stats(x.t()), compute_stats(x.double())
    assert (a.min, a.max) == (b.min, b.max) and a.std == pytest.approx(b.std, rel=1e-6)
    assert c.std == pytest.approx(a.std, rel=1e-6)
    h = compute_stats(x.half())
    assert h.std == pytest.approx(a.std, rel=1e-3)


_DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8, np.bool_, np.complex64]
_SHAPES = st.tuples(st.integers(0, 3), st.integers(1, 6), st.integers(1, 40))
# magnitudes whose sums do not overflow (an overflowing sum is its own story), plus NaN and ±Inf
_FLOATS = st.floats(-1e4, 1e4, width=16) | st.sampled_from([float("nan"), float("inf"), -float("inf")])


@st.composite
def _arrays(draw):
    dtype = draw(st.sampled_from(_DTYPES))
    elements = _FLOATS if np.dtype(dtype).kind in "fc" else None
    return draw(arrays(dtype, _SHAPES, elements=elements))


@settings(max_examples=200, deadline=None)
@given(_arrays())
def test_numpy_and_torch_backends_give_the_same_statistics(a):
    """Bundles and ports' .npz dumps are read with the NumPy backend, captures use torch: both must agree."""
    from dataclasses import asdict

    s_np = compute_stats(a)
    s_t = compute_stats(torch.from_numpy(a.copy()))
    exact = ("numel", "kind", "nan", "posinf", "neginf", "channel_dim", "channels", "nonfinite_channels",
             "partial_nonfinite_channels", "nonfinite_channel_idx", "finite_frac")
    d_np, d_t = asdict(s_np), asdict(s_t)
    assert {k: d_np[k] for k in exact} == {k: d_t[k] for k in exact}
    for k in ("min", "max", "mean", "std", "absmax"):
        x, y = d_np[k], d_t[k]
        assert (x is None) == (y is None), k
        if x is not None:
            tol = 1e-3 if a.dtype in (np.float16, np.complex64) else 1e-5
            assert x == pytest.approx(y, rel=tol, abs=tol * (1 + abs(d_t["absmax"] or 0))), k


@pytest.mark.parametrize("n", [1000, 70_000])    # NumPy's reductions below KERNEL_MIN_ELEMENTS, Numba above
def test_small_and_large_arrays_take_the_same_figures(n, monkeypatch):
    from tensorprobe.stats import core

    a = np.random.default_rng(n).standard_normal((2, 5, n // 10)).astype(np.float32) + 3.0
    s = compute_stats(a)
    monkeypatch.setattr(core, "KERNEL_MIN_ELEMENTS", 0 if n < core.KERNEL_MIN_ELEMENTS else 10**12)
    from tensorprobe.stats import numpy_backend
    monkeypatch.setattr(numpy_backend, "KERNEL_MIN_ELEMENTS", core.KERNEL_MIN_ELEMENTS)
    other = compute_stats(a)
    assert (s.min, s.max) == (other.min, other.max)
    assert s.mean == pytest.approx(other.mean, rel=1e-6) and s.std == pytest.approx(other.std, rel=1e-5)


def test_reading_statistics_of_arrays_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, numpy as np; from tensorprobe.stats import compute_stats, tensor_digest; "
            "x = np.ones((1, 4, 3), np.float32); x[0, 1] = np.nan; s = compute_stats(x); tensor_digest(x); "
            "assert (s.nan, s.nonfinite_channel_idx) == (3, (1,)), s; assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("dtype", ["uint16", "uint32", "uint64"])
def test_wide_unsigned_integers_have_statistics(dtype):
    """torch has no min/max kernel for uint16-64 (an ONNX model's uint16 output failed its capture); their
    statistics are those of the same values as int64, and NumPy's backend agrees."""
    values = np.array([3, 7, 65000, 0], dtype=dtype)
    got = compute_stats(torch.from_numpy(values))
    assert (got.kind, got.min, got.max, got.mean, got.numel) == ("int", 0, 65000, 65010 / 4, 4)
    assert compute_stats(values).to_dict() == got.to_dict()
