"""Preflight predictions, checked against what the real targets then do."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import torch

from tensorprobe.errors import InputError
from tensorprobe.preflight import preflight

from ..runtimes._export_models import NormConv, mean100_input, nan_channels


def _one(report, kind):
    found = [f for f in report.findings if f.kind == kind]
    assert len(found) == 1, [f.message for f in report.findings]
    return found[0]


def test_numbers_predict_the_norm_channels_a_one_pass_variance_breaks():
    pred = _one(preflight(NormConv(), mean100_input(), target="tvm", code=False), "one_pass_variance")
    assert pred.severity == "error" and pred.module == "norm"
    # mean 100, std 1e-3…1 log-spaced, 400 values: float32 rounding of E[x²] − E[x]² reaches 1e4·400·2⁻²⁴ ≈ 0.24,
    # above variance + eps for the 14 channels with std < 0.49; channels 14 and 15 are safe
    assert pred.evidence["channels"] == list(range(14)) and pred.evidence["worst_first"][0] == 0
    safe = _one(preflight(NormConv(), mean100_input(), target="onnx", code=False), "one_pass_variance")
    assert safe.severity == "info"          # ONNX Runtime computes it in two passes


@pytest.mark.parametrize("runtime,package", [("tvm", "tvm"), ("executorch", "executorch")])
def test_verify_runs_the_real_target_and_confirms_the_predicted_channels(runtime, package):
    pytest.importorskip(package)
    r = preflight(NormConv(), mean100_input(), target=runtime, code=False, verify=True)
    pred = _one(r, "one_pass_variance")
    # TVM and ExecuTorch break channels 4, 6 and 8 (tests/runtimes): among the 14 predicted
    assert pred.confirmed is True and "NaN in 3 of 16 channels of norm (4, 6, 8), all among the predicted" in pred.observed
    assert any(n.startswith(f"--verify: ran {runtime}") for n in r.notes)


def test_verify_on_a_two_pass_runtime_does_not_confirm():
    pytest.importorskip("onnxruntime")
    pred = _one(preflight(NormConv(), mean100_input(), target="onnx", code=False, verify=True), "one_pass_variance")
    assert pred.severity == "info" and pred.confirmed is False and pred.observed == "onnxruntime: norm is finite"


def test_exp_overflow_predicted_for_float16_and_seen_in_a_real_half_run():
    class Spec(torch.nn.Module):
        def forward(self, x):
            return torch.exp(x)

    x = torch.linspace(0, 12, 64).reshape(1, 64)              # exp(12) > 65504: float16 overflows
    pred = _one(preflight(Spec(), x, target="fp16", code=False), "overflow")
    assert pred.severity == "error" and pred.evidence["max_input"] == pytest.approx(12.0)
    assert not torch.isfinite(Spec().half()(x.half())).all()      # float16 does overflow
    checked = _one(preflight(Spec(), x, target="fp16", code=False, verify=True), "overflow")
    assert checked.confirmed is True and checked.observed.startswith("float16: first non-finite value at aten.exp")
    assert not [f for f in preflight(Spec(), x, target="executorch", code=False).findings if f.kind == "overflow"]


def test_code_lint_of_the_kokoro_decoder_names_complex_stft_random_ops_and_weight_norm():
    kokoro = pytest.importorskip("tensorprobe.examples.kokoro")
    pytest.importorskip("kokoro")
    r = preflight(kokoro.build_decoder(stable_source=False), *kokoro.decoder_inputs(0.25), target="executorch",
                  numbers=False)
    assert r.exported
    complex_ = [f for f in r.findings if f.kind == "complex"]
    assert complex_ and all(f.severity == "error" for f in complex_)
    assert any(f.module == "generator" and f.source and "kokoro/istftnet.py" in f.source for f in complex_)
    rng = {f.op for f in r.findings if f.kind == "random_op"}
    assert {"aten.rand.default", "aten.randn_like.default"} <= rng
    assert all(f.module.startswith("generator.m_source") for f in r.findings if f.kind == "random_op")
    assert _one(r, "weight_norm").count == 70
    # the port's own decoder (conv STFT, weight norm folded) has neither
    port = preflight(kokoro.exportable_decoder(), *kokoro.decoder_inputs(0.25), target="executorch", numbers=False)
    assert not [f for f in port.findings if f.kind in ("complex", "weight_norm")]


def test_unknown_target_and_cli_exit_codes(tmp_path):
    with pytest.raises(InputError, match="unknown preflight target 'npu'"):
        preflight(NormConv(), mean100_input(), target="npu")
    (tmp_path / "m.py").write_text(
        "from tests.runtimes._export_models import NormConv, mean100_input\n"
        "def build():\n    return NormConv(), (mean100_input(),)\n")
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "-m", "tensorprobe", "preflight", f"{tmp_path / 'm.py'}:build", "--target", "tvm",
                        "--no-code", "--json"], capture_output=True, text=True, cwd=root)
    doc = json.loads(p.stdout)
    assert p.returncode == 1 and doc["status"] == "finding"
    assert doc["preflight"]["findings"][0]["evidence"]["channels"] == list(range(14))
    p = subprocess.run([sys.executable, "-m", "tensorprobe", "preflight", f"{tmp_path / 'm.py'}:build", "--target", "npu"],
                       capture_output=True, text=True, cwd=root)
    assert p.returncode == 2 and "unknown preflight target 'npu'" in p.stderr and "Traceback" not in p.stderr


def test_verify_does_not_judge_a_norm_whose_nan_comes_from_upstream():
    pytest.importorskip("tvm")

    class TwoNorms(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.first, self.second = NormConv().norm, torch.nn.InstanceNorm1d(16)

        def forward(self, x):
            return self.second(100 + 1e-3 * self.first(x))     # both inputs: mean 100, tiny spread

    r = preflight(TwoNorms(), mean100_input(), target="tvm", code=False, verify=True)
    by_module = {f.module: f for f in r.findings if f.kind == "one_pass_variance"}
    assert by_module["first"].confirmed is True
    second = by_module["second"]
    assert second.confirmed is None and second.observed == "tvm: NaN reaches second from upstream (first): not judged"


def test_stress_in_float16_matches_a_real_half_run():
    """The emulation (float32 ops, operands and results rounded to float16) against PyTorch's own float16."""
    import math

    from tensorprobe.preflight.stress import stress

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv1d(8, 16, 5, padding=2), torch.nn.ReLU(), torch.nn.Conv1d(16, 8, 5, padding=2))
    x = torch.randn(1, 8, 2000)
    with torch.no_grad():
        ref, half = m.eval()(x).double(), copy.deepcopy(m).half()(x.half()).double()
    real_snr = -10 * math.log10(float(((half - ref) ** 2).sum() / (ref ** 2).sum()))
    fp16, bf16 = stress(m, x, emulate="fp16"), stress(m, x, emulate="bf16")
    assert not fp16.finding and fp16.output_snr_db == pytest.approx(real_snr, abs=1.5)   # 67.3 dB here
    assert bf16.output_snr_db < fp16.output_snr_db - 12                 # 8 mantissa bits against 11


