"""Cost of `tensorprobe.isolate` on the Kokoro-82M decoder, as a multiple of one plain forward.

A module-level pass over every leaf module call (~220 calls for the decoder): the reference forward with
hooks that clone each call's inputs and run the candidate's module on them (local error), beside the
candidate's own forward (accumulated error; run first, and its module calls whose inputs equal the
reference's are not run twice). Target: <= 3x.

Each ratio is the median over repetitions of (isolate time) / (plain forward timed right before it, in
the same process), so drift in machine load cancels out. Candidates: a second decoder built from the
same seed (best case), one with one layer perturbed (a port bug), one with every Conv1d perturbed (every
module call differs: worst case).

    python bench/bench_isolate.py --seconds 1 3 --reps 3 [--threads 1] [--json bench/results/isolate.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from tensorprobe.isolate import isolate
from tensorprobe.bundle import atomic_write_bytes
from tensorprobe.examples import kokoro

def _nudge_all(model: torch.nn.Module, rel: float) -> torch.nn.Module:
    for m in model.modules():
        if isinstance(m, torch.nn.Conv1d):
            m.register_forward_hook(lambda mod, a, out: out * (1 + rel))
    return model


def _nudge_one(model: torch.nn.Module, path: str, rel: float) -> torch.nn.Module:
    dict(model.named_modules())[path].register_forward_hook(lambda mod, a, out: out * (1 + rel))
    return model


# (candidate factory, isolate options): best case, a realistic port bug, worst case (every layer differs).
SCENARIOS = {
    "identical candidate": (lambda: kokoro.build_decoder(), {}),
    "one layer perturbed (decode.1.conv1x1)": (lambda: _nudge_one(kokoro.build_decoder(), "decode.1.conv1x1", 1e-3), {}),
    "every Conv1d perturbed (worst case)": (lambda: _nudge_all(kokoro.build_decoder(), 1e-6), {}),
    "every Conv1d perturbed, local only": (lambda: _nudge_all(kokoro.build_decoder(), 1e-6), {"accumulated": False}),
    "every Conv1d perturbed, depth 2": (lambda: _nudge_all(kokoro.build_decoder(), 1e-6), {"depth": 2}),
}


def plain(model: torch.nn.Module, inputs: tuple) -> float:
    with torch.no_grad():
        t = time.perf_counter()
        model(*inputs)
        return time.perf_counter() - t


def bench(seconds: float, reps: int) -> dict:
    ref = kokoro.build_decoder()
    inputs = kokoro.decoder_inputs(seconds)
    plain(ref, inputs)
    out = {"seconds_audio": seconds, "scenarios": {}}
    for label, (make, kw) in SCENARIOS.items():
        cand = make()
        isolate(ref, cand, *inputs, modules=r"^F0_conv$")  # warm-up: metric kernel, hooks
        ratios, fwd, iso = [], [], []
        for _ in range(reps):
            f = plain(ref, inputs)
            t = time.perf_counter()
            report = isolate(ref, cand, *inputs, **kw)
            i = time.perf_counter() - t
            ratios.append(i / f)
            fwd.append(f)
            iso.append(i)
        row = {"ratio": statistics.median(ratios), "forward_s": statistics.median(fwd),
               "isolate_s": statistics.median(iso), "module_calls": len(report.layers), "reused": report.reused,
               "first_local": report.first_local}
        out["scenarios"][label] = row
        print(f"{seconds:>5.2f} s audio  {label:<40} {row['module_calls']:>4} calls ({row['reused']:>3} reused)  "
              f"forward {row['forward_s']:6.3f} s  isolate {row['isolate_s']:6.3f} s  = {row['ratio']:4.2f}x",
              flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, nargs="+", default=[1.0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results = {"machine": {"platform": platform.platform(), "torch": torch.__version__,
                           "threads": torch.get_num_threads()},
               "runs": [bench(s, args.reps) for s in args.seconds]}
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(args.json, json.dumps(results, indent=1).encode())


if __name__ == "__main__":
    main()
