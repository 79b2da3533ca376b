"""Commands that read bundles and audio start without torch, and everything imports without the extras.

`show`, `diff` of bundles, `nan BUNDLE`, `audio check`, `audio diff` and `rng show/export` are run in CI
loops and by ports in other languages: they must not pay for (or need) torch. Start-up times are measured
in bench/bench_startup.py, not here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import soundfile as sf
import torch

import tensorprobe as tp

HEAVY = ("torch", "onnx", "onnxruntime", "tvm", "executorch", "mlx", "kokoro")

# Runs the CLI in-process, then reports which heavy packages got imported.
PROBE = textwrap.dedent("""
    import json, sys
    from tensorprobe.cli import main
    sys.argv = ["tensorprobe", *sys.argv[1:]]
    code = 0
    try:
        main()
    except SystemExit as e:
        code = e.code or 0
    sys.stderr.write("\\nPROBE " + json.dumps({"code": code, "heavy": [m for m in %r if m in sys.modules]}) + "\\n")
""" % (HEAVY,))


class _Noisy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.log(self.lin(x + torch.randn_like(x)))   # log of negatives: NaN; randn: a random record


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("startup")
    torch.manual_seed(0)
    model, x = _Noisy(), torch.ones(2, 4)
    tp.capture(model, x, level="op", keep="full", out=d / "ref")
    tp.capture(model, x, level="op", keep="full", out=d / "cand")
    t = np.arange(24000) / 24000
    sf.write(d / "a.wav", 0.3 * np.sin(2 * np.pi * 220 * t), 24000)
    sf.write(d / "b.wav", 0.3 * np.sin(2 * np.pi * 220 * t + 0.01), 24000)
    np.savez(d / "dump.npz", lin=np.ones((2, 4), np.float32))
    return d


@pytest.mark.parametrize("args,code", [
    (["--help"], 0),
    (["show", "ref"], 0),
    (["show", "dump.npz"], 0),
    (["diff", "ref", "cand"], 1),          # the random draws differ: a finding
    (["nan", "ref"], 1),                   # log of negative values
    (["audio", "check", "a.wav"], 0),
    (["audio", "diff", "a.wav", "b.wav"], 0),
    (["rng", "show", "ref"], 0),
    (["rng", "export", "ref", "-o", "noise.safetensors"], 0),
])
def test_reading_commands_do_not_import_torch(files, args, code):
    p = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=files)
    probe = json.loads(p.stderr.rsplit("PROBE ", 1)[1])
    assert probe["code"] == code, p.stderr[-2000:]
    assert probe["heavy"] == [], f"{' '.join(args)} imported {probe['heavy']}"


def test_rng_export_without_torch_writes_the_recorded_noise(files):
    from safetensors.numpy import load_file

    subprocess.run([sys.executable, "-c", PROBE, "rng", "export", "ref", "-o", "n2.safetensors"], check=True,
                   capture_output=True, cwd=files)
    noise = load_file(str(files / "n2.safetensors"))
    ref = tp.open_bundle(files / "ref")
    (name,) = [r.name for r in ref if r.kind == "rng"]
    np.testing.assert_array_equal(noise[name], ref.numpy(name))


NO_EXTRAS = textwrap.dedent("""
    import importlib, pkgutil, sys
    BLOCKED = {"onnx", "onnxruntime", "onnxscript", "tvm", "executorch", "mlx", "kokoro", "misaki", "torchao",
               "lightning", "pytorch_lightning", "transformers"}
    # integrations with a framework (the trainers' callbacks) need it; without it they say which extra to install
    NEEDS_FRAMEWORK = {"tensorprobe.train.lightning": "[train]", "tensorprobe.train.hf": "[train]"}

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is not installed (blocked by the test)")
            return None

    sys.meta_path.insert(0, Block())
    import tensorprobe
    from typer.main import get_command
    from typer.testing import CliRunner
    failed = []
    for m in pkgutil.walk_packages(tensorprobe.__path__, "tensorprobe."):
        if not m.name.endswith("__main__"):
            try:
                importlib.import_module(m.name)
            except Exception as e:
                if m.name not in NEEDS_FRAMEWORK or NEEDS_FRAMEWORK[m.name] not in str(e):
                    failed.append(f"import {m.name}: {e!r}")
    from tensorprobe.cli import app
    root = get_command(app)
    paths = [[]]
    for name, cmd in root.commands.items():
        paths.append([name])
        paths += [[name, sub] for sub in getattr(cmd, "commands", {})]
    for path in paths:
        res = CliRunner().invoke(app, [*path, "--help"])
        if res.exit_code != 0 or "Usage" not in res.output:
            failed.append(f"{' '.join(path)} --help: exit {res.exit_code}: {res.output[-300:]}")
    print(len(paths), "help pages")
    print("\\n".join(failed))
    sys.exit(1 if failed else 0)
""")


def test_every_module_imports_and_every_help_runs_without_the_runtime_extras():
    p = subprocess.run([sys.executable, "-c", NO_EXTRAS], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr[-3000:]
    assert int(p.stdout.split()[0]) >= 14        # every command and sub-command


def test_help_shows_the_defaults_the_library_uses():
    from tensorprobe.audio import DiffThresholds

    p = subprocess.run([sys.executable, "-m", "tensorprobe", "audio", "diff", "--help"], capture_output=True,
                       text=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    text = " ".join(p.stdout.split())
    assert f"(default {DiffThresholds.wave_corr})" in text and f"(default {DiffThresholds.mel_mean_db})" in text
