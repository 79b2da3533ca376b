"""isolate: local error (candidate module on reference inputs) vs accumulated error, with real models."""

from __future__ import annotations

import copy
import json
import textwrap

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import tensorprobe as tp
from tensorprobe.cli import app
from tensorprobe.errors import InputError
from tensorprobe.isolate import (INHERITED, LOCAL, OK, UNKNOWN, ModuleCall, ModuleRunner, isolate,
                                 local_snr_from_json, select_modules)
from tensorprobe.report.isolate import write_isolate_html

PERTURBED = "decode.1.conv1x1"


def _perturb(model: torch.nn.Module, path: str, rel: float = 1e-3) -> torch.nn.Module:
    dict(model.named_modules())[path].register_forward_hook(lambda m, a, out: out * (1 + rel))
    return model


@pytest.fixture(scope="module")
def kokoro_report():
    pytest.importorskip("kokoro")
    from tensorprobe.examples import kokoro

    ref = kokoro.build_decoder()
    cand = _perturb(kokoro.build_decoder(), PERTURBED)
    return isolate(ref, cand, *kokoro.decoder_inputs(0.25), min_snr=80)


@pytest.mark.slow
def test_kokoro_local_error_only_at_the_perturbed_layer(kokoro_report):
    r = kokoro_report
    assert r.first_local == PERTURBED
    assert r.local_layers() == [PERTURBED]
    layer = r.layer(PERTURBED)
    assert layer.verdict == LOCAL and layer.local["snr_db"] == pytest.approx(60.0, abs=0.05)
    i = next(i for i, x in enumerate(r.layers) if x.name == PERTURBED)
    # Upstream: identical. Downstream: every failing layer fails by inheritance, with zero local error.
    assert all(x.verdict == OK and x.accumulated["rel_l2_err"] == 0 for x in r.layers[:i])
    inherited = r.inherited_layers()
    assert len(inherited) >= 10
    for x in r.layers[i + 1:]:
        assert x.local["rel_l2_err"] == 0, x.name
        assert x.verdict in (OK, INHERITED)
    assert r.layer("decode.2.conv1").verdict == INHERITED
    assert "decode.1.conv1x1" in r.summary() and "inheritance" in r.summary()


@pytest.mark.slow
def test_kokoro_shared_module_is_reported_per_call(kokoro_report):
    # The decoder's blocks share one LeakyReLU (a default argument): one path, many calls, none recursing.
    calls = [x.name for x in kokoro_report.layers if x.module == "encode.actv"]
    assert calls[:3] == ["encode.actv", "encode.actv@1", "encode.actv@2"] and len(calls) >= 10
    assert all(x.note is None for x in kokoro_report.layers)


@pytest.mark.slow
def test_kokoro_voiced_source_replayed_into_candidate(kokoro):
    ref = kokoro.build_decoder(stable_source=False)
    cand = kokoro.build_decoder(stable_source=False)
    inputs = kokoro.decoder_inputs(0.25, voiced=True)
    mods = r"^generator\.(m_source|noise_convs\.0)$"
    replayed = isolate(ref, cand, *inputs, modules=mods)
    assert replayed.rng == "state" and not replayed.found and replayed.first_accumulated is None
    assert replayed.reused == 2  # same inputs and generator state: the candidate's own run is the local one
    local_only = isolate(ref, cand, *inputs, modules=mods, accumulated=False)
    assert local_only.noise_replayed >= 1 and not local_only.found  # re-run with the reference's state
    fresh = isolate(ref, cand, *inputs, modules=mods, replay_rng=False)
    assert fresh.first_local == "generator.m_source:0"  # fresh noise: the random source "is wrong"


@pytest.mark.slow
def test_kokoro_float64_candidate_replays_recorded_noise_and_blames_code_between_modules(kokoro):
    ref = kokoro.build_decoder(stable_source=False)
    cand = kokoro.build_decoder(stable_source=False).double()
    inputs = kokoro.decoder_inputs(0.25, voiced=True)
    mods = r"^generator\.(m_source|noise_convs\.\d|conv_post)$"
    r = isolate(ref, cand, *inputs, modules=mods)
    # float64 draws other noise than float32 from the same state: the recorded tensors are replayed.
    assert r.rng == "tensors" and r.noise_replayed == 3
    assert r.layer("generator.m_source:0").local["snr_db"] > 80
    # Every module is right on its own. The accumulated error starts at noise_convs.0, behind the STFT the
    # generator computes between m_source and noise_convs.0 (functional code): isolate looks above, runs the
    # generator alone on the reference's inputs, and finds it within its own float32 rounding (measured):
    # float64 against float32 is no bug, the phase of the sine source amplifies rounding.
    assert not r.found and r.first_accumulated == "generator.noise_convs.0"
    assert r.layer("generator.noise_convs.0").verdict == INHERITED
    assert r.ascent is not None and r.ascent.found is None
    assert "generator" in [x.module for x in r.ascent.tested]
    assert "no module fails alone" in r.summary()
    fresh = isolate(ref, cand, *inputs, modules=mods, replay_rng=False)
    assert fresh.first_local == "generator.m_source:0"


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = torch.nn.Linear(16, 32)
        self.act = torch.nn.GELU()
        self.out = torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.out(self.act(self.inp(x)))


