"""ONNX graphs as people ship them: If on an input, model-local functions, fp16 files — here a synthetic
If graph (both branches, nested) and Silero VAD's own ONNX files from the PyPI package."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import pytest

import tensorprobe as tp

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper  # noqa: E402

from tensorprobe.runtimes import get_runtime  # noqa: E402

pytestmark = pytest.mark.onnx


def _if_graph() -> "onnx.ModelProto":
    """y = If(sr == 16000, then: relu(x @ W1) [with a nested If on sum(x) > 0], else: sigmoid(x @ W2))."""
    rng = np.random.default_rng(0)
    w1 = onnx.numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "W1")
    w2 = onnx.numpy_helper.from_array(rng.standard_normal((4, 4)).astype(np.float32), "W2")
    out = helper.make_tensor_value_info("h", TensorProto.FLOAT, None)
    inner_then = helper.make_graph([helper.make_node("Relu", ["m"], ["h"], name="relu")], "inner_then", [], [out])
    inner_else = helper.make_graph([helper.make_node("Neg", ["m"], ["h"], name="neg")], "inner_else", [], [out])
    then = helper.make_graph([
        helper.make_node("MatMul", ["x", "W1"], ["m"], name="matmul"),
        helper.make_node("ReduceSum", ["x"], ["s"], name="sum", keepdims=0),
        helper.make_node("Greater", ["s", "zero"], ["pos"], name="pos"),
        helper.make_node("If", ["pos"], ["h"], name="If_inner", then_branch=inner_then, else_branch=inner_else),
    ], "then", [], [helper.make_tensor_value_info("h", TensorProto.FLOAT, None)],
        initializer=[onnx.numpy_helper.from_array(np.array(0.0, np.float32), "zero")])
    other = helper.make_graph([
        helper.make_node("MatMul", ["x", "W2"], ["m2"], name="matmul"),
        helper.make_node("Sigmoid", ["m2"], ["h2"], name="sigmoid"),
    ], "else", [], [helper.make_tensor_value_info("h2", TensorProto.FLOAT, None)])
    graph = helper.make_graph([
        helper.make_node("Equal", ["sr", "sr16k"], ["is16k"], name="eq"),
        helper.make_node("If", ["is16k"], ["y0"], name="If_0", then_branch=then, else_branch=other),
        helper.make_node("Mul", ["y0", "two"], ["y"], name="scale"),
    ], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
             helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=[w1, w2, onnx.numpy_helper.from_array(np.array(16000, np.int64), "sr16k"),
                     onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("sr, x_sign, branch, op", [(16000, 1, "If_0.then", "If_inner.then"),
                                                    (16000, -1, "If_0.then", "If_inner.else"),
                                                    (8000, 1, "If_0.else", None)])
def test_if_branches_the_inputs_take_are_captured_value_by_value(tmp_path, sr, x_sign, branch, op):
    path = tmp_path / "if.onnx"
    onnx.save(_if_graph(), str(path))
    feeds = {"x": np.abs(np.random.default_rng(1).standard_normal((1, 4))).astype(np.float32) * x_sign,
             "sr": np.array(sr, np.int64)}
    expected = ort.InferenceSession(str(path)).run(["y"], feeds)[0]
    b = get_runtime("onnxruntime").capture_artifact(path, feeds, tmp_path / "b")
    names = [r.name for r in b.records]
    assert any(n.startswith(f"{branch}/MatMul") for n in names), names
    if op is not None:   # the nested If, decided in the next round, is inlined too
        assert any(n.startswith(f"{branch}.{op}") for n in names), names
    # The If's output is its branch's value; the scale after it is the graph's own (root) code, not the branch's
    assert b["If_0"].runtime_name == "y0" and b["<root>"].op == "Mul"
    assert not any("/If." in n for n in names)   # no If is left as one opaque op
    outputs = [r.name for r in b.records if r.kind == "model_output"]
    assert outputs == ["output"]
    np.testing.assert_array_equal(b.tensor("output").numpy(), expected)
    assert any("inlined 2 If" in n or "inlined 1 If" in n for n in b.manifest["runtime"]["notes"])


def test_a_graph_onnx_runtime_cannot_run_is_one_line_and_exit_2(tmp_path):
    bad = helper.make_model(helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[onnx.numpy_helper.from_array(np.ones((4, 2), np.float32), "W")]),
        opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "bad.onnx"
    onnx.save(bad, str(path))
    np.savez(tmp_path / "in.npz", x=np.ones((1, 3), np.float32))
    res = subprocess.run([sys.executable, "-m", "tensorprobe", "capture", str(path), "--inputs",
                          str(tmp_path / "in.npz"), "-o", str(tmp_path / "out")], capture_output=True, text=True)
    assert res.returncode == 2, res.stderr
    err = " ".join(res.stderr.split())
    assert "Traceback" not in err and "Incompatible dimensions for matrix multiplication" in err
    assert "Node (mm) Op (MatMul)" in err and len(res.stderr.strip().splitlines()) <= 3
    assert not (tmp_path / "out" / "manifest.json").exists() or \
        json.loads((tmp_path / "out" / "manifest.json").read_text())["status"] != "complete"


# ---------------------------------------------------------------------------------------------------
# Silero VAD, as shipped on PyPI


def _silero(name: str) -> Path:
    spec = importlib.util.find_spec("silero_vad")
    if spec is None:
        pytest.skip("silero-vad is not installed (the [test] extra installs it)")
    path = Path(spec.submodule_search_locations[0]) / "data" / name
    if not path.is_file():
        pytest.skip(f"silero-vad ships no {name}")
    return path


def _speech_like(with_sr: bool = True) -> dict[str, np.ndarray]:
    t = np.arange(512) / 16000
    x = (0.3 * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32)[None]
    feeds = {"input": x, "state": np.zeros((2, 1, 128), np.float32)}
    if with_sr:
        feeds["sr"] = np.array(16000, np.int64)
    return feeds


SHIPPED = [("silero_vad.onnx", True), ("silero_vad_half.onnx", False), ("silero_vad_op18_ifless.onnx", True),
           ("silero_vad_16k_op15.onnx", True)]


@pytest.mark.parametrize("name, with_sr", SHIPPED)
def test_shipped_silero_files_capture_and_match_themselves(tmp_path, name, with_sr):
    path = _silero(name)
    feeds = _speech_like(with_sr)
    expected = ort.InferenceSession(str(path)).run(None, feeds)
    rt = get_runtime("onnxruntime")
    a = rt.capture_artifact(path, feeds, tmp_path / "a")
    b = rt.capture_artifact(path, feeds, tmp_path / "b")
    forward = [r for r in a.records if r.kind == "output"]
    assert len(forward) > 40, f"{name}: only {len(forward)} values exposed"
    # the network inside the If / the functions, value by value
    assert sum(r.op == "Conv" for r in forward) >= 4 and any(r.op in ("LSTM", "Tanh") for r in forward)
    for got, want in zip((a.tensor("output.output"), a.tensor("output.stateN")), expected):
        np.testing.assert_array_equal(got.numpy(), want)
    r = tp.diff(a, b)
    assert r.verdict == "match" and not r.ref_only and not r.cand_only


def test_shipped_silero_int8_and_float16_ports_get_sensible_verdicts(tmp_path):
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.float16 import convert_float_to_float16

    path = _silero("silero_vad_16k_op15.onnx")
    feeds = _speech_like()
    quantize_dynamic(str(path), str(tmp_path / "int8.onnx"), weight_type=QuantType.QInt8)
    onnx.save(convert_float_to_float16(onnx.load(str(path)), keep_io_types=True), str(tmp_path / "fp16.onnx"))
    rt = get_runtime("onnxruntime")
    ref = rt.capture_artifact(path, feeds, tmp_path / "ref")
    int8 = tp.diff(ref, rt.capture_artifact(tmp_path / "int8.onnx", feeds, tmp_path / "q"))
    out = int8.get(int8.output)     # judged by its output: a match exactly when it meets the output criterion
    meets = out.metric("snr_db") >= 20 and out.metric("pearson") >= 0.99
    assert int8.verdict == ("match" if meets else "diverged"), int8.summary
    first = next(p for p in int8.pairs if p.name == int8.first_divergence)
    assert first.op == "Conv" and "stft" in first.module   # the first conv ONNX Runtime quantized
    assert any(p.cause == "quantized" for p in int8.pairs if p.failed)
    fp16 = tp.diff(ref, rt.capture_artifact(tmp_path / "fp16.onnx", feeds, tmp_path / "h"))
    assert fp16.verdict == "match"   # float16 rounding, within its noise floor everywhere
    # Model inputs pair only with model inputs: the int64 sample rate is compared exactly, with itself.
    sr = next(p for p in int8.pairs if p.name == "input.sr")
    assert sr.cand_name == "input.sr" and sr.passed
    for report in (int8, fp16):
        assert all(p.cand_name.startswith("input.") == p.name.startswith("input.") for p in report.pairs)


@pytest.mark.parametrize("fed, differs", [("same", False), ("reversed", True), ("louder", True)])
def test_a_default_capture_keeps_the_model_inputs_so_diff_says_they_differ(tmp_path, fed, differs):
    """The Silero port against the shipped ONNX file, both captured at the default keep (statistics): a port
    fed another frame (reversed, or 0.1% louder) is told "the inputs already differ", not a layer's own error."""
    from tensorprobe.examples import silero

    ref = get_runtime("onnxruntime").capture_artifact(_silero("silero_vad_16k_op15.onnx"), silero.onnx_feeds(),
                                                      tmp_path / "onnx", keep="stats")
    inputs = [r for r in ref.records if r.kind == "model_input"]
    assert [r.name for r in inputs] == ["input.input", "input.state", "input.sr"] and all(r.has_tensor for r in inputs)
    model, (x, state) = silero.pytorch_port()
    x = {"same": x, "reversed": x.flip(-1).contiguous(), "louder": x * 1.001}[fed]
    report = tp.diff(ref, tp.capture(model, x, state, out=tmp_path / "port", keep="stats"), rules=silero.RULES)
    pair = next(p for p in report.pairs if p.name == "input.input")
    assert pair.failed == differs
    if differs:
        assert report.first_divergence == "input.input" and "model inputs already differ" in report.summary
    else:
        assert "inputs already differ" not in report.summary and report.first_divergence is None, report.summary


