"""Verdicts a user can trust: what `diff` compares, what it refuses to compare, and how it explains.

Each test plants a real difference (or a harmless one) and asserts the verdict, the record and the cause;
`test_ports_corpus.py` does the same on ports made by onnxruntime's tools.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn as nn

import tensorprobe as tp
from tensorprobe.emulate import tf32
from tensorprobe.examples import kokoro
from tensorprobe.testing import assert_parity

from . import ports


# ---- the default capture (module level, statistics) finds a 1% weight change -----------------------------
@pytest.fixture(scope="module")
def decoder_ref(tmp_path_factory):
    out = tmp_path_factory.mktemp("dec") / "ref"
    model, inputs = kokoro.build_decoder(), kokoro.decoder_inputs(0.1, voiced=True)  # voiced: F0_conv sees data
    tp.capture(model, *inputs, out=out)   # the defaults: module level, statistics only
    return out, inputs


# One layer of each kind and place: encoder, decoder blocks, AdaIN style projection, F0 path, the
# generator's upsampling, its noise branch, its resblocks and its output conv.
LAYERS = ["encode.conv1", "decode.0.conv2", "decode.3.norm1.fc", "F0_conv", "asr_res.0", "generator.ups.1",
          "generator.noise_convs.0", "generator.noise_res.1.convs1.2", "generator.resblocks.4.convs2.1",
          "generator.conv_post"]


@pytest.mark.parametrize("layer", LAYERS)
def test_default_capture_finds_a_one_percent_weight_change_in_any_layer(decoder_ref, tmp_path, layer):
    ref, inputs = decoder_ref
    model = kokoro.build_decoder()
    mod = dict(model.named_modules())[layer]
    name = "weight_g" if hasattr(mod, "weight_g") else "weight"
    with torch.no_grad():
        getattr(mod, name).mul_(1.01)
    cand = tp.capture(model, *inputs, out=tmp_path / "cand", replay_rng=ref)  # the same noise: voiced F0
    r = tp.diff(ref, cand)
    assert r.verdict == "diverged" and f"{layer}.{name}" in {w.name for w in r.weights_differ}
    first = r.get(r.first_divergence)
    assert first.module == layer and first.cause == "weights", r.summary
    assert r.counts()["statistics"] > 100 and "by statistics only" in r.summary


def test_every_parameter_scaled_by_one_percent_is_a_weight_that_differs():
    """All 426 weights of the decoder, one at a time: the statistics and the fingerprint each prove it."""
    from tensorprobe.diff.compat import stats_bounds
    from tensorprobe.stats import compute_stats, tensor_digest

    model = kokoro.build_decoder()

    found = 0
    for name, p in model.named_parameters():
        t = p.detach()
        if t.abs().max() == 0:
            continue  # a zero tensor scaled is the same tensor
        s, d = compute_stats(t), tensor_digest(t)
        scaled = t * 1.01
        b = stats_bounds(s, compute_stats(scaled))
        assert tensor_digest(scaled) != d and b.rel_err_lower > 5e-3, name
        found += 1
    assert found > 400


def test_scale_invariant_weight_v_differs_but_the_forward_does_not_see_it(decoder_ref, tmp_path):
    """weight_norm divides weight_v by its norm: scaling it changes the weights, not the computation."""
    ref, inputs = decoder_ref
    model = kokoro.build_decoder()
    with torch.no_grad():
        dict(model.named_modules())["decode.1.conv1"].weight_v.mul_(1.5)
    r = tp.diff(ref, tp.capture(model, *inputs, out=tmp_path / "cand", replay_rng=ref))
    assert [w.name for w in r.weights_differ] == ["decode.1.conv1.weight_v"] and r.verdict == "diverged"
    derived = next(w for w in r.weights if w.name == "decode.1.conv1.weight")  # the weight the conv uses
    assert "derived" in derived.tags and derived.passed
    # the forward sees the rescaling only as rounding of g·v/‖v‖ (the runs' arithmetic is identical, so even
    # that is reported, at the conv that reads the weight)
    assert r.get("output").passed or r.get("output").rel_err < 1e-5
    assert max(p.rel_err or p.rel_err_lower or 0.0 for p in r.pairs if p.kind != "rng") < 1e-5


def test_transposed_square_weight_keeps_every_statistic_but_not_its_fingerprint(tmp_path):
    lin = nn.Linear(16, 16)
    x = torch.randn(4, 16)
    ref = tp.capture(lin, x, out=tmp_path / "ref")
    with torch.no_grad():
        lin.weight.copy_(lin.weight.t().clone())
    r = tp.diff(ref, tp.capture(lin, x, out=tmp_path / "cand"))
    w = r.get("weight")
    assert w.failed and w.method == "statistics" and "a transpose or a permutation?" in "; ".join(w.reasons)
    assert r.get("output").failed and r.get("output").method == "elementwise"


# ---- comparable pairs only ---------------------------------------------------------------------------------
def test_values_of_different_kinds_are_never_compared_ranked_or_first(make_bundle):
    x = torch.randn(8, 8)
    acc = (x * 100).to(torch.int32)                 # an int8 kernel's accumulator
    ref = make_bundle([("input.0", x, {"kind": "model_input"}), ("m/matmul.0", x @ x, {"module": "m"}),
                       ("m/relu.0", torch.relu(x @ x), {"module": "m"})])
    cand = make_bundle([("input.0", x, {"kind": "model_input"}), ("m/matmul.0", acc, {"module": "m"}),
                        ("m/relu.0", torch.relu(x @ x) * 1.5, {"module": "m"})])
    r = tp.diff(ref, cand)
    bad = r.get("m/matmul.0")
    assert bad.status == "not_comparable" and "int32" in bad.reasons[0] and bad.passed
    assert r.first_divergence == "m/relu.0" and r.counts()["not_comparable"] == 1
    assert all(a.name != "m/matmul.0" for a in r.amplifiers)


def test_integers_compare_exactly(make_bundle):
    n = torch.arange(10)
    r = tp.diff(make_bundle([("lengths", n)]), make_bundle([("lengths", n + (n == 3))]))
    p = r.get("lengths")
    assert p.method == "exact" and p.failed and p.metrics["mismatches"] == 1


def test_nothing_compared_element_wise_is_said_first_and_never_asserted_as_parity(make_bundle, tmp_path):
    """Bundles with statistics only (a port's summary dump): no divergence found is not a match."""
    from tensorprobe.bundle import BundleWriter
    from tensorprobe.record import Record
    from tensorprobe.stats import compute_stats

    paths = []
    for k in range(2):
        with BundleWriter(tmp_path / f"s{k}") as w:
            for i, name in enumerate(["a", "b"]):
                t = torch.linspace(0, 1 + i, 100)
                w.add(Record(name=name, module=name, op="tensor", order=i, shape=(100,), dtype="float32",
                             stats=compute_stats(t)))
        paths.append(tmp_path / f"s{k}")
    r = tp.diff(*paths)
    assert r.verdict == "consistent" and r.summary.startswith("No divergence found, but nothing was compared")
    with pytest.raises(AssertionError, match="can't be asserted: nothing was compared element-wise"):
        assert_parity(*paths)


# ---- ops of pre-hooks and parametrizations belong to their module ------------------------------------------
def test_weight_norm_ops_belong_to_the_module_and_link_to_its_parameters():
    model = nn.Sequential(nn.utils.weight_norm(nn.Conv1d(2, 3, 3)))
    b = tp.capture(model, torch.randn(1, 2, 8), level="op")
    wn = b["0/_weight_norm_interface.0:0"]
    assert wn.module == "0" and set(wn.inputs) == {"0.weight_v", "0.weight_g"}
    assert "0/_weight_norm_interface.0:0" in b["0/convolution.0"].inputs
    assert b["0.weight"].kind == "param" and "derived" in b["0.weight"].tags


def test_parametrized_weight_is_recorded_as_derived_and_its_ops_stay_inside_the_module():
    model = nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Linear(4, 4)))
    b = tp.capture(model, torch.randn(2, 4), level="op")
    assert b["0.weight"].kind == "param" and "derived" in b["0.weight"].tags
    assert {"0.parametrizations.weight.original0", "0.parametrizations.weight.original1"} <= {r.name for r in b}
    ops = [r for r in b if r.kind == "output" and "norm" in r.op]
    assert ops and all(r.module.startswith("0") for r in ops)