def test_lower_precision_candidate_is_noise_by_default_and_fails_a_threshold_at_its_first_layer():
    ref = MLP()
    cand = copy.deepcopy(ref).to(torch.bfloat16)
    x = torch.randn(8, 16)
    default = isolate(ref, cand, x)
    assert not default.found and default.criteria.noise   # bfloat16 rounding is what a bfloat16 port does
    assert default.layer("inp").local["noise_floor"] == pytest.approx(12 * 2.0 ** -8)   # 12 units, as diff's
    r = isolate(ref, cand, x, min_snr=60)
    assert r.first_local == "inp" and r.layer("inp").cand_dtype == "bfloat16"
    assert 20 < r.layer("inp").local["snr_db"] < 60  # bfloat16 has 8 mantissa bits: ~45-50 dB
    assert r.layer("inp").accumulated["snr_db"] == pytest.approx(r.layer("inp").local["snr_db"])
    assert r.rng == "tensors"  # another dtype draws other noise: recorded tensors are replayed


def test_a_bfloat16_layer_whose_bias_is_off_is_wrong_on_its_own_and_its_faithful_twin_is_not():
    ref = MLP()
    x = torch.randn(8, 16)
    faithful = copy.deepcopy(ref).to(torch.bfloat16)
    assert not isolate(ref, faithful, x).found
    broken = copy.deepcopy(ref)
    with torch.no_grad():
        broken.out.bias.mul_(0.6)   # 13% off: within 32 bfloat16 roundoffs (12.5%) x the count measured there
    found = isolate(ref, broken.to(torch.bfloat16), x)
    assert found.first_local == "out" and found.layer("inp").local_reasons == ()


class Stepper(torch.nn.Module):
    """One module called 4 times, as in an ODE loop; the input grows each step."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.step = torch.nn.Linear(6, 6)

    def forward(self, x):
        for _ in range(4):
            x = x + torch.tanh(self.step(x)) * 3
        return x


class SaturatingLinear(torch.nn.Linear):
    """A port's Linear that goes wrong only on large inputs (clamps them)."""

    def forward(self, x):
        return super().forward(x.clamp(-4, 4))


def test_repeated_calls_are_compared_call_by_call():
    ref = Stepper()
    cand = copy.deepcopy(ref)
    bad = SaturatingLinear(6, 6)
    bad.load_state_dict(ref.step.state_dict())
    cand.step = bad
    x = torch.linspace(-1, 1, 6).reshape(1, 6)
    r = isolate(ref, cand, x)
    assert [x.name for x in r.layers] == ["step", "step@1", "step@2", "step@3"]
    verdicts = [x.verdict for x in r.layers]
    first_bad = verdicts.index(LOCAL)
    assert first_bad >= 1 and all(v == OK for v in verdicts[:first_bad])
    assert r.first_local == f"step@{first_bad}"


