"""`tensorprobe sweep` on a local pool, Dask and Ray: the right items found, a killed worker survived, a rerun
resumed; and the shipped decoder swept against ONNX Runtime."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from tensorprobe.sweep import ResultStore, sweep
from tensorprobe.sweep.spec import TargetSource

SWEEP_FILE = textwrap.dedent('''
    import os
    import torch
    from tensorprobe.sweep import Sweep

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a = torch.nn.Conv1d(4, 8, 3, padding=1)
            self.b = torch.nn.Conv1d(8, 1, 3, padding=1)

        def forward(self, x):
            return self.b(torch.tanh(self.a(x)))

    class Port(Net):
        """Rounds the hidden layer to float16 on loud inputs only; dies on a marked one."""

        def forward(self, x):
            if float(x[0, 0, 0]) == 999.0:
                os._exit(3)
            y = torch.tanh(self.a(x))
            return self.b(y.half().float() if float(x.abs().max()) > 4.0 else y)

    def items():
        g = torch.Generator().manual_seed(1)
        out = {f"item{i:02d}": (torch.randn(1, 4, 200, generator=g) * (0.5 + i / 8),) for i in range(12)}
        killer = torch.zeros(1, 4, 200)
        killer[0, 0, 0] = 999.0
        out["killer"] = (killer,)
        return out

    def build():
        return Sweep(Net().eval(), items(), candidate=Port().eval())

    def plain():
        return Sweep(Net().eval(), {n: v for n, v in items().items() if n != "killer"})

    def port():
        return Port()
''')


@pytest.fixture()
def target(tmp_path):
    (tmp_path / "port_sweep.py").write_text(SWEEP_FILE)
    return f"{tmp_path / 'port_sweep.py'}:build"


def _loud(target):
    sweep_ = TargetSource.of(target).load()
    return {n for n in sweep_.names if n != "killer" and float(sweep_.inputs_of(n)[0].abs().max()) > 4.0}


def _check(summary, store, loud):
    latest = store.read()
    assert latest["killer"]["status"] == "failed" and "worker process died" in latest["killer"]["error"]
    assert summary.done == 12 and summary.failed == 1 and 0 < len(loud) < 12
    assert {n for n, r in latest.items() if r.get("finding")} == loud         # exactly the loud items diverge
    assert summary.first_divergence == [("b", len(loud))]                      # at the layer after the rounding
    assert summary.worst_snr[0]["item"] in loud and summary.worst_snr[0]["verdict"] == "diverged"
    assert {p.name for p in store.bundles.iterdir()} == loud                    # bundles kept for failing items only
    return latest


def test_local_pool_finds_the_diverging_items_survives_a_killed_worker_and_resumes(target, tmp_path):
    out = tmp_path / "results"
    summary = sweep(target, out, workers=2)
    store = ResultStore(out)
    latest = _check(summary, store, _loud(target))
    assert latest["killer"]["attempts"] == 2
    lines = store.path.read_text().splitlines()
    assert len(lines) == 13
    with open(store.path, "a") as f:
        f.write('{"item": "item0')                    # a run that died mid-line
    again = sweep(target, out, workers=2)              # resumes: only the failed item runs again
    assert len(store.path.read_text().splitlines()) == 15 and again.done == 12
    assert (out / "summary.json").exists() and "item00" in (out / "report.html").read_text()
    from tests.report.test_diff_html import _chromium, _headless

    if _chromium():                                    # the page's shared table script runs in a real browser
        dom = _headless((out / "report.html").resolve().as_uri(), "--dump-dom").stdout
        assert "13 of 13 items shown" in dom


def test_dask_local_cluster_gives_the_same_items(target, tmp_path):
    pytest.importorskip("distributed")
    out = tmp_path / "dask"
    _check(sweep(target, out, workers=2, engine="dask"), ResultStore(out), _loud(target))


def test_ray_local_cluster_gives_the_same_items(target, tmp_path):
    pytest.importorskip("ray")
    out = tmp_path / "ray"
    _check(sweep(target, out, workers=2, engine="ray"), ResultStore(out), _loud(target))


def test_cli_json_exit_codes_and_bad_input(target, tmp_path):
    out = tmp_path / "cli"
    p = subprocess.run([sys.executable, "-m", "tensorprobe", "sweep", target, "-o", str(out), "-j", "1", "--json",
                        "--limit", "3"], capture_output=True, text=True)
    doc = json.loads(p.stdout)
    assert p.returncode in (0, 1) and doc["command"] == "sweep" and doc["sweep"]["items"] == 3
    assert (p.returncode == 1) == doc["sweep"]["finding"]
    for args, says in [(["--engine", "spark"], "unknown engine 'spark'"),
                       (["--runtime", "nosuch"], "nosuch")]:
        bad = subprocess.run([sys.executable, "-m", "tensorprobe", "sweep", target.replace("build", "build"), "-o",
                              str(tmp_path / "bad"), *args], capture_output=True, text=True)
        assert bad.returncode == 2 and says in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    missing = subprocess.run([sys.executable, "-m", "tensorprobe", "sweep", "/nope/x.py:build", "-o",
                              str(tmp_path / "bad")], capture_output=True, text=True)
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_cand_factory_replaces_the_sweeps_candidate(target, tmp_path):
    out = tmp_path / "cand"
    file = target.rpartition(":")[0]
    summary = sweep(f"{file}:plain", out, cand=f"{file}:port", workers=1)
    loud = _loud(target)
    latest = ResultStore(out).read()
    assert summary.done == 12 and {n for n, r in latest.items() if r["finding"]} == loud
    assert summary.first_divergence == [("b", len(loud))]


def _export(model_file, path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("port_sweep_mod", model_file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.onnx.export(mod.Net().eval(), (torch.zeros(1, 4, 200),), str(path), dynamo=False,
                      input_names=["x"], output_names=["y"])


def test_cand_artifact_an_exact_onnx_export_matches_and_its_int8_quantization_is_judged_by_its_outputs(
        target, tmp_path, monkeypatch):
    """Three real ports of the same model as files: the float export matches on every item; ONNX Runtime's own
    int8 quantization (quantize_dynamic of the convolutions) matches by its outputs on every item (its records
    carry int8's error from conv a on, by design; its output stays above 20 dB); the same int8 file with conv a's
    weight scale doubled diverges on every item at a, by its weights. The workers' scratch files are gone."""
    pytest.importorskip("onnxruntime")
    import onnx
    from onnx import numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    monkeypatch.setattr("tempfile.tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    file = target.rpartition(":")[0]
    exact, int8, wrong = tmp_path / "net.onnx", tmp_path / "net.int8.onnx", tmp_path / "net.int8.wrong.onnx"
    _export(file, exact)
    quantize_dynamic(str(exact), str(int8), op_types_to_quantize=["Conv"], weight_type=QuantType.QUInt8)
    same = sweep(f"{file}:plain", tmp_path / "exact", cand=str(exact), workers=2)
    assert same.done == 12 and same.verdicts.get("match") == 12 and not same.finding
    q = sweep(f"{file}:plain", tmp_path / "int8", cand=str(int8), workers=2)
    latest = ResultStore(tmp_path / "int8").read()
    assert q.done == 12 and q.verdicts.get("match") == 12 and not q.finding, q.verdicts
    assert all(20 <= r["output_snr_db"] < 45 for r in latest.values()), [r["output_snr_db"] for r in latest.values()]
    model = onnx.load(str(int8))
    scale = next(i for i in model.graph.initializer if i.name.startswith("a.") and i.name.endswith("weight_scale"))
    scale.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(scale) * 2, scale.name))
    onnx.save(model, str(wrong))
    bad = sweep(f"{file}:plain", tmp_path / "wrong", cand=str(wrong), workers=2)
    latest = ResultStore(tmp_path / "wrong").read()
    assert bad.done == 12 and bad.finding and all(r["verdict"] == "diverged" for r in latest.values())
    assert bad.first_divergence == [("a", 12)] and {r["cause"] for r in latest.values()} == {"weights"}
    assert list((tmp_path / "tmp").iterdir()) == []


