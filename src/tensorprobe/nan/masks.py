"""Deliberate infinities: ±Inf that a constant writes on purpose (a mask), told apart from NaN/Inf born.

Models put ±Inf in tensors on purpose: `masked_fill(mask, -inf)` before a softmax, an ONNX `Pad` with a -inf
constant before a peak pick (SwiftF0), a `-inf` initializer read by `Where`, a causal-mask buffer of 0 and -inf.
Such a value is a *mask*: it comes from a constant, and the ops after it consume it (exp(-inf) = 0 in a softmax,
max and argmax pass over it). A mask is a finding only when it reaches a model output, or when an op turns it
into NaN (-inf − -inf, 0 × inf, a softmax over a row masked throughout): that op is then where NaN is born.

The rules, shared by the live search (`live.py`) and the bundle search (`in_bundle.py`):

- a **constant** is a mask when it holds no NaN, infinities of one sign, and at most one finite value (a fill:
  a scalar -inf, a causal mask of 0 and -inf): `constant_mask_value`; a trainable parameter never is;
- an op **makes** a mask when its inputs are finite, its output holds ±Inf and no NaN, and what it read says the
  infinities are a constant's: a non-finite scalar argument (`x.masked_fill(m, -inf)`, `F.pad(..., value=-inf)`),
  a constant input, or, where the bundle does not hold the constant, an op that only copies and fills
  (`FILL_OPS`: pad, masked_fill, where, fill, ConstantOfShape);
- an op **carries** a mask when every non-finite value it read is a mask's and its output holds no NaN; an
  elementwise op must also make no ±Inf where its inputs had none (an overflow beside a mask is still found).

    >>> from tensorprobe.stats import TensorStats
    >>> constant_mask_value(TensorStats(numel=1, neginf=1, finite_frac=0.0))          # a -inf initializer
    '-inf'
    >>> constant_mask_value(TensorStats(numel=4, neginf=2, finite_frac=0.5, min=0.0, max=0.0))   # 0 / -inf
    '-inf'
    >>> constant_mask_value(TensorStats(numel=4, posinf=1, finite_frac=0.75, min=-1.0, max=2.0)) is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ..ops import canonical_op
from ..stats import TensorStats

# Ops whose output holds only values they read or a constant they write: ±Inf in their output, from finite
# recorded inputs, is the constant's (an unrecorded pad value, fill value or literal).
FILL_OPS = frozenset({"constant_pad_nd", "pad", "masked_fill", "where", "fill", "full", "full_like", "new_full",
                      "scalar_tensor", "index_put", "index_fill", "masked_scatter", "constant_of_shape",
                      "constant", "lift_fresh_copy"})
# Ops computed element by element (inputs broadcast to the output): ±Inf in their output where no input held
# one is made by the op (an overflow), not carried from a mask.
ELEMENTWISE_OPS = frozenset({"add", "sub", "rsub", "mul", "div", "true_divide", "exp", "exp2", "expm1", "log",
                             "log2", "log10", "log1p", "sqrt", "rsqrt", "pow", "reciprocal", "neg", "abs", "tanh",
                             "sigmoid", "relu", "gelu", "silu", "clamp", "clamp_min", "clamp_max", "maximum",
                             "minimum", "square", "sinh", "cosh", "addcmul", "addcdiv", "_to_copy", "cast"})
_SOFTMAX_OPS = frozenset({"softmax", "_softmax", "log_softmax", "_log_softmax", "safe_softmax", "_safe_softmax"})
CARRIED_SHOWN = 8   # record names kept per mask; the count is always exact


def constant_mask_value(stats: TensorStats) -> str | None:
    """"-inf" or "+inf" when a constant with these statistics is a mask (no NaN, infinities of one sign, every
    finite element one value: `min == max` over the finite elements); None otherwise."""
    if stats.kind != "float" or stats.nan or stats.all_finite or (stats.posinf and stats.neginf):
        return None
    if stats.min is not None and stats.min != stats.max:
        return None
    return "-inf" if stats.neginf else "+inf"


def infinity_sign(stats: TensorStats) -> str:
    """"-inf", "+inf" or "±inf": the infinities a tensor holds."""
    return "±inf" if stats.posinf and stats.neginf else "-inf" if stats.neginf else "+inf"


def _base(op: str) -> str:
    base = canonical_op(op)
    return base[:-1] if base.endswith("_") and not base.endswith("__") else base   # in place: add_ is add


def is_fill_op(op: str) -> bool:
    """The op only copies values it read or writes a constant (`FILL_OPS`), in any producer's spelling."""
    return _base(op) in FILL_OPS


