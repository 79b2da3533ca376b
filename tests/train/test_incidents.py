"""`tensorprobe train report`: one lr blow-up is one incident (its first finding first, what follows from it
grouped under it), each finding carries its likely cause and fix, the HTML marks each incident on the
per-layer heatmaps. Real short runs of the example mel predictor (SGD, two parameter groups) and of a
conv-GRU model not built for these tests; the clean twins report nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
import torch.nn.functional as F

from tensorprobe.examples.training import N_MELS, MelPredictor
from tensorprobe.train import Monitor, summarize
from tensorprobe.train.report import group_incidents

from .test_monitor import _data


def _run(tmp_path, model, groups, steps, blow_up_at=None, blow_group=1, lr=30.0, data=_data):
    opt = torch.optim.SGD(groups, lr=0.05)
    with Monitor(model, opt, run_dir=tmp_path / "run", watch=[]) as mon:
        for k in range(steps):
            inputs, target = data(k)
            loss = F.mse_loss(model(*inputs), target)
            opt.zero_grad()
            loss.backward()
            mon.step(loss)
            if k == blow_up_at:
                opt.param_groups[blow_group]["lr"] = lr
            opt.step()
    return summarize(tmp_path / "run")


def test_an_lr_blow_up_is_one_incident_first_with_what_follows_grouped(tmp_path):
    model = MelPredictor()
    s = _run(tmp_path, model, [{"params": model.encoder.parameters()}, {"params": model.decoder.parameters()}],
             200, blow_up_at=150)
    assert len(s.findings) > 3                             # the monitor reports the cascade finding by finding...
    [incident] = s.incidents                               # ...the report makes one incident of it
    first = incident.first
    assert first["step"] in (150, 151) and first["kind"] in ("exploding_update", "exploding_gradient",
                                                               "nonfinite_gradient")
    assert "decoder" in first["layer"]
    assert len(incident.following) == len(s.findings) - 1 and incident.end > incident.start
    assert first["cause"] and first["fix"] and all(f["cause"] and f["fix"] for f in s.findings)
    assert s.headline().startswith("200 steps of MelPredictor: 1 incident (")
    assert f"first at step {first['step']}" in s.headline() and "Fix:" in s.headline()


def test_the_report_cli_lists_incidents_and_marks_them_on_the_heatmap(tmp_path):
    model = MelPredictor()
    _run(tmp_path, model, [{"params": model.encoder.parameters()}, {"params": model.decoder.parameters()}],
         170, blow_up_at=150)
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "tensorprobe", "train", "report", str(run), "--json"],
                       capture_output=True, text=True)
    doc = json.loads(p.stdout)
    assert p.returncode == 1 and len(doc["incidents"]) == 1
    inc = doc["incidents"][0]
    assert inc["steps"][0] == doc["findings"][0]["step"] and inc["fix"] and inc["cause"]
    assert len(inc["following"]) == len(doc["findings"]) - 1
    page = (run / "report.html").read_text()
    assert 'id="incident-1"' in page and "likely cause" in page and "each incident is marked" in page
    text = subprocess.run([sys.executable, "-m", "tensorprobe", "train", "report", str(run)],
                          capture_output=True, text=True).stdout
    assert "likely cause" in text and "fix" in text


def test_the_clean_twin_has_no_incident(tmp_path):
    model = MelPredictor()
    s = _run(tmp_path, model, [{"params": model.encoder.parameters()}, {"params": model.decoder.parameters()}], 170)
    assert s.findings == [] and s.incidents == [] and not s.finding


class ConvGRU(torch.nn.Module):
    """Another architecture: conv front end, a GRU, a linear mel head."""

    def __init__(self, channels: int):
        super().__init__()
        torch.manual_seed(3)
        self.conv = torch.nn.Conv1d(channels, 24, 3, padding=1)
        self.rnn = torch.nn.GRU(24, 24, batch_first=True)
        self.head = torch.nn.Linear(24, N_MELS)

    def forward(self, x, voiced):
        h = torch.relu(self.conv(x)).transpose(1, 2)
        h, _ = self.rnn(h)
        return self.head(h).transpose(1, 2) * voiced


def test_a_blow_up_on_another_architecture_is_one_incident_at_its_step(tmp_path):
    (x, _), _ = _data(0)
    model = ConvGRU(x.shape[1])
    s = _run(tmp_path, model, [{"params": list(model.conv.parameters()) + list(model.rnn.parameters())},
                               {"params": model.head.parameters()}], 140, blow_up_at=110, lr=300.0)
    assert len(s.findings) > 1 and len(s.incidents) == 1
    assert s.incidents[0].start in (110, 111) and "head" in s.incidents[0].first["layer"]


def test_findings_far_apart_or_unrelated_are_separate_incidents(tmp_path):
    """Two blow-ups 200 steps apart are two incidents; a layer dead from step 0 is never folded into a later
    blow-up (it did not follow from it)."""
    model = MelPredictor()
    s = _run(tmp_path, model, [{"params": model.encoder.parameters()}, {"params": model.decoder.parameters()}],
             190, blow_up_at=150)
    findings = [dict(f, step=f["step"] - 150) for f in s.findings]            # the same cascade at step 0...
    later = [dict(f, step=f["step"] + 200) for f in findings]                 # ...and again 200 steps on
    dead = {"step": 0, "kind": "dead_gradient", "severity": "warning", "layer": "encoder", "message": "dead"}
    incidents = group_incidents([dead] + findings + later, gap=50)
    assert [i.first["kind"] for i in incidents][0] == "dead_gradient"
    assert len(incidents) == 3 and incidents[1].start == 0 and incidents[2].start == 200