def test_weights_in_an_external_data_file_load_from_the_models_path(tmp_path, monkeypatch):
    path = _silero("silero_vad_16k_op15.onnx")
    ext = tmp_path / "model" / "vad.onnx"
    ext.parent.mkdir()
    onnx.save(onnx.load(str(path)), str(ext), save_as_external_data=True, all_tensors_to_one_file=True,
              location="vad.weights", size_threshold=1024)
    assert (ext.parent / "vad.weights").stat().st_size > ext.stat().st_size
    monkeypatch.chdir(tmp_path)   # the weights are found next to the model, not in the working directory
    rt = get_runtime("onnxruntime")
    feeds = _speech_like()
    inline = rt.capture_artifact(path, feeds, tmp_path / "inline")
    external = rt.capture_artifact(ext, feeds, tmp_path / "external")
    r = tp.diff(inline, external)
    assert r.verdict == "match" and r.weights and all(p.passed for p in r.weights)
    np.testing.assert_array_equal(external.tensor("output.output").numpy(), inline.tensor("output.output").numpy())


# ---------------------------------------------------------------------------------------------------
# Files that break ONNX's rules in ways ONNX Runtime forgives, and unseeded random ops


def _noisy_graph(*, reverse: bool = False, seed: float | None = None) -> "onnx.ModelProto":
    """y = tanh(x @ W) + 0.1 * RandomNormalLike(x)."""
    rng = np.random.default_rng(0)
    draw = helper.make_node("RandomNormalLike", ["x"], ["n"], name="noise")
    if seed is not None:
        draw.attribute.append(helper.make_attribute("seed", seed))
    nodes = [helper.make_node("MatMul", ["x", "W"], ["m"], name="mm"),
             helper.make_node("Tanh", ["m"], ["t"], name="tanh"), draw,
             helper.make_node("Mul", ["n", "tenth"], ["s"], name="scale"),
             helper.make_node("Add", ["t", "s"], ["y"], name="add")]
    graph = helper.make_graph(
        nodes[::-1] if reverse else nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])],
        initializer=[onnx.numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W"),
                     onnx.numpy_helper.from_array(np.array(0.1, np.float32), "tenth")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_nodes_listed_out_of_order_capture_in_the_order_they_run(tmp_path):
    onnx.save(_noisy_graph(), str(tmp_path / "sorted.onnx"))
    onnx.save(_noisy_graph(reverse=True), str(tmp_path / "reversed.onnx"))   # ONNX Runtime runs it anyway
    feeds = {"x": np.ones((2, 8), np.float32)}
    rt = get_runtime("onnxruntime")
    a = rt.capture_artifact(tmp_path / "sorted.onnx", feeds, tmp_path / "a")
    b = rt.capture_artifact(tmp_path / "reversed.onnx", feeds, tmp_path / "b")
    names = [r.name for r in b.records if r.kind in ("output", "rng")]
    assert sorted(names) == sorted(["<root>/MatMul.0", "<root>/Tanh.0", "<root>/RandomNormalLike.0", "<root>/Mul.0",
                                    "<root>"])
    at = names.index   # each value after what it reads
    assert at("<root>/MatMul.0") < at("<root>/Tanh.0") and at("<root>/RandomNormalLike.0") < at("<root>/Mul.0")
    assert names[-1] == "<root>"
    assert any("topological order" in n for n in b.manifest["runtime"]["notes"])
    assert not any("topological order" in n for n in a.manifest["runtime"].get("notes", []))
    r = tp.diff(a, b)
    assert r.verdict == "match" and not r.ref_only and not r.cand_only


def test_unseeded_random_ops_draw_the_same_numbers_however_the_capture_runs_the_graph(tmp_path):
    path = tmp_path / "noisy.onnx"
    onnx.save(_noisy_graph(), str(path))
    feeds = {"x": np.ones((2, 8), np.float32)}
    rt = get_runtime("onnxruntime")
    full = rt.capture_artifact(path, feeds, tmp_path / "full")
    only = rt.capture_artifact(path, feeds, tmp_path / "only", include="Random|Mul")   # other values marked
    draws = full.numpy("<root>/RandomNormalLike.0")
    assert draws.std() > 0.5   # real draws, not zeros
    np.testing.assert_array_equal(only.numpy("<root>/RandomNormalLike.0"), draws)
    assert any("random op(s) without a seed" in n for n in full.manifest["runtime"]["notes"])


def test_a_seed_the_file_sets_is_kept(tmp_path):
    path = tmp_path / "seeded.onnx"
    onnx.save(_noisy_graph(seed=7.0), str(path))
    feeds = {"x": np.ones((2, 8), np.float32)}
    probe = onnx.load(str(path))
    probe.graph.output.append(helper.make_empty_tensor_value_info("n"))
    plain = ort.InferenceSession(probe.SerializeToString()).run(["n"], feeds)[0]
    b = get_runtime("onnxruntime").capture_artifact(path, feeds, tmp_path / "b")
    np.testing.assert_array_equal(b.numpy("<root>/RandomNormalLike.0"), plain)
    assert not any("without a seed" in n for n in b.manifest["runtime"].get("notes", []))


# ---------------------------------------------------------------------------------------------------
# Loop and Scan: unrolled when the inputs fix the iteration count


def _rnn_body(loop: bool) -> "onnx.GraphProto":
    """h' = tanh(h @ W + x_t); returns h' as the carried state and as a scan output."""
    nodes = [helper.make_node("MatMul", ["h", "W"], ["hw"], name="matmul"),
             helper.make_node("Add", ["hw", "xt"], ["pre"], name="add"),
             helper.make_node("Tanh", ["pre"], ["h2"], name="tanh"),
             helper.make_node("Identity", ["h2"], ["y_t"], name="emit")]
    f = TensorProto.FLOAT
    if loop:   # x_t = x[i], read from the outer graph; the condition passes through
        nodes = [helper.make_node("Gather", ["x", "i"], ["xt"], name="step", axis=0),
                 helper.make_node("Identity", ["cond"], ["cond_out"], name="keep_going"), *nodes]
        inputs = [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                  helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
                  helper.make_tensor_value_info("h", f, [1, 4])]
        outputs = [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                   helper.make_tensor_value_info("h2", f, [1, 4]), helper.make_tensor_value_info("y_t", f, [1, 4])]
    else:
        inputs = [helper.make_tensor_value_info("h", f, [1, 4]), helper.make_tensor_value_info("xt", f, [1, 4])]
        outputs = [helper.make_tensor_value_info("h2", f, [1, 4]), helper.make_tensor_value_info("y_t", f, [1, 4])]
    return helper.make_graph(nodes, "body", inputs, outputs)


def _rnn_graph(op: str, *, stop_inside: bool = False) -> "onnx.ModelProto":
    """An RNN over x[T, 1, 4] as a Loop (trip count = T, from the input's shape) or a Scan."""
    rng = np.random.default_rng(0)
    f = TensorProto.FLOAT
    inits = [onnx.numpy_helper.from_array((0.5 * rng.standard_normal((4, 4))).astype(np.float32), "W"),
             onnx.numpy_helper.from_array(np.zeros((1, 4), np.float32), "h0"),
             onnx.numpy_helper.from_array(np.array(0, np.int64), "zero"),
             onnx.numpy_helper.from_array(np.array(True), "true")]
    if op == "Loop":
        body = _rnn_body(loop=True)
        if stop_inside:   # a while loop: stop once the state's sum goes negative
            body.node.remove(next(n for n in body.node if n.name == "keep_going"))
            body.node.extend([helper.make_node("ReduceSum", ["h2"], ["s"], name="sum", keepdims=0),
                              helper.make_node("Greater", ["s", "zero_f"], ["cond_out"], name="positive")])
            body.initializer.append(onnx.numpy_helper.from_array(np.array(0.0, np.float32), "zero_f"))
        nodes = [helper.make_node("Shape", ["x"], ["shape"], name="shape"),
                 helper.make_node("Gather", ["shape", "zero"], ["T"], name="T", axis=0),
                 helper.make_node("Loop", ["T", "true", "h0"], ["hT", "ys"], name="Loop_0", body=body)]
    else:
        nodes = [helper.make_node("Scan", ["h0", "x"], ["hT", "ys"], name="Scan_0", body=_rnn_body(loop=False),
                                  num_scan_inputs=1)]
    nodes.append(helper.make_node("Mul", ["ys", "two"], ["y"], name="scale"))
    inits.append(onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two"))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", f, ["T", 1, 4])],
                              [helper.make_tensor_value_info("y", f, None), helper.make_tensor_value_info("hT", f, None)],
                              initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("op", ["Loop", "Scan"])
