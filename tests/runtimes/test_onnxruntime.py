"""ONNX Runtime adapter, run for real: the Kokoro decoder exported, captured and compared with PyTorch."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from tensorprobe.errors import InputError, RuntimeUnavailable
from tensorprobe.runtimes import get_runtime
from tensorprobe.runtimes.base import RuntimeAdapter

pytest.importorskip("onnxruntime", reason="needs the onnx extra: pip install 'tensorprobe[onnx]'")
pytest.importorskip("onnxscript", reason="needs the onnx extra: pip install 'tensorprobe[onnx]'")
import onnx  # noqa: E402

from tensorprobe.capture import capture  # noqa: E402
from tensorprobe.compare import compare, module_view  # noqa: E402
from tensorprobe.diff import diff  # noqa: E402
from tensorprobe.runtimes.onnxruntime import export_onnx  # noqa: E402
from tensorprobe.stats import compute_stats  # noqa: E402

pytestmark = pytest.mark.onnx


class _Tiny(torch.nn.Module):
    """Two calls of one block, a ModuleList, a tuple-returning block, and atan2 at the root."""

    def __init__(self):
        super().__init__()
        self.blk = _Block()
        self.blocks = torch.nn.ModuleList([_Block(), _Block()])

    def forward(self, x):
        a, b = self.blk(x)
        c, _ = self.blk(a)
        for bl in self.blocks:
            c = bl(c)[0]
        return torch.atan2(c, b)


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.act = torch.nn.ReLU()

    def forward(self, x):
        return self.act(self.lin(x)) * 2, x + 1


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return _Tiny().eval(), (torch.randn(4, 8),)


@pytest.mark.parametrize("exporter", ["dynamo", "legacy"])
def test_tiny_model_names_match_pytorch(tiny, tmp_path, exporter):
    model, inputs = tiny
    ref = capture(model, *inputs, level="module", keep="full")
    b = get_runtime("onnxruntime").capture(model, inputs, out=tmp_path / "ort", exporter=exporter)
    assert b.runtime["exporter"] == exporter
    for name in ["blk.lin", "blk.act", "blk:0", "blk:1", "blk.lin@1", "blk.act@1", "blocks.1.lin"]:
        np.testing.assert_allclose(b.numpy(name), ref.numpy(name), rtol=1e-5, atol=1e-6, err_msg=name)
    # atan2(+0, negative): PyTorch gives +pi, the ONNX decomposition -pi; equal modulo 2*pi
    wrapped = np.angle(np.exp(1j * (b.numpy("<root>") - ref.numpy("<root>"))))
    assert np.abs(wrapped).max() < 1e-5
    # the op graph: the second call of blk.lin reads blk's first output and the Linear's weights
    assert b["blk.lin@1"].runtime_name and b["blk.lin@1"].inputs[0] == "blk:0"
    assert {"blk.lin.weight", "blk.lin.bias"} & set(b["blk.lin@1"].inputs[1:])
    assert "angle" in b["<root>"].tags


def test_segmented_run_equals_single_run(tiny, tmp_path):
    model, inputs = tiny
    ort = get_runtime("onnxruntime")
    one = ort.capture(model, inputs, out=tmp_path / "one")
    seg = ort.capture(model, inputs, out=tmp_path / "seg", max_bytes=1)   # forces one segment per node
    assert ort.last_run["session_runs"] > 5
    assert [r.name for r in seg] == [r.name for r in one]
    for r in one:
        np.testing.assert_array_equal(seg.numpy(r.name), one.numpy(r.name))


def test_segments_over_one_reused_buffer_give_the_same_records_as_full_tensors(tiny, tmp_path):
    """Each segment's outputs are written into the same buffer: stats and kept tensors must be those of
    that segment's values, not of whatever the buffer held before."""
    model, _ = tiny
    inputs = (torch.randn(4096, 8, generator=torch.Generator().manual_seed(0)),)  # values of 128 KiB
    ort = get_runtime("onnxruntime")
    stats = ort.capture(model, inputs, out=tmp_path / "stats", keep="stats", max_bytes=300 << 10)
    assert ort.last_run["session_runs"] > 2 and ort.last_run["pool_bytes"] <= 300 << 10
    full = ort.capture(model, inputs, out=tmp_path / "full", keep="full", max_bytes=300 << 10)
    whole = ort.capture(model, inputs, out=tmp_path / "whole", keep="full")
    assert ort.last_run["session_runs"] == 1
    assert ort.last_run["pool_bytes"] < 16 << 20  # sized to the outputs, not to the 256 MiB cap
    assert [r.name for r in stats] == [r.name for r in full] == [r.name for r in whole]
    for a, b, c in zip(stats, full, whole):
        # a value kept as statistics only also carries its sketch (stats.sketch), made from that segment's values
        assert replace(a.stats, sketch=b.stats.sketch) == b.stats == c.stats, a.name
        np.testing.assert_array_equal(full.numpy(b.name), whole.numpy(c.name), err_msg=b.name)
        if a.stats.sketch is not None:
            expected = compute_stats(full.tensor(b.name), sketch=True).sketch
            assert a.stats.sketch == pytest.approx(expected, rel=1e-6, abs=1e-9), a.name
        # torch's backend sums in its own order (and thread count): float figures agree to float64 rounding
        recomputed = compute_stats(full.tensor(b.name), sketch=b.stats.sketch is not None).to_dict()
        kept = b.stats.to_dict()
        assert recomputed.keys() == kept.keys(), b.name
        for key, value in kept.items():
            close = pytest.approx(value, rel=1e-12, abs=1e-300) if isinstance(value, (float, list)) else value
            assert recomputed[key] == close, (b.name, key)


