"""What one ONNX Runtime capture leaves to the next in the same process (the shape-inference and naming
plan of a file, the pre-faulted output buffer, the sessions) must never change what the next capture records."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="needs the onnx extra: pip install 'tensorprobe[onnx]'")
import onnx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from tensorprobe.bundle.writer import PREFAULTED, release_buffers  # noqa: E402
from tensorprobe.runtimes import get_runtime  # noqa: E402
from tensorprobe.runtimes.onnxruntime import adapter, forget_kept  # noqa: E402

pytestmark = pytest.mark.onnx


def _fresh_process_state() -> None:
    forget_kept()
    release_buffers()


def _same_bundles(a, b) -> None:
    assert [r.name for r in a] == [r.name for r in b]
    for ra, rb in zip(a, b):
        assert ra.stats == rb.stats, ra.name
        if ra.shard is not None:
            np.testing.assert_array_equal(a.numpy(ra.name), b.numpy(rb.name), err_msg=ra.name)


def _warm_equals_cold(tmp_path, path, feeds, planned: bool) -> None:
    """Two items of the same shapes: the second capture reuses the first's output buffer (and plan, where
    the graph is the same whatever the inputs' values) and must equal a capture made with nothing kept."""
    ort = get_runtime("onnxruntime")
    _fresh_process_state()
    first = ort.capture_artifact(path, feeds(0), out=tmp_path / "item0", keep="full")
    kept, sessions = PREFAULTED.kept_bytes(), dict(adapter._SESSIONS)
    assert len(adapter._PLANS) == int(planned) and kept > 0 and len(sessions) == int(planned)
    warm = ort.capture_artifact(path, feeds(1), out=tmp_path / "item1", keep="full")
    assert len(adapter._PLANS) == int(planned) and PREFAULTED.kept_bytes() == kept   # reused, nothing new
    assert all(adapter._SESSIONS.get(k) is v for k, v in sessions.items()) and len(adapter._SESSIONS) == len(sessions)
    _fresh_process_state()
    cold = ort.capture_artifact(path, feeds(1), out=tmp_path / "item1-cold", keep="full")
    _same_bundles(warm, cold)
    differ = [r.name for r, s in zip(first, warm) if r.stats != s.stats and r.kind != "param"]
    assert len(differ) > len([r for r in first if r.kind != "param"]) // 4   # stale values would show


def _noisy_file(tmp_path, shape: list[int], **seed) -> Path:
    """x + RandomNormalLike(x) saved as an ONNX file (`seed=...`: a seeded draw)."""
    nodes = [helper.make_node("RandomNormalLike", ["x"], ["r"], name="noise/RandomNormalLike", **seed),
             helper.make_node("Add", ["x", "r"], ["y"], name="mix/Add")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)])
    path = tmp_path / "noisy.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_second_capture_of_a_shipped_model_records_what_a_fresh_process_records(tmp_path):
    """Silero VAD's shipped opset-15 file: its If is inlined by the inputs' values, so it is planned each
    time; the output buffer is reused."""
    from tensorprobe.examples import silero

    _warm_equals_cold(tmp_path, silero.onnx_file(), silero.onnx_feeds, planned=False)


def test_second_capture_of_a_graph_without_if_reuses_its_plan(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(_graph("Tanh"), str(path))
    feeds = lambda seed: {"x": np.random.default_rng(seed).standard_normal((8, 64)).astype(np.float32)}  # noqa: E731
    _warm_equals_cold(tmp_path, path, feeds, planned=True)


def _graph(op: str) -> onnx.ModelProto:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="proj/MatMul"),
             helper.make_node(op, ["h"], ["y"], name=f"act/{op}")]
    w = helper.make_tensor("w", TensorProto.FLOAT, [64, 64], np.linspace(-1, 1, 64 * 64).astype(np.float32))
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 64])], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_file_rewritten_in_place_is_planned_again(tmp_path):
    """Same path, same shapes, another graph: the plan of the old file must not name the new one's values."""
    path = tmp_path / "m.onnx"
    feeds = {"x": np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)}
    ort = get_runtime("onnxruntime")
    onnx.save(_graph("Relu"), str(path))
    relu = ort.capture_artifact(path, feeds, out=tmp_path / "relu", keep="stats")
    assert len(adapter._PLANS) >= 1
    onnx.save(_graph("Neg"), str(path))
    neg = ort.capture_artifact(path, feeds, out=tmp_path / "neg", keep="stats")
    assert "Relu" in {r.op for r in relu} and "Neg" not in {r.op for r in relu}
    assert "Neg" in {r.op for r in neg} and "Relu" not in {r.op for r in neg}
    assert neg["output"].stats.min < 0 <= relu["output"].stats.min


