"""`tensorprobe rng show` says in its text which random ops were replayed (issue 32 item 3), not only in JSON.

Two models with random ops (a noise-injecting block: randn_like, normal_, dropout; a two-layer GRU with dropout
between its layers) captured fresh (nothing replayed) and with --replay-rng (everything replayed); a bundle
whose tags say only some were (the sentence names both groups); a model with no random op (the Silero VAD).
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
from typer.testing import CliRunner

import tensorprobe as tp
from tensorprobe.cli import app
from tensorprobe.examples.silero import SileroVAD


class Noisy(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        h = torch.tanh(self.lin(x) + torch.randn_like(x))
        return self.drop(h * (1 + torch.empty(8).normal_(0.0, 0.1)))


class GruDrop(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.gru = nn.GRU(8, 8, num_layers=2, dropout=0.3, batch_first=True)
        self.drop = nn.Dropout(0.2)

    def forward(self, x):
        return self.drop(self.gru(x)[0])


def _show(path):
    res = CliRunner().invoke(app, ["rng", "show", str(path)])
    assert res.exit_code == 0, res.output
    return " ".join(res.output.split())


def _json(path):
    res = CliRunner().invoke(app, ["rng", "show", str(path), "--json"])
    return json.loads(res.stdout)["entries"]


@pytest.mark.parametrize("make, x", [(Noisy, torch.ones(2, 8)), (GruDrop, torch.ones(2, 5, 8))], ids=["noisy", "gru"])
def test_show_says_which_ops_were_replayed(tmp_path, make, x):
    torch.manual_seed(1)
    ref = tp.capture(make().train(), x, level="op", keep="full", out=tmp_path / "ref")
    torch.manual_seed(2)
    again = tp.capture(make().train(), x, level="op", keep="full", out=tmp_path / "again", replay_rng=ref)
    n = len(_json(ref.path))
    assert n >= 2
    text = _show(ref.path)
    assert f"None of the {n} random ops was replayed: every one drew from this run's own generator" in text, text
    assert " no " in text and " yes " not in text                       # the table's replayed column
    text = _show(again.path)
    assert f"All {n} random ops were replayed from a recording." in text, text
    assert " yes " in text and " no " not in text
    # the text and the JSON say the same
    assert all(e["replayed"] for e in _json(again.path)) and not any(e["replayed"] for e in _json(ref.path))

    # a bundle whose records say only the first was replayed: the sentence names both groups
    manifest = json.loads((again.path / "manifest.json").read_text())
    rng = [r for r in manifest["records"] if r.get("kind") == "rng"]
    for r in rng[1:]:
        r["tags"] = [t for t in r.get("tags") or () if t != "replayed"]
    (again.path / "manifest.json").write_text(json.dumps(manifest))
    text = _show(again.path)
    assert f"Replayed 1 of {n} random ops from a recording: {rng[0]['name']}." in text, text
    assert f"Drawn by this run's own generator: {rng[1]['name']}" in text


def test_a_model_without_random_ops_says_so(tmp_path):
    b = tp.capture(SileroVAD(), torch.zeros(1, 512), torch.zeros(2, 1, 128), out=tmp_path / "vad")
    assert "No random op ran: nothing to replay." in _show(b.path)
