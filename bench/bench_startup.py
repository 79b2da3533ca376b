"""Benchmark: start-up time of the commands people run in CI loops (wall time of the whole process).

    python bench/bench_startup.py                 # 7 runs per command, median and min; bench/results/startup.json

The fixtures are tiny (a 3-layer op-level capture, a 1 s WAV), so the figures are the cost of starting:
Python, the imports a command needs, argument parsing, rendering. None of these commands imports torch
(tests/cli/test_startup.py checks it); the table also says which heavy packages each one loads.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

COMMANDS = [
    ["--help"],
    ["show", "ref"],
    ["diff", "ref", "cand"],
    ["nan", "ref"],
    ["rng", "show", "ref"],
    ["rng", "export", "ref", "-o", "noise.safetensors"],
    ["audio", "check", "a.wav"],
    ["audio", "diff", "a.wav", "b.wav"],
]
HEAVY = ("torch", "numba", "scipy", "librosa", "pydantic", "jinja2", "matplotlib")
PROBE = ("import sys, json; from tensorprobe.cli import main; sys.argv = ['tensorprobe', *sys.argv[1:]]\n"
         "try:\n    main()\nexcept SystemExit:\n    pass\n"
         f"sys.stderr.write('PROBE ' + json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")


def fixtures(d: Path) -> None:
    import soundfile as sf
    import torch

    import tensorprobe as tp

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        def forward(self, x):
            return self.b(torch.relu(self.a(x + 0.01 * torch.randn_like(x))))

    torch.manual_seed(0)
    net, x = Net(), torch.ones(4, 16)
    tp.capture(net, x, level="op", keep="full", out=d / "ref")
    tp.capture(net, x, level="op", keep="full", out=d / "cand")
    t = np.arange(24000) / 24000
    sf.write(d / "a.wav", 0.3 * np.sin(2 * np.pi * 220 * t), 24000)
    sf.write(d / "b.wav", 0.3 * np.sin(2 * np.pi * 220 * t + 0.01), 24000)


def main() -> None:
    exe = Path(sys.executable).with_name("tensorprobe")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        fixtures(d)
        for args in COMMANDS:
            times = []
            for _ in range(7):
                t0 = time.perf_counter()
                subprocess.run([str(exe), *args], cwd=d, capture_output=True)
                times.append(time.perf_counter() - t0)
            probe = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=d, capture_output=True, text=True)
            loaded = json.loads(probe.stderr.rsplit("PROBE ", 1)[1])
            rows.append({"command": " ".join(args), "median_s": round(statistics.median(times), 3),
                         "min_s": round(min(times), 3), "loads": loaded})
            print(f"{rows[-1]['median_s']:6.2f} s  (min {rows[-1]['min_s']:.2f})  tensorprobe {' '.join(args):45s} "
                  f"loads: {', '.join(loaded) or '-'}")
    base = []
    for _ in range(7):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import numpy"], capture_output=True)
        base.append(time.perf_counter() - t0)
    print(f"{statistics.median(base):6.2f} s  python -c 'import numpy' (the floor of any command that reads a bundle)")
    out = Path(__file__).with_name("results") / "startup.json"
    out.write_text(json.dumps({"machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                                           "python": platform.python_version()},
                               "python_numpy_s": round(statistics.median(base), 3), "commands": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
