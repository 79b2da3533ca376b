"""What one ONNX Runtime capture leaves to the next in the same process (the shape-inference and naming
plan of a file, the pre-faulted output buffer) must never change what the next capture records."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnxruntime", reason="needs the onnx extra: pip install 'tensorprobe[onnx]'")
import onnx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

from tensorprobe.bundle.writer import PREFAULTED, release_buffers  # noqa: E402
from tensorprobe.runtimes import get_runtime  # noqa: E402
from tensorprobe.runtimes.onnxruntime import adapter  # noqa: E402

pytestmark = pytest.mark.onnx


def _fresh_process_state() -> None:
    adapter._PLANS.clear()
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
    kept = PREFAULTED.kept_bytes()
    assert len(adapter._PLANS) == int(planned) and kept > 0
    warm = ort.capture_artifact(path, feeds(1), out=tmp_path / "item1", keep="full")
    assert len(adapter._PLANS) == int(planned) and PREFAULTED.kept_bytes() == kept   # reused, nothing new
    _fresh_process_state()
    cold = ort.capture_artifact(path, feeds(1), out=tmp_path / "item1-cold", keep="full")
    _same_bundles(warm, cold)
    differ = [r.name for r, s in zip(first, warm) if r.stats != s.stats and r.kind != "param"]
    assert len(differ) > len([r for r in first if r.kind != "param"]) // 4   # stale values would show


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
