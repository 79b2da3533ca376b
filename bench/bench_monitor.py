"""Benchmark: what `tensorprobe.train.Monitor` adds to a training step.

    python bench/bench_monitor.py [--steps 6] [--seconds 0.3]       # bench/results/monitor.json

Steps of the Kokoro decoder (kokoro.istftnet, seeded random weights, train mode, Adam) on `--seconds` of voiced
input, and of the small mel predictor (examples.training). Modes, interleaved step by step so that drift in
machine load cancels out: plain; the monitor with loss and gradient statistics only (no optimizer given: no
update ratios); with the optimizer and the update ratio measured every step (a copy of the weights into reused
buffers around each step, the default); sampled (`updates.every = 10`; the bench skips the
monitor's 20-step warm-up, during which every step is measured, to show the steady state); with module
outputs watched as well; and with both the update ratios and the watched outputs sampled
(`output_stats.every = 10`). Reported per mode: `_x`, the median over steps of the step time / the plain step's
(what a typical step costs), and `_mean_x`, total time / the plain total (the amortised cost: a sampled
step's copy counts in it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from _results import machine, write_results


def _kokoro(seconds: float):
    from tensorprobe.examples.kokoro import build_decoder, decoder_inputs

    model = build_decoder(stable_source=False).train()
    inputs = decoder_inputs(seconds, voiced=True)
    with torch.no_grad():
        target = torch.randn_like(model(*inputs))
    return model, inputs, lambda out: F.l1_loss(out, target), ["decode\\.\\d+", "generator\\.resblocks\\.\\d+"]


def _mel():
    from tensorprobe.examples.training import MelPredictor, batch

    (x, voiced), target = batch()
    return MelPredictor(), (x, voiced), lambda out: F.mse_loss(out, target), ["encoder", "decoder"]


def run(label: str, factory, steps: int) -> dict:
    from tensorprobe.train import Monitor

    model, inputs, loss_fn, watch = factory()
    opt = torch.optim.Adam(model.parameters(), lr=1e-5)
    root = Path(tempfile.mkdtemp(prefix="tp-bench-monitor-"))
    monitors = {"plain": None,
                "grads": Monitor(model, None, root / "grads"),
                "grads+updates_every_step": Monitor(model, opt, root / "every"),
                "grads+updates": Monitor(model, opt, root / "updates"),
                "grads+updates+outputs": Monitor(model, opt, root / "outputs", watch=watch),
                "grads+updates+outputs_sampled": Monitor(model, opt, root / "sampled", watch=watch)}
    monitors["grads+updates"].updates.every = 10
    monitors["grads+updates+outputs_sampled"].updates.every = 10
    monitors["grads+updates+outputs_sampled"].output_stats.every = 10
    for m in list(monitors.values())[1:]:
        m.updates.warmup = m.output_stats.warmup = 0
    for m in monitors.values():     # each monitor's hooks are active only in its own steps
        if m is not None:
            m.pause()
    times: dict[str, list[float]] = {k: [] for k in monitors}

    def step(mon):
        t = time.perf_counter()
        loss = loss_fn(model(*inputs))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if mon is not None:
            mon.step(loss)
        opt.step()
        return time.perf_counter() - t

    step(None)                                                           # warm-up
    for _ in range(steps):
        for name, mon in monitors.items():
            _activate(monitors, mon)
            times[name].append(step(mon))
    _activate(monitors, None)
    for m in monitors.values():
        if m is not None:
            m.close()
    shutil.rmtree(root, ignore_errors=True)
    plain = times["plain"]
    row = {"model": label, "parameters": sum(p.numel() for p in model.parameters()),
           "plain_step_s": round(statistics.median(plain), 4)}
    for name in list(monitors)[1:]:
        row[f"{name}_x"] = round(statistics.median(t / p for t, p in zip(times[name], plain)), 3)
        row[f"{name}_mean_x"] = round(sum(times[name]) / sum(plain), 3)
    print(json.dumps(row))
    return row


def _activate(monitors, active) -> None:
    """Only the active monitor's hooks run."""
    for m in monitors.values():
        if m is not None and m is not active:
            m.pause()
    if active is not None:
        active.resume()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seconds", type=float, default=0.3)
    ap.add_argument("--out", default="bench/results/monitor.json")
    args = ap.parse_args()
    rows = [run("mel predictor (examples.training)", _mel, args.steps * 10),
            run(f"Kokoro decoder, {args.seconds} s", lambda: _kokoro(args.seconds), args.steps)]
    write_results(args.out, {"machine": machine(), "rows": rows})


if __name__ == "__main__":
    main()
