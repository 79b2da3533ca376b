"""`diff`'s verdicts on real ports of three architectures, none built to pass (`ports.py` makes them).

For each: the fp32 ONNX model against its `quantize_dynamic` and static QDQ int8 versions and its float16
conversion (onnxruntime's own tools), weight-conversion bugs (a transposed linear, a scaled conv, a wrong
norm epsilon), and float64 against float32. Each test asserts the verdict, where and why it diverges, and
that no pair of incomparable values is ranked (first divergence or amplifier).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import tensorprobe as tp

from . import ports
from .ports import assert_nothing_incomparable_ranked

needs_ort = pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None, reason="needs the [onnx] extra")


@pytest.fixture(scope="module")
def onnx_ports(tmp_path_factory):
    built: dict[str, ports.OnnxPorts] = {}

    def get(name: str) -> ports.OnnxPorts:
        if name not in built:
            built[name] = ports.onnx_ports(name, tmp_path_factory.mktemp(name))
        return built[name]
    return get


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("torch_ports")


# ---- int8 and float16 ports made by onnxruntime's tools ------------------------------------------------
FIRST_QUANTIZED = {"transformer": "layers.0.self_attn", "convlstm": "conv1", "decoder": "F0_conv"}


def _int8_verdict(r, arch: str) -> str:
    """A faithful int8 port is judged by its outputs (SNR >= 20 dB, correlation >= 0.99): a match when they meet it,
    diverged when not. The Kokoro decoder's waveform never does (its sine source's phase moves); the others do."""
    outs = [r.get(n) for n in r.outputs]
    meets = all(o.metric("snr_db") >= 20 and o.metric("pearson") >= 0.99 for o in outs)
    assert meets is (arch != "decoder"), [(o.name, o.metric("snr_db"), o.metric("pearson")) for o in outs]
    return "match" if meets else "diverged"


@needs_ort
@pytest.mark.onnx
@pytest.mark.parametrize("arch", ["transformer", "convlstm", "decoder"])
def test_int8_dynamic_port_diverges_by_quantization_at_its_first_quantized_op(onnx_ports, arch):
    p = onnx_ports(arch)
    r = tp.diff(p.fp32, p.int8_dynamic)
    first = r.get(r.first_divergence)
    assert r.verdict == _int8_verdict(r, arch) and first.cause == "quantized", r.summary
    assert first.module == FIRST_QUANTIZED[arch], r.summary
    # pairing by ONNX value name puts the float value that stands for each original output (the rescale after
    # MatMulInteger/ConvInteger) against the reference: never the int32 accumulator
    assert not any(p.cand_dtype.startswith("int") and p.dtype.startswith("float") for p in r.pairs if p.compared)
    assert any(any(t.startswith("dequantized") for t in w.tags) for w in r.weights)  # weights dequantized
    assert not r.weights_differ        # within one quantisation step of the fp32 weights
    assert "int8 port" in r.summary or "quantized port" in r.summary
    assert_nothing_incomparable_ranked(r)


@needs_ort
@pytest.mark.onnx
@pytest.mark.parametrize("arch", ["transformer", "convlstm", "decoder"])
def test_int8_qdq_port_diverges_by_quantization(onnx_ports, arch):
    p = onnx_ports(arch)
    r = tp.diff(p.fp32, p.int8_qdq)
    first = r.get(r.first_divergence)
    assert r.verdict == _int8_verdict(r, arch) and first.cause == "quantized", r.summary
    # QDQ: the DequantizeLinear after a QuantizeLinear of v stands for v
    assert sum("stands_for:" in " ".join(q.tags) for q in r.pairs) > 5
    assert not r.weights_differ
    assert_nothing_incomparable_ranked(r)


@needs_ort
@pytest.mark.onnx
@pytest.mark.parametrize("arch", ["transformer", "convlstm"])
def test_float16_conversion_matches_within_float16_rounding(onnx_ports, arch):
    p = onnx_ports(arch)
    r = tp.diff(p.fp32, p.fp16)
    assert r.verdict == "match", r.summary
    assert {q.cand_dtype for q in r.pairs if q.compared and q.kind == "output"} >= {"float16"}
    worst = r.get(r.worst)
    assert 1e-5 < worst.rel_err < 1e-2   # float16 rounding is visible, and judged as such
    assert_nothing_incomparable_ranked(r)


@needs_ort
@pytest.mark.onnx
def test_float16_decoder_diverges_by_phase_accumulation(onnx_ports):
    """The decoder's harmonic source accumulates phase to ~1,000 rad: float16 keeps ~0.15 rad of it."""
    p = onnx_ports("decoder")
    r = tp.diff(p.fp32, p.fp16)
    first = r.get(r.first_divergence)
    assert r.verdict == "diverged" and first.op == "Sin" and first.cause == "amplified", r.summary
    assert "phase accumulation" in first.explanation and "rad" in first.explanation
    assert_nothing_incomparable_ranked(r)


# ---- weight-conversion bugs in PyTorch ports -------------------------------------------------------------
BUGS = {
    "transposed linear": ("transformer", lambda m: ports.transposed_linear(m, "layers.2.self_attn.out_proj"),
                          "layers.2.self_attn", "layers.2.self_attn.out_proj.weight"),
    "scaled linear": ("transformer", lambda m: ports.scaled_weight(m, "layers.1.linear1"),
                      "layers.1.linear1", "layers.1.linear1.weight"),
    "scaled conv": ("convlstm", lambda m: ports.scaled_weight(m, "conv2"), "conv2", "conv2.weight"),
    "scaled decoder conv": ("decoder", lambda m: ports.scaled_weight(m, "decode.1.conv1"), "decode.1.conv1",
                            "decode.1.conv1.weight"),
    "2% attention projection": ("vits", lambda m: ports.scaled_weight(
        m, "text_encoder.encoder.layers.1.attention.k_proj", factor=1.02),
        "text_encoder.encoder.layers.1.attention.k_proj", "text_encoder.encoder.layers.1.attention.k_proj.weight"),
}


