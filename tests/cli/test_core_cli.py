"""The core commands as a user runs them: exit codes 0/1/2, one clear line on bad input, --json."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest


def run(*args, cwd=None):
    p = subprocess.run([sys.executable, "-m", "tensorprobe", *args], capture_output=True, text=True, cwd=cwd,
                       env={"COLUMNS": "160", "PATH": "/usr/bin:/bin", "HOME": "/tmp",
                            "PYTHONWARNINGS": "ignore"})
    return p.returncode, p.stdout, p.stderr


@pytest.fixture()
def target_file(tmp_path):
    f = tmp_path / "my_port.py"
    f.write_text(textwrap.dedent("""
        import torch

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = torch.nn.Linear(4, 4)
            def forward(self, x):
                return torch.log(self.lin(x))

        def clean():
            torch.manual_seed(0)
            return torch.nn.Linear(4, 4), (torch.randn(2, 4),)

        def broken():
            torch.manual_seed(0)
            return Net(), (torch.randn(8, 4),)

        def raises():
            raise ValueError("weights file not found")
    """))
    return f


def test_nan_exit_codes(target_file):
    code, out, err = run("nan", f"{target_file}:clean")
    assert code == 0 and "No NaN or Inf" in out
    code, out, err = run("nan", f"{target_file}:broken", "--json")
    assert code == 1
    doc = json.loads(out)
    assert doc["command"] == "nan" and doc["status"] == "finding"
    assert doc["origin"]["op"] == "aten.log.default" and doc["origin"]["module"] == ""
    assert any("log of" in d and "negative" in d for d in doc["origin"]["diagnosis"])


@pytest.mark.parametrize("target,message", [
    ("nope.py:build", "no such file"),
    ("tensorprobe.nonexistent:build", "can't import module"),
    ("missing_colon", "must look like"),
])
def test_bad_targets_exit_2_without_traceback(target, message):
    code, out, err = run("nan", target)
    assert code == 2 and message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2


def test_factory_that_raises(target_file):
    code, out, err = run("capture", f"{target_file}:raises", "-o", str(target_file.parent / "o"))
    assert code == 2 and "the factory raised ValueError: weights file not found" in err
    assert "Traceback" not in err


def test_capture_show_and_bundle_nan(target_file, tmp_path):
    code, out, err = run("capture", f"{target_file}:broken", "-o", str(tmp_path / "b"), "--level", "op", "--keep", "full")
    assert code == 0, err
    assert "records hold NaN/Inf" in out
    code, out, err = run("show", str(tmp_path / "b"), "--nonfinite", "--json")
    doc = json.loads(out)
    # the op where NaN is born, and the model's output it reaches
    assert code == 0 and [r["name"] for r in doc["records"]] == ["<root>/log.0", "output"]
    code, out, err = run("nan", str(tmp_path / "b"))
    assert code == 1 and "<root>/log.0" in out


def test_corrupt_bundle_exit_2(tmp_path):
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "manifest.json").write_text("{oops")
    code, out, err = run("show", str(tmp_path / "b"))
    assert code == 2 and "corrupt manifest" in err and "Traceback" not in err
    np.savez(tmp_path / "ok.npz", x=np.zeros(3, np.float32))
    (tmp_path / "trunc.npz").write_bytes((tmp_path / "ok.npz").read_bytes()[:40])
    code, out, err = run("nan", str(tmp_path / "trunc.npz"))
    assert code == 2 and "trunc.npz" in err


def test_usage_error_exit_2():
    code, out, err = run("capture")
    assert code == 2


@pytest.mark.slow
def test_demo_finds_origin(kokoro):
    code, out, err = run("demo", "--seconds", "1", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["origin"]["module"] == "generator.noise_res.0.adain1.0.norm"
    assert doc["reference"]["found"] is False


def test_a_bundle_cut_short_says_where_it_stops_in_nan_show_and_diff(tmp_path):
    (tmp_path / "net.py").write_text(textwrap.dedent("""
        import torch

        class Net(torch.nn.Module):
            def __init__(self, fail):
                super().__init__()
                self.a, self.b, self.c = (torch.nn.Linear(4, 4) for _ in range(3))
                self.fail = fail
            def forward(self, x):
                x = torch.relu(self.b(torch.relu(self.a(x))))
                if self.fail:
                    raise RuntimeError("CUDA out of memory")
                return self.c(x)

        def good():
            torch.manual_seed(0)
            return Net(False), (torch.ones(2, 4),)

        def cut():
            torch.manual_seed(0)
            return Net(True), (torch.ones(2, 4),)
    """))
    for name in ("good", "cut"):
        run("capture", f"net.py:{name}", "-o", name, "--level", "op", "--keep", "full", cwd=tmp_path)
    where = "its capture stopped after record 10, <root>/relu.1 (RuntimeError: CUDA out of memory)"

    code, out, _ = run("nan", "cut", "--json", cwd=tmp_path)
    doc = json.loads(out)
    assert code == 1 and doc["status"] == "incomplete" and not doc["origin"]["found"]   # not a clean run
    assert where in doc["origin"]["headline"] and "not checked" in doc["origin"]["headline"]
    code, out, _ = run("show", "cut", cwd=tmp_path)
    assert code == 0 and f"incomplete: {where}" in " ".join(out.split())
    code, out, _ = run("diff", "good", "cut", "--json", cwd=tmp_path)
    doc = json.loads(out)
    assert code == 1 and doc["report"]["verdict"] == "incomplete"      # everything compared matches: still not a pass
    assert doc["report"]["summary"].startswith(f"The candidate bundle is incomplete: {where}")
    assert run("diff", "good", "good", cwd=tmp_path)[0] == 0


def test_third_party_noise_is_silenced_unless_verbose(tmp_path):
    """Runtimes print loader failures and deprecation notices on import (torchao, torch's _pytree): users
    read them as breakage. Quiet by default; --verbose shows them."""
    (tmp_path / "noisy.py").write_text(textwrap.dedent("""
        import logging, warnings
        import torch

        warnings.warn("register_constant() on Enum subclasses is deprecated", DeprecationWarning)
        logging.getLogger("torchao").warning("Failed to load _C_mxfp8.so")
        logging.getLogger("torch.utils._pytree").warning("<enum 'KernelPreference'> is an Enum subclass")

        def build():
            return torch.nn.Linear(2, 2), (torch.ones(1, 2),)
    """))
    env = {"COLUMNS": "160", "PATH": "/usr/bin:/bin", "HOME": "/tmp"}   # no PYTHONWARNINGS: the CLI decides
    quiet = subprocess.run([sys.executable, "-m", "tensorprobe", "nan", "noisy.py:build"], capture_output=True,
                           text=True, cwd=tmp_path, env=env)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr
    loud = subprocess.run([sys.executable, "-m", "tensorprobe", "nan", "noisy.py:build", "--verbose"],
                          capture_output=True, text=True, cwd=tmp_path, env=env)
    assert loud.returncode == 0
    assert "Failed to load _C_mxfp8.so" in loud.stderr and "Enum subclass" in loud.stderr
