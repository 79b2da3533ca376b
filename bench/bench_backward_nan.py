"""Benchmark: the backward-NaN search against `torch.autograd.detect_anomaly(check_nan=True)` on the same
training steps, and what each names.

    python bench/bench_backward_nan.py [--repeat 3]          # bench/results/backward_nan.json

Steps (from `tensorprobe.examples.training`): the mel predictor with the where-masked √ energy (NaN born at
the silent frames), and the Kokoro decoder (0.5 s, voiced) under a spectral loss whose √(re² + im²) meets the
zero padding (+Inf born there). For each: a plain forward+loss+backward (the floor), detect_anomaly's step
(raises at the first NaN it sees), `find_first_nonfinite_backward` (runs the whole step, names the forward op,
elements and the parameters the NaN reaches) and the same with `full=False` (stops at the origin). Times are medians of `--repeat` runs on this machine's CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import torch
from _results import machine, write_results


def _timed(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def _plain(model, inputs, loss_fn):
    def run():
        model.zero_grad(set_to_none=True)
        loss_fn(model(*inputs)).backward()
    return run


def _anomaly(model, inputs, loss_fn):
    def run():
        model.zero_grad(set_to_none=True)
        try:
            with warnings.catch_warnings(), torch.autograd.detect_anomaly(check_nan=True):
                warnings.simplefilter("ignore")
                loss_fn(model(*inputs)).backward()
        except RuntimeError as e:
            return str(e).split("'")[1] if "'" in str(e) else str(e)[:60]
        return None
    return run


def main() -> None:
    from tensorprobe.examples.training import kokoro_decoder_step, masked_energy_step
    from tensorprobe.nan.backward import find_first_nonfinite_backward

    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="bench/results/backward_nan.json")
    args = ap.parse_args()
    rows = []
    for label, factory in [("mel predictor, masked sqrt", masked_energy_step),
                           ("Kokoro decoder 0.5 s, spectral loss", lambda: kokoro_decoder_step(0.5))]:
        model, inputs, loss_fn = factory()
        plain, _ = _timed(_plain(model, inputs, loss_fn), args.repeat)
        anomaly, named = _timed(_anomaly(model, inputs, loss_fn), args.repeat)
        ours, origin = _timed(lambda: find_first_nonfinite_backward(model, inputs, loss_fn), args.repeat)
        fast, _ = _timed(lambda: find_first_nonfinite_backward(model, inputs, loss_fn, full=False), args.repeat)
        rows.append({"step": label, "plain_s": round(plain, 4), "detect_anomaly_s": round(anomaly, 4),
                     "tensorprobe_s": round(ours, 4), "tensorprobe_vs_anomaly": round(ours / anomaly, 2),
                     "tensorprobe_vs_plain_step": round(ours / plain, 2),
                     "tensorprobe_stop_at_origin_s": round(fast, 4),
                     "stop_at_origin_vs_anomaly": round(fast / anomaly, 2),
                     "detect_anomaly_names": named, "tensorprobe_names": f"{origin.backward_op} = {origin.record}",
                     "tensorprobe_elements": origin.elements, "tensorprobe_reaches": len(origin.reaches)})
        print(json.dumps(rows[-1]))
    write_results(args.out, {"machine": machine(), "rows": rows})


if __name__ == "__main__":
    main()
