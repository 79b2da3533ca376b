"""The op watch of the numbers lint (atan2 branch cuts, values near zero, phase accumulation, dynamic range,
layer and group norms) and the code lint's shapes, mutations and constants, each checked against what a real
runtime or a float64 computation then does."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tensorprobe.preflight import preflight


def _kind(report, kind):
    return [f for f in report.findings if f.kind == kind]


class Phase(torch.nn.Module):
    """The phase of an STFT-like spectrum, with bins exactly on atan2's branch cut."""

    def forward(self, re, im):
        return torch.atan2(im, re)


def _cut_inputs():
    re = torch.tensor([[-1.0, -2.0, 3.0, 0.0, -0.5, 1.0]])
    im = torch.tensor([[0.0, 0.0, 1.0, 0.0, -0.0, 1e-9]])     # +0 on two negative reals, −0 on one, (0, 0) once
    return re, im


def test_atan2_branch_cut_predicted_for_onnx_seen_in_onnxruntime_and_removed_by_guard(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    from tensorprobe.preflight.functions import guard_atan2
    from tensorprobe.runtimes.onnxruntime import export_onnx

    re, im = _cut_inputs()
    (pred,) = _kind(preflight(Phase(), re, im, target="onnx", code=False), "branch_cut")
    assert pred.severity == "warning" and pred.rule == "guard_atan2"
    assert pred.evidence["on_cut"] == 2 and pred.evidence["origin"] == 1    # the two +0 bins; (0, 0) once

    def run(model):
        path = tmp_path / f"{id(model)}.onnx"
        export_onnx(model, (re, im), path)
        sess = ort.InferenceSession(str(path))
        return sess.run(None, dict(zip([i.name for i in sess.get_inputs()], (re.numpy(), im.numpy()))))[0]

    want = Phase()(re, im).numpy()
    plain = run(Phase())
    wrong = np.flatnonzero(~np.isclose(plain, want, atol=1e-6)[0]).tolist()
    assert wrong == [0, 1]                      # exactly the predicted +0 bins: −π in ONNX Runtime, +π in PyTorch
    guarded, _ = guard_atan2(Phase())
    np.testing.assert_allclose(run(guarded), want, atol=1e-6)
    # on targets that keep atan2's sign of zero the same points are only worth knowing
    (info,) = _kind(preflight(Phase(), re, im, target="executorch", code=False), "branch_cut")
    assert info.severity == "info"


class LogMag(torch.nn.Module):
    def forward(self, x):
        return torch.log(x)


def test_log_of_values_float16_rounds_to_zero_predicted_and_confirmed_by_a_half_run():
    x = torch.tensor([[1.0, 0.5, 1e-3, 1e-6, 1e-9]])      # 1e-6: a float16 subnormal; 1e-9: rounds to 0
    (pred,) = _kind(preflight(LogMag(), x, target="fp16", code=False, verify=True), "near_zero")
    assert pred.severity == "error" and pred.evidence["tiny"] == 2 and pred.evidence["vanish"] == 1
    assert pred.confirmed is True and "log" in pred.observed
    assert torch.isinf(LogMag().half()(x.half())).tolist() == [[False, False, False, False, True]]
    # float32 holds both: only flush-to-zero kernels would break it, and nothing is below float32's normal range
    assert _kind(preflight(LogMag(), x, target="executorch", code=False), "near_zero") == []


def test_phase_accumulation_estimate_bounds_the_real_float32_phase_error_of_kokoro_sines():
    pytest.importorskip("kokoro")
    from tensorprobe.examples import kokoro as K

    model, inputs = K.voiced_decoder(1.0)
    fp16 = _kind(preflight(model, *inputs, target="fp16", code=False), "phase_accumulation")
    fp32 = _kind(preflight(model, *inputs, target="executorch", code=False), "phase_accumulation")
    assert [f.module for f in fp16] == ["generator.m_source.l_sin_gen"] and fp16[0].severity == "error"
    # the same sines in float32 and float64, on the same random draw: the real phase error against the estimate
    from tensorprobe.preflight.functions import record_random
    from tensorprobe.preflight.rewrite import clone_module, seeded

    sine = model.generator.m_source.l_sin_gen
    f0 = model.generator.f0_upsamp(inputs[1][:, None]).transpose(1, 2)
    with seeded():
        fixed, _ = record_random(clone_module(sine), f0)
    s32 = fixed(f0)[0].double()
    s64 = clone_module(fixed).double()(f0.double())[0]
    measured = float((s32 - s64).abs().max()) / sine.sine_amp      # |Δ sin| ≈ |Δ phase| for small errors
    estimate = (fp32[0].evidence["phase_error_rad"] if fp32 else
                fp16[0].evidence["phase_error_rad"] * 2.0 ** -13)       # float16 → float32 unit roundoff
    assert measured < estimate * 4 and measured > estimate / 100, (measured, estimate)


def test_layer_and_group_norms_of_offset_rows_are_predicted_and_stable_norm_rewrites_them():
    from tensorprobe.preflight.rewrite import TwoPassGroupNorm, TwoPassLayerNorm, rewrite

    class Blocks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = torch.nn.LayerNorm(256)
            self.gn = torch.nn.GroupNorm(4, 8)

        def forward(self, x):
            return self.ln(x), self.gn(x.reshape(2, 8, -1))

    g = torch.Generator().manual_seed(0)
    x = 30 + torch.randn(2, 4, 256, generator=g) * torch.tensor([1.0, 1e-3, 1.0, 1e-3]).view(1, 4, 1)
    found = {f.module: f for f in _kind(preflight(Blocks(), x, target="executorch", code=False), "one_pass_variance")}
    # rows 1 and 3 of each batch (std 1e-3 on a mean of 30) are the flat ones: rows 1, 3, 5, 7 of [2·4, 256]
    assert found["ln"].evidence["channels"] == [1, 3, 5, 7] and found["ln"].evidence["units"] == "normalised rows"
    assert found["ln"].severity == "warning"        # one-pass kernels were measured for instance norm only
    assert found["gn"].evidence["units"] == "groups"
    result = rewrite(Blocks(), x, rules=["stable_norm"])
    assert result.rules[0].applied and set(result.rules[0].changed) == {"ln", "gn"}
    assert isinstance(result.model.ln, TwoPassLayerNorm) and isinstance(result.model.gn, TwoPassGroupNorm)
    for a, b in zip(Blocks()(x), result.model(x)):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-3)


