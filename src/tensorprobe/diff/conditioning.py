"""How much error a normalization passes on, measured on the values rather than bounded from statistics.

A normalization divides each group of its input by that group's own spread, so its conditioning depends on
groups the statistics of the whole tensor do not show: `explain.predicted_gain` bounds it by
max|x|/sqrt(eps) (hundreds), and a norm whose own arithmetic changed (an eps of 1e-1 for 1e-5, a variance
computed another way) read "amplified rounding". With both sides' input and output kept, the error the norm
inherits can be computed: for each group g of the input, the error of the normalized group to first order is
the centred input error against the centred input, ||c(δx_g)|| / ||c(x_g)||, plus the norm's own rounding
through the group's conditioning (u·E[x²]/var: a silent channel on an offset); summed over groups, weighted
by their share of the output. The norm's grouping is not recorded (LayerNorm: the last dims; InstanceNorm: each
channel over time; GroupNorm: channel groups), so every plausible grouping is tried and the largest kept:
what a norm does to its input error can be no worse than that, twice over (the variance's own error).

    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=(1, 8, 100))
    >>> dx = 1e-4 * np.random.default_rng(1).normal(size=x.shape)
    >>> y = (x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True)
    >>> 0.5e-4 < inherited_norm_error(x, x + dx, y) < 1e-3
    True
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from ..environment import UNIT_ROUNDOFF
from ..record import TAG_INPUTS_UNRECORDED, Record
from .explain import family
from .noise import CAUSE_AMPLIFIED, CAUSE_OWN, LOCAL_UNITS, OWN_MARGIN
from .result import TAG_NORM_MEASURED, PairResult

VARIANCE_TERM = 2.0      # the variance's own error adds at most as much as the centred input's, to first order
ROUNDING_CAP = 1e6       # a constant group's rounding term (its spread is zero): large, finite


def inherited_norm_error(x_ref: np.ndarray, x_cand: np.ndarray, y_ref: np.ndarray,
                         gamma_rms: float = 1.0, unit: float = 2.0 ** -24) -> float | None:
    """The relative error a normalization of `x_ref` passes on when its input is `x_cand` instead, plus its
    own rounding (`unit`) through each group's conditioning (first order, the largest over the plausible
    groupings, the variance's term included); None when the values do not allow it (shapes differ,
    non-finite values, a silent output).

    The rounding term: a variance computed as E[x²] − E[x]² (a one-pass kernel) is off by ~u·E[x²] summed
    over the group, so a group whose mean dwarfs its spread (a silent channel riding on an offset) comes out
    with its σ off by u·E[x²]/var: that is the port's rounding, amplified, not a change of its own."""
    if x_ref.shape != x_cand.shape or x_ref.shape != y_ref.shape or x_ref.ndim < 2 or x_ref.size == 0:
        return None
    x = x_ref.astype(np.float64, copy=False)
    d = x_cand.astype(np.float64, copy=False) - x
    y = y_ref.astype(np.float64, copy=False)
    y2 = float(np.sum(y * y))
    if not (np.isfinite(d).all() and np.isfinite(y2)) or y2 <= 0.0:
        return None
    worst = 0.0
    for xs, ds, ys in _groupings(x, d, y):
        cx, cd = xs - xs.mean(axis=1, keepdims=True), ds - ds.mean(axis=1, keepdims=True)
        spread = np.maximum(np.sum(cx * cx, axis=1), 1e-300)
        rounding = np.minimum(LOCAL_UNITS * unit * np.sum(xs * xs, axis=1) / spread,
                              ROUNDING_CAP)
        e2 = np.sum(cd * cd, axis=1) / spread + rounding * rounding
        by_share = float(np.sum(e2 * np.sum(ys * ys, axis=1))) / y2                 # each group's output energy
        by_size = float(np.sum(e2) * xs.shape[1] * gamma_rms ** 2) / y2            # a unit-variance group, scaled
        worst = max(worst, by_share, by_size)
    return VARIANCE_TERM * math.sqrt(worst)


