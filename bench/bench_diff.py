"""Benchmark: `tensorprobe.diff` throughput (GB/s per side) on two full bundles of the Kokoro decoder.

    python bench/bench_diff.py --seconds 1.0              # op-level, keep="full": ~1 GB per bundle
    python bench/bench_diff.py --seconds 10 --out /big    # the issue's size: ~8-10 GB per bundle

The candidate is the same decoder with one conv perturbed by a 1% relative error (so every record after
it differs). Printed, per side (bytes of the reference bundle's tensors / wall time):

- diff          the full `tensorprobe.diff` (alignment, one fused pass per pair, analysis)
- metric pass   the metric kernel alone over the same pairs
- read floor    one read pass per side (torch sum of each tensor): what memory bandwidth allows
- naive NumPy   one pass per metric with np.corrcoef (on a subset; extrapolated per GB)

and the exactness of the fused metrics against float64 NumPy on the largest pair. Bundles live in
page cache after capture (figures are warm-cache; a cold disk read is bounded by the disk instead).
"""

from __future__ import annotations

import argparse
import math
import shutil
import time
from pathlib import Path

import numpy as np
import torch

import tensorprobe as tp
from tensorprobe.bundle import Bundle
from tensorprobe.diff import metrics as M

TARGET = "generator.resblocks.2.convs1.1"


def make_bundles(out: Path, seconds: float, level: str) -> tuple[Path, Path]:
    from tensorprobe.examples import kokoro

    ref_p, cand_p = out / "ref", out / "cand"
    if (ref_p / "manifest.json").exists() and (cand_p / "manifest.json").exists():
        return ref_p, cand_p
    model = kokoro.build_decoder()
    inputs = kokoro.decoder_inputs(seconds)
    with torch.inference_mode():
        torch.manual_seed(0)
        tp.capture(model, *inputs, level=level, keep="full", out=ref_p)

        def perturb(module, args, y):
            return y * (1 + 1e-2 * torch.sin(torch.arange(y.numel(), dtype=y.dtype) * 0.37).reshape(y.shape))

        h = dict(model.named_modules())[TARGET].register_forward_hook(perturb)
        torch.manual_seed(0)
        tp.capture(model, *inputs, level=level, keep="full", out=cand_p)
        h.remove()
    return ref_p, cand_p


def tensor_bytes(b: Bundle) -> int:
    return sum(r.stats.numel * torch.empty(0, dtype=getattr(torch, r.dtype)).element_size()
               for r in b if r.has_tensor and hasattr(torch, r.dtype))


