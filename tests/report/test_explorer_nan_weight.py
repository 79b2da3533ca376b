"""A NaN born in a weight is marked on the graph (issue 33 item 1: "the NaN origin ... marked").

When `nan` finds the origin in a parameter (a converter wrote NaN into a bias), that parameter is no node of
the graph Model Explorer draws (an ONNX initializer shows as a node's input), so the overlay used to mark no
origin at all and called the node reading it "non-finite (inherited)". The origin is now the node that reads
the weight. Model: Silero-like VAD (`tensorprobe.examples.silero`, the shipped ONNX file's weights) exported by
`torch.onnx.export(dynamo=True)` as a user would, run by ONNX Runtime. Planted: one NaN in conv3's bias
(channel 5); moved: in conv1's bias (channel 7): the marked node moves to conv1's Conv. The right node is read
from the ONNX file (the Conv node whose inputs name the bias), not from the overlay code.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime", reason="needs the onnx extra: pip install 'tensorprobe[onnx]'")
pytest.importorskip("onnxscript", reason="needs the onnx extra: pip install 'tensorprobe[onnx]'")

import onnx  # noqa: E402

from tensorprobe.examples import silero  # noqa: E402
from tensorprobe.nan import find_nonfinite_in_bundle  # noqa: E402
from tensorprobe.report.explorer import nan_node_data  # noqa: E402
from tensorprobe.runtimes import get_runtime  # noqa: E402

pytestmark = pytest.mark.onnx


def _port(tmp: Path, layer: str, channel: int) -> tuple[Path, object]:
    model, inputs = silero.pytorch_port()
    with torch.no_grad():
        getattr(model, layer).bias[channel] = float("nan")
    path = tmp / f"nan_{layer}.onnx"
    torch.onnx.export(model, inputs, str(path), dynamo=True, input_names=["input", "state"])
    feeds = {k: v for k, v in silero.onnx_feeds().items() if k in ("input", "state")}
    bundle = get_runtime("onnxruntime").capture_artifact(str(path), feeds, tmp / f"cand_{layer}", keep="stats")
    return path, bundle


def _reader(path: Path, weight: str) -> str:
    names = [n.name for n in onnx.load(str(path)).graph.node if n.op_type == "Conv" and weight in n.input]
    assert len(names) == 1, names
    return names[0]


@pytest.mark.parametrize("layer, channel", [("conv3", 5), ("conv1", 7)])
def test_a_nan_weight_marks_the_node_that_reads_it(tmp_path, layer, channel):
    path, bundle = _port(tmp_path, layer, channel)
    origin = find_nonfinite_in_bundle(bundle)
    assert origin.found and origin.record == f"{layer}.bias"          # nan names the weight
    nan = nan_node_data(origin, bundle)["nan"]["results"]             # graph found from the manifest
    born = [k for k, v in nan.items() if "born" in v["value"]]
    assert born == [_reader(path, f"{layer}.bias")]
    assert f"from weight {layer}.bias (channel {channel} of " in nan[born[0]]["value"]
    assert nan[born[0]]["bgColor"] == "#000000"
    # without the graph (a file that no longer exists): keyed by value name, still the op the weight fed
    gone = tmp_path / "gone.onnx"
    shutil.copy(path, gone)
    feeds = {k: v for k, v in silero.onnx_feeds().items() if k in ("input", "state")}
    cand = get_runtime("onnxruntime").capture_artifact(str(gone), feeds, tmp_path / "gone", keep="stats")
    gone.unlink()
    nan = nan_node_data(find_nonfinite_in_bundle(cand), cand)["nan"]["results"]
    born = [k for k, v in nan.items() if "born" in v["value"]]
    model = onnx.load(str(path))
    reader = next(n for n in model.graph.node if n.name == _reader(path, f"{layer}.bias"))
    assert born == [reader.output[0]]