def test_shapes_computed_in_the_graph_are_inferred_with_data_propagation():
    """A reshape whose target shape is computed from the input (Shape -> Gather -> Concat, as dynamic-axis
    exports do) has no shape under plain inference; the estimate falls back to data propagation for it."""
    from onnx import TensorProto, helper

    from tensorprobe.runtimes.onnxruntime.session import _inferred_shapes, estimate_bytes

    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["rows"], axis=0),
        helper.make_node("Concat", ["rows", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Relu", ["flat"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "computed_shape", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "c", "t"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
                     helper.make_tensor("minus_one", TensorProto.INT64, [1], [-1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {"x": np.zeros((2, 3, 5), np.float32)}
    sizes, shapes, _ = estimate_bytes(model, feeds)
    assert shapes["flat"] == shapes["y"] == (2, 15)
    assert sizes["y"] == 2 * 15 * 4
    concrete = onnx.ModelProto()
    concrete.CopyFrom(model)
    concrete.graph.input[0].CopyFrom(helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5]))
    assert "y" not in _inferred_shapes(concrete, data_prop=False)[0]  # what made the fallback necessary


def test_a_wrong_inferred_shape_falls_back_to_outputs_allocated_by_ort(tiny, tmp_path):
    """Outputs are bound into the buffer with the shapes ONNX shape inference gave; if one is wrong, ORT
    refuses the buffer and the run is made again with ORT allocating every output."""
    from tensorprobe.runtimes.onnxruntime.session import (_OutputPool, estimate_bytes, graph_feeds, make_session,
                                                  run_bound, with_outputs)

    model, inputs = tiny
    path = export_onnx(model, inputs, tmp_path / "tiny.onnx")
    proto = onnx.load(str(path))
    feeds = graph_feeds(proto, inputs)
    names = list(dict.fromkeys(o for n in proto.graph.node for o in n.output if o))
    _, shapes, types = estimate_bytes(proto, feeds)
    sess = make_session(with_outputs(proto, names))
    want = dict(zip(names, sess.run(names, feeds)))
    bound = [v for v in names if v in shapes and len(shapes[v]) == 2]
    assert len(bound) > 3
    right = run_bound(sess, feeds, names, shapes, types, _OutputPool(1 << 20))
    wrong_shapes = {**shapes, bound[1]: (shapes[bound[1]][0] + 1, shapes[bound[1]][1])}
    fallback = run_bound(sess, feeds, names, wrong_shapes, types, _OutputPool(1 << 20))
    for v in names:
        np.testing.assert_array_equal(right[v], want[v], err_msg=v)
        np.testing.assert_array_equal(fallback[v], want[v], err_msg=v)
    pool = _OutputPool(64)  # smaller than one output: it grows rather than fail
    np.testing.assert_array_equal(run_bound(sess, feeds, names, shapes, types, pool)[bound[0]], want[bound[0]])
    assert pool.allocated > 64


def test_segments_take_large_weights_from_memory_and_compute_the_same(tmp_path):
    """A segment carries stubs for its large initializers (no weight bytes to serialize and parse again);
    ORT gets their data from shared OrtValues, and the outputs are bit-identical to the original model's."""
    from tensorprobe.runtimes.onnxruntime import SharedInitializers, graph_feeds, make_session, segment_model

    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 16))
    x = (torch.randn(3, 64),)
    proto = onnx.load(str(export_onnx(model, x, tmp_path / "mlp.onnx")))
    feeds = graph_feeds(proto, x)
    outputs = [o for n in proto.graph.node for o in n.output if o]
    weights = SharedInitializers(proto)
    big = {i.name for i in proto.graph.initializer if len(i.raw_data) >= SharedInitializers.MIN_BYTES}
    assert len(big) == 2  # the two weight matrices; the biases stay inline
    seg, seg_in, seg_out = segment_model(proto, 0, len(proto.graph.node), feeds, set(outputs), {}, 0,
                                         weights.protos)
    assert seg.ByteSize() < 4096 < proto.ByteSize() // 8
    assert set(weights.values_for(seg)) == big
    got = make_session(seg, initializers=weights.values_for(seg)).run(seg_out, {v: feeds[v] for v in seg_in})
    whole = onnx.ModelProto()
    whole.CopyFrom(proto)
    del whole.graph.output[:]
    whole.graph.output.extend(onnx.helper.make_empty_tensor_value_info(o) for o in seg_out)
    want = make_session(whole).run(seg_out, feeds)
    for name, a, b in zip(seg_out, got, want):
        np.testing.assert_array_equal(a, b, err_msg=name)


