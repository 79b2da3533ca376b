import re

import pytest
import torch

import tensorprobe as tp


def _expected_faulty_channels(k, seconds):
    """Independent ground truth: feed the reference decoder, take the input of each InstanceNorm1d in
    execution order, and count the channels where the injected lowering's variance (float16 E[x²]−E[x]²)
    plus eps is negative. Returns the first norm with such channels and their indices."""
    model, inputs = k.decoder(seconds)
    seen = []
    hooks = [m.register_forward_hook(lambda mod, a, o, p=p: seen.append((p, a[0].detach().clone(), mod.eps)))
             for p, m in model.named_modules() if isinstance(m, torch.nn.InstanceNorm1d)]
    with torch.no_grad():
        model(*inputs)
    for h in hooks:
        h.remove()
    for path, x, eps in seen:
        xh = x.half()
        var = ((xh * xh).mean(-1) - xh.mean(-1) ** 2).float()
        bad = torch.nonzero((var + eps)[0] < 0).flatten().tolist()
        if bad:
            return path, bad
    return None, []


@pytest.mark.slow
def test_faulty_kokoro_decoder_origin_is_injected_instance_norm(kokoro):
    expected_path, expected_channels = _expected_faulty_channels(kokoro, 1.0)
    assert expected_path == "generator.noise_res.0.adain1.0.norm"
    model, inputs = kokoro.faulty_decoder(1.0)
    o = tp.find_first_nonfinite(model, *inputs)
    assert o.found and o.cause == "op"
    assert o.module == expected_path and o.op == "aten.rsqrt.default"
    assert o.module_type == "FaultyInstanceNorm1d"
    assert o.output.stats.nonfinite_channels == len(expected_channels)
    assert list(o.output.stats.nonfinite_channel_idx) == expected_channels[:64]
    assert o.inputs[0].stats.all_finite and o.inputs[0].stats.min < 0
    assert any("variance came out negative" in d for d in o.diagnosis)
    assert o.source and o.source.split(":")[0].endswith("kokoro.py")
    # the damage spreads: the norm's output keeps the channel pattern, the next conv is entirely NaN
    assert o.spread[0].module == expected_path
    assert o.spread[-1].module == "generator.noise_res.0.convs1.0" and o.spread[-1].finite_frac == 0.0


@pytest.mark.slow
def test_reference_kokoro_decoder_is_clean(kokoro):
    model, inputs = kokoro.decoder(0.5)
    o = tp.find_first_nonfinite(model, *inputs)
    assert not o.found and o.ops_checked > 500


def test_nonfinite_model_input_reported_as_such():
    x = torch.randn(2, 4)
    x[1, 2] = float("nan")
    o = tp.find_first_nonfinite(torch.nn.Linear(4, 4), x)
    assert o.found and o.cause == "model_input" and o.record == "input.0"
    assert "already non-finite" in o.headline()


def test_nonfinite_parameter_reported():
    lin = torch.nn.Linear(4, 4)
    with torch.no_grad():
        lin.weight[0, 0] = float("inf")
    o = tp.find_first_nonfinite(lin, torch.randn(1, 4))
    assert o.cause == "parameter" and o.record == "weight"


