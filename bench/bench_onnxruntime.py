"""Cost of capturing every intermediate of the Kokoro decoder under ONNX Runtime, as a multiple of a plain run.

    python bench/bench_onnxruntime.py --seconds 10 --repeats 3

The decoder is exported once (dynamo exporter, ONNX-ready: conv STFT, weight norm folded). Then, interleaved
in one process: a plain ORT session run (graph outputs only), and `capture_artifact` of all ~1,150 node
outputs into a bundle: keep="stats" (every value fetched whole, the Polygraphy-style "mark all"),
keep="stats" with each value reduced inside the graph (`in_graph_stats=True`), keep="full" (tensors streamed
to safetensors shards), and keep="full" forced into segments (`max_bytes`): the bounded-memory path.
Each figure is the median of per-round ratios to the plain run of the same round. Peak RSS is printed.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch



def exportable_decoder():
    from tensorprobe.examples import kokoro

    return kokoro.exportable_decoder(), kokoro


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--segment-mb", type=int, default=1024, help="max_bytes of the segmented run (MiB)")
    ap.add_argument("--modes", nargs="+", default=["stats", "stats, in-graph", "full", "full, segmented"])
    args = ap.parse_args()

    from tensorprobe.runtimes import get_runtime
    from tensorprobe.runtimes.onnxruntime import export_onnx, graph_feeds, make_session

    import onnx

    model, kokoro = exportable_decoder()
    inputs = kokoro.decoder_inputs(args.seconds)
    with tempfile.TemporaryDirectory(prefix="tp-bench-ort-") as tmp:
        tmp = Path(tmp)
        t0 = time.perf_counter()
        path = export_onnx(model, inputs, tmp / "decoder.onnx")
        print(f"export (dynamo): {time.perf_counter() - t0:.1f}s")
        proto = onnx.load(str(path))
        feeds = graph_feeds(proto, inputs)
        sess = make_session(proto, args.threads)
        sess.run(None, feeds)  # warm-up
        ort = get_runtime("onnxruntime")
        all_modes = {"stats": dict(keep="stats"), "stats, in-graph": dict(keep="stats", in_graph_stats=True),
                     "full": dict(keep="full"), "full, segmented": dict(keep="full", max_bytes=args.segment_mb << 20)}
        modes = {m: all_modes[m] for m in args.modes}
        ratios: dict[str, list[float]] = {m: [] for m in modes}
        plain_times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            sess.run(None, feeds)
            plain = time.perf_counter() - t0
            plain_times.append(plain)
            for mode, kw in modes.items():
                t0 = time.perf_counter()
                b = ort.capture_artifact(path, inputs, out=tmp / "bundle", threads=args.threads, **kw)
                ratios[mode].append((time.perf_counter() - t0) / plain)
                info = dict(ort.last_run)
            print(f"  round: plain {plain:.2f}s; " + ", ".join(f"{m} x{r[-1]:.2f}" for m, r in ratios.items()))
        print(f"\nKokoro decoder, {args.seconds:g} s of audio, onnxruntime {ort.runtime_info()['version']}")
        print(f"records: {len(b)}; outputs estimated {info['estimated_bytes'] / 2**30:.2f} GiB; "
              f"segmented run used {info['session_runs']} sessions")
        print(f"plain ORT run: {statistics.median(plain_times):.2f}s (median)")
        for mode, r in ratios.items():
            print(f"capture all intermediates, keep={mode:<16} x{statistics.median(r):.2f} of a plain run")
        print(f"peak RSS: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