def test_stress_finds_where_float16_overflows_as_the_real_half_model_does():
    from tensorprobe.nan import find_first_nonfinite
    from tensorprobe.preflight.stress import stress

    class Spec(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.exp(self.proj(x)).sum(-1)

    torch.manual_seed(0)
    m, x = Spec().eval(), 40 * torch.ones(2, 4)     # proj outputs up to ~14: exp overflows float16 (> 11.1), not float32
    real = find_first_nonfinite(copy.deepcopy(m).half(), x.half())
    r = stress(m, x, emulate="fp16")
    assert real.found and r.finding and r.origin.op == real.op == "aten.exp.default"
    assert not stress(m, x, emulate="bf16").finding                      # bfloat16 has float32's exponent range


@pytest.mark.parametrize("runtime,package", [("tvm", "tvm"), ("executorch", "executorch")])
def test_stable_norm_rewrite_is_kept_and_removes_the_runtime_nan(runtime, package, tmp_path):
    pytest.importorskip(package)
    from tensorprobe.preflight.rewrite import TwoPassInstanceNorm, rewrite
    from tensorprobe.runtimes import get_runtime

    model, x = NormConv().eval(), mean100_input()
    result = rewrite(model, x, rules=["stable_norm"])
    (rule,) = result.rules
    # near-constant channels: float32 norms all carry ~1e-4 error against float64; the rewrite is no worse
    assert rule.applied and rule.changed == ("norm",) and rule.max_rel_err <= 2 * rule.model_rel_err
    assert isinstance(result.model.norm, TwoPassInstanceNorm) and isinstance(model.norm, torch.nn.InstanceNorm1d)
    before = get_runtime(runtime).capture(model, (x,), out=tmp_path / "before", keep="stats")
    after = get_runtime(runtime).capture(result.model, (x,), out=tmp_path / "after", keep="stats")
    assert before["norm"].stats.nonfinite_channel_idx == (4, 6, 8)
    assert all(r.stats.all_finite for r in after)


def test_a_rule_that_changes_the_outputs_is_not_applied():
    from tensorprobe.preflight.rewrite import rewrite

    def scale_conv(model):
        with torch.no_grad():
            model.conv.weight.mul_(1.01)
        return model, ["conv"]

    model, x = NormConv().eval(), mean100_input()
    result = rewrite(model, x, rules=[scale_conv])
    (rule,) = result.rules
    assert not rule.applied and "outputs move" in rule.reason and rule.max_rel_err > 1e-3
    assert torch.equal(result.model.conv.weight, model.conv.weight)


def test_fold_weight_norm_is_exact_and_leaves_plain_weights():
    from tensorprobe.preflight.rewrite import rewrite

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(4, 4, 3)),
                            torch.nn.utils.weight_norm(torch.nn.Conv1d(4, 2, 3)))
    result = rewrite(m, torch.randn(1, 4, 50), rules=["fold_weight_norm"])
    (rule,) = result.rules
    assert rule.applied and rule.changed == ("0", "1") and rule.max_rel_err < 1e-6
    assert not torch.nn.utils.parametrize.is_parametrized(result.model[0]) and not hasattr(result.model[1], "weight_g")