# ---- the model's outputs are records ------------------------------------------------------------------------
@dataclasses.dataclass
class Out:
    wav: torch.Tensor
    info: dict


class Structured(nn.Module):
    def forward(self, x):
        return Out(wav=x * 2, info={"n": torch.tensor(3), "spec": (x.abs(), "text")})


def test_every_tensor_the_forward_returns_is_a_model_output_named_by_its_path():
    b = tp.capture(Structured(), torch.randn(3))
    outs = [r.name for r in b if r.kind == "model_output"]
    assert outs == ["output.wav", "output.info.n", "output.info.spec.0"]
    assert all(b[n].has_tensor for n in outs)   # kept whatever `keep` is: diff compares them element-wise


def test_an_integer_bookkeeping_output_is_not_taken_for_the_output(tmp_path):
    """The last op of VitsModel's forward is an int64 sample count; the report's output is the waveform."""
    m = Structured()
    x = torch.randn(3)
    ref = tp.capture(m, x, level="op", keep="full", out=tmp_path / "r")
    r = tp.diff(ref, tp.capture(m, x * 1.01, level="op", keep="full", out=tmp_path / "c"))
    assert r.get("output.info.n").method == "exact" and r.get("output.info.n").passed
    assert r.output == "output.wav" and r.get("output.wav").failed


