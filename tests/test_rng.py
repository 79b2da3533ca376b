"""Randomness recorded and replayed: runs that differ only in their generators compare equal with replay."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from typer.testing import CliRunner

import tensorprobe as tp
from tensorprobe.cli import app
from tensorprobe.diff import diff
from tensorprobe.errors import InputError
from tensorprobe.rng import RngReplay, export_noise, load_noise, unreplayed_rng_before


class Noisy(torch.nn.Module):
    """randn_like, an in-place normal_, and dropout (bernoulli_ in train mode), each feeding later ops."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        h = torch.tanh(self.lin(x) + torch.randn_like(x))
        jitter = torch.empty(8).normal_(0.0, 0.1)
        return self.drop(h * (1 + jitter))


class Other(torch.nn.Module):
    def forward(self, x):
        return x + torch.randn(3, 5)


@pytest.fixture()
def model():
    return Noisy().train()


@pytest.fixture()
def x():
    return torch.ones(2, 8)


def _cap(model, x, seed, **kw):
    torch.manual_seed(seed)
    return tp.capture(model, x, level="op", keep="full", **kw)


def test_random_ops_are_recorded_with_call_site_names(model, x):
    b = _cap(model, x, 1)
    rng = [r for r in b if r.kind == "rng"]
    assert [r.name for r in rng] == ["<root>/randn_like.0", "<root>/normal_.0", "drop/bernoulli_.float.0"]
    assert all(r.has_tensor and r.source and "test_rng.py" in r.source for r in rng)


def test_different_seeds_diverge_right_after_the_random_op(model, x):
    ref, cand = _cap(model, x, 1), _cap(model, x, 2)
    report = diff(ref, cand)
    assert not report.passed
    # Everything before the noise matches; the first non-random record to diverge is the op that adds it.
    failed = [p for p in report.pairs if p.failed]
    assert failed[0].name == "<root>/randn_like.0"
    assert next(p.name for p in failed if p.kind != "rng") == "<root>/add.0"
    assert report.pair("lin/addmm.0").passed
    suspect = unreplayed_rng_before(cand, "<root>/add.0", ref=ref)
    assert suspect is not None and suspect.rng == "<root>/randn_like.0" and suspect.direct
    assert not suspect.replayed and abs(suspect.pearson) < 0.9
    assert "right after random op <root>/randn_like.0" in suspect.sentence()
    assert "--replay-rng" in suspect.sentence()
    assert report.rng_note and "randn_like" in report.rng_note
    # Given the diff report itself: its first divergence is the random op, its bundles are opened by path.
    from_report = unreplayed_rng_before(report)
    assert from_report is not None and from_report.rng == from_report.divergent == report.first_divergence


def test_replay_makes_runs_with_different_seeds_match(model, x):
    ref = _cap(model, x, 1)
    again = _cap(model, x, 2, replay_rng=ref)
    report = diff(ref, again, atol=1e-7, rtol=1e-6)
    assert report.passed, report.summary
    assert torch.equal(ref.tensor("drop/mul.0"), again.tensor("drop/mul.0"))
    assert all("replayed" in r.tags for r in again if r.kind == "rng")
    assert again.manifest["capture"]["replay_rng"] == str(ref.path)
    assert unreplayed_rng_before(again, "drop/mul.0", ref=ref) is None


def test_replay_context_manager_names_ops_by_module(model, x):
    ref = _cap(model, x, 1)
    torch.manual_seed(7)
    with RngReplay(ref, model=model) as replay, torch.no_grad():
        y = model(x)
    assert replay.replayed == ["<root>/randn_like.0", "<root>/normal_.0", "drop/bernoulli_.float.0"]
    assert replay.unused == []
    assert torch.equal(y, ref.tensor("drop/mul.0"))


def test_replay_of_a_bundle_from_another_model_is_a_clear_error(model, x):
    other = tp.capture(Other(), torch.zeros(3, 5), level="module")
    with pytest.raises(InputError, match=r"float32\[3×5\] but this run drew float32\[2×8\].*another model"):
        _cap(model, x, 1, replay_rng=other)


def test_replay_running_out_or_without_noise_is_a_clear_error(model, x, tmp_path):
    short = {"<root>/randn_like.0": torch.zeros(2, 8)}
    with pytest.raises(InputError, match=r"ran out: it holds 1 random tensors.*\(<root>/normal_.0 at .*test_rng.py"):
        _cap(model, x, 1, replay_rng=short)
    plain = tp.capture(torch.nn.Linear(2, 2), torch.zeros(1, 2))
    with pytest.raises(InputError, match="no random ops were recorded"):
        _cap(model, x, 1, replay_rng=plain)


