"""Capture overhead on the Kokoro-82M decoder: tensorprobe vs a plain forward, with TorchLens beside it.

Each mode is timed as the median of per-run ratios to a plain forward run right before it in the same
process (interleaved, so drift in machine load cancels out). Peak memory is the highest RSS seen by a
sampling thread during the run, minus the RSS just before it.

    pip install torch==2.13.0 -e ".[kokoro,bench]"
    python bench/bench_capture.py --seconds 3 10 --reps 5 --json bench/results/capture.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import torch

import tensorprobe as tp
from tensorprobe.examples import kokoro


class PeakRss:
    """Highest resident set size seen while the block runs (sampled every 5 ms)."""

    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.peak = 0
        self._stop = threading.Event()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.005)

    def __enter__(self) -> "PeakRss":
        gc.collect()
        self.base = self.proc.memory_info().rss
        self.peak = self.base
        self._t = threading.Thread(target=self._sample, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self.proc.memory_info().rss)

    @property
    def delta_mb(self) -> float:
        return (self.peak - self.base) / 2**20


def plain(model, inputs, workdir):
    with torch.no_grad():
        model(*inputs)


def module_stats(model, inputs, workdir):
    tp.capture(model, *inputs, level="module", keep="stats", out=workdir / "m")


def op_stats(model, inputs, workdir):
    tp.capture(model, *inputs, level="op", keep="stats", out=workdir / "o")


def op_full(model, inputs, workdir):
    tp.capture(model, *inputs, level="op", keep="full", out=workdir / "f")


def nan_check(model, inputs, workdir):
    tp.find_first_nonfinite(model, *inputs)


def torchlens_all(model, inputs, workdir):
    import torchlens

    with torch.no_grad():
        trace = torchlens.trace(model, input_args=tuple(inputs))
    del trace


MODES = {"module/stats": module_stats, "op/stats": op_stats, "op/full→disk": op_full, "nan": nan_check,
         "torchlens (all layers)": torchlens_all}


def bench(seconds: float, reps: int, modes: list[str]) -> dict:
    model, inputs = kokoro.decoder(seconds)
    results = {}
    with tempfile.TemporaryDirectory(prefix="tp-bench-", dir=os.environ.get("TP_BENCH_DIR")) as d:
        workdir = Path(d)
        plain(model, inputs, workdir)  # warm-up
        plain_times = []
        for mode in modes:
            fn = MODES[mode]
            fn(model, inputs, workdir)  # warm-up (imports, allocator)
            ratios, peaks = [], []
            for _ in range(reps):
                t0 = time.perf_counter(); plain(model, inputs, workdir); tp_ = time.perf_counter() - t0
                plain_times.append(tp_)
                with PeakRss() as mem:
                    t0 = time.perf_counter(); fn(model, inputs, workdir); tm = time.perf_counter() - t0
                ratios.append(tm / tp_)
                peaks.append(mem.delta_mb)
                gc.collect()
            results[mode] = {"ratio_median": statistics.median(ratios), "ratios": ratios,
                             "peak_rss_delta_mb": max(peaks)}
            print(f"  {seconds:>4}s  {mode:<24} {statistics.median(ratios):5.2f}x   peak +{max(peaks):7.0f} MB",
                  flush=True)
        with PeakRss() as mem:
            plain(model, inputs, workdir)
        results["plain"] = {"seconds_median": statistics.median(plain_times), "peak_rss_delta_mb": mem.delta_mb}
        print(f"  {seconds:>4}s  {'plain forward':<24} {statistics.median(plain_times):5.2f}s   "
              f"peak +{mem.delta_mb:7.0f} MB", flush=True)
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, nargs="+", default=[3.0, 10.0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--modes", nargs="+", default=list(MODES))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
               "ram_gb": round(psutil.virtual_memory().total / 2**30), "torch": torch.__version__,
               "threads": torch.get_num_threads(), "python": platform.python_version()}
    print(f"machine: {machine}")
    out = {"machine": machine, "results": {}}
    for s in args.seconds:
        out["results"][str(s)] = bench(s, args.reps, args.modes)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    sys.exit(main())
