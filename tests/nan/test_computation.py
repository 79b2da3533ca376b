"""`statistic_of` reads what a value is from the ops that made it, never from its shape: pass-through ops (casts,
views, `+ eps`, `/ n`) keep a one-pass variance a variance and a conv output a conv output; an op that mixes two
computed values (or applies a nonlinearity) ends the statistic."""

from __future__ import annotations

from hypothesis import given, strategies as st

from tensorprobe.nan.computation import OpNode, chain_text, is_square, statistic_of

X = OpNode("convolution", (None, None, None))
PASS = ["_to_copy", "clone", "unsqueeze", "expand", "add", "div", "mul", "clamp"]
BREAK = ["relu", "tanh", "exp", "convolution", "cat"]


def one_pass(x: OpNode = X, square_by: str = "mul") -> OpNode:
    sq = OpNode("mul", (x, x), same_inputs=True) if square_by == "mul" else OpNode("pow", (x,))
    m = OpNode("mean", (x,))
    m2 = OpNode("mul", (m, m), same_inputs=True) if square_by == "mul" else OpNode("pow", (m,))
    return OpNode("sub", (OpNode("mean", (sq,)), m2))


def wrap(node: OpNode, ops: list[str]) -> OpNode:
    for op in ops:                       # each with one computed input and a constant (eps, n, a scale)
        node = OpNode(op, (node, None) if op in ("add", "div", "mul") else (node,))
    return node


@given(st.lists(st.sampled_from(PASS), max_size=5), st.sampled_from(["mul", "pow"]))
def test_pass_through_ops_keep_a_one_pass_variance_a_variance(ops, square_by):
    assert "one-pass variance" in statistic_of(wrap(one_pass(square_by=square_by), ops))


@given(st.lists(st.sampled_from(PASS), max_size=5))
def test_pass_through_ops_never_make_a_conv_output_a_statistic(ops):
    assert statistic_of(wrap(X, ops)) is None


@given(st.lists(st.sampled_from(PASS), max_size=3), st.sampled_from(BREAK), st.lists(st.sampled_from(PASS), max_size=3))
def test_an_op_that_transforms_the_variance_ends_it(before, breaker, after):
    assert statistic_of(wrap(OpNode(breaker, (wrap(one_pass(), before), None)), after)) is None


def test_a_difference_of_squares_without_means_is_not_a_variance():
    re_, im = OpNode("slice", (X,)), OpNode("slice", (X,))
    diff = OpNode("sub", (OpNode("pow", (re_,)), OpNode("pow", (im,))))
    assert statistic_of(diff) is None
    assert chain_text(diff) == "convolution → slice → pow → sub"


def test_a_product_of_two_values_is_not_a_square_unless_one_value_or_known_non_negative():
    a, b = OpNode("relu", (X,)), OpNode("tanh", (X,))
    assert not is_square(OpNode("mul", (a, b)))
    assert is_square(OpNode("mul", (a, a), same_inputs=True))
    assert not is_square(OpNode("mul", (a,)))                       # x * 2 read from a bundle
    assert is_square(OpNode("mul", (a,), nonneg=True))              # x * x read from a bundle: never negative
    assert statistic_of(OpNode("var", (X,))) == "a variance (var)"
    assert statistic_of(None) is None and chain_text(None) is None
