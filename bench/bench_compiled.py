"""Benchmark: what the compiled capture's in-graph statistics cost against the compiled forward itself.

    python bench/bench_compiled.py [--backend inductor] [--channels 128] [--samples 24000] [--reps 15]
                                   # bench/results/compiled.json
    python bench/bench_compiled.py --level op --json bench/results/compiled_op.json

The model is an audio-shaped conv stack (`--blocks` blocks of Conv1d -> InstanceNorm1d -> LeakyReLU, residual,
`--channels` x `--samples`), small enough that Inductor's C++ compile fits a shared 2-core machine. Both sides are
compiled once with the same backend (`torch.compile(model, backend=...)` and our instrumenting backend,
`tensorprobe.compiled.CompiledRun`, at module level, keep="stats"); compile time is measured apart (first call).
Then the two compiled forwards alternate `--reps` times and the figure is the median of per-run ratios
(instrumented / plain): the cost of the statistics computed inside the graph plus turning each graph's extra
outputs into `TensorStats` (what `tp.capture(..., compile=True)` adds per forward, less writing the bundle's
manifest). The eager forward and an eager module/stats capture are measured beside them for scale.

With `--level op` the instrumented side records every aten op of the graph after AOT autograd (Inductor's
decomposed graph), and the figure the issue asks for is set beside it: an eager op/stats capture of the same
model (`tp.capture(model, x, level="op")`, which also writes its bundle: ~ms here).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _results import machine, write_results  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv = torch.nn.Conv1d(c, c, 3, padding=1)
        self.norm = torch.nn.InstanceNorm1d(c, affine=True)
        self.act = torch.nn.LeakyReLU(0.2)

    def forward(self, x):
        return x + self.act(self.norm(self.conv(x)))


class Stack(torch.nn.Module):
    def __init__(self, c: int, blocks: int):
        super().__init__()
        self.blocks = torch.nn.Sequential(*[Block(c) for _ in range(blocks)])
        self.out = torch.nn.Conv1d(c, 1, 1)

    def forward(self, x):
        return torch.tanh(self.out(self.blocks(x)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--channels", type=int, default=128)
    ap.add_argument("--samples", type=int, default=24000)
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--level", default="module", choices=["module", "op"])
    ap.add_argument("--json", default="bench/results/compiled.json")
    a = ap.parse_args()

    import tensorprobe as tp
    from tensorprobe.compiled import CompiledRun, _meta_value, mark_hook, stats_from_vector

    torch.manual_seed(0)
    model = Stack(a.channels, a.blocks).eval().to(a.device)
    x = torch.randn(1, a.channels, a.samples, device=a.device)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)

    def timed(fn) -> float:
        sync()
        t = time.perf_counter()
        fn()
        sync()
        return time.perf_counter() - t
    stats_made = []

    def on_run(plan, extra):
        stats_made.append([stats_from_vector(v, e.shape, 1, _meta_value(e.node).dtype) for e, v in zip(plan.entries, extra) if not e.full])

    with torch.no_grad():
        torch._dynamo.reset()
        plain = torch.compile(model, backend=a.backend, dynamic=False)
        t = time.perf_counter()
        plain(x)
        compile_plain = time.perf_counter() - t

        handles = [m.register_forward_hook(mark_hook(p, type(m).__name__)) for p, m in model.named_modules() if p
                   and a.level == "module"]
        backend = CompiledRun(model, level=a.level, backend=a.backend, mode=None, keep_full=False,
                              wanted=lambda n: True, placeholder_names=lambda ex: {}, on_graph_run=on_run)
        instrumented = torch.compile(model, backend=backend, dynamic=False)
        t = time.perf_counter()
        instrumented(x)
        compile_instr = time.perf_counter() - t
        records = sum(len(e.names) for p in backend.plans for e in p.entries)

        ratios, t_plain, t_instr, t_eager = [], [], [], []
        for _ in range(a.reps):
            tp_ = timed(lambda: plain(x))
            ti = timed(lambda: instrumented(x))
            te = timed(lambda: model(x))
            t_plain.append(tp_); t_instr.append(ti); t_eager.append(te); ratios.append(ti / tp_)
        for h in handles:
            h.remove()
        # an eager capture at the same level of the same model, for scale (its own ratio to the eager forward)
        eager_caps, eager_cap_s = [], []
        for _ in range(max(3, a.reps // 3)):
            te = timed(lambda: model(x))
            tc = timed(lambda: tp.capture(model, x, level=a.level, weights=False))
            eager_caps.append(tc / te)
            eager_cap_s.append(tc)

    doc = {
        "machine": machine(), "device": torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu",
        "backend": a.backend, "model": f"{a.blocks} x (Conv1d {a.channels}ch, InstanceNorm1d, "
        f"LeakyReLU) + Conv1d, input 1x{a.channels}x{a.samples}", "records_per_forward": records,
        "compile_seconds": {"plain": round(compile_plain, 2), "instrumented": round(compile_instr, 2)},
        "median_seconds": {"compiled_forward": statistics.median(t_plain),
                           "compiled_stats_capture": statistics.median(t_instr),
                           "eager_forward": statistics.median(t_eager)},
        "median_ratio_instrumented_vs_compiled": statistics.median(ratios),
        "ratios": ratios, "level": a.level,
        f"eager_{a.level}_stats_capture_vs_eager_forward": statistics.median(eager_caps),
        f"eager_{a.level}_stats_capture_seconds": statistics.median(eager_cap_s),
        f"compiled_{a.level}_stats_vs_eager_{a.level}_stats_capture":
            statistics.median(t_instr) / statistics.median(eager_cap_s),
    }
    print(f"{a.backend}: compiled forward {doc['median_seconds']['compiled_forward'] * 1e3:.1f} ms, with in-graph "
          f"statistics of {records} {a.level} outputs {doc['median_seconds']['compiled_stats_capture'] * 1e3:.1f} ms: "
          f"{doc['median_ratio_instrumented_vs_compiled']:.2f}x (median of per-run ratios); eager forward "
          f"{doc['median_seconds']['eager_forward'] * 1e3:.1f} ms, eager {a.level}/stats capture "
          f"{statistics.median(eager_cap_s) * 1e3:.1f} ms ({statistics.median(eager_caps):.2f}x of it): compiled "
          f"{a.level}/stats at {doc[f'compiled_{a.level}_stats_vs_eager_{a.level}_stats_capture']:.2f}x of the eager "
          f"{a.level}/stats capture; compile {compile_plain:.1f} s plain, {compile_instr:.1f} s instrumented")
    write_results(a.json, doc)


if __name__ == "__main__":
    main()