def _groupings(x: np.ndarray, d: np.ndarray, y: np.ndarray) -> Iterator[tuple[np.ndarray, ...]]:
    """(groups, elements) views of the three arrays for each grouping a norm may use: the trailing dims from
    dim k on (LayerNorm over the last dims, InstanceNorm over time, GroupNorm's whole sample) and each channel
    (dim 1) over every other dim (batch norm's statistics)."""
    shape = x.shape
    for k in range(1, x.ndim):
        rows = int(np.prod(shape[:k]))
        if shape[k:] and int(np.prod(shape[k:])) > 1:
            yield x.reshape(rows, -1), d.reshape(rows, -1), y.reshape(rows, -1)
    if x.ndim > 2:
        yield (np.moveaxis(x, 1, 0).reshape(shape[1], -1), np.moveaxis(d, 1, 0).reshape(shape[1], -1),
               np.moveaxis(y, 1, 0).reshape(shape[1], -1))


def measured_norm_causes(forward: list[PairResult], by_name: Mapping[str, Record], ref_bundle: Any,
                         cand_bundle: Any) -> list[PairResult]:
    """A normalization called `amplified` by the bound from statistics whose error is beyond OWN_MARGIN x what
    its input's error, carried through it as measured on both sides' values, can make: its own (cause own).
    Only where both sides kept the norm's input and output."""
    if ref_bundle is None or cand_bundle is None:
        return forward
    done = {p.name: p for p in forward}
    out = []
    for p in forward:
        if p.failed and p.cause == CAUSE_AMPLIFIED and p.origin == p.name and p.input_name in done:
            p = _judged_on_values(p, done[p.input_name], by_name, ref_bundle, cand_bundle)
        out.append(p)
    return out


def _judged_on_values(p: PairResult, src: PairResult, by_name: Mapping[str, Record], ref_bundle: Any,
                      cand_bundle: Any) -> PairResult:
    rec = by_name.get(p.name)
    e = p.rel_err
    if rec is None or family(rec.op) != "norm" or e is None or src.cand_name is None:
        return p
    if TAG_INPUTS_UNRECORDED in rec.tags or src.name not in rec.inputs:
        return p        # its input came through code no record shows (`x + 300`): not the value measured
    arrays = [_held(ref_bundle, src.name), _held(cand_bundle, src.cand_name), _held(ref_bundle, p.name)]
    if any(a is None for a in arrays):
        return p        # a side kept statistics only: the bound from statistics stands
    weight = _held(ref_bundle, f"{rec.module}.weight" if rec.module else "weight")
    gamma = float(np.sqrt(np.mean(weight.astype(np.float64) ** 2))) if weight is not None and weight.size else 1.0
    inherited = inherited_norm_error(*arrays, gamma_rms=gamma, unit=_unit(rec, ref_bundle, cand_bundle, src))
    if inherited is None or e <= OWN_MARGIN * max(inherited, p.rounding or 0.0):
        return p
    return replace(p, cause=CAUSE_OWN, origin=p.name, tags=p.tags + (TAG_NORM_MEASURED,), explanation=(
        f"its input's error ({src.rel_err or 0.0:.2g}), carried through the normalization as measured on both "
        f"sides' values (each group's centred error against its spread), makes at most {inherited:.2g} of its "
        f"{e:.2g}: the rest is its own (its eps, its variance or its affine parameters)"))


def _unit(rec: Record, ref_bundle: Any, cand_bundle: Any, src: PairResult) -> float:
    """The unit roundoff of the coarser side's dtype at this norm (float32's when a dtype is not a float's)."""
    float32 = UNIT_ROUNDOFF["float32"]
    cand = cand_bundle.get(src.cand_name)
    dtypes = {rec.dtype, cand.dtype if cand is not None else None}
    return max([UNIT_ROUNDOFF.get(d, float32) for d in dtypes if d] or [float32])


def _held(bundle: Any, name: str) -> np.ndarray | None:
    """The stored values of record `name`, None where the bundle has no such record or statistics only."""
    rec = bundle.get(name)
    return bundle.numpy(name) if rec is not None and rec.has_tensor else None