def test_stats_of_nonfinite_values_are_counted_on_the_whole_value(tmp_path):
    class HalfNan(torch.nn.Module):
        def forward(self, x):
            y = torch.sqrt(x) * 2          # channels 0 and 2 of x are negative: NaN there
            return y.sum(dim=1, keepdim=True) + x.abs().mean()

    x = torch.ones(1, 4, 8192)  # 128 KiB per value: reduced in the graph, then fetched again
    x[:, 0::2] = -1.0
    ort = get_runtime("onnxruntime")
    b = ort.capture(HalfNan(), (x,), out=tmp_path / "nan", keep="stats", max_bytes=64 << 10)
    assert ort.last_run["session_runs"] >= 2
    sqrt = next(r for r in b if r.op == "Sqrt")
    assert sqrt.stats.nan == 2 * 8192 and sqrt.stats.nonfinite_channels == 2
    assert sqrt.stats.nonfinite_channel_idx == (0, 2)
    assert all(r.stats.all_finite for r in b if r.op == "Abs")


def test_legacy_exporter_atan2_nan_is_found_by_compare(tmp_path):
    class Phase(torch.nn.Module):
        def forward(self, x):
            return torch.atan2(x * 0, x * 0) + x     # atan2(0, 0) = 0 in PyTorch

    res = compare(Phase(), (torch.ones(2, 3),), "onnxruntime", out=tmp_path,
                  runtime_options={"exporter": "legacy"})
    assert not res.ref_nan.found
    assert res.cand_nan.found and res.cand_nan.record == "<root>/Div.0" and res.cand_nan_escapes
    assert res.first_divergence == "<root>" and res.finding


