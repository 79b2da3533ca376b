"""How a value was computed, as far as it was recorded: the evidence a diagnosis may name a cause from.

A diagnosis that says "a normalization's variance went negative" must see that computation, not guess it
from a tensor's shape (a mono conv output `[1, 1, N]` looks like a per-channel statistic and is not one).
`OpNode` is one op of the recorded computation behind a value, with the nodes of the values it read; a
live NaN search builds it from the ops it watched (`live.py`), a bundle from `Record.inputs` (`in_bundle.py`).
`statistic_of(node)` says what the computation shows the value to be — a one-pass variance E[x²] − E[x]²,
a variance op, a normalization's statistics — or None; `chain_text(node)` says which ops made it.

    >>> x = OpNode("input")
    >>> sq, m = OpNode("mul", (x, x), same_inputs=True), OpNode("mean", (x,))
    >>> var = OpNode("sub", (OpNode("mean", (sq,)), OpNode("mul", (m, m), same_inputs=True)))
    >>> statistic_of(OpNode("add", (var, None)))
    'a one-pass variance E[x²] − E[x]² (the mean of a square minus the square of a mean)'
    >>> statistic_of(OpNode("convolution", (x, None, None))) is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ops import ALIAS_OPS

# A variance, or the statistics a normalization kernel computes.
VARIANCE_OPS = frozenset({"var", "var_mean", "std", "std_mean", "native_batch_norm", "_native_batch_norm_legit",
                          "_native_batch_norm_legit_no_training", "native_layer_norm", "native_group_norm",
                          "instance_norm", "batch_norm", "layer_norm", "group_norm"})
# Ops that average or sum values: E[·] of a one-pass variance.
REDUCTION_OPS = frozenset({"mean", "sum", "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d",
                           "adaptive_avg_pool2d", "reduce_mean", "reduce_sum"})
# Ops that keep what a value is: dtype conversions, copies, views, and arithmetic with a constant or a
# weight (var + eps, sum / n). An op reading two computed values is not one of them.
_PASS_OPS = frozenset(ALIAS_OPS | {"_to_copy", "to", "copy", "cast", "clone", "contiguous", "type_as", "expand",
                                   "repeat", "squeeze", "unsqueeze", "view", "reshape", "add", "sub", "mul", "div",
                                   "clamp", "clamp_min", "clip", "maximum", "abs"})
MAX_DEPTH = 8   # ops followed back from the value: a variance is a handful of ops before its rsqrt


@dataclass(frozen=True)
class OpNode:
    """One op of the recorded computation behind a value.

    Attributes:
        op: the canonical op name (`ops.canonical_op`).
        inputs: the nodes of the tensors it read, None where that value is not recorded (a weight, a
            constant, a model input, a value out of reach).
        same_inputs: every tensor it read is one value (`x * x`).
        nonneg: its output is known to hold no negative value (None: not known).
        name: the record name, where there is one.
        label: how a finding names the op, where it differs from `op`: the producer's own name (ONNX
            `ReduceMean`, not aten's `mean`).
    """

    op: str
    inputs: tuple["OpNode | None", ...] = ()
    same_inputs: bool = False
    nonneg: bool | None = None
    name: str = ""
    label: str = ""

    @property
    def computed_inputs(self) -> list["OpNode"]:
        return [n for n in self.inputs if n is not None]


def _through(node: OpNode | None, depth: int = MAX_DEPTH) -> OpNode | None:
    """The first node behind `node` that is not a pass-through op (a copy, a cast, `+ eps`, `/ n`)."""
    while node is not None and depth > 0 and node.op in _PASS_OPS and not is_square(node):
        computed = node.computed_inputs
        if len(computed) != 1 and not (computed and node.same_inputs):
            return node
        node, depth = computed[0], depth - 1
    return node


def is_square(node: OpNode | None) -> bool:
    """x·x or x**2: a `mul` of one value by itself, a `pow` or `square` of one value (the exponent a constant)."""
    if node is None:
        return False
    if node.op in ("pow", "square"):
        return len(node.inputs) == 1
    if node.op != "mul":
        return False
    if len(node.inputs) >= 2:
        return node.same_inputs
    # one recorded input (a PyTorch op-level bundle names `x * x`'s input once, as it does `x * 2`): a square
    # is never negative
    return len(node.inputs) == 1 and node.nonneg is True


def _mean_of_square(node: OpNode | None) -> bool:
    node = _through(node)
    if node is None or node.op not in REDUCTION_OPS:
        return False
    return any(is_square(_through(i)) or is_square(i) for i in node.computed_inputs)


def statistic_of(node: OpNode | None) -> str | None:
    """What the recorded computation shows `node`'s value to be, when it is a statistic that must not go
    negative: a one-pass variance, a variance op, a normalization's statistics. None when it shows nothing
    of the kind (or was not recorded)."""
    core = _through(node)
    if core is None:
        return None
    if core.op in VARIANCE_OPS:
        return f"a variance ({core.op})"
    if core.op == "sub" and len(core.computed_inputs) == 2:
        first, second = core.computed_inputs
        if _mean_of_square(first) and (is_square(_through(second)) or is_square(second)):
            return "a one-pass variance E[x²] − E[x]² (the mean of a square minus the square of a mean)"
    return None


def chain_text(node: OpNode | None, limit: int = 4) -> str | None:
    """The ops that made `node`'s value, oldest first (`convolution → mul → add`), following the first
    recorded input back at most `limit` ops; None when nothing was recorded."""
    ops: list[str] = []
    while node is not None and len(ops) < limit:
        ops.append(node.label or node.op)
        computed = node.computed_inputs
        node = computed[0] if computed else None
    return " → ".join(reversed(ops)) if ops else None


__all__ = ["MAX_DEPTH", "OpNode", "REDUCTION_OPS", "VARIANCE_OPS", "chain_text", "is_square", "statistic_of"]
