"""A sweep's findings are about the port: an audio check the reference's output fails too is a property of the
model (exit 0, named), a check the port fails alone is a finding with its reason (exit 1); an output that is
NaN on the candidate side only is total error and ranks worst; a script without a `__main__` guard is told so."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from tensorprobe.sweep import ResultStore, sweep

SWEEP_FILE = textwrap.dedent('''
    import copy
    import math
    import torch
    from tensorprobe.sweep import Sweep

    SR = 16000


    class Limiter(torch.nn.Module):
        """A small vocoder-like net with a hard limiter at its output: loud items clip in the model itself."""

        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv1d(1, 8, 5, padding=2)
            self.b = torch.nn.Conv1d(8, 1, 5, padding=2)

        def forward(self, x):
            return torch.clamp(self.b(torch.tanh(self.a(x))) + x, -1.0, 1.0)


    def checkpoint():
        """What training saved: the output conv under weight norm (its gain g is not the norm of v)."""
        g = torch.Generator().manual_seed(0)
        v = torch.randn(1, 8, 5, generator=g)
        return {"a.weight": torch.randn(8, 1, 5, generator=g) * 0.5, "a.bias": torch.zeros(8),
                "b.weight_v": v, "b.weight_g": 0.15 * v.norm(dim=(1, 2), keepdim=True), "b.bias": torch.zeros(1)}


    def limiter(fold=True):
        """The model from the checkpoint; fold=False is the converter bug that takes v for the weight."""
        state = checkpoint()
        v, g = state.pop("b.weight_v"), state.pop("b.weight_g")
        state["b.weight"] = g * v / v.norm(dim=(1, 2), keepdim=True) if fold else v
        model = Limiter()
        model.load_state_dict(state)
        return model.eval()


    def tone(i, gain=1.0):
        t = torch.arange(4000) / SR
        return (gain * 0.05 * 1.6 ** i * torch.sin(2 * math.pi * (220 + 40 * i) * t)).reshape(1, 1, -1)


    def tones(gain=1.0):
        return {f"tone{i}": (tone(i, gain),) for i in range(10)}


    def faithful():                     # the reference against its own ONNX export, run by ONNX Runtime
        return Sweep(limiter(), tones(), candidate="onnxruntime", sample_rate=SR)


    def faithful_louder():
        return Sweep(limiter(), tones(1.25), candidate="onnxruntime", sample_rate=SR)


    def misconverted():
        return Sweep(limiter(), tones(), candidate=limiter(fold=False), sample_rate=SR)


    class Normed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a = torch.nn.Conv1d(1, 8, 5, padding=2)
            self.norm = torch.nn.InstanceNorm1d(8, affine=True)
            self.b = torch.nn.Conv1d(8, 1, 5, padding=2)

        def forward(self, x):
            return self.b(torch.tanh(self.norm(self.a(x))))


    class Float16(torch.nn.Module):
        """The usual float16 conversion: the model in half precision, float32 in and out."""

        def __init__(self, model):
            super().__init__()
            self.model = copy.deepcopy(model).half()

        def forward(self, x):
            return self.model(x.half()).float()


    def levels():
        g = torch.Generator().manual_seed(3)
        # from 1e3 up the first conv's output passes float16's 65504: Inf, then NaN in the norm
        return {f"level{k}": (10.0 ** k * torch.randn(1, 1, 2000, generator=g),) for k in range(7)}


    def half_port():
        return Sweep(Normed().eval(), levels(), candidate=Float16(Normed().eval()), sample_rate=SR)
''')


@pytest.fixture(scope="module")
def sweep_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("port") / "port_findings.py"
    path.write_text(SWEEP_FILE)
    return path


def _cli(target, out, *args):
    p = subprocess.run([sys.executable, "-m", "tensorprobe", "sweep", target, "-o", str(out), "-j", "1", "--json",
                        *args], capture_output=True, text=True)
    return p.returncode, json.loads(p.stdout)


def _clipping_in_reference(target):
    from tensorprobe.sweep.spec import TargetSource

    import tensorprobe.audio as ta

    s = TargetSource.of(target).load()
    clipped = set()
    for name in s.names:
        out = s.reference(*s.inputs_of(name)).detach().numpy().squeeze()
        if ta.check(out, s.sample_rate).verdict("clipping").status == "error":
            clipped.add(name)
    return clipped


@pytest.mark.parametrize("factory", ["faithful", "faithful_louder"])
def test_a_faithful_port_whose_reference_clips_exits_0_and_names_the_model_property(sweep_file, tmp_path, factory):
    """ONNX Runtime running the reference's own export: the loud items clip in both, which is the model's
    limiter and not the port. A louder corpus keeps the truth (more items clip, still no finding)."""
    target = f"{sweep_file}:{factory}"
    code, doc = _cli(target, tmp_path / "out")
    clipped = _clipping_in_reference(target)
    assert clipped and len(clipped) < 10
    assert code == 0 and doc["status"] == "ok" and doc["sweep"]["findings"] == 0
    assert doc["sweep"]["model_properties"] == {"audio.clipping": len(clipped)}
    assert "Properties of the model, not findings" in doc["sweep"]["headline"]
    latest = ResultStore(tmp_path / "out").read()
    for name, r in latest.items():
        assert r["status"] == "done" and not r["finding"] and r["reasons"] == []
        shared = [p["code"] for p in r["model_properties"]]
        assert shared == (["audio.clipping"] if name in clipped else []), name
        if name in clipped:
            assert "the reference's output fails the same check" in r["model_properties"][0]["text"]
            assert r["audio"]["model_problems"] == ["clipping"] and r["audio"]["problems"] == []
    assert not list((tmp_path / "out" / "bundles").iterdir())      # nothing kept: no finding


def test_a_port_that_clips_where_the_reference_does_not_exits_1_with_the_reason(sweep_file, tmp_path):
    """The converter takes weight norm's v for the weight (twice too loud): items the reference plays clean
    clip in the port, and the summary says so; where the reference clips too, clipping stays the model's."""
    target = f"{sweep_file}:misconverted"
    code, doc = _cli(target, tmp_path / "out")
    clipped_ref = _clipping_in_reference(target)
    latest = ResultStore(tmp_path / "out").read()
    port_clips = {n for n, r in latest.items() if "audio.clipping" in [x["code"] for x in r["reasons"]]}
    assert code == 1 and doc["status"] == "finding"
    assert port_clips and not port_clips & clipped_ref
    for name, r in latest.items():
        assert r["finding"] and r["cause"] == "weights" and r["first_divergence"] == "b"
        codes = [x["code"] for x in r["reasons"]]
        assert codes[0] == "diverged"
        if name in clipped_ref:
            assert [p["code"] for p in r["model_properties"]] == ["audio.clipping"]
    why = doc["sweep"]["why"]
    assert why["diverged"] == 10 and why["audio.clipping"] == len(port_clips)
    headline = doc["sweep"]["headline"]
    assert "Findings: diverge from the reference (10 items)" in headline
    assert f"the candidate's audio fails clipping, the reference's passes ({len(port_clips)} items)" in headline
    clip = next(x["text"] for x in latest[sorted(port_clips)[0]]["reasons"] if x["code"] == "audio.clipping")
    assert "the reference's output passes" in clip