def test_cand_bad_input_is_a_clear_error(target, tmp_path):
    file = target.rpartition(":")[0]
    for args, says in [(["--cand", str(tmp_path / "missing.onnx")], "no such artifact file"),
                       (["--cand", f"{file}:port", "--runtime", "onnxruntime"], "--runtime does not apply"),
                       (["--cand", str(tmp_path / "w.bin")], "no runtime opens .bin files")]:
        (tmp_path / "w.bin").write_bytes(b"x")
        bad = subprocess.run([sys.executable, "-m", "tensorprobe", "sweep", f"{file}:plain", "-o",
                              str(tmp_path / "bad"), *args], capture_output=True, text=True)
        assert bad.returncode == 2 and says in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


SIBLING_MODEL = textwrap.dedent('''
    import torch

    class Gain(torch.nn.Module):
        def __init__(self, gain=1.0):
            super().__init__(); torch.manual_seed(0); self.c = torch.nn.Conv1d(1, 4, 3); self.gain = gain
        def forward(self, x):
            return self.c(x) * self.gain
''')

SIBLING_SWEEP = textwrap.dedent('''
    import torch
    from tensorprobe.sweep import Sweep
    from my_model import Gain           # a module beside this file, the usual layout

    NAMES = ["spk1/a", "spk1_a", "Spk1_A", "spk1_a "]

    def build():
        g = torch.Generator().manual_seed(0)
        return Sweep(Gain().eval(), {n: (torch.randn(1, 1, 64, generator=g) * (k + 1),) for k, n in enumerate(NAMES)})

    def port():
        return Gain(gain=1.01).eval()
''')


