"""Values that agree in another layout: a candidate record that is the reference transposed (NCT against NTC)
or with its channels in another order (gates stacked IFGO against IOFG).

Such a pair is not a plain divergence: every value is right, only where it sits differs. `find_layout` is run
only on pairs that already fail (a shape mismatch of equal element count, or values off by more than half of
the reference), so a faithful run pays nothing for it. Size-1 dimensions are dropped first: (1, 80, 100)
against (100, 80) is a transpose.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

TRANSPOSED, REORDERED = "transposed", "channels reordered"
MIN_ROW = 4   # values per channel needed before a reordering of channels is claimed
TAG_LAYOUT = "layout:"        # tag of a pair whose candidate holds the reference's values in another layout
# tag of a pair the port holds transposed whose values differ in every layout: compared in the closest one
TAG_COMPARED_TRANSPOSED = "compared_transposed"
MAX_AXES = 5                  # transposes tried: every axis order of up to 5 dimensions (120)
MAX_CHANNELS = 4096           # channel orders looked for along axes of at most this size
REORDER_MIN_ERROR = 0.5       # a pair with equal shapes is looked at only when its error is this large


@dataclass(frozen=True)
class Layout:
    """How the candidate's values sit relative to the reference's: `axes` (transposed: the candidate is the
    squeezed reference with its axes in this order), or `axis` and `order` (channels reordered: candidate
    channel i along `axis` is reference channel order[i]); `rel_err` once the layout is undone."""

    kind: str
    rel_err: float
    axes: tuple[int, ...] | None = None
    axis: int | None = None
    order: tuple[int, ...] | None = None

    def words(self) -> str:
        """'transposed: axes (0, 2, 1) of the reference' or 'reordered along axis 1: 0<-1, 1<-0'."""
        if self.kind == TRANSPOSED:
            return f"transposed: axes {self.axes} of the reference"
        moved = [i for i, j in enumerate(self.order or ()) if i != j]
        shown = ", ".join(f"{i}<-{self.order[i]}" for i in moved[:6]) + (" ..." if len(moved) > 6 else "")
        return f"reordered along axis {self.axis}, candidate<-reference: {shown}"

    def tag(self) -> str:
        return TAG_LAYOUT + ("transposed" if self.kind == TRANSPOSED else "reordered")


def find_layout(ref: np.ndarray, cand: np.ndarray, limit: float) -> Layout | None:
    """The layout in which `cand` holds `ref`'s values within relative L2 error `limit`, or None. Shapes that
    differ are tried as transposes; equal shapes as channels reordered along one axis."""
    r, c = _squeezed(ref), _squeezed(cand)
    if r is None or c is None or r.size != c.size or r.size == 0:
        return None
    kept = [i for i, d in enumerate(np.shape(ref)) if d != 1]    # the reference's axes the squeezed ones are
    if r.shape != c.shape:
        found = _transposed(r, c, limit)
        if found is not None and len(np.shape(ref)) == len(np.shape(cand)) and \
                [i for i, d in enumerate(np.shape(cand)) if d != 1] == kept:   # size-1 axes in place: say all axes
            axes = list(range(len(np.shape(ref))))
            for pos, i in enumerate(kept):
                axes[i] = kept[found.axes[pos]]
            found = Layout(TRANSPOSED, found.rel_err, axes=tuple(axes))
        return found
    found = _reordered(r, c, limit)
    return found if found is None else Layout(REORDERED, found.rel_err, axis=kept[found.axis], order=found.order)


def closest_transpose(ref: np.ndarray, cand: np.ndarray) -> Layout | None:
    """The transpose of `ref` closest to `cand` (shapes that differ only in the order of their dimensions),
    whatever its error; None when no transpose gives `cand`'s shape or none comes within REORDER_MIN_ERROR."""
    r, c = _squeezed(ref), _squeezed(cand)
    if r is None or c is None or r.size != c.size or r.size == 0 or r.shape == c.shape:
        return None
    found = _transposed(r, c, REORDER_MIN_ERROR, best=True)
    return found


def in_reference_layout(cand: np.ndarray, ref_shape: tuple[int, ...], layout: Layout) -> np.ndarray:
    """`cand` (the squeezed reference transposed by `layout.axes`) put back in the reference's shape."""
    c = _squeezed(cand)
    return np.transpose(c, np.argsort(layout.axes)).reshape(ref_shape)


def _squeezed(a: np.ndarray) -> np.ndarray | None:
    a = np.asarray(a)
    if a.dtype.kind not in "fiu":
        return None
    return a.reshape(tuple(d for d in a.shape if d != 1))


def _rel_err(r: np.ndarray, c: np.ndarray) -> float:
    r64, c64 = r.astype(np.float64, copy=False), c.astype(np.float64, copy=False)
    with np.errstate(invalid="ignore", over="ignore"):    # inf - inf (a mask in both): no layout to tell
        energy = float(np.sum(r64 * r64))
        err = float(np.sum((c64 - r64) ** 2))
    if not math.isfinite(err):
        return math.inf
    return math.sqrt(err / energy) if energy > 0 else (0.0 if err == 0 else math.inf)


def _transposed(r: np.ndarray, c: np.ndarray, limit: float, best: bool = False) -> Layout | None:
    """The first transpose of `r` within `limit` of `c` (`best`: the closest one within it)."""
    if r.ndim > MAX_AXES or sorted(r.shape) != sorted(c.shape):
        return None
    found = None
    for axes in itertools.permutations(range(r.ndim)):
        if tuple(r.shape[i] for i in axes) != c.shape:
            continue
        e = _rel_err(np.transpose(r, axes), c)
        if e <= limit and (found is None or e < found.rel_err):
            found = Layout(TRANSPOSED, e, axes=tuple(axes))
            if not best:
                break
    return found


def _reordered(r: np.ndarray, c: np.ndarray, limit: float) -> Layout | None:
    """Channels in another order along one axis: rows matched by their sum and sum of squares, then the
    whole tensor compared in the matched order."""
    for axis in range(r.ndim):
        k = r.shape[axis]
        # rows of a few values are no evidence: any vector is a "reordering" of its sorted values (a time-reversed
        # audio frame read as 512 channels reordered)
        if not 2 <= k <= MAX_CHANNELS or r.size // k < MIN_ROW:
            continue
        rr = np.moveaxis(r, axis, 0).reshape(k, -1).astype(np.float64)
        cc = np.moveaxis(c, axis, 0).reshape(k, -1).astype(np.float64)
        ri = np.lexsort(((rr * rr).sum(axis=1), rr.sum(axis=1)))
        ci = np.lexsort(((cc * cc).sum(axis=1), cc.sum(axis=1)))
        order = np.empty(k, dtype=np.int64)
        order[ci] = ri                               # candidate row ci[j] holds reference row ri[j]
        if np.array_equal(order, np.arange(k)):
            continue
        e = _rel_err(rr[order], cc)
        if e <= limit:
            return Layout(REORDERED, e, axis=axis, order=tuple(int(i) for i in order))
    return None


__all__ = ["Layout", "REORDERED", "REORDER_MIN_ERROR", "TAG_COMPARED_TRANSPOSED", "TAG_LAYOUT", "TRANSPOSED",
           "closest_transpose", "find_layout", "in_reference_layout"]