def test_nan_on_the_candidate_side_only_is_total_error_and_ranks_worst(sweep_file, tmp_path):
    """A float16 conversion: the loud items overflow to Inf and turn NaN in the norm; the reference is finite.
    Their output SNR is -inf (not a figure from the finite elements), they lead the worst list, and each
    says how many elements are non-finite on the candidate side."""
    import numpy as np

    from tensorprobe.sweep.spec import TargetSource

    target = f"{sweep_file}:half_port"
    summary = sweep(target, tmp_path / "out", workers=1)
    latest = ResultStore(tmp_path / "out").read()
    s = TargetSource.of(target).load()
    broken = {}
    for name in s.names:                                     # what the float16 model really does
        x = s.inputs_of(name)
        out = s.candidate(*x).detach().numpy()
        ref = s.reference(*x).detach().numpy()
        assert np.isfinite(ref).all()
        if not np.isfinite(out).all():
            broken[name] = int((~np.isfinite(out)).sum())
    assert broken and len(broken) < len(s.names)
    assert summary.finding and summary.why["nonfinite"] == len(broken)
    assert {w["item"] for w in summary.worst_snr[:len(broken)]} == set(broken)
    for name, n in broken.items():
        r = latest[name]
        assert r["output_snr_db"] == "-inf" and r["finding"]
        assert r["output_nonfinite"]["candidate_only"] == n
        assert f"non-finite on the candidate side: {n} elements" in " ".join(x["text"] for x in r["reasons"])
        assert r["audio"]["diff"] == "differs" and "non_finite" in r["audio"]["problems"]    # said, never raised
    for name in set(s.names) - set(broken):
        assert latest[name]["output_nonfinite"]["candidate_only"] == 0
        assert latest[name]["output_snr_db"] != "-inf"
    assert f"Worst output SNR: {summary.worst_snr[0]['item']} (-inf dB)" in summary.headline()


GUARD_SCRIPT = textwrap.dedent('''
    import tensorprobe as tp

    def run():
        summary = tp.sweep("{target}", "{out}", workers=1)
        print(summary.headline())

    {call}
''')


@pytest.mark.parametrize("guarded", [False, True])
def test_a_script_without_main_guard_is_told_what_is_missing(sweep_file, tmp_path, guarded):
    """Spawned workers run the main script again: unguarded, each would start the sweep anew and die, and
    every item would read "the worker process died". The call is refused before any worker starts."""
    out = tmp_path / "out"
    call = 'if __name__ == "__main__":\n        run()' if guarded else "run()"
    script = tmp_path / "my_sweep.py"
    script.write_text(GUARD_SCRIPT.format(target=f"{sweep_file}:faithful", out=out, call=call))
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600)
    if guarded:
        assert p.returncode == 0, p.stderr
        assert "10 of 10 items compared, 0 with a finding" in p.stdout
        return
    assert p.returncode != 0 and "worker process died" not in p.stderr + p.stdout
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("tensorprobe.errors.InputError: ")
    assert f"{script}:8 calls tp.sweep(...)" in last and 'if __name__ == "__main__":' in last
    assert not (out / "items.jsonl").exists()