# ---- the numerics environment and the noise rule ------------------------------------------------------------
def test_bundles_record_the_numerics_environment(tmp_path):
    b = tp.capture(nn.Linear(2, 2), torch.randn(1, 2), out=tmp_path / "b")
    env = tp.open_bundle(tmp_path / "b").manifest["environment"]
    assert env["device"] == "cpu" and env["dtypes"] == ["float32"] and set(env["tf32"]) == {"matmul", "cudnn"}
    assert env["torch"] == torch.__version__ and env["threads"] == torch.get_num_threads() and b is not None


def test_tf32_is_noise_when_the_environment_says_so_and_a_divergence_when_it_does_not(tmp_path):
    model, (x,) = ports.transformer()
    ref = tp.capture(model, x, level="op", keep="full", out=tmp_path / "ref")
    with tf32():
        declared = tp.capture(model, x, level="op", keep="full", out=tmp_path / "tf32")
    r = tp.diff(ref, declared)
    assert r.verdict == "match" and "TF32" in " ".join(r.environment_notes)
    assert 1e-4 < r.get(r.worst).rel_err < 1e-2          # TF32 rounding is there, and judged as such
    from tensorprobe.emulate import _MATMUL_OPS, _RoundOperands
    with _RoundOperands(_MATMUL_OPS):                    # the same rounding, recorded nowhere
        hidden = tp.capture(model, x, level="op", keep="full", out=tmp_path / "hidden")
    r = tp.diff(ref, hidden)
    first = r.get(r.first_divergence)
    # attention runs as one fused op that the matmul rounding does not reach: the first rounded op is linear1
    assert r.verdict == "diverged" and first.module == "layers.0.linear1" and first.cause == "own", r.summary


def test_degenerate_stft_phase_is_named_as_the_amplifier_of_rounding(tmp_path):
    """The stable decoder's harmonic source is a constant: its STFT bins are ~0, and their phase is decided by
    rounding. float64 against float32 diverges there, and only there: nothing adds error of its own."""
    model, inputs = kokoro.decoder(0.1)
    ref = tp.capture(model, *inputs, level="op", keep="full", out=tmp_path / "f32")
    m64 = kokoro.build_decoder().double()
    cand = tp.capture(m64, *(t.double() for t in inputs), level="op", keep="full", out=tmp_path / "f64",
                      replay_rng=ref)
    r = tp.diff(ref, cand)
    first = r.get(r.first_divergence)
    assert first.name == "generator/angle.0" and first.cause == "amplified", r.summary
    assert "values near zero" in first.explanation
    assert not any(p.cause == "own" for p in r.pairs)