def test_compare_names_random_draws_in_the_runtime_as_the_cause(tmp_path):
    """A module that adds noise: ONNX Runtime's RandomNormalLike draws other numbers, so the module's output
    differs for a reason that is not arithmetic. compare's module-level diff must say `random` at that module
    (not `own`, which would send the user hunting a port bug), and the deterministic layer before it matches."""

    class Noisy(torch.nn.Module):
        def forward(self, x):
            return x + 0.1 * torch.randn_like(x)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.pre = torch.nn.Linear(8, 8)
            self.noise = Noisy()
            self.post = torch.nn.Linear(8, 4)

        def forward(self, x):
            return self.post(self.noise(self.pre(x)))

    res = compare(Net().eval(), (torch.randn(16, 8),), "onnxruntime", out=tmp_path)
    assert res.diff.get("pre").status == "pass"
    assert res.first_divergence == "noise"
    first = res.diff.get("noise")
    assert first.cause == "random" and "random draws" in first.explanation
    assert res.diff.get("post").origin == "noise"           # what follows carries the same draws


def test_mapping_rules_name_unnamed_nodes(tiny, tmp_path):
    model, inputs = tiny
    path = export_onnx(model, inputs, tmp_path / "m.onnx", exporter="legacy")
    m = onnx.load(str(path))
    for i, node in enumerate(m.graph.node):       # what a hand-built or renamed graph looks like
        node.name = f"{node.name.strip('/').split('/')[0]}_op{i}" if node.name.count("/") > 1 else f"root_op{i}"
    onnx.save(m, str(path))
    rules = tmp_path / "rules.txt"
    rules.write_text("# node name -> module\n^(blocks\\.\\d+)_op\\d+$ -> \\1\n")
    b = get_runtime("onnxruntime").capture_artifact(path, {"x": inputs[0]}, out=tmp_path / "b", rules=rules)
    ref = capture(model, *inputs, level="module", keep="full")
    assert "blocks" not in b      # a ModuleList is never called: only the ruled module gets a record
    for name in ["blocks.0:0", "blocks.1:0"]:    # _Block returns a tuple: slot 0 by shape and order
        np.testing.assert_allclose(b.numpy(name), ref.numpy(name), rtol=1e-5, err_msg=name)
    assert b["blocks.1:0"].inputs == ("blocks.1/Relu.0",)


def test_bad_inputs_are_one_clear_error(tiny, tmp_path):
    model, inputs = tiny
    path = export_onnx(model, inputs, tmp_path / "m.onnx")
    ort = get_runtime("onnxruntime")
    with pytest.raises(InputError, match=r"missing \['x'\].*the graph takes x\[4,8\] float32"):
        ort.capture_artifact(path, {"y": inputs[0]}, out=tmp_path / "b")
    with pytest.raises(InputError, match="got int64, the graph expects float32"):
        ort.capture_artifact(path, {"x": np.zeros((4, 8), dtype=np.int64)}, out=tmp_path / "b")


CAPTURE_TARGETS = """
import torch
from tensorprobe.examples import silero


def good():
    return silero.pytorch_port()


def float64_frame():          # a NumPy frame fed as is: float64 against float32 weights
    model, (x, state) = silero.pytorch_port()
    return model, (x.double(), state)


class DataDependent(torch.nn.Module):   # runs in PyTorch, cannot be traced by torch.export
    def forward(self, x):
        if x.sum() > 0:
            return x * 2
        return x.nonzero().float().sum() * x


def data_dependent():
    return DataDependent().eval(), (torch.randn(3),)
"""


@pytest.mark.parametrize("factory, code, words, hint", [
    ("good", 0, "wrote ", False),
    ("float64_frame", 2, "the model's forward raised RuntimeError: ", False),   # the model's error, said as such
    ("data_dependent", 2, "torch.onnx.export (dynamo exporter) failed: GuardOnDataDependentSymNode", True),
])
def test_capture_in_onnxruntime_says_a_forward_error_or_an_export_failure_in_one_line(tmp_path, factory, code,
                                                                                    words, hint):
    import subprocess
    import sys

    pytest.importorskip("silero_vad")
    (tmp_path / "vad.py").write_text(CAPTURE_TARGETS)
    p = subprocess.run([sys.executable, "-m", "tensorprobe", "capture", f"vad.py:{factory}", "--runtime",
                        "onnxruntime", "-o", str(tmp_path / "b")], capture_output=True, text=True, cwd=tmp_path)
    text = p.stdout + p.stderr
    assert p.returncode == code and words in text and len(text.strip().splitlines()) == 1, text
    assert "\x1b" not in text and ("exporter='legacy'" in text) == hint   # no log lines, no colours


