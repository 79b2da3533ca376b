"""Preflight runs the model first: what float32 PyTorch already breaks on the given inputs is said first,
located as `tensorprobe nan` locates it, and no target finding is made from it. The truth each test judges by
is computed here from the model's own float32 arithmetic, not taken from preflight."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tensorprobe.nan import find_first_nonfinite
from tensorprobe.preflight import FLOAT32, preflight

from ._models import ExpNet, build_norm_net, exp_inputs, one_pass_variance

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _float32(report):
    return [f for f in report.findings if f.kind == FLOAT32]


def _broken_channels(model, x) -> list[int]:
    """Channels whose one-pass variance + eps is not positive in float32: rsqrt makes NaN or Inf there."""
    with torch.no_grad():
        var = one_pass_variance(model.pre(x))
    return sorted(int(c) for c in torch.nonzero(var <= 0).flatten())


def _outputs_finite(model, *inputs) -> bool:
    with torch.no_grad():
        return bool(torch.isfinite(model(*inputs)).all())


@pytest.mark.parametrize("target", ["tvm", "onnx", "fp16"])
def test_a_model_already_nan_in_float32_is_said_first_with_nans_origin(target):
    model, (x,) = build_norm_net(mean=30, spread=0.01)
    broken = _broken_channels(model, x)
    assert broken and not _outputs_finite(model, x)          # the premise: plain float32 PyTorch makes NaN
    r = preflight(model, x, target=target, code=False)
    first, origin = r.findings[0], find_first_nonfinite(model, x)
    assert first.kind == FLOAT32 and first.severity == "error" and r.finding
    assert (first.module, first.op) == (origin.module, origin.op) == ("norm", "aten.rsqrt.default")
    assert first.evidence["channels"] == broken and first.evidence["diagnosis"] == list(origin.diagnosis)
    assert origin.diagnosis and first.source and first.source.endswith("(one_pass_normalise)")
    assert r.summary().startswith("Float32 PyTorch already makes the outputs non-finite")
    assert r.float32.origin.op == origin.op and r.float32.outputs_finite is False
    # no target finding judged on what already fails: nothing kept carries a non-finite operand
    assert not [f for f in r.findings[1:] if "nonfinite" in f.evidence or f.op == "rsqrt"]


def test_figures_left_out_are_signed_and_say_what_was_non_finite():
    """fp16 would warn that the rsqrt input lies below float16's normal range: that input also holds the
    negative variances that make float32 NaN, so the finding is left out, with its signed range."""
    model, (x,) = build_norm_net(mean=30, spread=0.01)
    with torch.no_grad():
        var = one_pass_variance(model.pre(x))
    r = preflight(model, x, target="fp16", code=False)
    (left,) = [f for f in r.float32.left_out if f.kind == "near_zero"]
    assert left.op == "rsqrt" and left.module == "norm" and left.evidence["nonfinite"] == len(_broken_channels(model, x))
    assert left.evidence["min"] == pytest.approx(float(var.min()), rel=1e-6) and left.evidence["min"] < 0
    assert left.evidence["negative"] == int((var < 0).sum()) and f"{float(var.min()):.3g}" in left.message
    assert "near_zero at norm (rsqrt)" in r.findings[0].evidence["left_out"]
    assert "1 target finding(s) at ops that meet these NaN/Inf in float32 are left out" in r.summary()


def test_the_norm_moved_into_the_roots_forward_is_still_found_and_located():
    model, (x,) = build_norm_net(mean=30, spread=0.01, root=True)
    broken = _broken_channels(model, x)
    r = preflight(model, x, target="tvm", code=False)
    first = r.findings[0]
    assert first.kind == FLOAT32 and first.module == "" and first.op == "aten.rsqrt.default"
    assert first.evidence["channels"] == broken
    assert first.source and "RootNormNet" not in first.source and first.source.endswith("(forward)")


@pytest.mark.parametrize("target", ["tvm", "onnx", "fp16"])
def test_a_healthy_spread_is_not_called_broken_in_float32(target):
    model, (x,) = build_norm_net(mean=30, spread=1.0)
    assert _outputs_finite(model, x) and not _broken_channels(model, x)
    r = preflight(model, x, target=target, code=False)
    assert r.float32.finite and not _float32(r) and not r.float32.left_out
    assert not r.finding


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mean=st.floats(0, 60), log_spread=st.floats(-3, 0), seed=st.integers(0, 3), root=st.booleans())
def test_float32_verdict_follows_the_model_itself(mean, log_spread, seed, root):
    """Whatever the offset and spread: a float32 finding exactly when PyTorch's own outputs are non-finite,
    at the rsqrt, on the channels whose variance went non-positive; otherwise nothing at all on onnx."""
    model, (x,) = build_norm_net(mean=mean, spread=10.0 ** log_spread, seed=seed, root=root)
    broken = not _outputs_finite(model, x)
    r = preflight(model, x, target="onnx", code=False)
    assert bool(_float32(r)) == broken == r.finding
    if broken:
        first = r.findings[0]
        assert first.op == "aten.rsqrt.default" and first.module == ("" if root else "norm")
        assert first.evidence["channels"] == _broken_channels(model, x)
    else:
        assert not r.findings


def test_exp_overflowing_float32_is_a_float32_finding_not_a_float16_one():
    model, x = ExpNet(reach=58), exp_inputs()
    with torch.no_grad():
        top = float(model.fc1(x).max())
    assert top > 88.73 and not _outputs_finite(model, x)       # e^100 is inf in float32 already
    for target in ("fp16", "executorch"):
        r = preflight(model, x, target=target, code=False)
        first = r.findings[0]
        assert first.kind == FLOAT32 and first.module == "" and first.op == "aten.exp.default" and r.finding
        assert not [f for f in r.findings if f.kind == "overflow"]      # neither "float16 overflows" nor addmm
        left = {(f.module, f.op): f for f in r.float32.left_out}
        assert set(left) == {("", "exp"), ("fc2", "addmm")} if target == "fp16" else set(left) == {("", "exp")}
        assert all(f.evidence["nonfinite"] > 0 for f in left.values())
        assert any("exp overflow" in d for d in first.evidence["diagnosis"])


@pytest.mark.parametrize("reach,fp16_severity", [(20, "error"), (6, "warning")])
def test_exp_finite_in_float32_stays_a_float16_finding(reach, fp16_severity):
    model, x = ExpNet(reach=reach), exp_inputs()
    with torch.no_grad():
        top = float(model.fc1(x).max())
    r = preflight(model, x, target="fp16", code=False)
    assert r.float32.finite and not _float32(r)
    (exp,) = [f for f in r.findings if f.kind == "overflow" and f.op == "exp"]
    assert exp.severity == fp16_severity and exp.evidence["max_input"] == pytest.approx(top)
    assert "float16 overflows above 11.09" in exp.message
    assert not [f for f in preflight(model, x, target="executorch", code=False).findings if f.kind == "overflow"]


class Reciprocal(torch.nn.Module):
    def forward(self, x, d):
        return x / d


def test_near_zero_reports_negative_denominators_as_negative():
    x = torch.ones(1, 4)
    d = torch.tensor([[-1e-9, 1e-9, -0.5, 2.0]])       # finite in float32; 1e-9 rounds to 0 in float16
    r = preflight(Reciprocal(), x, d, target="fp16", code=False)
    assert r.float32.finite
    (f,) = [f for f in r.findings if f.kind == "near_zero"]
    assert f.severity == "error" and f.evidence["min"] == -0.5 and f.evidence["max"] == 2.0
    assert f.evidence["negative"] == 2 and f.evidence["min_abs"] == pytest.approx(1e-9)
    assert "values from -0.5 to 2" in f.message
    assert [f.op for f in r.findings if f.kind == "overflow"] == ["div"]       # 1/1e-9 = 1e9 > 65504
    # a zero denominator is already Inf in float32: said first, and both float16 findings at div left out
    r = preflight(Reciprocal(), x, d.clone().index_fill_(1, torch.tensor([0]), 0.0), target="fp16", code=False)
    assert r.findings[0].kind == FLOAT32 and r.findings[0].op == "aten.div.Tensor" and len(r.findings) == 1
    assert sorted(f.kind for f in r.float32.left_out) == ["near_zero", "overflow"]


class MaskedLog(torch.nn.Module):
    def forward(self, x):
        return torch.where(x > 0, torch.log(x), torch.zeros_like(x))


def test_a_nan_masked_before_the_outputs_is_a_warning_first():
    x = torch.tensor([[-1.0, 0.0, 1e-9, 2.0]])         # log(-1) = NaN, log(0) = -inf: both masked by where
    assert _outputs_finite(MaskedLog(), x)
    r = preflight(MaskedLog(), x, target="fp16", code=False)
    first = r.findings[0]
    assert first.kind == FLOAT32 and first.severity == "warning" and first.op == "aten.log.default"
    assert r.float32.outputs_finite and not r.finding
    assert "masked before the outputs" in first.message
    assert [f.kind for f in r.float32.left_out] == ["near_zero"]     # log of 1e-9 in float16: not judged here


@pytest.mark.slow
def test_kokoro_decoder_is_not_called_broken_and_its_faulty_norm_is():
    """The real Kokoro-82M decoder is finite in float32; with the broken instance-norm lowering injected
    (one-pass variance in float16, `examples.kokoro.faulty_decoder`) it is NaN, and preflight says where."""
    pytest.importorskip("kokoro")
    from tensorprobe.examples import kokoro as K

    model, inputs = K.decoder(0.25)
    r = preflight(model, *inputs, target="onnx", code=False)
    assert r.float32.finite and not _float32(r) and not r.finding
    model, inputs = K.faulty_decoder(0.25)
    origin = find_first_nonfinite(model, *inputs)
    r = preflight(model, *inputs, target="tvm", code=False)
    first = r.findings[0]
    assert origin.found and first.kind == FLOAT32 and r.finding
    assert (first.module, first.op) == (origin.module, origin.op) == ("generator.noise_res.0.adain1.0.norm",
                                                                      "aten.rsqrt.default")
    assert first.evidence["channels"] == list(origin.output.stats.nonfinite_channel_idx) != []


def test_stress_says_a_float32_failure_first():
    from tensorprobe.preflight.stress import stress

    x = exp_inputs()
    broken = stress(ExpNet(reach=58), x, emulate="fp16")
    assert broken.finding and broken.float32_origin.op == "aten.exp.default"
    assert broken.summary().startswith("Already non-finite in float32, before any emulation")
    only_fp16 = stress(ExpNet(reach=20), x, emulate="fp16")
    assert only_fp16.float32_origin is None and only_fp16.origin.op == "aten.exp.default"
    assert only_fp16.summary().startswith("In fp16 the first non-finite value is born at aten.exp.default")


def _factory(tmp_path, body: str) -> str:
    (tmp_path / "m.py").write_text("import torch\nfrom tests.preflight._models import *\n" + body)
    return f"{tmp_path / 'm.py'}:build"


def _cli(*args):
    p = subprocess.run([sys.executable, "-m", "tensorprobe", "preflight", *args], capture_output=True, text=True,
                       cwd=ROOT)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def test_cli_exits_1_on_a_model_broken_in_float32_and_0_on_a_healthy_one(tmp_path):
    factory = _factory(tmp_path, "def build():\n    return build_norm_net(30, 0.01)\n")
    for target, extra in (("tvm", []), ("onnx", []), ("fp16", ["--verify"])):
        p = _cli(factory, "--target", target, "--no-import", *extra, "--json")
        doc = json.loads(p.stdout)["preflight"]
        assert p.returncode == 1 and doc["finding"] and doc["findings"][0]["kind"] == FLOAT32
        assert doc["float32"]["origin"]["op"] == "aten.rsqrt.default" and doc["float32"]["origin"]["module"] == "norm"
    text = _cli(factory, "--target", "tvm", "--no-code")
    assert text.returncode == 1 and "where float32 fails (tensorprobe nan)" in text.stdout
    (tmp_path / "healthy.py").write_text("from tests.preflight._models import *\n"
                                         "def build():\n    return build_norm_net(30, 1.0)\n")
    assert _cli(f"{tmp_path / 'healthy.py'}:build", "--target", "tvm", "--no-code").returncode == 0


def test_a_forward_that_raises_is_one_clear_input_error():
    from tensorprobe.errors import InputError

    model, (x,) = build_norm_net()
    with pytest.raises(InputError, match=r"the model's forward raised RuntimeError: .*channels"):
        preflight(model, x[:, :3], target="tvm", code=False)       # 3 channels into an 8-channel conv


def test_finite_real_models_are_not_called_broken_and_an_overflowing_input_is():
    """Two more architectures that are finite on their own inputs: the Silero VAD port (weights from the ONNX
    file the silero-vad package ships) and the training example's mel predictor with its masked sqrt and
    hand-written segment norm (finite forward, NaN gradient: not a forward failure). Silero fed audio in the
    wrong units (×1e20) overflows in float32 at the power spectrum: said first, where nan finds it."""
    pytest.importorskip("silero_vad")
    from tensorprobe.examples import silero, training

    vad, (frame, state) = silero.pytorch_port()
    (phonemes, voiced), _ = training.batch()
    mel = training.MelPredictor(energy=training.Energy(), norm=training.SegmentNorm())
    for model, inputs in ((vad, (frame, state)), (mel, (phonemes, voiced))):
        for target in ("onnx", "fp16"):
            r = preflight(model, *inputs, target=target, code=False)
            assert r.float32.finite and not _float32(r), r.summary()
    loud = frame * 1e20
    origin = find_first_nonfinite(vad, loud, state)
    r = preflight(vad, loud, state, target="onnx", code=False)
    first = r.findings[0]
    assert not _outputs_finite(lambda *a: vad(*a)[0], loud, state) and r.finding
    assert first.kind == FLOAT32 and (first.module, first.op) == (origin.module, origin.op) == ("", "aten.pow.Tensor_Scalar")
