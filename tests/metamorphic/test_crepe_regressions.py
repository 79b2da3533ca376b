"""CREPE (real weights): cases where tensorprobe answered wrong before the verdicts of issue 27 were fixed; each
comment says the wrong answer it gave."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorprobe as tp
from tensorprobe.examples import crepe

from .test_crepe import (CONVS, LEVELS, RootClassifier, frames, negative_variance, reference,  # noqa: F401
                         tiny, workdir)
from .variants import capture_in, first_cause, output_pair, with_scaled_output

SLOW_EXAMPLES = settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _export(model, frames, path, fp16=False):
    pytest.importorskip("onnxruntime", reason="needs the onnx extra")
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from tensorprobe.runtimes.onnxruntime import export_onnx

    export_onnx(model, frames, path)
    if fp16:
        onnx.save(convert_float_to_float16(onnx.load(str(path)), keep_io_types=True), str(path))
    return path


# Was wrong: `compare` says "onnxruntime matches PyTorch" for an ONNX file whose output is 1% off (SNR
# 40 dB): the output's noise floor is 0.0166 relative (the sigmoid's lower tail and the classifier's cancellation
# propagated into a floor 16,000x float32's roundoff). It diverges only from eps ~0.02 on.
@SLOW_EXAMPLES
@given(st.floats(min_value=1e-3, max_value=0.5))
def test_compare_never_calls_a_scaled_onnx_output_a_match(workdir, frames, eps):
    path = _export(with_scaled_output(tiny(), 1 + eps), frames, workdir / f"scaled-{eps}.onnx")
    result = tp.compare(tiny(), frames, "onnxruntime", artifact=path)
    assert result.finding and result.diff.verdict == "diverged", result.summary


# Was wrong: at module level (default capture) a kernel reversed in time is found at the right conv, and the
# summary says "Weights differ: convN.weight (... a transpose or a permutation?)", but the pair's cause is `own`
# with origin `convN`, not `weights` (the op-level capture says `weights`).
@pytest.mark.parametrize("layer", CONVS)
def test_a_reversed_kernel_has_cause_weights_at_module_level_too(reference, workdir, frames, layer):
    report = tp.diff(reference["module"], capture_in(workdir / "flipped", layer, crepe.flip_conv_kernel(tiny(), layer),
                                                     frames, **LEVELS["module"]))
    assert first_cause(report) == (layer, "weights", f"{layer}.weight"), report.summary


# Was wrong: `model.half()` with nothing else changed (output SNR 74 dB, the same pitch) is DIVERGED at op
# level: float16 rounding flips a few argmax indices of max_pool2d (an int64 output, read by no forward op), the
# integers are judged exactly, and conv1_BN is blamed with cause `amplified`.
def test_a_float16_model_is_a_match_at_op_level(reference, workdir, frames):
    report = tp.diff(reference["op"], capture_in(workdir / "half", "op", tiny().half(), (frames[0].half(),),
                                                 **LEVELS["op"]))
    assert report.verdict == "match", report.summary


# Was wrong: a float16 port's output floor is ~3e5 relative (op level; 136 at module level), so
# (a) `compare` calls an ORT float16 file whose output is 10% off a MATCH ("relative error 0.1, noise floor 1.4e+02");
# (b) a float16 model with conv3's kernel reversed is diverged at conv3, but "The error recovers: the output passes:
#     output (SNR -0.0 dB, correlation 0.009)".
def test_a_float16_port_with_a_wrong_output_is_not_a_match(workdir, frames):
    path = _export(with_scaled_output(tiny(), 1.1), frames, workdir / "scaled-fp16.onnx", fp16=True)
    result = tp.compare(tiny(), frames, "onnxruntime", artifact=path)
    assert result.finding and result.diff.verdict == "diverged", result.summary


@pytest.mark.parametrize("level", LEVELS)
def test_a_float16_port_with_a_garbage_output_does_not_pass_its_output(reference, workdir, frames, level):
    bug = crepe.flip_conv_kernel(tiny()).half()
    report = tp.diff(reference[level], capture_in(workdir / "half-bug", level, bug, (frames[0].half(),),
                                                  **LEVELS[level]))
    assert output_pair(report).failed, report.summary
    assert "the output passes" not in report.summary


# Was wrong: in a module-level bundle, NaN born in an eval-mode BatchNorm2d whose running_var holds a negative
# value is diagnosed "typically var = E[x²] − E[x]² with cancellation on channels whose mean is large": no variance
# is computed in eval mode; the running variance (a buffer the bundle holds, conv4_BN.running_var) is negative.
def test_a_negative_running_variance_is_not_diagnosed_as_a_one_pass_variance(workdir, frames):
    broken = negative_variance(tiny(), "conv4_BN", 3)
    origin = tp.find_nonfinite_in_bundle(capture_in(workdir / "nan", "module", broken, frames))
    assert origin.module == "conv4_BN"
    text = " ".join(origin.diagnosis)
    assert "E[x²]" not in text and "running_var" in text, text


def test_a_negative_running_variance_is_named_live_and_a_healthy_one_is_not_a_nan(frames):
    assert not tp.find_first_nonfinite(tiny(), *frames).found
    origin = tp.find_first_nonfinite(negative_variance(tiny(), "conv2_BN", 5), *frames)
    assert origin.module == "conv2_BN" and origin.output.stats.nonfinite_channel_idx == (5,)
    assert origin.diagnosis[0].startswith("conv2_BN.running_var holds negative values"), origin.diagnosis


# Was wrong: with the classifier's F.linear moved into the root's forward and its weight 1% off, the module-level
# diff blames `<root>` with cause `own` (the op level says `weights`, origin classifier.weight).
def test_a_weight_read_by_the_roots_own_code_is_the_cause_at_module_level(reference, workdir, frames):
    model = tiny(RootClassifier)
    with torch.no_grad():
        model.classifier.weight.mul_(1.01)
    report = tp.diff(reference["module"], capture_in(workdir / "moved", "module", model, frames))
    assert first_cause(report) == ("<root>", "weights", "classifier.weight"), report.summary