def test_loop_and_scan_unroll_into_one_scope_per_iteration(tmp_path, op):
    path = tmp_path / f"{op}.onnx"
    onnx.save(_rnn_graph(op), str(path))
    feeds = {"x": np.random.default_rng(1).standard_normal((5, 1, 4)).astype(np.float32)}
    expected = ort.InferenceSession(str(path)).run(None, feeds)
    b = get_runtime("onnxruntime").capture_artifact(path, feeds, tmp_path / "b")
    names = [r.name for r in b.records]
    for k in range(5):   # iteration k's values, each under <node>@k (the first call, like a module's, bare)
        scope = f"{op}_0@{k}" if k else f"{op}_0"
        assert f"{scope}/Tanh.0" in names and f"{scope}/MatMul.0" in names, names
    assert f"{op}_0@5/Tanh.0" not in names and not any(r.op == op for r in b.records)
    # the 4th iteration's state is what ORT's own Loop computed at step 4
    np.testing.assert_allclose(b.numpy(f"{op}_0@3/Tanh.0"), expected[0][3] / 2, rtol=1e-6)
    for got, want in zip((b.numpy("output.y"), b.numpy("output.hT")), expected):
        np.testing.assert_array_equal(got, want)
    assert any("unrolled 1 Loop/Scan" in n for n in b.manifest["runtime"]["notes"])
    assert tp.diff(b, get_runtime("onnxruntime").capture_artifact(path, feeds, tmp_path / "c")).verdict == "match"


