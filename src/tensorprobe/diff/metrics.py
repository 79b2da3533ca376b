"""Error metrics between a reference tensor and a candidate tensor, in one streaming pass.

One pass over both tensors gathers `Sums` (sufficient statistics accumulated in float64); every metric
is then a small function of those sums, registered in `METRICS`:

    >>> import numpy as np
    >>> r = np.linspace(-1, 1, 1000, dtype=np.float32); c = r * 1.001
    >>> m = compare(r, c)
    >>> round(m["snr_db"], 3), round(m["pearson"], 6), m["max_abs_err"] < 1.01e-3
    (60.0, 1.0, True)

Exactness: each element is widened to float64 before any arithmetic; products and sums are float64,
accumulated in blocks of `_kernel.BLOCK` elements whose partial sums are added pairwise (NumPy), so results agree
with a float64 NumPy computation to ~1e-12 relative even on billions of elements. Float32 sums would
not (a cosine of 1.08 on large tensors). Centered sums use each side's mean (from the record statistics)
as a shift, so Pearson correlation does not suffer cancellation when the mean is large against the spread.

Speed: the pass is a Numba kernel (Numba ships with librosa, a dependency) run over memory-mapped data
with one thread per core; without Numba a chunked NumPy float64 fallback gives the same sums, slower.
Torch tensors are accepted (viewed as NumPy on the CPU); NumPy arrays never import torch.

Angles: with `angle=True` the difference is wrapped into (-π, π] before use (the candidate is treated as
`ref + wrap(cand - ref)`), and elements whose raw difference exceeds π are counted as branch-cut flips.

Non-finite values: an element finite on one side only is total error. The error metrics are then infinite
(SNR -inf, relative and absolute errors inf) and the correlations undefined, whatever the other elements do;
`nonfinite_cand_only` / `nonfinite_ref_only` count the elements non-finite on the candidate side only and on
the reference side only. Elements non-finite on both sides are left out (both runs agree there is no value).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from ..arrays import as_numpy

CHUNK = 1 << 22          # elements converted at a time for dtypes the kernel does not read directly
TWO_PI = 2.0 * math.pi

# Fields of the kernel's per-block partial results, in order.
_SUM_FIELDS = ("n_ref_finite", "n_cand_finite", "n_both", "nonfinite_mismatch", "sum_abs", "s_r", "s_c",
               "s_rr", "s_cc", "s_rc", "s_dd", "raw_s_dd", "flips", "violations")
_MAX_FIELDS = ("max_abs", "max_rel", "raw_max_abs")


@dataclass(frozen=True)
class Sums:
    """Sufficient statistics of one (reference, candidate) pair; every metric is a function of these.

    `s_*` sums are of shifted values (`r - shift_r`, `c - shift_c`); `s_dd` is the squared error (wrapped
    for angles), `raw_*` the unwrapped error, `violations` the count of elements outside `atol + rtol*|r|`.
    """

    n: int
    shift_r: float
    shift_c: float
    n_ref_finite: float = 0.0
    n_cand_finite: float = 0.0
    n_both: float = 0.0
    nonfinite_mismatch: float = 0.0
    sum_abs: float = 0.0
    s_r: float = 0.0
    s_c: float = 0.0
    s_rr: float = 0.0
    s_cc: float = 0.0
    s_rc: float = 0.0
    s_dd: float = 0.0
    raw_s_dd: float = 0.0
    flips: float = 0.0
    violations: float = 0.0
    max_abs: float = 0.0
    max_rel: float = 0.0
    raw_max_abs: float = 0.0

    def energy_ref(self) -> float:
        """Sum of r² over elements finite on both sides (unshifted)."""
        k = self.shift_r
        return self.s_rr + 2 * k * self.s_r + self.n_both * k * k

    def energy_cand(self) -> float:
        k = self.shift_c
        return self.s_cc + 2 * k * self.s_c + self.n_both * k * k

    def dot(self) -> float:
        kr, kc = self.shift_r, self.shift_c
        return self.s_rc + kc * self.s_r + kr * self.s_c + self.n_both * kr * kc


# ---------------------------------------------------------------------------------------------------
# The metric registry: name -> small function of Sums. Returns None when undefined (nothing to compare).

Metric = Callable[[Sums], "float | None"]
METRICS: dict[str, Metric] = {}


def metric(name: str) -> Callable[[Metric], Metric]:
    """Register a metric function under `name` (it then appears in every pair's results)."""
    def deco(fn: Metric) -> Metric:
        METRICS[name] = fn
        return fn
    return deco


@metric("max_abs_err")
def max_abs_err(s: Sums) -> float | None:
    if s.nonfinite_mismatch:
        return math.inf
    return s.max_abs if s.n_both else None


@metric("mean_abs_err")
def mean_abs_err(s: Sums) -> float | None:
    if s.nonfinite_mismatch:
        return math.inf
    return s.sum_abs / s.n_both if s.n_both else None


@metric("max_rel_err")
def max_rel_err(s: Sums) -> float | None:
    """max |c - r| / (|r| + floor), floor = float32 eps x the reference's abs-max (set by the caller)."""
    if s.nonfinite_mismatch:
        return math.inf
    return s.max_rel if s.n_both else None


@metric("rel_l2_err")
def rel_l2_err(s: Sums) -> float | None:
    """||c - r|| / ||r||: the relative error used for error gain (inf when an element is finite on one side
    only: a NaN where the other side has a value is total error)."""
    if s.nonfinite_mismatch:
        return math.inf
    if not s.n_both:
        return None
    e = s.energy_ref()
    if e <= 0:
        return 0.0 if s.s_dd == 0 else math.inf
    return math.sqrt(s.s_dd / e)


@metric("cosine")
def cosine(s: Sums) -> float | None:
    er, ec = s.energy_ref(), s.energy_cand()
    if s.nonfinite_mismatch or not s.n_both or er <= 0 or ec <= 0:
        return None
    return _clip1(s.dot() / math.sqrt(er * ec))


@metric("pearson")
def pearson(s: Sums) -> float | None:
    n = s.n_both
    if n < 2 or s.nonfinite_mismatch:
        return None   # undefined: a value against no value has no correlation
    vr = s.s_rr - s.s_r * s.s_r / n
    vc = s.s_cc - s.s_c * s.s_c / n
    if vr <= 0 or vc <= 0:
        return None  # a constant side: correlation undefined
    return _clip1((s.s_rc - s.s_r * s.s_c / n) / math.sqrt(vr * vc))


@metric("snr_db")
def snr_db(s: Sums) -> float | None:
    """10·log10(reference energy / error energy); +inf for identical tensors, -inf when an element is finite
    on one side only."""
    if s.nonfinite_mismatch:
        return -math.inf
    if not s.n_both:
        return None
    e = s.energy_ref()
    if s.s_dd == 0:
        return math.inf
    if e <= 0:
        return -math.inf
    return 10.0 * math.log10(e / s.s_dd)


@metric("ref_finite_frac")
def ref_finite_frac(s: Sums) -> float | None:
    return s.n_ref_finite / s.n if s.n else None


@metric("cand_finite_frac")
def cand_finite_frac(s: Sums) -> float | None:
    return s.n_cand_finite / s.n if s.n else None


@metric("nonfinite_cand_only")
def nonfinite_cand_only(s: Sums) -> float | None:
    """Elements finite in the reference and not in the candidate (NaN/Inf on the candidate side only)."""
    return float(s.n_ref_finite - s.n_both) if s.n else None


@metric("nonfinite_ref_only")
def nonfinite_ref_only(s: Sums) -> float | None:
    """Elements finite in the candidate and not in the reference."""
    return float(s.n_cand_finite - s.n_both) if s.n else None


def _clip1(x: float) -> float:
    return max(-1.0, min(1.0, x))


# ---------------------------------------------------------------------------------------------------
# The pass

def accumulate(ref: Any, cand: Any, *, shift_r: float = 0.0, shift_c: float = 0.0, floor: float = 1e-30,
               atol: float = math.inf, rtol: float = 0.0, angle: bool = False) -> Sums:
    """One pass over `ref` and `cand` (torch tensors or NumPy arrays of equal element count).

    Args:
        shift_r, shift_c: values subtracted before centered sums (each side's mean is best).
        floor: added to |r| in the denominator of the relative error.
        atol, rtol: elements with |c - r| > atol + rtol·|r| are counted as violations.
        angle: compare modulo 2π.
    """
    r, c = _flat(ref), _flat(cand)
    if r.size != c.size:
        raise ValueError(f"element counts differ: {r.size} vs {c.size}")
    n = r.size
    kernel = _kernel() if n >= KERNEL_MIN_ELEMENTS else None   # small pairs: NumPy, without importing Numba
    direct = kernel is not None and r.dtype in _DIRECT and c.dtype in _DIRECT
    step = max(n, 1) if direct else CHUNK
    run = kernel if kernel is not None else _numpy_pass
    acc = _Acc()
    for lo in range(0, n, step):
        acc.add(*run(_readable(r[lo:lo + step]), _readable(c[lo:lo + step]),
                     float(shift_r), float(shift_c), float(floor), float(atol), float(rtol), bool(angle)))
    return acc.result(n, shift_r, shift_c)


def compare(ref: Any, cand: Any, **kw: Any) -> dict[str, float | None]:
    """All registered metrics for one pair (convenience over `accumulate` + `METRICS`)."""
    s = accumulate(ref, cand, **kw)
    return {name: fn(s) for name, fn in METRICS.items()}


def evaluate(s: Sums) -> dict[str, float | None]:
    return {name: fn(s) for name, fn in METRICS.items()}


class _Acc:
    def __init__(self) -> None:
        self.sums = np.zeros(len(_SUM_FIELDS), np.float64)
        self.maxes = np.zeros(len(_MAX_FIELDS), np.float64)

    def add(self, sums: np.ndarray, maxes: np.ndarray) -> None:
        self.sums += sums
        self.maxes = np.fmax(self.maxes, maxes)

    def result(self, n: int, shift_r: float, shift_c: float) -> Sums:
        vals = dict(zip(_SUM_FIELDS, (float(v) for v in self.sums)))
        vals.update(zip(_MAX_FIELDS, (float(v) for v in self.maxes)))
        return Sums(n=n, shift_r=shift_r, shift_c=shift_c, **vals)


def _flat(x: Any) -> np.ndarray:
    """A flat NumPy view of `x` (complex as interleaved real/imaginary parts); torch tensors go to the CPU."""
    a = np.ascontiguousarray(as_numpy(x))
    if a.dtype.kind == "c":
        a = a.view(a.real.dtype)
    return a.reshape(-1)


_DIRECT = (np.dtype(np.float32), np.dtype(np.float64))


def _readable(a: np.ndarray) -> np.ndarray:
    """`a` itself (no copy) for float32/float64; other dtypes are widened chunk by chunk."""
    if a.dtype not in _DIRECT:
        a = a.astype(np.float64 if a.dtype in (np.int64, np.int32, np.uint32, np.uint64) else np.float32)
    return a


_KERNEL: Any = False
KERNEL_MIN_ELEMENTS = 1 << 16


def _kernel() -> Any:
    """The compiled Numba kernel, or None when Numba is unavailable (torch fallback)."""
    global _KERNEL
    if _KERNEL is False:
        try:
            from ._kernel import pair_pass
            _KERNEL = pair_pass
        except Exception:  # numba missing or unable to compile on this platform
            _KERNEL = None
    return _KERNEL


def _numpy_pass(r: np.ndarray, c: np.ndarray, shift_r: float, shift_c: float, floor: float,
                atol: float, rtol: float, angle: bool) -> tuple[np.ndarray, np.ndarray]:
    """Same sums as the Numba kernel, with NumPy float64 ops on the chunk (fallback and cross-check)."""
    rd, cd = r.astype(np.float64), c.astype(np.float64)
    fr, fc = np.isfinite(rd), np.isfinite(cd)
    both = fr & fc
    rd, cd = rd[both], cd[both]
    raw = cd - rd
    d = raw - TWO_PI * np.round(raw / TWO_PI) if angle else raw
    ad = np.abs(d)
    rr, cc = rd - shift_r, rd + d - shift_c
    viol = np.count_nonzero(ad > atol + rtol * np.abs(rd))
    sums = [fr.sum(), fc.sum(), both.sum(), (fr != fc).sum(), ad.sum(), rr.sum(), cc.sum(), (rr * rr).sum(),
            (cc * cc).sum(), (rr * cc).sum(), (d * d).sum(), (raw * raw).sum(),
            np.count_nonzero(np.abs(raw) > math.pi) if angle else 0, viol]
    maxes = [ad.max() if ad.size else 0.0, (ad / (np.abs(rd) + floor)).max() if ad.size else 0.0,
             np.abs(raw).max() if ad.size else 0.0]
    return np.array([float(v) for v in sums], np.float64), np.array([float(v) for v in maxes], np.float64)