def _append_to_output(src, dst, op: str, factor: float | None = None):
    """What a user does to an exported file: one node appended after the graph's output, with no name and
    no scope (a calibration gain, a log-magnitude head)."""
    from onnx import helper, numpy_helper

    proto = onnx.load(str(src))
    graph = proto.graph
    out = graph.output[0].name
    for node in graph.node:
        node.output[:] = [f"{out}_pre" if o == out else o for o in node.output]
    inputs = [f"{out}_pre"]
    if factor is not None:
        graph.initializer.append(numpy_helper.from_array(np.array(factor, np.float32), "appended_gain"))
        inputs.append("appended_gain")
    graph.node.append(helper.make_node(op, inputs, [out]))
    onnx.save(proto, str(dst))
    return dst


@pytest.fixture(scope="module", params=["dynamo", "legacy"])
def transformer_files(request, tmp_path_factory):
    """torch.nn.TransformerEncoder (its last op is layers.3's norm2) exported by the user, with appended ops."""
    from tests.isolate.models import transformer, transformer_inputs

    model, x = transformer(), transformer_inputs()
    d = tmp_path_factory.mktemp(f"tf_{request.param}")
    base = d / "model.onnx"
    torch.onnx.export(model, (x,), str(base), dynamo=request.param == "dynamo", input_names=["x"])
    files = {name: _append_to_output(base, d / f"{name}.onnx", *how)
             for name, how in {"x1": ("Mul", 1.0), "x1.01": ("Mul", 1.01), "log": ("Log",)}.items()}
    return model, (x,), {"plain": base, **files}


def test_ops_appended_after_the_last_module_are_the_roots_not_that_modules(transformer_files, tmp_path):
    model, inputs, files = transformer_files
    last = "encoder.layers.3.norm2"
    for keep in ("plain", "x1"):          # a faithful file, and one with a gain of 1 appended: no divergence
        res = compare(model, inputs, "onnxruntime", artifact=files[keep])
        assert res.diff.verdict == "match", (keep, res.summary)
    res = compare(model, inputs, "onnxruntime", artifact=files["x1.01"], out=tmp_path / "x101")
    assert res.first_divergence == "<root>" and res.diff.get(last).passed, res.summary
    from tensorprobe.bundle import Bundle
    cand = Bundle.open(tmp_path / "x101" / "onnxruntime")
    assert cand[last].op == "LayerNormalization" and cand["<root>"].op == "Mul"
    res = compare(model, inputs, "onnxruntime", artifact=files["log"])   # NaN made by the appended log
    assert res.first_divergence == "<root>" and res.diff.get(last).passed
    assert res.cand_nan.record == "<root>" and res.cand_nan.op == "Log"
    assert "log of" in res.summary.lower() and "negative values" in res.summary, res.summary


