"""Sweep tiers, the shared export cache and resuming after a kill: a passing item runs plainly and keeps
nothing; a failing one is captured; the ONNX export is made once and reused by a rerun; a killed sweep
resumes with only its unfinished items."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tensorprobe.sweep import ResultStore, sweep
from tensorprobe.sweep.tiers import TIER1_REL_MAX
from tests.sweep.test_sweep import SWEEP_FILE

EXTRA = textwrap.dedent('''
    import time

    class Slow(Net):
        def forward(self, x):
            time.sleep(float(os.environ.get("SWEEP_ITEM_SLEEP", "0")))
            return super().forward(x)

    def quiet_items():
        return {n: v for n, v in items().items() if n != "killer"}

    def port_only():
        return Sweep(Net().eval(), quiet_items(), candidate=Port().eval())

    def slow():
        return Sweep(Slow().eval(), quiet_items(), candidate=Slow().eval())
''')
N_ITEMS = 12


@pytest.fixture()
def sweep_file(tmp_path):
    path = tmp_path / "tier_sweep.py"
    path.write_text(SWEEP_FILE + EXTRA)
    return str(path)


def test_passing_items_run_plainly_and_keep_nothing_failing_ones_are_captured(sweep_file, tmp_path):
    out = tmp_path / "port"
    summary = sweep(f"{sweep_file}:port_only", out, workers=1)
    latest = ResultStore(out).read()
    loud = {n for n, r in latest.items() if r.get("finding")}
    assert loud and loud != set(latest)
    for name, rec in latest.items():
        if name in loud:          # tier 1 sent it on: captured, diffed, kept statistics-only
            assert rec["tier"] == 2 and "relative error" in rec["tier1"] and rec["verdict"] == "diverged"
            assert rec["bundle"] and (out / "bundles" / name).is_dir()
        else:                     # settled by the plain run: no capture, no bundle
            assert rec["tier"] == 1 and rec["verdict"] == "match" and rec["bundle"] is None
            assert rec["output_snr_db"] == "inf" or rec["output_snr_db"] > 60    # "inf": the same bits
    assert {p.name for p in (out / "bundles").iterdir()} == loud
    assert summary.findings == len(loud)


def test_capture_all_gives_the_same_findings_as_the_tiers(sweep_file, tmp_path):
    tiered = sweep(f"{sweep_file}:port_only", tmp_path / "tiered", workers=1)
    every = sweep(f"{sweep_file}:port_only", tmp_path / "every", workers=1, capture_all=True)
    latest = ResultStore(tmp_path / "every").read()
    assert all(r["tier"] == 2 for r in latest.values())
    assert every.findings == tiered.findings and every.why == tiered.why


def test_onnx_export_made_once_and_reused_by_a_rerun_with_a_sample_of_passing_items(sweep_file, tmp_path):
    out = tmp_path / "onnx"
    sweep(f"{sweep_file}:plain", out, workers=1, limit=3)
    prepared = [p for p in (out / "prepared").iterdir() if p.is_dir()]
    assert len(prepared) == 1 and (prepared[0] / "model.onnx").is_file()
    stamp = (prepared[0] / "model.onnx").stat()
    first = ResultStore(out).read()
    assert sum(1 for r in first.values() if r.get("exported")) == 1     # one export, by the first item
    summary = sweep(f"{sweep_file}:plain", out, workers=2, sample_passing=2)   # a rerun: the 9 items left
    latest = ResultStore(out).read()
    again = stamp.st_ino, stamp.st_mtime_ns
    now = (prepared[0] / "model.onnx").stat()
    assert (now.st_ino, now.st_mtime_ns) == again                      # not exported again
    assert not any(latest[n].get("exported") for n in set(latest) - set(first))
    assert [p for p in (out / "prepared").iterdir() if p.is_dir()] == prepared
    sampled = {n for n, r in latest.items() if r.get("tier1") == "sampled"}
    assert len(sampled) == 2 and all(latest[n]["tier"] == 2 for n in sampled)
    assert summary.done == N_ITEMS and summary.findings == 0           # a faithful export: nothing found
    assert all(r["tier"] == 1 for n, r in latest.items() if n not in sampled)


def test_a_killed_sweep_resumes_with_only_its_unfinished_items(sweep_file, tmp_path):
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "tensorprobe", "sweep", f"{sweep_file}:slow", "-o", str(out), "-j", "1", "--json"]
    env = {**os.environ, "SWEEP_ITEM_SLEEP": "0.4"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    items = out / "items.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if items.exists() and len(items.read_text().splitlines()) >= 3:
            break
        time.sleep(0.1)
    assert proc.poll() is None, "the sweep ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)          # the driver and its worker, as a kill -9 of the job would
    proc.wait()
    before = [json.loads(line)["item"] for line in items.read_text().splitlines() if line.strip()]
    assert 3 <= len(before) < N_ITEMS
    done = subprocess.run(cmd, env={**env, "SWEEP_ITEM_SLEEP": "0"}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in items.read_text().splitlines() if line.strip().startswith("{")]
    names = [r["item"] for r in lines]
    assert sorted(set(names)) == [f"item{i:02d}" for i in range(N_ITEMS)]
    assert len(names) == N_ITEMS and names[:len(before)] == before      # nothing done before ran again
    assert json.loads(done.stdout)["sweep"]["done"] == N_ITEMS


def test_the_workers_die_with_a_killed_driver(sweep_file, tmp_path):
    """kill -9 of the driver alone (not its process group): its pool workers end too, within seconds (they ran
    on for minutes), so a rerun does not share the cores with orphans."""
    psutil = pytest.importorskip("psutil")
    out = tmp_path / "orphans"
    cmd = [sys.executable, "-m", "tensorprobe", "sweep", f"{sweep_file}:slow", "-o", str(out), "-j", "2", "--json"]
    proc = subprocess.Popen(cmd, env={**os.environ, "SWEEP_ITEM_SLEEP": "0.4"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    items = out / "items.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if items.exists() and len(items.read_text().splitlines()) >= 2:
            break
        time.sleep(0.1)
    children = psutil.Process(proc.pid).children(recursive=True)
    assert proc.poll() is None and children, "the sweep ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    gone, alive = psutil.wait_procs(children, timeout=15)
    for p in alive:                      # leave nothing behind whatever the outcome
        p.kill()
    assert not alive, [p.cmdline()[-3:] for p in alive]


CLICK_SWEEP = textwrap.dedent('''
    import math
    import torch
    from tensorprobe.sweep import Sweep

    SR = 16000

    class Gain(torch.nn.Module):
        """A 'vocoder' that passes its input through a 1x1 convolution (gain 1)."""
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(1, 1, 1, bias=False)
            torch.nn.init.ones_(self.conv.weight)

        def forward(self, x):
            return self.conv(x)

    class Clicks(Gain):
        """The port: the same, plus a 5e-3 click in the silent gap of the items marked by a flag sample."""
        def forward(self, x):
            y = super().forward(x)
            flagged = (x[..., -1] != 0).float()[..., None]
            click = torch.zeros_like(y)
            click[..., 8500] = 5e-3
            return y + flagged * click

    def inputs(name):
        t = torch.arange(SR) / SR
        x = 0.5 * torch.sin(2 * math.pi * 220 * t)
        x[8000:9600] = 0                          # a silent gap, where a click is heard
        x[-1] = 1e-7 if name.startswith("click") else 0.0
        return (x[None, None],)

    def build():
        names = ["clean-0", "clean-1", "click-0", "clean-2", "click-1"]
        return Sweep(Gain().eval(), names, candidate=Clicks().eval(), inputs=inputs, sample_rate=SR)
''')


def test_a_click_within_float32_rounding_overall_is_sent_to_tier_2_by_the_block_it_sits_in(tmp_path):
    """A 5e-3 click in a silent gap is 1e-4 of the signal's energy: the whole output's relative error lets it
    through, the 64-sample block it sits in does not. The clean items are settled at tier 1 with the audio
    diff verdict (identical: no sample differs), the clicked ones are captured and are findings, their audio
    diff saying so."""
    (tmp_path / "clicks.py").write_text(CLICK_SWEEP)
    summary = sweep(f"{tmp_path / 'clicks.py'}:build", tmp_path / "out", workers=1)
    latest = ResultStore(tmp_path / "out").read()
    for name, rec in latest.items():
        if name.startswith("clean"):
            assert rec["tier"] == 1 and not rec["finding"]
            assert rec["audio"]["diff"] == "identical" and "16-bit PCM step" in rec["audio"]["diff_by"]
        else:
            assert rec["tier"] == 2 and "from index" in rec["tier1"] and "whole output" in rec["tier1"], rec
            assert rec["finding"] and rec["audio"]["diff"] == "differs", rec
    assert summary.findings == 2 and summary.audio == {"identical": 3, "differs": 2}


@pytest.mark.parametrize("runtime", ["executorch", "tvm"])
def test_executorch_and_tvm_programs_are_made_once_and_shared_by_workers_and_reruns(sweep_file, tmp_path, runtime):
    """The program (`.pte` with its tap names and run facts; TVM's `.so` with its tap names) is made by one
    worker into RESULTS/prepared and loaded by the other worker and by a rerun; the faithful lowering is 0
    findings whichever process made it."""
    pytest.importorskip(runtime)
    out = tmp_path / runtime
    sweep(f"{sweep_file}:plain", out, runtime=runtime, workers=2, limit=4)
    prepared = [p for p in (out / "prepared").iterdir() if p.is_dir()]
    name = {"executorch": "model.pte", "tvm": "model.so"}[runtime]
    assert len(prepared) == 1 and (prepared[0] / name).is_file()
    first = ResultStore(out).read()
    assert sum(1 for r in first.values() if r.get("exported")) == 1      # one worker made it, the other loaded it
    stamp = (prepared[0] / name).stat()
    summary = sweep(f"{sweep_file}:plain", out, runtime=runtime, workers=1, sample_passing=2)   # the rerun
    latest = ResultStore(out).read()
    now = (prepared[0] / name).stat()
    assert (now.st_ino, now.st_mtime_ns) == (stamp.st_ino, stamp.st_mtime_ns)
    assert not any(latest[n].get("exported") for n in set(latest) - set(first))
    sampled = [r for r in latest.values() if r.get("tier1") == "sampled"]
    assert len(sampled) == 2 and all(r["verdict"] == "match" for r in sampled)    # captured from the loaded file
    assert summary.done == N_ITEMS and summary.findings == 0


LENGTHS_SWEEP = textwrap.dedent('''
    import torch
    from tensorprobe.sweep import Sweep

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a = torch.nn.Conv1d(4, 8, 3, padding=1)
            self.n = torch.nn.InstanceNorm1d(8, affine=True)
            self.b = torch.nn.Conv1d(8, 1, 3, padding=1)

        def forward(self, x):
            return self.b(torch.tanh(self.n(self.a(x))))

    class Branchy(Net):
        """Its code branches on the length: the export fixes the length, so no one file runs them all."""
        def forward(self, x):
            y = super().forward(x)
            return y * 0.5 if x.shape[-1] > 250 else y

    def inputs(name):
        i = int(name[-2:])
        return (torch.randn(1, 4, 100 + 37 * i, generator=torch.Generator().manual_seed(i)),)

    def build():
        return Sweep(Net().eval(), [f"len{i:02d}" for i in range(6)], inputs=inputs)

    def branchy():
        return Sweep(Branchy().eval(), [f"len{i:02d}" for i in range(6)], inputs=inputs)

    class Recurrent(torch.nn.Module):
        """A GRU over time after a transpose: torch.export unrolls it, fixing the length."""
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.gru = torch.nn.GRU(4, 8, batch_first=True)
            self.out = torch.nn.Linear(8, 1)

        def forward(self, x):
            h, _ = self.gru(x.transpose(1, 2))
            return self.out(h)

    def recurrent():
        return Sweep(Recurrent().eval(), [f"len{i:02d}" for i in range(4)], inputs=inputs)
''')


def inputs_length(name: str) -> int:
    return 100 + 37 * int(name[-2:])


def test_items_of_varying_length_share_one_dynamic_export_where_the_model_allows(tmp_path):
    """Six lengths: the first is exported for its shape, the second length makes one ONNX export with a
    symbolic length that serves the plain runs of the rest (was six exports). A model
    whose code branches on the length gets an export with the length fixed: the other lengths are exported
    one by one, and every item is still judged right (a faithful export: 0 findings either way)."""
    pytest.importorskip("onnxruntime")
    (tmp_path / "lengths.py").write_text(LENGTHS_SWEEP)
    out = tmp_path / "one"
    summary = sweep(f"{tmp_path / 'lengths.py'}:build", out, workers=1)
    latest = ResultStore(out).read()
    assert summary.done == 6 and summary.findings == 0
    assert all(r["tier"] == 1 for r in latest.values())
    assert [n for n, r in latest.items() if r["tier1_export"] != "dynamic shapes"] == ["len00"]
    assert sorted(p.name[:4] != "dyn-" for p in (out / "prepared").iterdir() if p.is_dir()) == [False, True]
    out = tmp_path / "branchy"
    summary = sweep(f"{tmp_path / 'lengths.py'}:branchy", out, workers=1)
    latest = ResultStore(out).read()
    assert summary.done == 6 and summary.findings == 0 and all(r["tier"] == 1 for r in latest.values())
    per_shape = [n for n, r in latest.items() if r["tier1_export"] == "this shape" and n != "len00"]
    assert 0 < len(per_shape) < 6          # the lengths beyond the export's guard (length <= 250)
    assert all("outside [" in latest[n]["tier1_export_why"] for n in per_shape)
    assert all(inputs_length(n) > 250 for n in per_shape)
    assert len([p for p in (out / "prepared").iterdir() if p.is_dir()]) == 1 + len(per_shape) + 1   # + len00's


@pytest.mark.parametrize("exporter", ["dynamo", "legacy"])
def test_a_recurrent_model_of_varying_length_says_why_dynamo_exports_each_length_and_legacy_shares_one(
        tmp_path, exporter):
    """torch.export unrolls a GRU over time, so the dynamo export with a symbolic length comes back fixed at
    the length it saw: each later length is exported on its own, and the item says so and names the way out.
    The legacy exporter keeps one ONNX GRU with every dimension symbolic: one file serves every later length.
    A faithful export either way: every item matches at tier 1."""
    pytest.importorskip("onnxruntime")
    (tmp_path / "lengths.py").write_text(LENGTHS_SWEEP)
    out = tmp_path / exporter
    summary = sweep(f"{tmp_path / 'lengths.py'}:recurrent", out, workers=1, options={"exporter": exporter})
    latest = ResultStore(out).read()
    assert summary.done == 4 and summary.findings == 0 and all(r["tier"] == 1 for r in latest.values())
    later = [latest[f"len{i:02d}"] for i in (2, 3)]
    if exporter == "legacy":
        assert all(r["tier1_export"] == "dynamic shapes" and "exported" not in r for r in later), later
    else:
        assert all(r["tier1_export"] == "this shape" and "the dynamo export fixed it at" in r["tier1_export_why"]
                   and "-O exporter=legacy" in r["tier1_export_why"] for r in later), later


def test_results_of_another_sweep_an_empty_sweep_and_a_wrong_candidate_are_refused(sweep_file, tmp_path):
    """A rerun into RESULTS must be the same sweep (its old lines would be read as this one's); a Sweep with
    no items checks nothing; a --cand factory that returns no module is said once, by the driver."""
    from tensorprobe.errors import InputError, TargetError

    out = tmp_path / "r"
    sweep(f"{sweep_file}:plain", out, workers=1, limit=2)
    sweep(f"{sweep_file}:plain", out, workers=1, limit=1)                   # the same sweep resumes
    with pytest.raises(InputError, match="holds the results of another sweep .*cand was None"):
        sweep(f"{sweep_file}:plain", out, workers=1, cand=f"{sweep_file}:port")
    assert len(ResultStore(out).read()) == 3                               # nothing was run or written
    (tmp_path / "empty.py").write_text(SWEEP_FILE + "\ndef empty():\n    return Sweep(Net().eval(), {})\n")
    with pytest.raises(InputError, match="no items"):
        sweep(f"{tmp_path / 'empty.py'}:empty", tmp_path / "e", workers=1)
    (tmp_path / "wrong.py").write_text(SWEEP_FILE + "\ndef tensor():\n    return torch.zeros(3)\n")
    with pytest.raises(TargetError, match="must return a torch.nn.Module"):
        sweep(f"{sweep_file}:plain", tmp_path / "w", workers=1, cand=f"{tmp_path / 'wrong.py'}:tensor")


LATE_FRAMES_SWEEP = textwrap.dedent('''
    import torch
    from torch import nn
    from tensorprobe.sweep import Sweep

    class Smooth(nn.Module):
        """Causal running mean over time of a (1, C, T) value; `table` frames of divisors, then the last again."""
        def __init__(self, table=None):
            super().__init__(); self.table = table
        def forward(self, h):
            n = torch.arange(1, h.shape[-1] + 1, dtype=h.dtype)
            return h.cumsum(-1) / (n if self.table is None else n.clamp(max=self.table))

    class Net(nn.Module):
        def __init__(self, table=None, split=False):
            super().__init__(); torch.manual_seed(3)
            self.pre, self.smooth, self.post = nn.Conv1d(16, 24, 3, padding=1), Smooth(table), nn.Conv1d(48, 16, 1)
            self.split = split
        def forward(self, x):
            h = torch.tanh(self.pre(x))
            z = torch.cat([h, self.smooth(h)], 1)
            if self.split:            # the same sum in two halves: float32 rounding, nothing more
                w, b = self.post.weight, self.post.bias
                return (nn.functional.conv1d(z[:, :24], w[:, :24]) + nn.functional.conv1d(z[:, 24:], w[:, 24:])
                        + b[None, :, None])
            return self.post(z)

    def make(name):
        t = int(name[1:])
        return (torch.randn(1, 16, t, generator=torch.Generator().manual_seed(t)),)

    NAMES = ["t150", "t300", "t301", "t303", "t320"]

    def faithful():
        return Sweep(Net().eval(), NAMES, inputs=make, candidate=Net(split=True).eval())

    def table_port():
        return Sweep(Net().eval(), NAMES, inputs=make, candidate=Net(table=300).eval())
''')


@pytest.mark.parametrize("factory", ["faithful", "table_port"])
def test_an_error_in_a_few_late_frames_is_not_diluted_by_the_frames_that_agree(tmp_path, factory):
    """A port whose divisor table ends at 300 frames differs only in the frames past 300: in an item of 301
    frames that is 1 frame in 301, below float32 rounding over the whole output, yet a real divergence at
    `smooth`. Tier 1 judges each frame (and channel) too, so those items are captured and found; a faithful
    port that only sums in another order stays at tier 1 at every length."""
    (tmp_path / "late.py").write_text(LATE_FRAMES_SWEEP)
    summary = sweep(f"{tmp_path / 'late.py'}:{factory}", tmp_path / "out", workers=1)
    latest = ResultStore(tmp_path / "out").read()
    if factory == "faithful":
        assert {n: r["tier"] for n, r in latest.items()} == {n: 1 for n in latest} and summary.findings == 0
        return
    bitten = {n for n in latest if int(n[1:]) > 300}
    assert {n for n, r in latest.items() if r["finding"]} == bitten
    for name in bitten:
        rec = latest[name]
        assert rec["tier"] == 2 and "relative error" in rec["tier1"] and rec["first_divergence"] == "smooth", rec
    whole = float(latest["t301"]["tier1"].rpartition("whole output ")[2].rstrip(")"))
    assert "from index 300 of axis 2" in latest["t301"]["tier1"] and whole < TIER1_REL_MAX   # diluted overall