def test_dynamic_range_below_float16_normals_is_flagged_for_float16_targets_only():
    class Tiny(torch.nn.Module):
        def forward(self, x):
            return torch.sigmoid(x) * 1e-6        # probabilities scaled into float16's subnormal range

    x = torch.randn(1, 1000, generator=torch.Generator().manual_seed(0))
    found = _kind(preflight(Tiny(), x, target="fp16", code=False), "dynamic_range")
    assert [f.op for f in found] == ["mul"] and found[0].evidence["share"] == 1.0
    half = (torch.sigmoid(x.half()) * 1e-6).float()
    assert float(((half - Tiny()(x)).abs() / Tiny()(x)).max()) > 1e-2     # float16 really loses them (>1% error)
    assert _kind(preflight(Tiny(), x, target="executorch", code=False), "dynamic_range") == []


def test_code_lint_names_data_dependent_shapes_input_mutation_and_constants():
    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, mask):
            x.mul_(2)
            keep = torch.nonzero(mask)
            return self.lin(x) * torch.rsqrt(torch.tensor(2.0)), keep

    r = preflight(Odd(), torch.randn(3, 4), torch.tensor([1, 0, 1]), target="executorch", numbers=False)
    kinds = {f.kind: f for f in r.findings}
    assert kinds["data_dependent_shape"].op == "aten.nonzero.default"
    assert kinds["input_mutation"].evidence == {"input": "x"}
    const = kinds["constant"]
    assert const.op == "rsqrt" and const.source.endswith("(forward)") and "test_numbers_watch.py" in const.source


def test_kokoro_constant_rsqrt_of_seed_001_is_found_on_its_source_line():
    pytest.importorskip("kokoro")
    from tensorprobe.examples import kokoro as K

    model, inputs = K.export_decoder(0.5)
    consts = [f for f in _kind(preflight(model, *inputs, target="executorch", numbers=False), "constant")
              if f.op == "rsqrt"]
    # AdainResBlk1d.forward: `* torch.rsqrt(torch.tensor(2))`, once per residual block (encode + 4 decode)
    assert sorted(f.module for f in consts) == ["decode.0", "decode.1", "decode.2", "decode.3", "encode"]
    assert all("istftnet.py" in f.source for f in consts)
    assert math.isfinite(len(consts))