def test_random_draws_that_differ_are_reported_even_when_harmless(tmp_path):
    """Unreplayed noise that the model multiplies by zero: reported, and not a divergence of the outputs."""
    model, inputs = kokoro.decoder(0.1)
    torch.manual_seed(1)
    ref = tp.capture(model, *inputs, out=tmp_path / "a")
    torch.manual_seed(2)
    r = tp.diff(ref, tp.capture(model, *inputs, out=tmp_path / "b"))
    assert len(r.rng_differs) >= 3 and r.verdict == "match", r.summary
    assert "drew different noise; it does not reach the outputs" in r.summary


# ---- explanations -------------------------------------------------------------------------------------------
def test_phase_accumulation_is_explained_with_the_phase_it_reaches(tmp_path):
    from .test_diff_findings import SineModel

    m = SineModel().eval()
    f0 = torch.full((1, 1, 24000), 220.0)
    ref = tp.capture(m, f0, level="op", keep="full", out=tmp_path / "ref")
    r = tp.diff(ref, tp.capture(m, f0 * 1.001, level="op", keep="full", out=tmp_path / "cand"))
    amp = r.strongest_amplifier
    assert amp.name == "src/sin.0" and "phase accumulation" in amp.explanation
    phase = tp.open_bundle(tmp_path / "ref")["src/cumsum.0"].stats.absmax
    # 0.1% of 1,380 rad is 1.4 rad of phase error: the waveform's phase is effectively random
    assert f"{phase:.3g} rad" in amp.explanation and "effectively random" in amp.explanation


class DivNearZero(nn.Module):
    def forward(self, x, d):
        return x / d


def test_division_by_values_near_zero_is_explained(tmp_path):
    x, d = torch.randn(1000), torch.linspace(-1, 1, 1000)
    ref = tp.capture(DivNearZero(), x, d, level="op", keep="full", out=tmp_path / "r")
    cand = tp.capture(DivNearZero(), x, d + 1e-6, level="op", keep="full", out=tmp_path / "c")
    r = tp.diff(ref, cand, min_snr=60)
    amp = r.strongest_amplifier
    assert amp.name == "<root>/div.0" and "division by values near zero" in amp.explanation
    assert "crosses zero" in amp.explanation


# ---- storage details the comparison relies on ---------------------------------------------------------------
def test_float64_capture_keeps_complex128_values(tmp_path):
    class Spec(nn.Module):
        def forward(self, x):
            return torch.fft.rfft(x).abs()

    x = torch.randn(64, dtype=torch.float64)
    tp.capture(Spec().double(), x, level="op", keep="full", out=tmp_path / "b")
    z = tp.open_bundle(tmp_path / "b").tensor("<root>/_fft_r2c.0")
    assert z.dtype == torch.complex128 and torch.equal(z, torch.fft.rfft(x))


def test_replay_casts_float32_noise_for_a_float64_run(tmp_path):
    class Noisy(nn.Module):
        def forward(self, x):
            return x + torch.randn_like(x)

    x = torch.randn(5)
    ref = tp.capture(Noisy(), x, level="op", keep="full", out=tmp_path / "r")
    cand = tp.capture(Noisy(), x.double(), level="op", keep="full", out=tmp_path / "c", replay_rng=ref)
    assert torch.allclose(cand.tensor("output").float(), ref.tensor("output"))


def test_a_non_finite_weight_in_a_bundle_is_blamed_on_the_weights(tmp_path):
    lin = nn.Linear(4, 4)
    with torch.no_grad():
        lin.weight[1, 2] = math.nan
    origin = tp.find_nonfinite_in_bundle(tp.capture(lin, torch.randn(2, 4), out=tmp_path / "b"))
    assert origin.cause == "parameter" and origin.record == "weight"