def test_a_graph_with_a_seeded_random_op_draws_the_same_numbers_at_every_capture(tmp_path):
    """A kept session's RandomNormalLike goes on drawing where its last run stopped (ORT keeps the generator
    in the kernel); a capture must draw what a new session draws, so such a graph's sessions are not kept."""
    path = _noisy_file(tmp_path, [4, 8], seed=3.0)
    feeds = {"x": np.zeros((4, 8), np.float32)}
    ort = get_runtime("onnxruntime")
    _fresh_process_state()
    first, second = (ort.capture_artifact(path, feeds, out=tmp_path / f"item{i}", keep="full") for i in range(2))
    assert first["output"].stats.std > 0.5   # standard normal draws
    np.testing.assert_array_equal(first.numpy("output"), second.numpy("output"))
    assert not adapter._SESSIONS


def test_sessions_kept_for_a_file_are_not_used_for_it_once_rewritten(tmp_path):
    """Same path and shapes, another graph written over the file: its capture runs a session of its own."""
    path = tmp_path / "m.onnx"
    feeds = {"x": np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)}
    ort = get_runtime("onnxruntime")
    _fresh_process_state()
    onnx.save(_graph("Relu"), str(path))
    ort.capture_artifact(path, feeds, out=tmp_path / "relu", keep="stats")
    onnx.save(_graph("Neg"), str(path))
    neg = ort.capture_artifact(path, feeds, out=tmp_path / "neg", keep="stats")
    assert neg["output"].stats.min < 0 < neg["output"].stats.max and len(adapter._SESSIONS) == 2
    forget_kept()
    assert not adapter._SESSIONS and not adapter._PLANS


def test_each_capture_of_a_loaded_file_carries_its_own_run_notes(tmp_path):
    """A sweep's worker captures every item from one loaded file: each bundle says what its run noted (here
    the seed given to an unseeded random op) once, not once for every item captured before it."""
    path = _noisy_file(tmp_path, [4, 8])
    ort = get_runtime("onnxruntime")
    loaded = ort.load(path)
    notes = [ort.capture_prepared(loaded, [np.zeros((4, 8), np.float32)], out=tmp_path / f"item{i}",
                                  keep="stats").manifest["runtime"]["notes"] for i in range(3)]
    assert len(notes[0]) == 1 and "given seeds" in notes[0][0]
    assert notes[1] == notes[2] == notes[0]


def test_a_forked_child_builds_its_own_sessions(tmp_path):
    """A kept session's thread pool does not survive a fork: a child process captures with its own."""
    import multiprocessing

    path = tmp_path / "m.onnx"
    onnx.save(_graph("Tanh"), str(path))
    feeds = {"x": np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)}
    ort = get_runtime("onnxruntime")
    parent = ort.capture_artifact(path, feeds, out=tmp_path / "parent", keep="stats")
    assert adapter._SESSIONS

    def child(queue):
        inherited = len(adapter._SESSIONS)
        queue.put((inherited, ort.capture_artifact(path, feeds, out=tmp_path / "child", keep="stats")["output"].stats))

    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    inherited, stats = queue.get(timeout=60)
    proc.join(60)
    assert inherited == 0 and stats == parent["output"].stats


def test_a_capture_of_a_torch_model_keeps_nothing_for_its_temporary_export(tmp_path):
    """`capture(model, ...)` exports into a temporary directory removed after the capture: the sessions
    (which hold the weights) and plans kept for that file would never serve again, so none are kept."""
    import torch

    _fresh_process_state()
    model = torch.nn.Sequential(torch.nn.Conv1d(2, 8, 3), torch.nn.GELU(), torch.nn.Conv1d(8, 2, 3)).eval()
    ort = get_runtime("onnxruntime")
    ort.capture(model, (torch.randn(1, 2, 64),), out=tmp_path / "bundle", keep="stats")
    assert not adapter._SESSIONS and not adapter._PLANS and not adapter._WEIGHT_FACTS
    kept = ort.capture(model, (torch.randn(1, 2, 64),), out=tmp_path / "kept", keep="stats",
                       workdir=tmp_path / "export")   # the user's directory: the file stays, so does its session
    assert len(adapter._SESSIONS) == 1 and len(kept) > 3