def test_a_loop_that_stops_on_its_own_condition_is_unrolled_as_often_as_it_ran(tmp_path):
    path = tmp_path / "while.onnx"
    onnx.save(_rnn_graph("Loop", stop_inside=True), str(path))
    for seed in range(6):   # inputs on which the loop stops early, and on which it runs to the trip count
        feeds = {"x": np.random.default_rng(seed).standard_normal((5, 1, 4)).astype(np.float32)}
        expected = ort.InferenceSession(str(path)).run(None, feeds)
        ran = expected[0].shape[0]           # ORT's own scan output has one entry per iteration run
        b = get_runtime("onnxruntime").capture_artifact(path, feeds, tmp_path / f"b{seed}")
        names = {r.name for r in b.records}
        assert not any(r.op == "Loop" for r in b.records)
        assert (f"Loop_0@{ran - 1}/Tanh.0" if ran > 1 else "Loop_0/Tanh.0") in names
        assert f"Loop_0@{ran}/Tanh.0" not in names
        assert any(f"it ran {ran} time(s) on these inputs" in n for n in b.manifest["runtime"]["notes"])
        np.testing.assert_array_equal(b.numpy("output.y"), expected[0])
        np.testing.assert_array_equal(b.numpy("output.hT"), expected[1])


def test_a_scripted_while_loop_exported_by_torch_is_unrolled_and_matches_each_step(tmp_path):
    # torch.onnx's TorchScript exporter turns a `while` on a stop gate into a Loop whose body computes its
    # condition: an autoregressive decoder. Iteration k's state must be PyTorch's state at step k.
    from ._export_models import StopGateDecoder

    torch.manual_seed(0)
    model = StopGateDecoder().eval()
    h = torch.randn(1, 8)
    with torch.no_grad():
        states = model.states(h)
    assert 2 < len(states) < StopGateDecoder.MAX_STEPS      # it stops on its gate, not on the step cap
    path = tmp_path / "decoder.onnx"
    torch.onnx.export(torch.jit.script(model), (h,), str(path), dynamo=False, input_names=["h"],
                      output_names=["total", "steps"], opset_version=17)
    b = get_runtime("onnxruntime").capture_artifact(path, {"h": h.numpy()}, tmp_path / "b")
    assert any(f"it ran {len(states)} time(s)" in n for n in b.manifest["runtime"]["notes"])
    assert b.numpy("output.steps").reshape(-1).tolist() == [len(states)]
    tanh = {r.name: r for r in b.records if r.op == "Tanh"}
    for k, state in enumerate(states):   # the first Tanh of each iteration is the new state
        scope = f"Loop@{k}" if k else "Loop"
        np.testing.assert_allclose(b.numpy(f"{scope}/Tanh.0"), state.numpy(), rtol=1e-5, atol=1e-6)
    assert f"Loop@{len(states)}/Tanh.0" not in tanh
    again = get_runtime("onnxruntime").capture_artifact(path, {"h": h.numpy()}, tmp_path / "c")
    assert tp.diff(b, again).verdict == "match"
    # PyTorch's module calls (`proj@3`) line up with the iterations (`Loop@3/Gemm.2`) through four rules
    rules = [rf"{m}(@\d+)?=Loop\1/Gemm.{k}" for k, m in enumerate(("inp", "rec", "proj", "stop"))]
    report = tp.diff(b, tp.capture(model, h, out=tmp_path / "torch"), rules=rules)
    assert report.verdict == "match", report.summary
    assert {f"Loop@{k}/Gemm.2" for k in range(1, len(states))} <= {p.name for p in report.pairs}
    with torch.no_grad():
        model.proj.weight.mul_(1.01)   # a 1% conversion error in one weight
    report = tp.diff(b, tp.capture(model, h, out=tmp_path / "bug"), rules=rules)
    assert report.first_divergence == "Loop/Gemm.2" and report.pair("Loop/Gemm.2").cause == "weights"