class _Recurrent(torch.nn.Module):
    """torch.nn.LSTM, whose (h_n, c_n) share a shape, and a head reading only h_n."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lstm = torch.nn.LSTM(6, 12, batch_first=True)
        self.head = torch.nn.Linear(12, 2)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return self.head(h[-1]) + out.mean(1)[:, :2], c


@pytest.mark.parametrize("seed", [0, 1])
def test_outputs_of_one_shape_are_named_by_value_not_by_the_order_the_graph_computes_them(tmp_path, seed):
    """LSTMCell computes c before h and returns (h, c): by production order the capture called c
    `lstm_cell:0`, and compare said the faithful Silero port diverges there (relative error 1.28)."""
    pytest.importorskip("silero_vad")
    from tensorprobe.examples import silero

    model, inputs = silero.pytorch_port(seed)
    with torch.no_grad():
        h, c = model.lstm_cell(*_lstm_cell_inputs(model, *inputs))
    b = get_runtime("onnxruntime").capture(model, inputs, out=tmp_path / "vad")
    for name, want in (("lstm_cell:0", h), ("lstm_cell:1", c)):
        got = b.numpy(name)
        assert np.linalg.norm(got - want.numpy()) <= 1e-3 * np.linalg.norm(want.numpy()), name   # swapped: ~1
    res = compare(model, inputs, "onnxruntime")
    for name in ("lstm_cell:0", "lstm_cell:1"):
        assert res.diff.get(name).metrics["rel_l2_err"] < 1e-4, res.summary
    rnn, x = _Recurrent().eval(), torch.randn(2, 7, 6, generator=torch.Generator().manual_seed(seed))
    b = get_runtime("onnxruntime").capture(rnn, (x,), out=tmp_path / "rnn")
    with torch.no_grad():
        out, (h, c) = rnn.lstm(x)
    for name, want in (("lstm:0", out), ("lstm:1", h), ("lstm:2", c)):
        np.testing.assert_allclose(b.numpy(name), want.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


def _lstm_cell_inputs(model, x, state):
    """What Silero's forward gives its LSTMCell (the port's own code up to that call)."""
    got = {}
    handle = model.lstm_cell.register_forward_pre_hook(lambda m, args: got.setdefault("args", args))
    with torch.no_grad():
        model(x, state)
    handle.remove()
    return got["args"]


def test_missing_runtime_names_the_extra():
    class Missing(RuntimeAdapter):
        name, package, extra = "fake", "tensorprobe_no_such_runtime_pkg", "onnx"

    with pytest.raises(RuntimeUnavailable, match=r"pip install 'tensorprobe\[onnx\]'"):
        Missing.require()
    with pytest.raises(RuntimeUnavailable, match=r"pip install 'tensorprobe\[onnx\]'"):
        Missing().capture(torch.nn.Identity(), (torch.ones(1),), out="unused")


class _ScalarWeights(torch.nn.Module):
    """A mono output conv (bias of one element), a learned 0-d gain, a 0-d buffer, and constants the exporter
    folds into one-element initializers of its own (3.0, 0.1, the length)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 1, 3, padding=1)
        self.gain = torch.nn.Parameter(torch.tensor(0.5))
        self.register_buffer("eps", torch.tensor(1e-5))

    def forward(self, x):
        y = self.conv(x) * self.gain * 3.0 + 0.1
        return torch.log(y.abs() + self.eps) / x.shape[-1]


@pytest.mark.parametrize("exporter", ["dynamo", "legacy"])
def test_weights_of_one_element_are_recorded_and_folded_constants_are_not(tmp_path, exporter):
    torch.manual_seed(0)
    model, x = _ScalarWeights().eval(), torch.randn(1, 4, 50)
    ort = get_runtime("onnxruntime")
    b = ort.capture(model, (x,), out=tmp_path / "b", exporter=exporter)
    weights = {r.name: r for r in b if r.kind == "param"}
    assert set(weights) == {"conv.weight", "conv.bias", "gain", "eps"}         # the state dict, nothing else
    assert weights["conv.bias"].shape == (1,) and weights["gain"].shape == () and weights["eps"].shape == ()
    # paired with the PyTorch capture's weights by name, and compared
    ref = capture(model, x, keep="full", out=tmp_path / "ref")
    report = diff(ref, b)
    assert {w.name for w in report.weights} == {"conv.weight", "conv.bias", "gain", "eps"}
    assert not report.weights_ref_only and not report.weights_cand_only and not report.weights_differ
    # a file opened on its own, no model to ask: the dynamo file's graph signature lists its weights; the
    # TorchScript exporter keeps its constants in Constant nodes, and names what it folds `onnx::...`
    path = export_onnx(model, (x,), tmp_path / "m.onnx", exporter=exporter)
    alone = {r.name for r in ort.capture_artifact(path, (x,), out=tmp_path / "a") if r.kind == "param"}
    assert alone == {"conv.weight", "conv.bias", "gain", "eps"}