class Rewritten(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = torch.nn.Linear(16, 32)
        self.act = torch.nn.Tanh()
        self.head = torch.nn.Linear(32, 4)  # renamed: no "out" module

    def forward(self, x):
        return self.head(self.act(self.inp(x)))


def test_missing_and_rewritten_modules_are_reported_not_crashing():
    ref = MLP()
    cand = Rewritten()
    cand.inp.load_state_dict(ref.inp.state_dict())
    r = isolate(ref, cand, torch.randn(4, 16))
    assert r.layer("inp").verdict == OK
    assert r.layer("act").verdict == LOCAL  # tanh instead of GELU
    assert r.layer("out").verdict == UNKNOWN and "has no module out" in r.layer("out").note


class NumpyLinearRunner:
    """A non-PyTorch candidate: each Linear evaluated with NumPy in float64 (what a runtime adapter does)."""

    name = "numpy"

    def __init__(self, model: torch.nn.Module) -> None:
        self.modules = dict(model.named_modules())

    def has(self, module_path: str) -> bool:
        return isinstance(self.modules.get(module_path), (torch.nn.Linear, torch.nn.GELU))

    def run(self, module_path: str, call: int, inputs: ModuleCall):
        m = self.modules[module_path]
        x = inputs.args[0].double().numpy()
        if isinstance(m, torch.nn.GELU):
            from scipy.special import erf
            return torch.from_numpy(0.5 * x * (1 + erf(x / np.sqrt(2))))
        w, b = m.weight.detach().double().numpy(), m.bias.detach().double().numpy()
        return torch.from_numpy(x @ w.T + b)


def test_runner_protocol_lets_another_runtime_plug_in(tmp_path):
    ref = MLP()
    runner = NumpyLinearRunner(ref)
    assert isinstance(runner, ModuleRunner)
    cand_bundle = tp.capture(ref, torch.ones(2, 16), keep="full", out=tmp_path / "cand")
    r = isolate(ref, runner, torch.ones(2, 16), accumulated=cand_bundle, min_snr=120)
    assert r.runner == "numpy" and not r.found  # float64 NumPy agrees with float32 torch to ~140 dB
    assert all(x.local["snr_db"] > 120 for x in r.layers)
    assert r.layer("out").accumulated["rel_l2_err"] == 0  # same model captured: identical


def test_module_selection():
    pytest.importorskip("kokoro")
    from tensorprobe.examples import kokoro

    model = kokoro.build_decoder()
    assert select_modules(model, depth=1) == ["encode", "decode.0", "decode.1", "decode.2", "decode.3",
                                              "F0_conv", "N_conv", "asr_res", "generator"]
    assert select_modules(model, r"^generator\.noise_res\.0\.convs1\.\d$") == [
        f"generator.noise_res.0.convs1.{i}" for i in range(3)]
    with pytest.raises(InputError, match="matches no module"):
        select_modules(model, "nothing-like-this")
    with pytest.raises(InputError, match="invalid --modules regex"):
        select_modules(model, "(")
    with pytest.raises(InputError, match="no module 'decode.9'"):
        select_modules(model, ["decode.9"])


def test_html_report_escapes_names(tmp_path):
    class Evil(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.add_module("<script>x</script>", torch.nn.Linear(3, 3))

        def forward(self, x):
            return getattr(self, "<script>x</script>")(x)

    ref = Evil()
    cand = copy.deepcopy(ref).to(torch.bfloat16)
    r = isolate(ref, cand, torch.randn(2, 3), min_snr=60)
    page = write_isolate_html(r, tmp_path / "iso.html").read_text()
    assert "<script>x</script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    assert 'id="layer-plot"' in page and "data:image/png;base64," in page
    assert "A LAYER IS WRONG ON ITS OWN" in page


@pytest.fixture()
def targets(tmp_path):
    f = tmp_path / "pair.py"
    f.write_text(textwrap.dedent("""
        import copy, torch

        def _mlp():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))

        def ref():
            return _mlp(), (torch.ones(3, 8),)

        def same():
            return _mlp(), (torch.ones(3, 8),)

        def bad():
            m = _mlp()
            with torch.no_grad():
                m[2].weight[0, 0] += 0.5
            return m, (torch.ones(3, 8),)
    """))
    return f


def test_isolate_cli_exit_codes_json_and_html(targets, tmp_path):
    runner = CliRunner()
    html = tmp_path / "iso.html"
    res = runner.invoke(app, ["isolate", f"{targets}:ref", f"{targets}:bad", "--json", "--html", str(html)])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    assert doc["command"] == "isolate" and doc["status"] == "finding"
    assert doc["report"]["first_local"] == "2" and doc["report"]["counts"]["local"] == 1
    assert doc["report"]["layers"][0]["local"]["snr_db"] == "inf"
    assert html.exists()
    saved = tmp_path / "iso.json"
    saved.write_text(res.stdout)
    assert local_snr_from_json(saved)["2"] < 60 and local_snr_from_json(saved)["0"] == float("inf")
    res = runner.invoke(app, ["isolate", f"{targets}:ref", f"{targets}:same"])
    assert res.exit_code == 0 and "No divergence" in res.stdout
    res = runner.invoke(app, ["isolate", f"{targets}:ref", f"{targets}:same", "--modules", "("])
    assert res.exit_code == 2 and "invalid --modules regex" in " ".join(res.output.split())
    res = runner.invoke(app, ["isolate", f"{targets}:ref", f"{targets}:nope"])
    assert res.exit_code == 2 and "no attribute 'nope'" in " ".join(res.output.split())