class ExpHead(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.exp(self.proj(x) * 30)


@pytest.mark.parametrize("dtype,limit", [(torch.float32, "88.7"), (torch.float16, "11.1"), (torch.bfloat16, "88.7")])
def test_exp_overflow_in_each_dtype(dtype, limit):
    model = ExpHead().to(dtype)
    with torch.no_grad():
        model.proj.weight.fill_(1.0)
        model.proj.bias.zero_()
    x = torch.full((1, 4), 1.0, dtype=dtype)  # proj = 4, ×30 = 120: over float32's and float16's limits
    o = tp.find_first_nonfinite(model, x)
    assert o.found and o.op == "aten.exp.default" and o.module == ""
    assert any(f"exceeds {limit}" in d for d in o.diagnosis), o.diagnosis


def test_division_by_zero_of_silent_audio():
    class Normalize(torch.nn.Module):
        def forward(self, audio):
            return audio / audio.abs().max()  # DiffRhythm's normalization (seed 003)

    o = tp.find_first_nonfinite(Normalize(), torch.zeros(1, 1000))
    assert o.op == "aten.div.Tensor"
    assert any("division by zero" in d and "0/0" in d for d in o.diagnosis)


def test_bundle_origin_skips_inherited_records(tmp_path, kokoro):
    model, inputs = kokoro.faulty_decoder(0.5)
    b = tp.capture(model, *inputs, level="op", keep="full", out=tmp_path / "f")
    o = tp.find_nonfinite_in_bundle(b)
    assert o.record == "generator.noise_res.0.adain1.0.norm/rsqrt.0"
    assert any("rsqrt of" in d and "negative" in d for d in o.diagnosis)
    # a module-level, statistics-only bundle of the same run names the norm module
    b2 = tp.capture(model, *inputs, level="module", out=tmp_path / "m")
    o2 = tp.find_nonfinite_in_bundle(b2)
    assert o2.record == "generator.noise_res.0.adain1.0.norm"
    assert o2.output.stats.nonfinite_channels == o.output.stats.nonfinite_channels


def test_npz_dump_origin(tmp_path):
    import numpy as np

    ok = np.ones((1, 4, 3), np.float32)
    bad = ok.copy()
    bad[0, 1] = np.nan
    np.savez(tmp_path / "dump.npz", a_conv=ok, b_norm=bad, c_conv=np.full_like(ok, np.nan))
    o = tp.find_nonfinite_in_bundle(tmp_path / "dump.npz")
    assert o.record == "b_norm" and o.output.stats.nonfinite_channels == 1


def _norm_feeding_a_mul(tmp_path, name, *, mul_inputs=(), inf_only=False, constant=(), stats_only=False):
    """A runtime's bundle in which the instance-norm kernel's output is missing: the first record holding NaN
    is the AdaIN's `mul`, and the norm's module output (tapped separately) comes later in the bundle.
    `constant`: channels of the norm's input (the conv's output) made nearly constant (mean 40, spread 1e-3)."""
    from tests.diff.diff_bundles import write_bundle

    x = torch.randn(1, 8, 16)
    for c in constant:
        x[:, c] = 40 + 1e-3 * x[:, c]
    bad = x.clone()
    bad[:, [2, 5]] = float("inf") if inf_only else float("nan")
    items = [("input.0", x, {"kind": "model_input", "module": "", "op": "input"}),
             ("blk/conv.0", x, {"module": "blk", "op": "aten.convolution.default", "stats_only": stats_only}),
             ("blk.adain/mul.0", bad, {"module": "blk.adain", "op": "aten.mul.Tensor", "inputs": mul_inputs}),
             ("blk.adain/add.0", bad, {"module": "blk.adain", "op": "aten.add.Tensor"}),
             ("blk.adain.norm", bad, {"module": "blk.adain.norm", "op": "executorch.output"}),
             ("blk.adain", bad, {"module": "blk.adain", "op": "executorch.output"})]
    return write_bundle(tmp_path / name, items)


def test_nan_in_an_op_that_cannot_make_nan_is_blamed_on_the_unrecorded_value_and_its_module(tmp_path):
    o = tp.find_nonfinite_in_bundle(_norm_feeding_a_mul(tmp_path, "b"))
    assert o.cause == "unrecorded_value" and o.module == "blk.adain.norm" and o.record == "blk.adain.norm"
    text = o.summary()
    assert "born inside blk.adain.norm" in text and "cannot make NaN from finite inputs" in text
    assert "2 of 8 channels" in text and "normalization" in text


def test_nan_born_in_a_norm_whose_input_channels_are_constant_says_so_with_the_evidence(tmp_path):
    o = tp.find_nonfinite_in_bundle(_norm_feeding_a_mul(tmp_path, "b", constant=(2, 5)))
    assert o.module == "blk.adain.norm"
    text = " ".join(o.diagnosis)
    ratios = dict(re.findall(r"channel (\d+): ([0-9.e+]+)", text))
    assert "2 of 8 channels nearly constant" in text and set(ratios) == {"2", "5"}, text
    # one-pass rounding noise over variance + eps: 40² · 16 values · 2⁻²⁴ / (~1e-6 + 1e-5) ≈ 140
    assert all(50 < float(r) < 200 for r in ratios.values()), ratios
    assert text.count("E[x²] − E[x]²") == 1   # the general advice is not repeated beside the numbers
    assert "Every NaN channel (2, 5) is one of them" in text and "E[x²] − E[x]²" in text
    # the same NaN pattern over an input with no such channels: no cancellation story is told
    o = tp.find_nonfinite_in_bundle(_norm_feeding_a_mul(tmp_path, "c"))
    assert o.module == "blk.adain.norm" and "nearly constant" not in " ".join(o.diagnosis)
    # constant channels elsewhere than the NaN ones: said, and said not to explain them all
    o = tp.find_nonfinite_in_bundle(_norm_feeding_a_mul(tmp_path, "d", constant=(1,)))
    assert "are not all among them" in " ".join(o.diagnosis)
    # the input's statistics only: it names the record to keep, and gives the general advice
    o = tp.find_nonfinite_in_bundle(_norm_feeding_a_mul(tmp_path, "e", constant=(2, 5), stats_only=True))
    text = " ".join(o.diagnosis)
    assert "Its input is most likely blk/conv.0" in text
    assert "--keep full --include 'blk/conv\\.0|blk\\.adain\\.norm'" in text
    assert "channel 2:" not in text and "E[x²] − E[x]²" in text   # nothing measured, the general advice given


def test_an_op_whose_inputs_are_all_recorded_or_that_overflows_stays_the_origin(tmp_path):
    # All its inputs recorded and finite: the bundle holds everything it read, so it is the origin as recorded.
    o = tp.find_nonfinite_in_bundle(_norm_feeding_a_mul(tmp_path, "a", mul_inputs=("blk/conv.0",)))
    assert o.cause == "record" and o.record == "blk.adain/mul.0"
    # ±Inf without NaN: a product of finite values can overflow, so the mul may well be where it is born.
    o = tp.find_nonfinite_in_bundle(_norm_feeding_a_mul(tmp_path, "c", inf_only=True))
    assert o.cause == "record" and o.record == "blk.adain/mul.0"
