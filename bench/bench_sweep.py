"""Benchmark: what a sweep costs beside a plain Python loop running both models over the same items, in one run.

    python bench/bench_sweep.py [--items 48] [--large 2000]      # bench/results/sweep.json
    python bench/bench_sweep.py --large 10000 --large-only       # bench/results/sweep_large.json

The model is a small vocoder-shaped stack (Conv1d, 64 channels, 8 layers, 0.25 s of 24 kHz audio per item);
the candidate is a second PyTorch model, the same weights (passing) or one whose last layer is off by 1% on
every third item (failing). Figures, each measured here beside the plain loop:

- plain loop: both models on every item, one process, one thread (what a sweep worker uses), no judging;
- sweep ratio: `tp.sweep(..., workers=1)` wall time over the plain loop's, on the passing corpus (target
  <= 1.3x) and on the corpus where a third fail (target <= 3x: those get captures, diff, nan, a bundle);
  "steady" leaves the start out (spawning the worker, building the models): the per-item cost;
- items/s at 1 and 2 workers, the driver's overhead per item ((wall x workers - sum of item seconds) / items),
  disk per kept (tier-2) item;
- a large run (`--large` items at 0.01 s each) with the peak RSS of the driver and its workers, sampled
  every 0.2 s, and the RSS after warm-up against the end (flat: memory does not grow with items).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _results import machine, write_results  # noqa: E402

FACTORY = '''
import torch
from tensorprobe.sweep import Sweep

class Voc(torch.nn.Module):
    def __init__(self, off_every=0):
        super().__init__()
        torch.manual_seed(0)
        self.pre = torch.nn.Conv1d(16, 64, 7, padding=3)
        self.body = torch.nn.ModuleList(torch.nn.Conv1d(64, 64, 7, padding=3) for _ in range(6))
        self.post = torch.nn.Conv1d(64, 1, 7, padding=3)
        self.off_every = off_every

    def forward(self, x):
        h = self.pre(x)
        for conv in self.body:
            h = h + torch.tanh(conv(h))
        y = torch.tanh(self.post(h))
        if self.off_every and round(x[0, 0, 0].item() * 1000) % self.off_every == 0:
            y = y * 1.01            # the port's bug: the output off by 1% on these items
        return y.squeeze(1)

def items(n, samples):
    def make(name):
        i = int(name[4:])
        g = torch.Generator().manual_seed(i)
        x = torch.randn(1, 16, samples, generator=g) * 0.3
        x[0, 0, 0] = i / 1000          # the item's number, which the failing port reads
        return (x,)
    return [f"item{{i:06d}}" for i in range(n)], make

def build(n={n}, samples={samples}, off_every={off_every}):
    names, make = items(n, samples)
    return Sweep(Voc().eval(), names, inputs=make, candidate=Voc(off_every).eval(), sample_rate=24000)
'''


def write_target(d: Path, tag: str, n: int, samples: int, off_every: int) -> str:
    path = d / f"bench_{tag}.py"
    path.write_text(FACTORY.format(n=n, samples=samples, off_every=off_every))
    return f"{path}:build"


def plain_loop(target: str) -> dict:
    """Both models over every item in this process, one thread: the floor a sweep is measured against."""
    import torch

    from tensorprobe.sweep.spec import TargetSource

    torch.set_num_threads(1)
    sw = TargetSource.of(target).load()
    cand = sw.candidate
    start = time.perf_counter()
    with torch.inference_mode():
        for name in sw.names:
            inputs = sw.inputs_of(name)
            sw.reference(*inputs).numpy()
            cand(*inputs).numpy()
    return {"wall_s": time.perf_counter() - start, "items": len(sw.names)}


def sweep_run(target: str, workers: int, engine: str = "local", watch: bool = False) -> dict:
    import tensorprobe as tp

    out = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    first: list[float] = []
    start = time.perf_counter()

    def on_item(record, done, total):
        if not first:
            first.append(time.perf_counter())

    sampler = _RssSampler() if watch else None
    try:
        if sampler:
            sampler.start()
        summary = tp.sweep(target, out, workers=workers, engine=engine, on_item=on_item)
        wall = time.perf_counter() - start
        records = [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()]
        kept = [r for r in records if r.get("bundle")]
        disk = sum(f.stat().st_size for f in (out / "bundles").rglob("*") if f.is_file())
    finally:
        if sampler:
            sampler.stop()
        shutil.rmtree(out, ignore_errors=True)
    n = len(records)
    compute = sum(r["seconds"] for r in records)
    doc = {"engine": engine, "workers": workers, "items": n, "wall_s": round(wall, 3),
           "steady_s": round(start + wall - first[0], 3) if first else None,
           "items_per_s": round(n / wall, 2), "tier2_items": sum(1 for r in records if r.get("tier") == 2),
           "findings": summary.findings, "item_compute_s": round(compute, 3),
           "driver_overhead_per_item_ms": round(1000 * (wall * workers - compute) / n, 2),
           "kept_items": len(kept), "disk_per_kept_item_kb": round(disk / len(kept) / 1024, 1) if kept else None}
    if sampler:
        doc.update(sampler.figures())
    return doc


class _RssSampler:
    """Peak RSS of this process and its children, sampled in a thread; the total after warm-up and at the end."""

    def __init__(self, every: float = 0.2):
        import psutil

        self.proc, self.every, self.samples, self._stop = psutil.Process(), every, [], threading.Event()

    def _total(self) -> int:
        total = 0
        for p in [self.proc, *self.proc.children(recursive=True)]:
            try:
                total += p.memory_info().rss
            except Exception:  # noqa: BLE001 - a worker that just ended
                pass
        return total

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self._total())
            time.sleep(self.every)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join()

    def figures(self) -> dict:
        s = self.samples
        if len(s) < 10:
            return {"peak_rss_mb": round(max(s, default=0) / 2**20, 1)}
        quarter, last = s[len(s) // 4: len(s) // 2], s[-len(s) // 4:]
        return {"peak_rss_mb": round(max(s) / 2**20, 1),
                "rss_after_warmup_mb": round(max(quarter) / 2**20, 1),
                "rss_last_quarter_mb": round(max(last) / 2**20, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=48)
    ap.add_argument("--samples", type=int, default=6000)
    ap.add_argument("--large", type=int, default=2000)
    ap.add_argument("--engines", default="ray:2,dask:2")
    ap.add_argument("--large-only", action="store_true",
                    help="only the large run (results in bench/results/sweep_large.json)")
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="bench-sweep-targets-"))
    if args.large_only:
        large = write_target(d, "large", args.large, 240, 0)
        res = {"machine": machine(), "large": sweep_run(large, 2, watch=True)}
        print("large", res["large"], flush=True)
        shutil.rmtree(d, ignore_errors=True)
        write_results(Path(__file__).parent / "results" / "sweep_large.json", res)
        return
    passing = write_target(d, "passing", args.items, args.samples, 0)
    failing = write_target(d, "failing", args.items, args.samples, 3)
    res: dict = {"machine": machine(), "items": args.items, "samples": args.samples}
    res["plain_loop"] = plain_loop(passing)
    print("plain loop", res["plain_loop"], flush=True)
    for tag, target in (("passing", passing), ("third_failing", failing)):
        r = sweep_run(target, 1)
        r["ratio_to_plain"] = round(r["wall_s"] / res["plain_loop"]["wall_s"], 2)
        r["steady_ratio_to_plain"] = round(r["steady_s"] / res["plain_loop"]["wall_s"], 2) if r["steady_s"] else None
        res[tag] = r
        print(tag, r, flush=True)
    res["passing_2_workers"] = sweep_run(passing, 2)
    print("2 workers", res["passing_2_workers"], flush=True)
    res["engines"] = []
    for spec in filter(None, args.engines.split(",")):
        engine, workers = spec.split(":")
        r = sweep_run(passing, int(workers), engine)
        res["engines"].append(r)
        print(engine, r, flush=True)
    if args.large:
        large = write_target(d, "large", args.large, 240, 0)
        res["large"] = sweep_run(large, 2, watch=True)
        print("large", res["large"], flush=True)
    shutil.rmtree(d, ignore_errors=True)
    out = Path(__file__).parent / "results" / "sweep.json"
    write_results(out, res)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
