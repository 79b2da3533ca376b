"""What can be compared with what, and what the statistics alone prove.

Two records are comparable when their values are of the same kind: float with float (any widths: float16
against float32 is rounding), integer with integer (compared exactly), bool with bool, complex with complex.
A float against the int32 accumulator of an int8 `MatMulInteger`, or a bool mask against a float, is
*not comparable*: its "error" would be an artefact (SNR -95 dB, error gains of 10^7), so such pairs are
listed with both dtypes and never fail, never lead, never feed an error gain.

When a side kept statistics only, `stats_bounds` turns the two statistics into facts about the unseen
difference d = cand - ref (over the elements finite on both sides):

    rms(d) >= sqrt((mean_c - mean_r)^2 + (std_c - std_r)^2)      since mean(d) = Δmean and std(d) >= |Δstd|
    max|d| >= max(|min_c - min_r|, |max_c - max_r|)               the extremes move by at most max|d|

so a relative L2 error of at least rms(d)/rms(ref) is *proven*; whether it is also at most something is
not known (a permutation keeps every statistic). Statistics carry their own rounding (float32 data are
summed in float32 within blocks: ~1e-6 of the RMS for the mean, more for the std when |mean| >> std), which
is subtracted before anything is called proven.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..record import Record
from ..stats import TensorStats

FLOAT, INT, BOOL, COMPLEX = "float", "int", "bool", "complex"
# Relative uncertainty of recorded statistics (of float data: see `stats.torch_backend._float_stats`), per unit of
# rms/std for the std. Measured worst cases: mean 1.6e-7, std 5.7e-6 at rms/std = 30 (float32).
STATS_REL_UNCERTAINTY = 2e-6


def value_kind(rec: Record) -> str:
    """'float', 'int', 'bool' or 'complex', from the record's statistics (else its dtype name)."""
    kind = rec.stats.kind
    if kind in (FLOAT, INT, BOOL, COMPLEX):
        return kind
    d = rec.dtype
    if d == "bool":
        return BOOL
    if d.startswith("complex"):
        return COMPLEX
    return INT if d.startswith(("int", "uint")) else FLOAT


def kinds_agree(r: Record, c: Record) -> bool:
    return value_kind(r) == value_kind(c)


def not_comparable_reason(r: Record, c: Record) -> str:
    return (f"not comparable: {value_kind(r)} {r.dtype} against {value_kind(c)} {c.dtype} "
            "(values of different kinds, e.g. a float output against an int8 kernel's integer accumulator)")


@dataclass(frozen=True)
class StatsBounds:
    """What two records' statistics prove about their difference."""

    nonfinite_differ: bool          # NaN/±Inf counts differ: the two tensors certainly differ
    rel_err_lower: float | None     # proven lower bound on ||cand - ref|| / ||ref|| (None: not computable)
    max_abs_err_lower: float | None
    values_differ: bool | None      # integer/bool statistics differ (exact data differ); None for floats
    reasons: tuple[str, ...]


def rms(s: TensorStats) -> float | None:
    if s.mean is None or s.std is None:
        return None
    return math.sqrt(float(s.mean) ** 2 + float(s.std) ** 2)


def stats_bounds(r: TensorStats, c: TensorStats) -> StatsBounds:
    """Compare two statistics (see the module docstring)."""
    reasons: list[str] = []
    nonfinite = (r.nan, r.posinf, r.neginf) != (c.nan, c.posinf, c.neginf)
    if nonfinite:
        reasons.append(f"NaN/+Inf/-Inf counts {r.nan}/{r.posinf}/{r.neginf} vs {c.nan}/{c.posinf}/{c.neginf} "
                       "(statistics)")
    if r.numel != c.numel:
        reasons.append(f"element counts {r.numel} vs {c.numel}")
    if r.kind in (INT, BOOL) and c.kind in (INT, BOOL):
        differ = any(_num(getattr(r, f)) != _num(getattr(c, f)) for f in ("min", "max", "mean", "std"))
        if differ:
            reasons.append(f"integer values differ (statistics: min {r.min}/{c.min}, max {r.max}/{c.max}, "
                           f"mean {_g(r.mean)}/{_g(c.mean)})")
        return StatsBounds(nonfinite, None, None, differ, tuple(reasons))
    rr = rms(r)
    if rr is None or rms(c) is None:
        return StatsBounds(nonfinite, None, None, None, tuple(reasons))
    d_mean = abs(float(c.mean) - float(r.mean))
    d_std = abs(float(c.std) - float(r.std))
    # the statistics' own rounding, on each side
    slack_mean = 2 * STATS_REL_UNCERTAINTY * max(rr, rms(c) or 0.0)
    slack_std = slack_mean * max(1.0, rr / max(float(r.std), 1e-300))
    mean_part, std_part = max(0.0, d_mean - slack_mean), max(0.0, d_std - slack_std)
    rel = math.sqrt(mean_part ** 2 + std_part ** 2) / rr if rr > 0 else (0.0 if rms(c) == 0 else math.inf)
    ext = [abs(float(c.min) - float(r.min)), abs(float(c.max) - float(r.max))] \
        if None not in (r.min, r.max, c.min, c.max) else []
    max_abs = max(0.0, max(ext) - slack_mean) if ext else None
    return StatsBounds(nonfinite, rel, max_abs, None, tuple(reasons))


def _num(v: object) -> object:
    return round(float(v), 12) if isinstance(v, float) else v


def _g(v: object) -> str:
    return f"{v:.6g}" if isinstance(v, float) else str(v)


__all__ = ["BOOL", "COMPLEX", "FLOAT", "INT", "StatsBounds", "kinds_agree", "not_comparable_reason", "rms",
           "stats_bounds", "value_kind"]
