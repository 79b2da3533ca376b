"""python -m bench.accuracy: run the accuracy benchmark.

    python -m bench.accuracy --quick                 # the seeded slice the test suite runs (prints the scores)
    python -m bench.accuracy --full                  # >= 3,000 cases: bench/results/accuracy.json, docs/accuracy.md
    python -m bench.accuracy --case ID [--case ID]   # one case, with the verdict's whole summary
    python -m bench.accuracy --page bench/results/accuracy.json   # docs/accuracy.md again from a run's JSON

Exit status: 0 when every target holds, 1 when one does not (each is printed), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

from .cases import generate
from .isolate import generate_isolate
from .nan import generate_nan
from .sweep import generate_sweep
from .run import case_from_id, run_population
from .report import failed_targets, markdown, misses, score

ROOT = Path(__file__).resolve().parents[2]
QUICK = {"count": 200, "seed": 0, "ports": ("torch", "fp16", "bf16", "onnx-legacy", "aot_eager"), "nan": 120,
         "isolate": 60, "sweep": 7, "sweep_ports": ("torch",)}
FULL = {"count": 3500, "seed": 1, "ports": ("torch", "fp16", "bf16", "onnx", "onnx-legacy", "onnx-int8", "onnx-qdq",
                                            "aot_eager", "inductor", "executorch"), "nan": 400, "isolate": 400,
        "sweep": 120, "sweep_ports": ("torch", "fp16")}


def _machine() -> dict:
    sys.path.insert(0, str(ROOT / "bench"))
    from _results import machine

    return machine()


def _atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _write_page(doc: dict) -> None:
    page = ROOT / "docs" / "accuracy.md"
    _atomic_write(page, markdown(doc))
    print(f"wrote {page}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.accuracy", description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--quick", action="store_true", help="the seeded slice of the test suite")
    what.add_argument("--full", action="store_true", help="the full run: writes the JSON and docs/accuracy.md")
    what.add_argument("--case", action="append", help="run one case by id (repeatable)")
    what.add_argument("--page", type=Path, metavar="JSON", help="write docs/accuracy.md again from a full run's JSON")
    parser.add_argument("--count", type=int, help="how many cases to draw (default: 200 quick, 3500 full)")
    parser.add_argument("--seed", type=int, help="the population's seed")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="worker processes")
    parser.add_argument("--json", type=Path, help="where the full run writes its JSON "
                                                  "(default bench/results/accuracy.json)")
    args = parser.parse_args(argv)

    if args.page:
        _write_page(json.loads(args.page.read_text()))
        return 0
    if args.case:
        try:
            cases = [case_from_id(i) for i in args.case]
        except ValueError as exc:
            parser.error(str(exc))
        for outcome in run_population(cases, jobs=1):
            print(json.dumps(outcome, indent=1, default=str))
        return 0

    plan = dict(QUICK if args.quick else FULL)
    if args.count:
        plan["count"] = args.count
    if args.seed is not None:
        plan["seed"] = args.seed
    cases = generate(plan["count"], plan["seed"], ports=plan["ports"]) + generate_nan(plan["nan"], plan["seed"]) + \
        generate_isolate(plan["isolate"], plan["seed"]) + \
        generate_sweep(plan["sweep"], plan["seed"], plan["sweep_ports"])
    started = time.perf_counter()
    outcomes = run_population(cases, args.jobs)
    seconds = time.perf_counter() - started
    total = score(outcomes)
    print(json.dumps({k: v for k, v in total.items()}, default=str))
    for m in misses(outcomes):
        print(f"  {m['id']}: {m['what']}")
    if args.full:
        wrong = {m["id"] for m in misses(outcomes)}
        kept = [{k: v for k, v in o.items() if k not in ("summary", "traceback") or o["id"] in wrong}
                for o in outcomes]   # the first sentence of a verdict is kept where it was wrong
        doc = {"date": datetime.date.today().isoformat(), "seed": plan["seed"], "seconds": seconds,
               "machine": _machine(), "score": total, "outcomes": kept}
        path = args.json or ROOT / "bench" / "results" / "accuracy.json"
        _atomic_write(path, json.dumps(doc, indent=0, default=str))
        _write_page(doc)
        print(f"wrote {path}")
    failed = failed_targets(outcomes)
    for line in failed:
        print(f"target missed: {line}")
    print(f"{len(outcomes)} cases in {seconds:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
