"""Gradient statistics reduced in fused passes at the end of each backward (the GPU path, forced here on the
CPU) give the figures the per-parameter path gives, are taken before clipping, cover accumulated gradients,
and find the same planted NaN at the same step and layer."""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from tensorprobe.examples.training import Energy, MelPredictor
from tensorprobe.train import Monitor

from .test_monitor import _data


def _run(tmp_path, name, fused, steps=60, *, energy=False, clip=None, accumulate=1, silent_from=40):
    torch.manual_seed(0)
    model = MelPredictor(energy=Energy()) if energy else MelPredictor()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    mon = Monitor(model, opt, run_dir=tmp_path / name)
    assert mon.fused_grad_stats is False      # on the CPU the per-parameter path is the default
    mon.fused_grad_stats = fused
    for k in range(steps):
        opt.zero_grad()
        for _ in range(accumulate):
            inputs, target = _data(k, silent_from=silent_from)
            F.mse_loss(model(*inputs), target).backward()
        if clip is not None:   # as a trainer clips: between the backward and the monitor's step
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        mon.step()
        opt.step()
    mon.close()
    rows = [json.loads(line) for line in (tmp_path / name / "steps.jsonl").read_text().splitlines()]
    return mon, rows


def _grad_figures(rows):
    return [{k: v for k, v in r.items() if k.startswith(("grad_norm/", "grad_absmax/", "grad_nonfinite/"))}
            for r in rows]


def test_fused_figures_equal_the_per_parameter_ones(tmp_path):
    _, plain = _run(tmp_path, "plain", False)
    _, fused = _run(tmp_path, "fused", True)
    a, b = _grad_figures(plain), _grad_figures(fused)
    assert len(a) == len(b) == 60 and all(x.keys() == y.keys() for x, y in zip(a, b))
    for x, y in zip(a, b):
        for key in x:
            assert abs(x[key] - y[key]) <= 1e-5 * abs(x[key]), (key, x[key], y[key])


def test_fused_figures_are_taken_before_clipping_and_over_accumulated_gradients(tmp_path):
    _, plain = _run(tmp_path, "plain", False, clip=1e-3, accumulate=2, steps=20)
    _, fused = _run(tmp_path, "fused", True, clip=1e-3, accumulate=2, steps=20)
    norms = [r["grad_norm/decoder.weight"] for r in fused]
    assert min(norms) > 1e-3            # the clipped norm would be at most 1e-3
    for x, y in zip(_grad_figures(plain), _grad_figures(fused)):
        assert all(abs(x[k] - y[k]) <= 1e-5 * abs(x[k]) for k in x)


def test_fused_path_finds_the_planted_nan_at_the_same_step_and_layer(tmp_path):
    got = []
    for name, fused in (("plain", False), ("fused", True)):
        mon, rows = _run(tmp_path, name, fused, steps=35, energy=True, silent_from=30)
        nan = [f for f in mon.findings if f["kind"] == "nonfinite_gradient"]
        got.append((nan[0]["step"], nan[0]["layer"], sorted(nan[0]["params"])))
        assert rows[30]["grad_nonfinite/encoder.weight"] > 0
    assert got[0] == got[1] == (30, "encoder", ["encoder.bias", "encoder.weight"])