def test_rewrite_cli_exports_the_verified_model(tmp_path):
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[2]
    (tmp_path / "m.py").write_text(
        "import torch\nfrom tests.runtimes._export_models import NormConv, mean100_input\n"
        "def build():\n    torch.manual_seed(0)\n    return NormConv(), (mean100_input(),)\n")
    out = tmp_path / "rewritten.pt2"
    p = subprocess.run([sys.executable, "-m", "tensorprobe", "rewrite", f"{tmp_path / 'm.py'}:build", "-o", str(out),
                        "--json"], capture_output=True, text=True, cwd=root)
    doc = json.loads(p.stdout)
    assert p.returncode == 0 and doc["rewrite"]["rules"][0] == {**doc["rewrite"]["rules"][0], "rule": "stable_norm",
                                                               "applied": True, "changed": ["norm"]}
    ep = torch.export.load(str(out))
    ops = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
    assert not any("instance_norm" in o or "batch_norm" in o for o in ops)     # the norm is plain mean/sub/rsqrt
    torch.manual_seed(0)
    model, x = NormConv().eval(), mean100_input()
    assert torch.allclose(ep.module()(x), model(x), rtol=0, atol=1e-2 * float(model(x).abs().max()))


def test_fix_applies_the_rules_the_findings_point_to_and_the_target_then_runs_clean(tmp_path):
    pytest.importorskip("tvm")
    from tensorprobe.runtimes import get_runtime

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(16, 16, 1)), NormConv())
    with torch.no_grad():
        model[0].parametrizations.weight.original1.copy_(torch.eye(16)[:, :, None])   # identity conv: mean 100 stays
        model[0].bias.zero_()
    x = mean100_input()
    r = preflight(model, x, target="tvm", fix=True)
    assert {f.rule for f in r.findings if f.rule} == {"stable_norm", "fold_weight_norm"}
    assert [(x.rule, x.applied) for x in r.rewrite.rules] == [("stable_norm", True), ("fold_weight_norm", True)]
    fixed = get_runtime("tvm").capture(r.rewrite.model, (x,), out=tmp_path / "fixed", keep="stats")
    assert all(rec.stats.all_finite for rec in fixed)
    assert not preflight(r.rewrite.model, x, target="tvm").findings            # nothing left to find