def test_a_wrong_one_element_bias_is_named_by_compare(tmp_path):
    torch.manual_seed(0)
    model, x = _ScalarWeights().eval(), torch.randn(1, 4, 50)
    path = export_onnx(model, (x,), tmp_path / "m.onnx")
    m = onnx.load(str(path))
    init = next(i for i in m.graph.initializer if i.name == "conv.bias")
    init.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(init) + np.float32(0.3), init.name))
    onnx.save(m, str(tmp_path / "wrong.onnx"))
    res = compare(model, (x,), "onnxruntime", artifact=tmp_path / "wrong.onnx", out=tmp_path / "cmp")
    assert [w.name for w in res.diff.weights_differ] == ["conv.bias"]
    assert res.diff.first_divergence == "conv" and res.diff.pair("conv").cause == "weights", res.summary
    res = compare(model, (x,), "onnxruntime", artifact=path, out=tmp_path / "ok")     # the file as exported
    assert not res.diff.weights_differ and not res.diff.weights_ref_only


# ---- the Kokoro decoder --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def kokoro_onnx(kokoro, tmp_path_factory):
    root = tmp_path_factory.mktemp("kokoro_onnx")
    model = kokoro.exportable_decoder()
    inputs = kokoro.decoder_inputs(0.25)
    path = export_onnx(model, inputs, root / "decoder.onnx")
    ref = capture(model, *inputs, level="module", keep="full", out=root / "ref")
    return model, inputs, path, ref, root


@pytest.mark.slow
def test_kokoro_decoder_every_mapped_record_matches(kokoro_onnx):
    model, inputs, path, ref, root = kokoro_onnx
    b = get_runtime("onnxruntime").capture_artifact(path, inputs, out=root / "ort")
    mapped = [r for r in ref if r.name in b and r.kind == "output"]
    assert len(mapped) >= 250, len(mapped)
    assert "generator.noise_res.0.adain1.0.norm" in b
    assert b["generator.noise_res.0.adain1.0.norm"].op == "InstanceNormalization"
    assert "encode.actv@2" in b     # a LeakyReLU shared by every block: named as PyTorch names its calls
    # float tolerance, scaled to each tensor: the "stable" setting feeds instance norms channels that are
    # constant over time, whose normalized values are pure rounding noise (~1e-5) in both runtimes
    bad = {}
    for r in mapped:
        a, c = ref.numpy(r.name), b.numpy(r.name)
        if not np.allclose(c, a, rtol=1e-3, atol=3e-3 * max(1.0, float(np.abs(a).max()))):
            bad[r.name] = float(np.abs(c - a).max())
    assert not bad, bad


@pytest.mark.slow
def test_scaled_initializer_first_divergence(kokoro_onnx):
    model, inputs, path, ref, root = kokoro_onnx
    m = onnx.load(str(path))
    init = next(i for i in m.graph.initializer if i.name == "decode.1.conv1.bias")
    arr = onnx.numpy_helper.to_array(init) * 1.5 + 0.1
    init.CopyFrom(onnx.numpy_helper.from_array(arr.astype(np.float32), init.name))
    wrong = root / "wrong.onnx"
    onnx.save(m, str(wrong))
    res = compare(model, inputs, "onnxruntime", artifact=wrong, out=root / "cmp_wrong")
    assert res.first_divergence == "decode.1.conv1"
    assert res.finding and not res.cand_nan_escapes
    assert res.compared >= 250
    assert "decode.1.conv1" in res.summary


@pytest.mark.slow
def test_kokoro_one_element_biases_are_weights_and_a_wrong_one_is_named(kokoro_onnx):
    model, inputs, path, ref, root = kokoro_onnx
    ort = get_runtime("onnxruntime")
    b = ort.capture_artifact(path, inputs, out=root / "weights")
    one = {r.name for r in b if r.kind == "param" and int(np.prod(r.shape)) == 1}
    # F0_conv and N_conv map 1 channel to 1; the harmonic source's linear layer has one output
    assert one == {"F0_conv.bias", "N_conv.bias", "generator.m_source.l_linear.bias"}
    m = onnx.load(str(path))
    init = next(i for i in m.graph.initializer if i.name == "F0_conv.bias")
    init.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(init) + np.float32(0.5), init.name))
    onnx.save(m, str(root / "wrong_f0_bias.onnx"))
    res = compare(model, inputs, "onnxruntime", artifact=root / "wrong_f0_bias.onnx", out=root / "cmp_f0")
    assert [w.name for w in res.diff.weights_differ] == ["F0_conv.bias"], res.summary
    assert res.diff.first_divergence == "F0_conv" and res.diff.pair("F0_conv").cause == "weights", res.summary


