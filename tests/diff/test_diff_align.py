"""Pairing records: exact name, mapping rules, order and shape within a module; one-sided records."""

import pytest
import torch

from tensorprobe.diff import diff
from tensorprobe.diff.align import align, load_rules, parse_rule
from tensorprobe.errors import InputError


def test_exact_names_pair_and_one_sided_records_are_reported(make_bundle):
    x = torch.randn(2, 3)
    ref = make_bundle([("a", x), ("b", x + 1), ("only_ref", x)])
    cand = make_bundle([("a", x), ("b", x + 1), ("only_cand", x)])
    a = align(ref, cand)
    assert [(p.ref.name, p.method) for p in a.pairs] == [("a", "name"), ("b", "name")]
    assert [r.name for r in a.ref_only] == ["only_ref"] and [c.name for c in a.cand_only] == ["only_cand"]


def test_rules_rename_candidate_names_into_the_reference(make_bundle, tmp_path):
    x = torch.randn(4)
    ref = make_bundle([("decoder.generator.conv_post", x), ("decoder.f0_conv", x)])
    cand = make_bundle([("dec.gen.conv_post", x), ("F0Conv", x)])
    f = tmp_path / "rules.txt"
    f.write_text("# port names -> reference names\n\ndec\\.gen\\.(.*)=decoder.generator.\\1\nF0Conv=decoder.f0_conv\n")
    a = align(ref, cand, load_rules(f))
    assert {p.ref.name: (p.cand.name, p.method) for p in a.pairs} == {
        "decoder.generator.conv_post": ("dec.gen.conv_post", "rule"), "decoder.f0_conv": ("F0Conv", "rule")}
    assert not a.ref_only and not a.cand_only


def test_order_and_shape_within_a_module(make_bundle):
    x, y = torch.randn(2, 8), torch.randn(8)
    ref = make_bundle([("blk/mul.0", x, {"module": "blk"}), ("blk/add.0", y, {"module": "blk"}),
                       ("blk/tanh.0", x, {"module": "blk"})])
    cand = make_bundle([("blk/Mul_1", x, {"module": "blk"}), ("blk/Add_7", y.reshape(1, 8), {"module": "blk"}),
                        ("blk/Tanh_2", x, {"module": "blk"})])
    a = align(ref, cand)
    assert [(p.ref.name, p.cand.name, p.method) for p in a.pairs] == [
        ("blk/mul.0", "blk/Mul_1", "order"), ("blk/add.0", "blk/Add_7", "order"), ("blk/tanh.0", "blk/Tanh_2", "order")]


def test_order_never_pairs_a_random_draw_with_a_computed_value(make_bundle):
    """A kernel's output has the shape of the `randn_like` that starts the module in PyTorch; by order alone
    it was paired with the draw (an XNNPACK delegate output was, in the full Kokoro decoder). It pairs with
    the computed value it is, the draw with a draw."""
    x = torch.randn(1, 9, 50)
    src = {"module": "m_source"}
    ref = make_bundle([("m_source/randn_like.0", torch.randn(1, 9, 50), {**src, "op": "aten.randn_like.default",
                                                                       "kind": "rng"}),
                       ("m_source/mul.0", x, {**src, "op": "aten.mul.Tensor"}),
                       ("m_source/tanh.0", x.tanh(), {**src, "op": "aten.tanh.default"})])
    portable = make_bundle([("m_source/mul_out.0", x, {**src, "op": "aten.mul.out"}),
                            ("m_source/tanh.0", x.tanh(), {**src, "op": "aten.tanh.default"})])
    a = align(ref, portable)
    assert [(p.ref.name, p.cand.name, p.method) for p in a.pairs] == [
        ("m_source/mul.0", "m_source/mul_out.0", "order"), ("m_source/tanh.0", "m_source/tanh.0", "name")]
    assert [r.name for r in a.ref_only] == ["m_source/randn_like.0"]
    # a delegate's output: its op is hidden, so it is not paired by order at all
    xnnpack = make_bundle([("m_source/delegate.0", x, {**src, "op": "delegate.XnnpackBackend", "tags": ("opaque",)})])
    a = align(ref, xnnpack)
    assert not a.pairs and [c.name for c in a.cand_only] == ["m_source/delegate.0"]
    zeros = make_bundle([("m_source/zeros.0", torch.zeros(1, 9, 50), {**src, "op": "aten.randn_like.default",
                                                                      "tags": ("random_replaced",)})])
    assert [(p.ref.name, p.cand.name) for p in align(ref, zeros).pairs] == [("m_source/randn_like.0", "m_source/zeros.0")]
    dump = make_bundle([("m_source/noise", torch.randn(1, 9, 50), src)])  # a port's dump: its op is unknown
    assert [(p.ref.name, p.cand.name) for p in align(ref, dump).pairs] == [("m_source/randn_like.0", "m_source/noise")]


def test_order_keeps_module_outputs_and_op_outputs_apart(make_bundle):
    """Against an op-level reference, a runtime's module tap (`enc.norm`, the module's output) has no exact
    name; by order alone it took the module's first op. It meets the op that ends the module's call (its value
    is the module's output), never the first op."""
    x = torch.randn(1, 4, 10)
    ref = make_bundle([("enc.norm/mul.0", x * 2, {"module": "enc.norm", "op": "aten.mul.Tensor"}),
                       ("enc.norm/add.0", x * 2 + 1, {"module": "enc.norm", "op": "aten.add.Tensor"})])
    cand = make_bundle([("enc.norm", x * 2 + 1, {"module": "enc.norm", "op": "executorch.output"}),
                        ("enc.norm/mul_out.0", x * 2, {"module": "enc.norm", "op": "aten.mul.out"})])
    a = align(ref, cand)
    assert sorted((p.ref.name, p.cand.name) for p in a.pairs) == [("enc.norm/add.0", "enc.norm"),
                                                                  ("enc.norm/mul.0", "enc.norm/mul_out.0")]
    assert not a.cand_only
    tap_only = make_bundle([("enc.norm", x * 2 + 1, {"module": "enc.norm", "op": "executorch.output"})])
    assert [(p.ref.name, p.cand.name) for p in align(ref, tap_only).pairs] == [("enc.norm/add.0", "enc.norm")]


def test_shape_mismatch_is_a_finding_not_a_crash(make_bundle):
    ref = make_bundle([("a", torch.randn(2, 3)), ("b", torch.randn(3))])
    cand = make_bundle([("a", torch.randn(3, 2)), ("b", torch.randn(3))])
    r = diff(ref, cand)
    assert r.shape_mismatches == ("a",) and r.first_divergence == "a" and not r.passed
    assert "shape (2, 3) vs (3, 2)" in r.pair("a").reasons[0]


@pytest.mark.parametrize("text,msg", [("no-equals", "expected PATTERN=REPLACEMENT"),
                                      ("a(b=c", "invalid regular expression"), ("=x", "empty pattern")])
def test_bad_rules_give_one_clear_error(text, msg):
    with pytest.raises(InputError, match=msg):
        parse_rule(text)


def test_rules_file_errors_name_the_line(tmp_path):
    f = tmp_path / "r.txt"
    f.write_text("ok=fine\nbroken(=x\n")
    with pytest.raises(InputError, match=r"r.txt:2: .*invalid regular expression"):
        load_rules(f)
