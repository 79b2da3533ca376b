"""The diff HTML page: self-contained, names escaped, and what a user needs is in the rendered DOM."""

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[1] / "diff"))
from diff_bundles import write_bundle  # noqa: E402  (the diff tests' BundleWriter helper)

import tensorprobe as tp  # noqa: E402
from tensorprobe.report.html import render_diff_html, write_diff_html  # noqa: E402

EVIL = 'blk<script>alert("x")</script>&"/conv'


@pytest.fixture
def report(tmp_path):
    x = torch.randn(1, 16, 300)
    y = torch.tanh(x)
    ripple = 1 + 2e-2 * torch.sin(torch.arange(y.numel()).reshape(y.shape).float())
    ref = write_bundle(tmp_path / "ref", [("input.0", x, {"kind": "model_input"}),
                                          ("enc", y, {"inputs": ("input.0",)}),
                                          (EVIL, 3 * y, {"inputs": ("enc",), "module": "blk"}),
                                          ("out", torch.exp(3 * y), {"inputs": (EVIL,)})])
    ref_only = write_bundle(tmp_path / "cand", [("input.0", x, {"kind": "model_input"}),
                                                ("enc", y, {"inputs": ("input.0",)}),
                                                (EVIL, 3 * y * ripple, {"inputs": ("enc",), "module": "blk"}),
                                                ("out", torch.exp(3 * y * ripple), {"inputs": (EVIL,)})])
    return tp.diff(ref, ref_only)


def test_names_are_escaped_and_page_is_self_contained(report):
    assert report.first_divergence == EVIL
    page = render_diff_html(report, local_snr={"enc": 150.0, EVIL: 34.0})
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt;" in page
    assert page.count("<script>") == 1                   # only our own sorting/filtering code
    for needle in ("http://", "https://", "src=\"//"):
        assert needle not in page
    assert 'id="layer-plot"' in page and "data:image/png;base64," in page
    assert "local SNR dB" in page


def _chromium():
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _headless(url, *extra):
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:  # chromium may still write it
        return subprocess.run(
            [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
             *extra, url], capture_output=True, text=True, timeout=120)


@pytest.mark.browser
@pytest.mark.skipif(not _chromium(), reason="needs Debian's chromium (apt-get install -y chromium)")
def test_rendered_in_a_real_browser(report, tmp_path):
    page = write_diff_html(report, tmp_path / "report.html")
    dom = _headless(page.resolve().as_uri(), "--dump-dom").stdout
    assert '<span id="verdict" class="verdict diverged">DIVERGED</span>' in dom
    assert "first divergence at blk&lt;script&gt;" in dom            # the summary, still escaped
    assert 'id="first-divergence"' in dom and "alert(" not in dom.split('id="first-divergence"')[1][:20]
    assert '<img id="layer-plot"' in dom and 'id="hist-plot"' in dom and 'id="channel-plot"' in dom
    assert "4 of 4 records shown" in dom                               # the table script ran
    shot = tmp_path / "shot.png"
    _headless(page.resolve().as_uri(), f"--screenshot={shot}", "--window-size=1200,1600")
    assert shot.exists() and shot.stat().st_size > 10_000
