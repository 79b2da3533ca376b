"""`preflight --fix`: the exit code judges the fixed model. Every finding fixed and proven -> 0 with the fixed
file written; something left (a finding no rule removes, a rule refused) -> 1, the file still written."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import torch

from tensorprobe.preflight import preflight

from ..runtimes._export_models import NormConv, mean100_input

ROOT = pathlib.Path(__file__).resolve().parents[2]


class NormThenSpectrum(NormConv):
    """NormConv, then a complex FFT: ExecuTorch and TVM have no complex dtype, and no rule rewrites an FFT
    that is not an iSTFTNet STFT module."""

    def forward(self, x):
        y = super().forward(x)
        return torch.fft.rfft(y, dim=-1).abs()


def _run(tmp_path, model_class: str, *args):
    (tmp_path / "m.py").write_text(
        "import torch\nfrom tests.runtimes._export_models import mean100_input\n"
        f"from tests.preflight.test_fix_exit_code import {model_class}\n"
        f"def build():\n    torch.manual_seed(0)\n    return {model_class}(), (mean100_input(),)\n")
    out = tmp_path / "fixed.pt2"
    p = subprocess.run([sys.executable, "-m", "tensorprobe", "preflight", f"{tmp_path / 'm.py'}:build", "--target",
                        "tvm", "--no-import", "--fix", "-o", str(out), *args], capture_output=True, text=True, cwd=ROOT)
    assert "Traceback" not in p.stderr, p.stderr
    return p, out


def test_everything_fixed_and_proven_exits_0_and_writes_the_fixed_model(tmp_path):
    torch.manual_seed(0)
    r = preflight(NormConv(), mean100_input(), target="tvm", fix=True, importer=False)
    assert [f.kind for f in r.errors] == ["one_pass_variance"]          # the model as given will break on TVM
    assert [(x.rule, x.applied) for x in r.rewrite.rules] == [("stable_norm", True)]
    assert r.remaining == () and not r.finding
    assert "After --fix nothing is left that would break on tvm." in r.summary()
    p, out = _run(tmp_path, "NormConv", "--json")
    doc = json.loads(p.stdout)
    assert p.returncode == 0 and doc["status"] == "ok" and doc["preflight"]["remaining"] == [] and out.exists()
    ep = torch.export.load(str(out))
    assert not any("instance_norm" in str(n.target) for n in ep.graph.nodes)       # the fixed norm, exported


def test_something_left_after_fix_exits_1_and_says_what(tmp_path):
    torch.manual_seed(0)
    r = preflight(NormThenSpectrum(), mean100_input(), target="tvm", fix=True, importer=False)
    assert {f.kind for f in r.errors} == {"one_pass_variance", "complex"}
    applied = {x.rule: x.applied for x in r.rewrite.rules}
    assert applied == {"stable_norm": True, "conv_stft": False}           # no STFT module to swap
    assert [f.kind for f in r.remaining if f.severity == "error"] == ["complex"] and r.finding
    assert "After --fix, 1 still break(s) on tvm; first: complex tensors" in r.summary()
    p, out = _run(tmp_path, "NormThenSpectrum")
    assert p.returncode == 1 and "left on the fixed model" in p.stdout and out.exists()