def is_elementwise(op: str) -> bool:
    return _base(op) in ELEMENTWISE_OPS


def adds_infinities_by_count(op: str, out: TensorStats, out_numel: int,
                             inputs: Sequence[tuple[TensorStats, int]]) -> bool:
    """For an elementwise op known by statistics only: its output holds more ±Inf than the non-finite values of its
    inputs can account for (each input's count, times how often broadcasting repeats it). False for other ops."""
    if not is_elementwise(op):
        return False
    room = sum(s.nonfinite * max(1, out_numel // max(n, 1)) for s, n in inputs)
    return out.posinf + out.neginf > room


def adds_infinities(op: str, out: np.ndarray, inputs: Sequence[np.ndarray]) -> bool:
    """For an elementwise op with its values: ±Inf at a place of its output where no input (broadcast) was
    non-finite. False for other ops and where the inputs do not broadcast to the output."""
    return is_elementwise(op) and new_infinities(out, inputs) > 0


def new_infinities(out: np.ndarray, inputs: Sequence[np.ndarray]) -> int:
    """Places of `out` holding ±Inf where no input, broadcast to `out`'s shape, was non-finite (0 where the inputs
    do not broadcast: nothing can be told)."""
    out = np.asarray(out)
    seen = np.zeros(out.shape, dtype=bool)
    for x in inputs:
        x = np.asarray(x)
        if x.dtype.kind not in "fc":
            continue
        try:
            seen |= np.broadcast_to(~np.isfinite(x), out.shape)
        except ValueError:
            return 0
    return int(np.count_nonzero(np.isinf(out) & ~seen))


def new_infinities_text(op_label: str, masks: str, count: int | None) -> str:
    """An elementwise op that carries a mask and makes ±Inf of its own beside it (an overflow)."""
    many = f"{count:,} ±Inf" if count else "more ±Inf than its inputs hold"
    return (f"{op_label} carries {masks} (deliberate), and makes {many} of its own where its inputs were finite: "
            "an overflow beside the mask, not the mask.")


@dataclass(frozen=True)
class Mask:
    """±Inf put in the computation on purpose, and where it went.

    Attributes:
        record: where the mask is made: the op that writes a constant's ±Inf, or the constant itself (an
            initializer, a buffer).
        op: its op, as its producer names it (`Pad`, `aten.masked_fill.Scalar`, `initializer`, `buffer`).
        module: the module it runs in.
        value: "-inf", "+inf" or "±inf".
        count: ±Inf elements there.
        constant: what the infinities come from, where known: a constant's name (`v442`), an argument
            (`value=-inf`), a literal (`a -inf constant tensor`).
        carried_by: later records that hold its ±Inf (at most `CARRIED_SHOWN`); `carried` counts them all.
        source: the source line (live search).
    """

    record: str
    op: str
    module: str | None
    value: str
    count: int
    constant: str | None = None
    carried_by: tuple[str, ...] = ()
    carried: int = 0
    source: str | None = None

    def describe(self) -> str:
        """One line: 'v442 (initializer) is a -inf constant; carried by 1 record: <root>/Pad.4'."""
        if self.constant == self.record:
            head = f"{self.record} ({self.op}) is a {self.value} constant"
        else:
            head = (f"{self.record} ({self.op}) writes {self.count:,} {self.value}"
                    + (f" (from {self.constant})" if self.constant else ""))
        if not self.carried:
            return head
        shown = ", ".join(self.carried_by) + (" …" if self.carried > len(self.carried_by) else "")
        return f"{head}; carried by {self.carried} record{'s' if self.carried > 1 else ''}: {shown}"

    def to_dict(self) -> dict[str, Any]:
        return {"record": self.record, "op": self.op, "module": self.module, "value": self.value,
                "count": self.count, "constant": self.constant, "carried_by": list(self.carried_by),
                "carried": self.carried, "source": self.source}


class MaskSources:
    """The masks a search has met, by index; a value carrying masks is known by the set of their indices."""

    def __init__(self) -> None:
        self._made: list[dict[str, Any]] = []

    def new(self, record: str, op: str, module: str | None, value: str, count: int, constant: str | None = None,
            source: str | None = None) -> frozenset[int]:
        self._made.append({"record": record, "op": op, "module": module, "value": value, "count": count,
                           "constant": constant, "source": source, "carried_by": [], "carried": 0})
        return frozenset({len(self._made) - 1})

    def carried(self, roots: frozenset[int], record: str) -> None:
        for i in roots:
            m = self._made[i]
            m["carried"] += 1
            if len(m["carried_by"]) < CARRIED_SHOWN:
                m["carried_by"].append(record)

    def get(self, i: int) -> Mask:
        m = self._made[i]
        return Mask(**{**m, "carried_by": tuple(m["carried_by"])})

    def masks(self) -> tuple[Mask, ...]:
        return tuple(self.get(i) for i in range(len(self._made)))

    def named(self, roots: frozenset[int]) -> str:
        """The masks in `roots`, as a finding names them: 'the -inf that <root>/Pad.4 (Pad) writes'."""
        parts = []
        for i in sorted(roots):
            m = self._made[i]
            if m["constant"] != m["record"]:
                parts.append(f"the {m['value']} that {m['record']} ({m['op']}) writes")
                continue
            into = f", read by {m['carried_by'][0]}" if m["carried_by"] else ""
            parts.append(f"the {m['value']} constant {m['record']} ({m['op']}){into}")
        return " and ".join(parts)

    def __bool__(self) -> bool:
        return bool(self._made)


def mask_output_text(output: str, count: int, masks: str) -> str:
    """A model output that still holds a deliberate mask's ±Inf."""
    return (f"The model output {output} holds {count:,} ±Inf carried from {masks}: a mask is meant to be consumed (by "
            "a softmax, a max, a where) before the output, and nothing after it removed these. Replace the masked "
            "values before returning them (with 0, say), or mask with a large finite negative (-1e9).")


def mask_nan_text(op_label: str, op: str, masks: str, inputs: Sequence[np.ndarray] = (),
                  output: np.ndarray | None = None) -> str:
    """Why an op that read a deliberate mask made NaN, from its values where they are known:
    inf − inf, 0 × inf, inf / inf, or a softmax over a row that is -inf throughout."""
    base = _base(op)
    head = f"{op_label} turned a deliberate mask into NaN: it read {masks}"
    arrays = [np.asarray(x) for x in inputs]
    floats = [x for x in arrays if x.dtype.kind == "f"]
    if base in _SOFTMAX_OPS and floats:
        rows = _rows_masked_throughout(floats[0])
        if rows:
            return (f"{head}, and {rows[0]:,} of its rows (along dim {rows[1]}) {'is' if rows[0] == 1 else 'are'} -inf "
                    "throughout: exp(x − max) there "
                    "is exp(−inf − (−inf)) = NaN. Leave at least one entry of each row unmasked, mask with a large "
                    "finite negative (-1e9 or the dtype's minimum), or zero the rows that are masked entirely.")
    pair = _pair_cause(base, [x.astype(np.float64) for x in arrays if x.dtype.kind in "fiub"], output)
    if pair:
        return f"{head}, and {pair}. Apply the mask after this op, or mask with a large finite negative (-1e9)."
    return (f"{head}, and its arithmetic on the ±Inf gave NaN (inf − inf, 0 × inf or inf / inf inside it). Apply the "
            "mask after this op, or mask with a large finite negative (-1e9).")


def _rows_masked_throughout(x: np.ndarray) -> tuple[int, int] | None:
    """(rows, dim) of the first dim, the last first, along which some rows of `x` are -inf throughout."""
    for dim in reversed(range(x.ndim)):
        rows = int(np.count_nonzero(np.all(np.isneginf(x), axis=dim)))
        if rows:
            return rows, dim
    return None


_PAIR_WORDS = {"add": "inf − inf", "sub": "inf − inf", "rsub": "inf − inf", "mul": "0 × inf",
               "div": "inf / inf", "true_divide": "inf / inf"}


def _pair_cause(base: str, arrays: list[np.ndarray], output: np.ndarray | None) -> str | None:
    """inf − inf, 0 × inf or inf / inf: NaN made by a binary op where an operand holds ±Inf (with finite or
    infinite operands, NaN there can only come that way). Operands the bundle does not hold count too (`x - x`
    records its input once)."""
    words = _PAIR_WORDS.get(base)
    if words is None or output is None:
        return None
    out = np.asarray(output)
    infinite = np.zeros(out.shape, dtype=bool)
    for x in arrays:
        try:
            infinite |= np.broadcast_to(np.isinf(x), out.shape)
        except ValueError:
            return None
    n = int(np.count_nonzero(np.isnan(out) & infinite))
    return f"{n:,} elements are {words} (an operand infinite there)" if n else None


__all__ = ["ELEMENTWISE_OPS", "FILL_OPS", "Mask", "MaskSources", "adds_infinities", "adds_infinities_by_count",
           "constant_mask_value", "infinity_sign", "is_elementwise", "is_fill_op", "mask_nan_text", "mask_output_text", "new_infinities",
           "new_infinities_text"]
