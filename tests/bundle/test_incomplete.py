"""No wrong or quiet answer from an incomplete run (issue 33 item 3).

A capture stopped by an error records that error as the bundle's reason (a full disk: the OS message), and
`show`, `nan`, `diff` and `sweep` repeat it; a capture into a directory that a live capture writes is refused
with one line (exit 2), and a killed capture does not leave the directory locked.

Disk full is made two ways: the writer's writes raise OSError(ENOSPC) (always), and a real 3 MB tmpfs in a
private mount namespace (`unshare -rm`, skipped where the kernel does not allow it).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from typer.testing import CliRunner

import tensorprobe.bundle.format as format_mod
import tensorprobe.bundle.writer as writer_mod
from tensorprobe import capture
from tensorprobe.capture import Capture
from tensorprobe.bundle import Bundle
from tensorprobe.bundle.lock import LOCK, holder
from tensorprobe.cli import app
from tensorprobe.errors import BundleError

runner = CliRunner()
ENOSPC = f"[Errno {errno.ENOSPC}] {os.strerror(errno.ENOSPC)}"    # "[Errno 28] No space left on device"


class ConvStack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Conv1d(16, 16, 3, padding=1),
                                                                torch.nn.Tanh()) for _ in range(6)])

    def forward(self, x):
        return self.layers(x)


class Recurrent(torch.nn.Module):     # a second architecture: a GRU and a head, as in a VAD
    def __init__(self):
        super().__init__()
        self.gru = torch.nn.GRU(16, 32, batch_first=True)
        self.head = torch.nn.Linear(32, 1)

    def forward(self, x):
        return torch.sigmoid(self.head(self.gru(x)[0]))


MODELS = {"conv": (ConvStack, (1, 16, 2000)), "gru": (Recurrent, (1, 200, 16))}


def _capture(model, x, out, shard_bytes):
    with Capture(model, level="op", keep="full", out=out, shard_bytes=shard_bytes) as cap:
        cap.run(x)
    return cap.bundle


def _model(kind):
    torch.manual_seed(0)
    cls, shape = MODELS[kind]
    return cls().eval(), torch.randn(*shape)


def _disk_full(monkeypatch, after: int = 0):
    """Every shard write after the first `after` raises ENOSPC, as a full disk does."""
    calls = {"n": 0}

    def full(*a, **k):
        calls["n"] += 1
        if calls["n"] > after:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_staged(*a, **k) if a and isinstance(a[0], writer_mod._StagedShard) else real_save(*a, **k)

    real_staged, real_save = writer_mod._StagedShard.write, writer_mod.safetensors.torch.save_file
    monkeypatch.setattr(writer_mod._StagedShard, "write", full)
    monkeypatch.setattr(writer_mod.safetensors.torch, "save_file", full)


def _text(res):
    return " ".join(res.output.split())


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_disk_full_is_the_bundle_reason_and_every_reader_repeats_it(kind, tmp_path, monkeypatch):
    model, x = _model(kind)
    ref = capture(model, x, level="op", keep="full", out=tmp_path / "ref")       # the disk has room here
    assert ref.complete
    _disk_full(monkeypatch)
    with pytest.raises(BundleError, match=r"No space left on device"):
        _capture(model, x, tmp_path / "full", shard_bytes=4096)
    monkeypatch.undo()
    b = Bundle.open(tmp_path / "full")
    assert not b.complete and ENOSPC in b.error["message"] and "killed" not in b.error["message"]
    assert ENOSPC in b.incomplete_note()
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "full").iterdir())   # its space was given back

    show = runner.invoke(app, ["show", str(tmp_path / "full")])
    assert show.exit_code == 0 and ENOSPC in _text(show) and "killed" not in _text(show)
    nan = runner.invoke(app, ["nan", str(tmp_path / "full")])
    assert ENOSPC in _text(nan) and "incomplete" in _text(nan)
    doc = json.loads(runner.invoke(app, ["nan", str(tmp_path / "full"), "--json"]).stdout)
    assert ENOSPC in json.dumps(doc)
    # diff: the first sentence says which side is incomplete, and why
    d = runner.invoke(app, ["diff", str(tmp_path / "ref"), str(tmp_path / "full")])
    first = _text(d).split(". ")[0]
    assert "candidate bundle is incomplete" in first and ENOSPC in first, first
    d = runner.invoke(app, ["diff", str(tmp_path / "full"), str(tmp_path / "ref")])
    first = _text(d).split(". ")[0]
    assert "reference bundle is incomplete" in first and ENOSPC in first, first
    # the truth kept: two complete bundles of the same model do not say "incomplete"
    capture(model, x, level="op", keep="full", out=tmp_path / "again")
    d = runner.invoke(app, ["diff", str(tmp_path / "ref"), str(tmp_path / "again")])
    assert d.exit_code == 0 and "incomplete" not in _text(d)


def test_a_failure_after_some_shards_keeps_them_and_names_the_error(tmp_path, monkeypatch):
    model, x = _model("conv")
    _disk_full(monkeypatch, after=2)
    with pytest.raises(BundleError, match="writing a tensor shard failed"):
        _capture(model, x, tmp_path / "b", shard_bytes=4096)
    monkeypatch.undo()
    b = Bundle.open(tmp_path / "b")
    assert ENOSPC in b.error["message"] and sum(1 for r in b if r.shard) > 0   # the first shards are readable
    assert all(b.numpy(r.name).size for r in b if r.shard)


def test_manifest_that_cannot_be_written_leaves_the_reason_in_the_lock_file(tmp_path, monkeypatch):
    """The disk is so full that the final manifest fails too: the reason goes into the bytes the lock file
    reserved at the start, and `Bundle.open` reads it from there instead of saying "killed"."""
    model, x = _model("gru")
    monkeypatch.setattr(writer_mod, "_JOURNAL_AFTER_S", 0.0)   # journal from the start, as a long capture does
    _disk_full(monkeypatch)

    def no_room(path, data, sync=True):
        if str(path).endswith("manifest.json") and b'"status": "running"' not in data:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, data, sync=sync)

    real = format_mod.atomic_write_bytes
    monkeypatch.setattr(writer_mod, "atomic_write_bytes", no_room)
    with pytest.raises(BundleError, match="No space left on device"):
        _capture(model, x, tmp_path / "b", shard_bytes=2048)
    monkeypatch.undo()
    assert (tmp_path / "b" / LOCK).exists() and not holder(tmp_path / "b")["live"]
    b = Bundle.open(tmp_path / "b")
    assert ENOSPC in b.error["message"] and "killed" not in b.error["message"]
    show = runner.invoke(app, ["show", str(tmp_path / "b")])
    assert ENOSPC in _text(show)
    capture(model, x, out=tmp_path / "b")            # the next capture replaces it, lock file included
    assert Bundle.open(tmp_path / "b").complete and not (tmp_path / "b" / LOCK).exists()


SLOW = textwrap.dedent('''
    import time, torch
    class Slow(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
        def forward(self, x):
            for _ in range(4000):
                x = torch.tanh(self.lin(x))
                time.sleep(0.01)
            return x
    def build():
        torch.manual_seed(0)
        return Slow(), (torch.randn(2, 8),)
    def quick():
        torch.manual_seed(0)
        return torch.nn.Linear(8, 8), (torch.randn(2, 8),)
''')


def _cli(*args):
    # the installed entry point's path (run_app): a library error is one line on stderr and exit 2
    return subprocess.run([sys.executable, "-m", "tensorprobe", *args], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "COLUMNS": "400"})


def _wait_live(path, proc, seconds=120):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        h = holder(path)
        if h and h.get("live"):
            return h
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.2)
    raise AssertionError("the first capture never started writing")


def test_second_capture_into_a_live_bundle_is_refused_and_a_killed_one_does_not_block(tmp_path):
    (tmp_path / "slow.py").write_text(SLOW)
    out = tmp_path / "b"
    first = subprocess.Popen([sys.executable, "-m", "tensorprobe", "capture", f"{tmp_path / 'slow.py'}:build",
                              "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        h = _wait_live(out, first)
        assert h["pid"] == first.pid
        t0 = time.monotonic()
        res = _cli("capture", f"{tmp_path / 'slow.py'}:quick", "-o", str(out))
        assert res.returncode == 2 and res.stdout == ""
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and f"another capture (pid {first.pid}" in lines[0], res.stderr
        print(f"refused in {time.monotonic() - t0:.1f} s (a process start included)")
        assert first.poll() is None                          # the first capture goes on, its files untouched
        live = runner.invoke(app, ["show", str(out)])
        assert "still running" in _text(live) and str(first.pid) in _text(live)
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(30)
    assert not holder(out)["live"]                          # the kernel dropped the lock with the process
    b = Bundle.open(out)
    assert not b.complete and "killed" in b.error["message"]
    res = _cli("capture", f"{tmp_path / 'slow.py'}:quick", "-o", str(out))
    assert res.returncode == 0, res.stderr
    b = Bundle.open(out)
    assert b.complete and not (out / LOCK).exists()


def test_two_writers_in_one_process_exclude_each_other(tmp_path):
    w = writer_mod.BundleWriter(tmp_path / "b")
    with pytest.raises(BundleError, match="another capture"):
        writer_mod.BundleWriter(tmp_path / "b")
    assert (tmp_path / "b" / LOCK).exists()                  # the refused writer touched nothing
    w.close()
    writer_mod.BundleWriter(tmp_path / "b").close()          # once closed, the directory is free


def _unshare_ok() -> bool:
    if not shutil.which("unshare") or sys.platform != "linux":
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


@pytest.mark.skipif(not _unshare_ok(), reason="needs unshare -rm and a tmpfs mount (a private mount namespace)")
def test_a_real_full_disk(tmp_path):
    """A 3 MB tmpfs: the capture fails with the OS message, exit 2, and show/nan repeat it."""
    (tmp_path / "conv.py").write_text(textwrap.dedent('''
        import torch
        def build():
            torch.manual_seed(0)
            m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Conv1d(64, 64, 3, padding=1), torch.nn.ReLU())
                                      for _ in range(8)])
            return m, (torch.randn(1, 64, 4000),)
    '''))
    tp = f"{sys.executable} -m tensorprobe"
    script = (f"mount -t tmpfs -o size=3m tmpfs /mnt && "
              f"{tp} capture {tmp_path / 'conv.py'}:build -o /mnt/b --level op --keep full; echo rc=$?; "
              f"{tp} show /mnt/b; {tp} nan /mnt/b; ls -a /mnt/b")
    out = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "COLUMNS": "400"})
    text = " ".join((out.stdout + out.stderr).split())
    assert "rc=2" in text, text
    assert text.count(ENOSPC) >= 3, text           # the capture's error, then show and nan repeat it
    assert "killed" not in text and ".tmp" not in text


SWEEP = textwrap.dedent('''
    import errno, multiprocessing, os, torch
    from tensorprobe.sweep import Sweep
    import tensorprobe.bundle.writer as w

    def _full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(8, 8)
        def forward(self, x):
            return torch.tanh(self.a(x))

    def build():
        if multiprocessing.parent_process() is not None:   # in the pool's workers only, not in the driver
            w._StagedShard.write = _full         # this worker's disk is full: every shard write fails
            w.safetensors.torch.save_file = _full
        torch.manual_seed(0)
        net = Net().eval()
        return Sweep(net, {f"item{i}": (torch.randn(2, 8),) for i in range(2)}, candidate=net)
''')


def test_sweep_says_why_its_items_failed(tmp_path):
    from tensorprobe.sweep import sweep

    (tmp_path / "full_sweep.py").write_text(SWEEP)
    # capture_all: no tier-1 pass (which compares outputs without a bundle), so every item writes one
    summary = sweep(f"{tmp_path / 'full_sweep.py'}:build", tmp_path / "out", workers=1, capture_all=True)
    assert summary.failed == 2 and summary.done == 0
    assert ENOSPC in summary.headline() and "failed to run" in summary.headline()
    assert all(ENOSPC in e["error"] for e in summary.errors)
    assert writer_mod._StagedShard.write is not None and capture(torch.nn.Linear(2, 2), torch.ones(1, 2),
                                                                 keep="full", out=tmp_path / "ok").complete
