"""Update ratios at a bounded cost: the weights are copied into reused buffers on sampled steps (every step of
the warm-up, then every `every`-th); where measured, the ratio is the exact |Δw|/|w| of that step."""

from __future__ import annotations

import json

import torch
import torch.nn.functional as F

from tensorprobe.examples.training import MelPredictor
from tensorprobe.train import Monitor

from .test_monitor import _data


def test_sampled_update_ratios_are_exact_where_measured_and_absent_between(tmp_path):
    model = MelPredictor()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    mon = Monitor(model, opt, run_dir=tmp_path / "run")
    mon.updates.every, mon.updates.warmup = 7, 5
    name, param = next((n, p) for n, p in model.named_parameters() if n.endswith("weight"))
    exact = {}
    for k in range(30):
        inputs, target = _data(k)
        loss = F.mse_loss(model(*inputs), target)
        opt.zero_grad()
        loss.backward()
        mon.step(loss)
        before = param.detach().clone()
        opt.step()
        exact[k] = float((param.detach() - before).norm() / before.norm())
    mon.close()
    rows = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    measured = {r["step"]: r[f"update_ratio/{name}"] for r in rows if f"update_ratio/{name}" in r}
    assert sorted(measured) == [0, 1, 2, 3, 4, 7, 14, 21, 28]
    for k, v in measured.items():
        assert abs(v - exact[k]) <= 1e-2 * exact[k] + 1e-12, (k, v, exact[k])   # |w| before or after the step
    assert len(rows) == 30                                     # every step still has its gradient row


def test_the_buffers_are_reused_not_reallocated(tmp_path):
    model = MelPredictor()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = Monitor(model, opt, run_dir=tmp_path / "run")
    mon.updates.warmup = 3
    seen = set()
    for k in range(3):
        inputs, target = _data(k)
        F.mse_loss(model(*inputs), target).backward()
        mon.step()
        opt.step()
        opt.zero_grad()
        seen.add(tuple(b.data_ptr() for b in mon.updates._buffers))
    mon.close()
    assert len(seen) == 1


def test_sampled_output_statistics_are_exact_where_measured_and_absent_between(tmp_path):
    """`output_stats.every`: a watched module's output is reduced on every step of the warm-up, then every
    k-th; where measured its std is the output's own (checked by a hook of the test), between there is none."""
    model = MelPredictor()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    mon = Monitor(model, opt, run_dir=tmp_path / "run", watch=["encoder"])
    mon.output_stats.every, mon.output_stats.warmup = 6, 3
    seen = {}
    model.encoder.register_forward_hook(lambda mod, a, out: seen.__setitem__(len(seen), float(out.detach().std())))
    for k in range(20):
        inputs, target = _data(k)
        loss = F.mse_loss(model(*inputs), target)
        opt.zero_grad()
        loss.backward()
        mon.step(loss)
        opt.step()
    mon.close()
    rows = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    measured = {r["step"]: r["out_std/encoder"] for r in rows if "out_std/encoder" in r}
    assert sorted(measured) == [0, 1, 2, 6, 12, 18]
    for k, v in measured.items():
        assert abs(v - seen[k]) <= 1e-5 * seen[k], (k, v, seen[k])
    assert len(rows) == 20
