"""Cost of capturing every intermediate of the Kokoro decoder under ONNX Runtime, as a multiple of a plain run.

    python bench/bench_onnxruntime.py --seconds 10 --repeats 3 --json bench/results/onnxruntime.json

The decoder is exported once (dynamo exporter, ONNX-ready: conv STFT, weight norm folded). Then, interleaved
in one process, each round times: a plain run of a warm ORT session (graph outputs only); a cold plain run
(load the .onnx, make the session, run: what a one-off script does); and `capture_artifact` of all ~1,000
values into a bundle: keep="stats" (every value run into a reused buffer, statistics on it), keep="full"
(tensors written to safetensors shards), and keep="full" with a smaller output buffer (`--segment-mb`, more segments). Each figure is the median of
per-round ratios to the plain runs of the same round; peak memory is the highest RSS sampled during the
capture, over the RSS before it.
"""

from __future__ import annotations

import argparse
import json
import shutil
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
    ap.add_argument("--segment-mb", type=int, default=64, help="output buffer of the 'full, small buffer' mode (MiB)")
    ap.add_argument("--modes", nargs="+", default=["stats", "full", "full, small buffer"])
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).parent))
    from bench_capture import PeakRss, machine_info

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
        all_modes = {"stats": dict(keep="stats"), "full": dict(keep="full"), "full, small buffer": dict(keep="full", max_bytes=args.segment_mb << 20)}
        modes = {m: all_modes[m] for m in args.modes}
        ratios: dict[str, list[float]] = {m: [] for m in modes}
        cold_ratios: dict[str, list[float]] = {m: [] for m in modes}
        peaks: dict[str, float] = {m: 0.0 for m in modes}
        times: dict[str, list[float]] = {m: [] for m in modes}
        plain_times, cold_times = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            sess.run(None, feeds)
            plain = time.perf_counter() - t0
            t0 = time.perf_counter()
            make_session(onnx.load(str(path)), args.threads).run(None, feeds)
            cold = time.perf_counter() - t0
            plain_times.append(plain)
            cold_times.append(cold)
            for mode, kw in modes.items():
                shutil.rmtree(tmp / "bundle", ignore_errors=True)  # untimed: each capture writes a fresh bundle
                with PeakRss() as peak:
                    t0 = time.perf_counter()
                    b = ort.capture_artifact(path, inputs, out=tmp / "bundle", threads=args.threads, **kw)
                    took = time.perf_counter() - t0
                ratios[mode].append(took / plain)
                times[mode].append(took)
                cold_ratios[mode].append(took / cold)
                peaks[mode] = max(peaks[mode], peak.delta_mb)
                info = dict(ort.last_run)
            print(f"  round: plain {plain:.2f}s, cold {cold:.2f}s; "
                  + ", ".join(f"{m} x{r[-1]:.2f}" for m, r in ratios.items()), flush=True)
        print(f"\nKokoro decoder, {args.seconds:g} s of audio, onnxruntime {ort.runtime_info()['version']}")
        print(f"records: {len(b)}; outputs estimated {info['estimated_bytes'] / 2**30:.2f} GiB; "
              f"the last mode ran {info['session_runs']} segments over a {info['pool_bytes'] >> 20} MiB buffer")
        print(f"plain ORT run: {statistics.median(plain_times):.2f}s warm, "
              f"{statistics.median(cold_times):.2f}s cold (load + session + run); medians")
        results = {}
        for mode in modes:
            fastest = min(times[mode]) / min(plain_times)
            results[mode] = {"ratio_warm": statistics.median(ratios[mode]), "ratio_cold": statistics.median(cold_ratios[mode]),
                             "ratio_of_minima_warm": fastest, "ratios_warm": ratios[mode], "seconds": times[mode],
                             "peak_rss_delta_mb": peaks[mode]}
            print(f"capture all intermediates, keep={mode:<20} x{results[mode]['ratio_warm']:.2f} of a warm run "
                  f"(fastest runs x{fastest:.2f}), x{results[mode]['ratio_cold']:.2f} of a cold one; "
                  f"peak memory +{peaks[mode]:.0f} MiB")
        if args.json:
            args.json.write_text(json.dumps({"machine": machine_info(), "seconds": args.seconds,
                                             "plain_warm_s": statistics.median(plain_times),
                                             "plain_warm_times": plain_times, "plain_cold_times": cold_times,
                                             "plain_cold_s": statistics.median(cold_times), "values": len(b),
                                             "estimated_bytes": info["estimated_bytes"], "results": results}, indent=1))

if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