class SharedAct(torch.nn.Module):
    """One LeakyReLU and one conv, each called twice: a user's dynamo file names both calls alike."""

    def __init__(self, gain: float = 1.0):
        super().__init__()
        torch.manual_seed(0)
        self.c1, self.c2 = torch.nn.Conv1d(8, 8, 3, padding=1), torch.nn.Conv1d(8, 8, 3, padding=1)
        self.act = torch.nn.LeakyReLU(0.1)
        self.gain = gain

    def forward(self, x):
        h = self.c2(self.act(self.c1(x)))
        return self.c2(self.act(h * self.gain if self.gain != 1.0 else h))


@pytest.mark.parametrize("gain", [1.0, 1.05])
def test_a_users_dynamo_file_numbers_the_calls_of_a_shared_module(tmp_path, gain):
    """`torch.onnx.export(dynamo=True)` as a user runs it keeps `name_scopes` without call indices: the second
    call of `act` took the first call's name and a faithful file diverged at c2 (relative error 1). Calls are
    numbered by where a module's result is read outside it: the faithful file matches; a gain the port applies
    between the calls is found at the second call."""
    from tensorprobe.compare import compare

    x = torch.randn(1, 8, 50, generator=torch.Generator().manual_seed(1))
    path = tmp_path / "shared.onnx"
    torch.onnx.export(SharedAct(gain).eval(), (x,), str(path), dynamo=True, verbose=False)
    r = compare(SharedAct().eval(), [x], "onnxruntime", artifact=path, out=tmp_path / "cmp").diff
    if gain == 1.0:
        assert r.verdict == "match", r.summary
        assert {"act", "act@1", "c2", "c2@1"} <= {p.name for p in r.pairs if p.compared}
    else:
        assert r.verdict == "diverged" and r.first_divergence == "act@1", r.summary
