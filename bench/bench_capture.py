"""Capture overhead on the Kokoro-82M decoder: tensorprobe vs a plain forward, with TorchLens beside it.

Each mode is timed as the median of per-run ratios to a plain forward run right before it in the same
process (interleaved, so drift in machine load cancels out). Peak memory is the highest RSS seen by a
sampling thread during the run, minus the RSS just before it.

    pip install torch==2.13.0 -e ".[kokoro,bench]"
    python bench/bench_capture.py --seconds 3 10 --reps 5 --json bench/results/capture.json
    python bench/bench_capture.py --seconds 3 10 --memory --json bench/results/capture_memory.json
    python bench/bench_capture.py --seconds 3 10 --memory --fixed-mmap --json bench/results/capture_memory_live.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
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


def machine_info() -> dict:
    """What the figures were measured on (also used by the other benchmarks)."""
    return {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "ram_gb": round(psutil.virtual_memory().total / 2**30), "torch": torch.__version__,
            "threads": torch.get_num_threads(), "python": platform.python_version()}


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
    from torchlens.options import CaptureOptions

    # TorchLens keeps every activation in RAM; its default budget (half the free memory) stops it at
    # 10 s of audio, so lift the budget to measure it at all.
    with torch.no_grad():
        trace = torchlens.trace(model, input_args=tuple(inputs), capture=CaptureOptions(save_budget=None))
    del trace


MODES = {"module/stats": module_stats, "op/stats": op_stats, "op/full→disk": op_full, "nan": nan_check,
         "torchlens (all layers)": torchlens_all}


def clear(workdir: Path) -> None:
    """Remove the bundles of earlier runs, untimed: each timed capture writes into a fresh directory.
    (Replacing an existing bundle costs its deletion on top, ~0.2 s per GB here: 0.5 s for the 2.4 GB
    of op/full at 3 s. Earlier rounds' op/full figures included it.)"""
    for p in workdir.iterdir():
        shutil.rmtree(p) if p.is_dir() else p.unlink()


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
            ratios, peaks, times, plains = [], [], [], []
            for _ in range(reps):
                t0 = time.perf_counter(); plain(model, inputs, workdir); tp_ = time.perf_counter() - t0
                plain_times.append(tp_)
                plains.append(tp_)
                clear(workdir)
                with PeakRss() as mem:
                    t0 = time.perf_counter(); fn(model, inputs, workdir); tm = time.perf_counter() - t0
                ratios.append(tm / tp_)
                times.append(tm)
                peaks.append(mem.delta_mb)
                gc.collect()
            # Median of per-run ratios cancels slow drift; the ratio of the fastest runs is the cost without
            # interference from other load (on a shared machine single runs spread by +-30%).
            results[mode] = {"ratio_median": statistics.median(ratios), "ratio_of_minima": min(times) / min(plains),
                             "ratios": ratios, "seconds": times, "plain_seconds": plains,
                             "peak_rss_delta_mb": max(peaks)}
            print(f"  {seconds:>4}s  {mode:<24} {statistics.median(ratios):5.2f}x  (fastest runs {min(times) / min(plains):5.2f}x)"
                  f"   peak +{max(peaks):7.0f} MB", flush=True)
        with PeakRss() as mem:
            plain(model, inputs, workdir)
        results["plain"] = {"seconds_median": statistics.median(plain_times), "peak_rss_delta_mb": mem.delta_mb}
        print(f"  {seconds:>4}s  {'plain forward':<24} {statistics.median(plain_times):5.2f}s   "
              f"peak +{mem.delta_mb:7.0f} MB", flush=True)
    return results


def run_once(mode: str, seconds: float) -> None:
    """Child process of --memory: build the model, run `mode` once, print the peak RSS in MiB."""
    import resource

    model, inputs = kokoro.decoder(seconds)
    with tempfile.TemporaryDirectory(prefix="tp-bench-", dir=os.environ.get("TP_BENCH_DIR")) as d:
        (plain if mode == "plain" else MODES[mode])(model, inputs, Path(d))
    print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def memory(seconds_list: list[float], modes: list[str], fixed_mmap: bool = False) -> dict:
    """Peak RSS of a fresh process per mode (in one process, freed memory stays with the allocator and
    hides what a later mode needs), minus that of a process running a plain forward.

    With `fixed_mmap`, glibc serves every allocation over 1 MiB with its own mmap and returns it on free
    (MALLOC_MMAP_THRESHOLD_), so the peak is live memory rather than what the heap happened to retain:
    by default glibc raises that threshold as blocks are freed, and the retained heap depends on the
    order of allocations, which a dispatch mode alone changes by hundreds of MiB."""
    import subprocess

    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_=str(1 << 20)) if fixed_mmap else None

    out: dict = {}
    for s in seconds_list:
        peaks = {}
        for mode in ["plain", *modes]:
            p = subprocess.run([sys.executable, __file__, "--one", mode, "--seconds", str(s)],
                               capture_output=True, text=True, env=env)
            peaks[mode] = float(p.stdout.strip().splitlines()[-1]) if p.returncode == 0 else None
            extra = (f"+{peaks[mode] - peaks['plain']:.0f} MiB over a plain forward" if peaks[mode] and mode != "plain"
                     else "" if peaks[mode] else f"failed: {p.stderr.strip().splitlines()[-1][:120]}")
            print(f"  {s:>4}s  {mode:<24} peak RSS {peaks[mode] or 0:7.0f} MiB  {extra}", flush=True)
        out[str(s)] = peaks
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, nargs="+", default=[3.0, 10.0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--modes", nargs="+", default=list(MODES))
    ap.add_argument("--json", type=Path)
    ap.add_argument("--memory", action="store_true", help="peak RSS per mode, one fresh process each")
    ap.add_argument("--fixed-mmap", action="store_true",
                    help="with --memory: glibc returns every block over 1 MiB on free (live memory, not heap retention)")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        return run_once(args.one, args.seconds[0])
    if args.memory:
        result = memory(args.seconds, args.modes, args.fixed_mmap)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(result, indent=1))
        return None
    machine = machine_info()
    print(f"machine: {machine}")
    out = {"machine": machine, "results": {}}
    for s in args.seconds:
        out["results"][str(s)] = bench(s, args.reps, args.modes)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    sys.exit(main())
