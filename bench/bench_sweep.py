"""Benchmark: sweep throughput (items per second) of each engine against a bare Python loop doing the same
work, and the engine's overhead per item.

    python bench/bench_sweep.py [--items 24] [--seconds 0.25]     # bench/results/sweep.json

The work is the shipped Kokoro export decoder against ONNX Runtime (`examples.kokoro:decoder_sweep`), items of
`--seconds` of audio. The bare loop builds one `SweepWorker` in this process and runs the items one after
another (no result file, no pool): the floor any engine adds to. Each engine's figure includes its start
(spawning workers, building the models, exporting once per worker), reported separately as the time to the
first item. Overhead per item = (engine wall time · workers − Σ item compute) / items, where item compute
is what the worker measured inside `SweepWorker.run`; that figure includes starting the workers. The steady
overhead leaves each worker's first item out: (wall time from the workers' first results to the last · workers
− the later items' compute) / later items.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

FACTORY = '''
from tensorprobe.examples.kokoro import decoder_sweep
def build():
    return decoder_sweep(items={items}, seconds={seconds})
'''


def bare_loop(target: str, names: list[str]) -> dict:
    from tensorprobe.sweep.item import SweepWorker
    from tensorprobe.sweep.spec import TargetSource

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as keep:
        worker = SweepWorker(TargetSource.of(target), None, keep)
        ready = time.perf_counter()
        secs = [worker.run(n)["seconds"] for n in names]
    end = time.perf_counter()
    return {"wall_s": end - start, "start_s": ready - start, "items_per_s": len(names) / (end - ready),
            "item_compute_s": sum(secs)}


def engine_run(target: str, engine: str, workers: int, n: int) -> dict:
    import tensorprobe as tp

    out = Path(tempfile.mkdtemp(prefix=f"bench-sweep-{engine}-"))
    first: list[float] = []
    finished: list[tuple[float, float]] = []        # (wall time at finish, the item's own compute)
    start = time.perf_counter()

    def on_item(record, done, total):
        now = time.perf_counter() - start
        if not first:
            first.append(now)
        finished.append((now, float(record.get("seconds", 0.0))))

    try:
        tp.sweep(target, out, workers=workers, engine=engine, on_item=on_item)
        wall = time.perf_counter() - start
        records = [json.loads(line) for line in (out / "items.jsonl").read_text().splitlines()]
    finally:
        shutil.rmtree(out, ignore_errors=True)
    compute = sum(r["seconds"] for r in records)
    # steady state: after each worker's first item (start-up, model build, export), what the engine adds per item
    later = finished[workers:]
    steady = None
    if len(later) > 1:
        span = (later[-1][0] - finished[workers - 1][0]) * workers
        steady = (span - sum(c for _, c in later)) / len(later)
    return {"engine": engine, "workers": workers, "wall_s": wall, "first_item_s": first[0] if first else None,
            "items_per_s": n / wall, "item_compute_s": compute,
            "overhead_per_item_s": (wall * workers - compute) / n, "steady_overhead_per_item_s": steady,
            "steady_item_compute_s": sum(c for _, c in later) / len(later) if later else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=24)
    ap.add_argument("--seconds", type=float, default=0.25)
    ap.add_argument("--engines", default="local:1,local:2,dask:2,ray:2")
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    (d / "bench_factory.py").write_text(FACTORY.format(items=args.items, seconds=args.seconds))
    target = f"{d / 'bench_factory.py'}:build"
    from tensorprobe.sweep.spec import TargetSource

    names = TargetSource.of(target).load().names
    results = {"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                           "python": platform.python_version()},
               "items": args.items, "seconds_of_audio": args.seconds, "bare_loop": bare_loop(target, names),
               "engines": []}
    print("bare loop", json.dumps(results["bare_loop"]))
    for spec in args.engines.split(","):
        engine, workers = spec.split(":")
        r = engine_run(target, engine, int(workers), len(names))
        results["engines"].append(r)
        print(json.dumps(r))
    out = Path(__file__).parent / "results" / "sweep.json"
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