@pytest.mark.parametrize("workers", [1, 2])
def test_a_sweep_file_imports_its_siblings_and_items_whose_names_differ_in_case_or_slashes_keep_apart(
        tmp_path, monkeypatch, workers):
    """Run from another directory, with nothing on PYTHONPATH: the sweep file imports `my_model` beside it.
    Four items whose names differ only by '/', case or a trailing space each keep their own bundle."""
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "my_model.py").write_text(SIBLING_MODEL)
    (tmp_path / "proj" / "sweep_me.py").write_text(SIBLING_SWEEP)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    file = "proj/sweep_me.py"
    summary = sweep(f"{file}:build", tmp_path / "out", cand=f"{file}:port", workers=workers)
    latest = ResultStore(tmp_path / "out").read()
    assert summary.done == 4 and all(r["finding"] for r in latest.values())
    bundles = {r["bundle"] for r in latest.values()}
    assert len(bundles) == 4 and all(len(list(Path(b).glob("*/manifest.json"))) == 2 for b in bundles), bundles
    assert latest["spk1_a"]["bundle"].endswith("bundles/spk1_a")      # a plain name is its own directory
    faithful = sweep(f"{file}:build", tmp_path / "same", workers=workers)
    assert faithful.done == 4 and not faithful.finding


def test_a_sweep_file_whose_sibling_is_missing_names_the_users_file(tmp_path):
    (tmp_path / "sweep_me.py").write_text(SIBLING_SWEEP)
    bad = subprocess.run([sys.executable, "-m", "tensorprobe", "sweep", str(tmp_path / "sweep_me.py") + ":build",
                          "-o", str(tmp_path / "out")], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert f"{tmp_path / 'sweep_me.py'}" in bad.stderr and "No module named 'my_model'" in bad.stderr
    assert "tensorprobe-sweep-" not in bad.stderr, bad.stderr


@pytest.mark.slow
def test_kokoro_decoder_swept_over_50_voiced_and_unvoiced_items_against_onnxruntime(tmp_path):
    """The shipped export decoder against ONNX Runtime. Voiced items carry the source's random noise
    (noise_std · uv), which ONNX Runtime draws differently: they part at the source and their audio differs.
    Unvoiced items have no noise (uv = 0) and agree at the output; where they first differ is rounding
    amplified in the decoder's near-constant norm channels."""
    pytest.importorskip("kokoro")
    pytest.importorskip("onnxruntime")
    (tmp_path / "k.py").write_text("from tensorprobe.examples.kokoro import decoder_sweep\n"
                                   "def build():\n    return decoder_sweep(items=50, seconds=0.1)\n")
    # capture_all: what every item's capture and diff say (tier 1 would settle the unvoiced items that agree
    # within float32 rounding without them: tests/sweep/test_tiers.py)
    summary = sweep(f"{tmp_path / 'k.py'}:build", tmp_path / "out", workers=2, capture_all=True)
    latest = ResultStore(tmp_path / "out").read()
    voiced = {n: r for n, r in latest.items() if n.startswith("voiced")}
    unvoiced = {n: r for n, r in latest.items() if n.startswith("unvoiced")}
    assert summary.done == 50 and len(voiced) == len(unvoiced) == 25
    for r in voiced.values():
        assert r["first_divergence"].startswith("generator.m_source") and r["output_snr_db"] < 20
        assert r["cause"] == "random"          # the runtime's RandomNormalLike in that module, not replayed
        assert r["audio"]["diff"] != "match"
    for r in unvoiced.values():
        assert r["output_snr_db"] == "inf" or r["output_snr_db"] > 50
        assert r["audio"]["diff"] in ("identical", "match")
    assert {w["item"] for w in summary.worst_snr} <= set(voiced)                   # the ten worst are voiced
    assert summary.first_divergence[0] == ("generator.m_source.l_sin_gen:0", 25)     # every voiced item
    # unvoiced items part inside the decoder's norms, by rounding the near-constant channels amplify
    assert all(r["first_divergence"].startswith("decode.") and r["cause"] == "amplified" for r in unvoiced.values())
    kept = [p for p in (tmp_path / "out" / "bundles").rglob("*.safetensors")]
    assert not kept                                                                # statistics only on disk
    # the seeded random weights make audio that the checks reject; the reference's output fails the same checks, so
    # they are the model's, never a finding
    for r in latest.values():
        assert not [x for x in r["reasons"] if x["code"].startswith("audio.") and x["code"] != "audio.diff"]
        assert r["audio"]["problems"] == [] and set(r["audio"]["model_problems"]) == \
            {x["code"][len("audio."):] for x in r["model_properties"] if x["code"].startswith("audio.")}
    assert summary.model_properties and "Properties of the model" in summary.headline()


@pytest.mark.slow
def test_kokoro_voiced_items_compare_value_by_value_with_replayed_draws(tmp_path):
    """--replay-rng: the reference takes ONNX Runtime's draws of the sine source's noise, so voiced items no
    longer part at the source: their output agrees with the reference's (the audio matches), like the unvoiced."""
    pytest.importorskip("kokoro")
    pytest.importorskip("onnxruntime")
    (tmp_path / "k.py").write_text("from tensorprobe.examples.kokoro import decoder_sweep\n"
                                   "def build():\n    return decoder_sweep(items=6, seconds=0.1)\n")
    summary = sweep(f"{tmp_path / 'k.py'}:build", tmp_path / "out", workers=2, replay_rng=True, capture_all=True)
    latest = ResultStore(tmp_path / "out").read()
    assert summary.done == 6 and "random" not in summary.causes
    for name, r in latest.items():
        assert r["output_snr_db"] == "inf" or r["output_snr_db"] > 50, name
        assert r["audio"]["diff"] in ("identical", "match") and r["cause"] != "random"
        assert not (r["first_divergence"] or "").startswith("generator.m_source")


@pytest.mark.slow
def test_tts_path_sweeps_texts_through_every_stage_checker(tmp_path):
    pytest.importorskip("kokoro")
    (tmp_path / "t.py").write_text(textwrap.dedent('''
        from tensorprobe.sweep import Sweep
        from tensorprobe.tts.kokoro import KokoroPipeline

        def build():
            texts = {"hello": "həlˈO wˈɜɹld", "hi": "hˈI", "foreign": "hˈɛloʊ ɫAH0 wˈɜːld", "empty": ""}
            return Sweep(None, texts, pipeline=KokoroPipeline(seed=0))
    '''))
    summary = sweep(f"{tmp_path / 't.py'}:build", tmp_path / "out", workers=1)
    latest = ResultStore(tmp_path / "out").read()
    assert summary.done == 4 and {n for n, r in latest.items() if r["finding"]} == {"foreign", "empty"}
    assert latest["foreign"]["problems"] == ["phonemes.unknown_symbols"]
    assert latest["empty"]["problems"] == ["phonemes.empty"]
    assert summary.bad_stages == [("phonemes", 2)] and latest["hello"]["audio_samples"] > 0