@pytest.mark.slow
def test_int8_dynamic_quantization_per_layer_drop(kokoro_onnx):
    from onnxruntime.quantization import QuantType, quantize_dynamic

    model, inputs, path, ref, root = kokoro_onnx
    q = root / "decoder_int8.onnx"
    quantize_dynamic(str(path), str(q), weight_type=QuantType.QInt8)
    ops = {n.op_type for n in onnx.load(str(q)).graph.node}
    assert {"ConvInteger", "DynamicQuantizeLinear"} <= ops
    ort = get_runtime("onnxruntime")
    fp32 = ort.capture_artifact(path, inputs, out=root / "fp32")
    int8 = ort.capture_artifact(q, inputs, out=root / "int8")
    assert any(r.dtype in ("uint8", "int32") and r.stats.kind == "int" for r in int8)
    # the two ONNX files line up by their shared tensor names
    report = diff(module_view(fp32), module_view(int8), min_corr=0.999)
    assert len(report.pairs) >= 200
    drops = {p.name: p.metrics["pearson"] for p in report.pairs if p.metrics.get("pearson") is not None}
    assert drops["encode.conv1"] < 1.0 and drops["encode.conv1"] > 0.9
    assert report.first_divergence is not None
    # and against PyTorch, the per-layer correlation drop is reported layer by layer
    res = compare(model, inputs, "onnxruntime", artifact=q, out=root / "cmp_int8", min_corr=0.9999)
    corr = [p.metrics["pearson"] for p in res.diff.pairs if p.name.startswith("decode.")]
    assert res.first_divergence is not None and min(corr) < 0.9999


def test_compare_cli_passes_runtime_options_and_rejects_unknown_ones_before_running(tmp_path):
    import json
    import subprocess
    import sys

    (tmp_path / "phase.py").write_text(
        "import torch\n"
        "class Phase(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.atan2(x * 0, x * 0) + x\n"
        "def build():\n"
        "    return Phase(), (torch.ones(2, 3),)\n")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "tensorprobe", "compare", "phase.py:build", *args],
                              capture_output=True, text=True, cwd=tmp_path)

    # -O reaches the runtime: only the legacy exporter lowers atan2 to a Div whose 0/0 is NaN.
    p = cli("--runtime", "onnxruntime", "-O", "exporter=legacy", "--json")
    doc = json.loads(p.stdout)
    assert p.returncode == 1, p.stderr
    assert doc["compare"]["runtime_info"]["exporter"] == "legacy"
    assert doc["compare"]["cand_nan"]["record"] == "<root>/Div.0"
    # An option the runtime does not take: one line naming it and the ones it takes, exit 2, nothing written.
    p = cli("--runtime", "onnxruntime", "-O", "random=zeros", "-o", "cmp")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr.strip().splitlines() == [
        "error: runtime 'onnxruntime' does not take option(s) random; it takes exporter, opset, rules, "
        "max_bytes, threads, dynamic"]
    assert not (tmp_path / "cmp").exists()


def test_nan_diagnosis_rules_read_onnx_records(tmp_path):
    """Rules are written for canonical op names: an ONNX Sqrt / Log gets the same diagnosis as aten's, in ONNX's
    words (`Log`, not aten's `log`)."""
    from tensorprobe.nan import find_nonfinite_in_bundle

    class LogOfNorm(torch.nn.Module):
        def forward(self, x):
            return torch.log(x - x.mean(dim=-1, keepdim=True))     # half the values negative: NaN

    x = torch.linspace(-1, 1, 64).reshape(1, 2, 32)
    b = get_runtime("onnxruntime").capture(LogOfNorm(), (x,), out=tmp_path / "b", keep="full")
    origin = find_nonfinite_in_bundle(b)
    assert origin.found and origin.op == "Log"                   # the ONNX node, as ONNX names it
    assert any(d.startswith("Log of 32 negative values") for d in origin.diagnosis), origin.diagnosis   # ONNX's name