@pytest.mark.parametrize("level", ["op", "module"])
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_weight_conversion_bug_is_found_at_its_weight_and_where_it_is_used(root, bug, level):
    arch, make, module, weight = BUGS[bug]
    r = tp.diff(*ports.capture_pair(arch, root, make, level=level))
    first = r.get(r.first_divergence)
    assert r.verdict == "diverged" and [w.name for w in r.weights_differ] == [weight]
    assert first.module == module and first.cause == "weights" and first.origin == weight, r.summary
    assert f"Weights differ: {weight}" in r.summary and "is where it is used" in r.summary
    assert_nothing_incomparable_ranked(r)


@pytest.mark.parametrize("arch, norm", [("convlstm", "norm1"), ("decoder", "generator.resblocks.0.adain1.1.norm")])
def test_wrong_norm_eps_is_an_error_of_its_own_at_the_norm(root, arch, norm):
    r = tp.diff(*ports.capture_pair(arch, root, lambda m: ports.wrong_eps(m, norm, 1e-2), level="op"))
    first = r.get(r.first_divergence)
    assert r.verdict == "diverged" and not r.weights_differ
    assert first.module == norm and first.cause == "own", r.summary
    assert_nothing_incomparable_ranked(r)


def test_vits_structured_output_is_compared_output_by_output(root):
    """VitsModel returns a ModelOutput (waveform, sequence_lengths, spectrogram): each is a model output, the
    integer lengths compare exactly, and a 2% weight change moves the waveform, by 3.6e-6 only (this small
    model's attention is nearly uniform): less than a float32 port's rounding could, so the output passes
    while the weight is reported and the run diverges."""
    arch, make, *_ = BUGS["2% attention projection"]
    r = tp.diff(*ports.capture_pair(arch, root, make, level="module"))
    assert set(r.outputs) == {"output.waveform", "output.sequence_lengths", "output.spectrogram"}
    assert r.get("output.sequence_lengths").method == "exact" and r.get("output.sequence_lengths").passed
    wave = r.get("output.waveform")
    assert wave.method == "elementwise" and 1e-7 < wave.rel_err < wave.floor and r.output == "output.waveform"
    assert r.verdict == "diverged" and "The error recovers" in r.summary


@pytest.mark.parametrize("arch", ["transformer", "convlstm", "vits"])
@pytest.mark.parametrize("level", ["op", "module"])
def test_float64_against_float32_matches_within_rounding(root, arch, level):
    r = tp.diff(*ports.capture_pair(arch, root, lambda m: m, level=level, cast=torch.float64))
    assert r.verdict == "match", r.summary
    assert r.get(r.worst).rel_err > 1e-9    # the two differ, by rounding only
    assert "different dtypes" in " ".join(r.environment_notes)
    assert_nothing_incomparable_ranked(r)


def test_float64_lstm_decomposition_is_not_paired_with_the_fused_float32_kernel(root):
    """float64 LSTM runs as 6,400 aten ops, float32 as two fused mkldnn_rnn_layer calls: op records inside the
    LSTM can't be paired, and saying "not comparable" beats a shape mismatch or a false divergence."""
    r = tp.diff(*ports.capture_pair("convlstm", root, lambda m: m, level="op", cast=torch.float64))
    assert r.verdict == "match" and r.not_comparable
    assert all(p.module == "lstm" for p in r.not_comparable) and not r.shape_mismatches


def test_float64_decoder_diverges_where_phase_accumulation_amplifies_rounding(root):
    """The voiced source's phase reaches ~1,000 rad in 0.1 s: sin turns float32 rounding of it (6e-8) into
    2.5e-5. Nothing adds error of its own; at this length the output still recovers (at 0.5 s it does not)."""
    r = tp.diff(*ports.capture_pair("decoder", root, lambda m: m, level="op", cast=torch.float64))
    first = r.get(r.first_divergence)
    assert r.verdict == "diverged" and first.cause == "amplified" and first.op == "aten.sin.default", r.summary
    assert "phase accumulation" in first.explanation and "982 rad" in first.explanation
    assert not any(p.cause == "own" for p in r.pairs) and r.output_persists is False


@needs_ort
@pytest.mark.onnx
def test_compare_onnxruntime_names_the_normalisation_that_amplifies_rounding(tmp_path):
    """ONNX Runtime against PyTorch on the shipped exportable decoder (unvoiced): the output differs (about
    30 dB) with no bug anywhere: an instance norm of channels below its epsilon amplifies rounding by ~1e9."""
    from tensorprobe.examples import kokoro

    res = tp.compare(kokoro.exportable_decoder(), kokoro.decoder_inputs(0.5), "onnxruntime", out=tmp_path)
    r = res.diff
    first = r.get(r.first_divergence)
    assert res.finding and r.verdict == "diverged" and r.get("output").failed
    assert first.name.startswith("generator.noise_res.") and first.cause == "amplified", r.summary
    assert "near-constant channels" in first.explanation
    assert not any(p.cause == "own" for p in r.pairs), [p.name for p in r.pairs if p.cause == "own"]
    assert "different runtimes" in " ".join(r.environment_notes)