def test_export_noise_and_load_it_back(model, x, tmp_path):
    ref = _cap(model, x, 1)
    path = tmp_path / "noise.safetensors"
    entries = export_noise(ref, path)
    assert [e.name for e in entries] == ["<root>/randn_like.0", "<root>/normal_.0", "drop/bernoulli_.float.0"]
    tensors, loaded = load_noise(path)
    assert loaded == entries
    assert [e.shape for e in loaded] == [(2, 8), (8,), (2, 8)]
    assert loaded[1].op == "aten.normal_.default" and "test_rng.py" in loaded[1].source
    for e in loaded:
        assert torch.equal(tensors[e.name], ref.tensor(e.name))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["noise.safetensors"]  # no temp file left
    # A noise file replays like the bundle it came from.
    again = _cap(model, x, 5, replay_rng=path)
    assert torch.equal(again.tensor("drop/mul.0"), ref.tensor("drop/mul.0"))


def test_rng_cli_export_and_show(model, x, tmp_path):
    ref = tp.capture(model, x, level="module", out=tmp_path / "ref")
    runner = CliRunner()
    out = tmp_path / "noise.safetensors"
    res = runner.invoke(app, ["rng", "export", str(ref.path), "-o", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["command"] == "rng export" and [e["name"] for e in doc["entries"]][0] == "<root>/randn_like.0"
    assert load_noise(out)[1][2].shape == (2, 8)
    res = runner.invoke(app, ["rng", "show", str(ref.path)])
    assert res.exit_code == 0 and "drop/bernoulli_.float.0" in res.stdout
    res = runner.invoke(app, ["rng", "export", str(tmp_path / "missing"), "-o", str(out)])
    assert res.exit_code == 2 and "no such bundle" in " ".join(res.output.split())


@pytest.mark.slow
def test_kokoro_voiced_decoder_random_source_replayed(kokoro):
    model, inputs = kokoro.voiced_decoder(0.25)
    keep_out = "^<root>$"
    torch.manual_seed(1)
    ref = tp.capture(model, *inputs, keep="full", include=keep_out)
    torch.manual_seed(2)
    other = tp.capture(model, *inputs, keep="full", include=keep_out)
    torch.manual_seed(3)
    replayed = tp.capture(model, *inputs, keep="full", include=keep_out, replay_rng=ref)
    names = [r.name for r in ref if r.kind == "rng"]
    assert names[:2] == ["generator.m_source.l_sin_gen/rand.0", "generator.m_source.l_sin_gen/randn_like.0"]
    a, b, c = (x.tensor("<root>") for x in (ref, other, replayed))
    corr_other = torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1]
    assert corr_other < 0.999  # the random source really changes the audio
    assert torch.allclose(a, c, rtol=0, atol=1e-6)
    suspect = unreplayed_rng_before(other, "<root>", ref=ref)
    assert suspect is not None and suspect.rng.startswith("generator.m_source")


def test_capture_cli_replay_rng_then_diff(tmp_path):
    target = tmp_path / "noisy_target.py"
    target.write_text(
        "import torch\n"
        "class Noisy(torch.nn.Module):\n"
        "    def forward(self, x):\n"
        "        return torch.tanh(x + torch.randn_like(x))\n"
        "def build():\n"
        "    return Noisy(), (torch.ones(2, 8),)\n")
    runner = CliRunner()

    def capture(out, seed, *extra):
        torch.manual_seed(seed)
        res = runner.invoke(app, ["capture", f"{target}:build", "-o", str(tmp_path / out), "--level", "op",
                                  "--keep", "full", *extra])
        assert res.exit_code == 0, res.output

    capture("ref", 1)
    capture("other", 2)
    capture("replayed", 3, "--replay-rng", str(tmp_path / "ref"))
    res = runner.invoke(app, ["diff", str(tmp_path / "ref"), str(tmp_path / "other"), "--json"])
    assert res.exit_code == 1
    note = json.loads(res.stdout)["report"]["rng_note"]
    assert "<root>/randn_like.0" in note and "--replay-rng" in note
    res = runner.invoke(app, ["diff", str(tmp_path / "ref"), str(tmp_path / "replayed")])
    assert res.exit_code == 0, res.output
    # Through the real entry point: one line on stderr, exit code 2.
    p = subprocess.run([sys.executable, "-m", "tensorprobe", "capture", f"{target}:build", "-o", str(tmp_path / "bad"),
                        "--replay-rng", str(tmp_path / "nowhere")], capture_output=True, text=True,
                       env={**os.environ, "COLUMNS": "200", "PYTHONWARNINGS": "ignore"})
    assert p.returncode == 2 and "no such bundle" in p.stderr and "Traceback" not in p.stderr