def test_a_session_is_kept_only_for_a_small_run(tmp_path):
    """A kept session keeps its arena too, which grows to the run's scratch memory: a run whose values pass
    64 MiB (a long input through a small model) builds its session each time and keeps none."""
    nodes = [helper.make_node("Tanh", ["x"], ["h"], name="act/Tanh"),
             helper.make_node("Neg", ["h"], ["y"], name="out/Neg")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "n"])])
    path = tmp_path / "dyn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    ort = get_runtime("onnxruntime")
    _fresh_process_state()
    ort.capture_artifact(path, {"x": np.ones((1, 12 << 20), np.float32)}, out=tmp_path / "long", keep="stats")
    assert not adapter._SESSIONS          # 2 x 48 MiB of values
    short = ort.capture_artifact(path, {"x": np.ones((1, 4096), np.float32)}, out=tmp_path / "short", keep="stats")
    assert len(adapter._SESSIONS) == 1 and short["output"].stats.max < 0


def _weights_scaled(factor: float) -> onnx.ModelProto:
    model = _graph("Tanh")
    w = model.graph.initializer[0]
    w.CopyFrom(helper.make_tensor("w", TensorProto.FLOAT, [64, 64],
                                  (factor * np.linspace(-1, 1, 64 * 64)).astype(np.float32).tobytes(), raw=True))
    return model


def test_a_file_rewritten_with_its_mtime_put_back_is_captured_anew(tmp_path):
    """`cp -p`, `rsync -t`, `tar x`: same path, size and inode, the old mtime; the ctime still moves."""
    import os

    path = tmp_path / "m.onnx"
    feeds = {"x": np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)}
    ort = get_runtime("onnxruntime")
    _fresh_process_state()
    onnx.save(_weights_scaled(1.0), str(path))
    st = os.stat(path)
    first = ort.capture_artifact(path, feeds, out=tmp_path / "first", keep="full")
    with open(path, "r+b") as f:   # in place: same inode
        f.write(_weights_scaled(1.5).SerializeToString())
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_ino == st.st_ino
    second = ort.capture_artifact(path, feeds, out=tmp_path / "second", keep="full")
    matmul = "<root>/MatMul.0"
    np.testing.assert_allclose(second.numpy(matmul), 1.5 * first.numpy(matmul), rtol=1e-5, atol=1e-5)


def test_a_model_whose_external_data_file_is_rewritten_is_captured_anew(tmp_path):
    """Weights saved beside the graph (`.onnx.data`): rewriting only that file changes what a capture runs."""
    path = tmp_path / "m.onnx"
    feeds = {"x": np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)}
    ort = get_runtime("onnxruntime")
    _fresh_process_state()

    onnx.save(_weights_scaled(1.0), str(path), save_as_external_data=True, all_tensors_to_one_file=True,
              location="m.onnx.data", size_threshold=0)
    first = ort.capture_artifact(path, feeds, out=tmp_path / "first", keep="full")
    data = tmp_path / "m.onnx.data"
    with open(data, "r+b") as f:   # in place, the weights x1.5; the graph file is not touched
        f.write((1.5 * np.frombuffer(data.read_bytes(), np.float32)).astype(np.float32).tobytes())
    second = ort.capture_artifact(path, feeds, out=tmp_path / "second", keep="full")
    matmul = "<root>/MatMul.0"
    np.testing.assert_allclose(second.numpy(matmul), 1.5 * first.numpy(matmul), rtol=1e-5, atol=1e-5)


def test_a_seeded_dropout_in_training_mode_draws_the_same_mask_at_every_capture(tmp_path):
    """ORT's Dropout keeps its generator in the kernel, as the random ops do: no session of it is kept."""
    nodes = [helper.make_node("Dropout", ["x", "ratio", "train"], ["y"], name="drop/Dropout", seed=7)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, 64])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [16, 64])],
                              initializer=[helper.make_tensor("ratio", TensorProto.FLOAT, [], [0.5]),
                                           helper.make_tensor("train", TensorProto.BOOL, [], [True])])
    path = tmp_path / "drop.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    feeds = {"x": np.ones((16, 64), np.float32)}
    ort = get_runtime("onnxruntime")
    _fresh_process_state()
    first, second = (ort.capture_artifact(path, feeds, out=tmp_path / f"item{i}", keep="full") for i in range(2))
    assert 0 < (first.numpy("output") == 0).mean() < 1   # a mask was drawn
    np.testing.assert_array_equal(first.numpy("output"), second.numpy("output"))
    assert not adapter._SESSIONS


def test_threads_capturing_from_one_loaded_file_each_get_their_own_notes(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    path = _noisy_file(tmp_path, [64, 256])
    ort = get_runtime("onnxruntime")
    loaded = ort.load(path)

    def capture(i):
        return ort.capture_prepared(loaded, [np.zeros((64, 256), np.float32)], out=tmp_path / f"item{i}",
                                    keep="stats").manifest["runtime"]["notes"]

    with ThreadPoolExecutor(3) as pool:
        notes = list(pool.map(capture, range(24)))
    assert all(len(n) == 1 and "given seeds" in n[0] for n in notes)