def best_of(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def naive_numpy(r: np.ndarray, c: np.ndarray) -> dict:
    r, c = r.astype(np.float64).ravel(), c.astype(np.float64).ravel()
    d = c - r
    return {"max_abs": np.abs(d).max(), "mean_abs": np.abs(d).mean(),
            "max_rel": (np.abs(d) / (np.abs(r) + 1e-30)).max(),
            "cos": np.dot(r, c) / np.sqrt(np.dot(r, r) * np.dot(c, c)), "pearson": np.corrcoef(r, c)[0, 1],
            "snr": 10 * np.log10(np.dot(r, r) / np.dot(d, d)), "fin_r": np.isfinite(r).mean(),
            "fin_c": np.isfinite(c).mean()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=1.0, help="audio length captured (default 1.0)")
    ap.add_argument("--level", default="op", choices=["op", "module"])
    ap.add_argument("--out", type=Path, default=Path("/tmp/tensorprobe_bench_diff"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cleanup", action="store_true", help="delete the bundles afterwards")
    args = ap.parse_args()

    t0 = time.perf_counter()
    ref_p, cand_p = make_bundles(args.out, args.seconds, args.level)
    print(f"bundles: {ref_p}, {cand_p} (made/reused in {time.perf_counter() - t0:.1f} s)")
    ref, cand = Bundle.open(ref_p), Bundle.open(cand_p)
    nbytes = tensor_bytes(ref)
    gb = nbytes / 1e9
    print(f"Kokoro decoder, {args.seconds:g} s of audio, level={args.level}, keep=full: {len(ref)} records, "
          f"{gb:.2f} GB of tensors per side; threads: {torch.get_num_threads()}")

    tp.diff(ref, cand)  # warm: Numba compile/cache load, page cache
    t_diff = best_of(lambda: tp.diff(ref, cand), args.repeat)
    report = tp.diff(ref, cand)
    names = [(p.name, p.cand_name) for p in report.pairs if p.metrics]

    def kernel_only():
        for a, b in names:
            M.accumulate(ref.tensor(a), cand.tensor(b))

    def read_floor():
        for a, b in names:
            ref.tensor(a).sum()
            cand.tensor(b).sum()

    t_kernel = best_of(kernel_only, args.repeat)
    t_floor = best_of(read_floor, args.repeat)
    print(f"first divergence: {report.first_divergence}; verdict {report.verdict}")
    print(f"diff (whole):        {t_diff:7.3f} s   {gb / t_diff:6.2f} GB/s per side")
    print(f"metric pass only:    {t_kernel:7.3f} s   {gb / t_kernel:6.2f} GB/s per side")
    print(f"read floor (sum):    {t_floor:7.3f} s   {2 * gb / t_floor:6.2f} GB/s over both sides "
          f"({gb / t_floor:.2f} per side)")
    large_pair(args.repeat)
    if args.cleanup:
        shutil.rmtree(args.out)


def large_pair(repeat: int, n: int = 1 << 26) -> None:
    """One large pair (256 MB per side, mean 1000): fused pass vs read floor vs naive NumPy; exactness."""
    g = np.random.default_rng(0)
    r = (1000.0 + g.standard_normal(n, dtype=np.float32))
    c = r + np.float32(1e-3) * g.standard_normal(n, dtype=np.float32)
    gb = r.nbytes / 1e9
    M.accumulate(r[:1000], c[:1000])
    t_fused = best_of(lambda: M.accumulate(r, c, shift_r=1000.0, shift_c=1000.0), repeat)
    rt, ct = torch.from_numpy(r), torch.from_numpy(c)
    t_floor = best_of(lambda: (rt.sum(), ct.sum()), repeat)
    sub = 1 << 23
    t_naive = best_of(lambda: naive_numpy(r[:sub], c[:sub]), 1) * (n / sub)
    print(f"large pair ({gb * 1e3:.0f} MB per side): fused {gb / t_fused:.2f} GB/s per side; read floor "
          f"{gb / t_floor:.2f} GB/s per side; naive NumPy {gb / t_naive:.3f} GB/s per side "
          f"({t_naive / t_fused:.0f}x slower than fused)")
    got = M.compare(r, c, shift_r=1000.0, shift_c=1000.0)
    want = naive_numpy(r, c)
    errs = {k: abs(got[a] - want[k]) / max(abs(want[k]), 1e-300)
            for k, a in (("cos", "cosine"), ("pearson", "pearson"), ("snr", "snr_db"), ("mean_abs", "mean_abs_err"))}
    print("exactness vs float64 NumPy (relative difference): " + ", ".join(f"{k} {v:.1e}" for k, v in errs.items()))
    cos32 = float(torch.dot(rt, ct) / torch.sqrt(torch.dot(rt, rt) * torch.dot(ct, ct)))
    s32 = float(torch.from_numpy(r).cumsum(0)[-1]) / n
    print(f"float32 for comparison: BLAS-dot cosine {cos32!r} (float64 {float(want['cos'])!r}); "
          f"sequential float32 mean {s32!r} (float64 {float(r.astype(np.float64).mean())!r})")
    assert all(math.isfinite(v) and v < 1e-9 for v in errs.values())


if __name__ == "__main__":
    main()
