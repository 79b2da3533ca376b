"""Backward NaN origin: forward-finite, backward-NaN faults planted in a small mel predictor and in its loss,
each found at the right op and module with the right diagnosis; the clean step reported clean; the answer
checked against torch.autograd.detect_anomaly, which names the same backward function."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tensorprobe.examples.training import Energy, MelPredictor, SafeEnergy, SegmentNorm, batch, mse_to
from tensorprobe.nan.backward import find_first_nonfinite_backward


def _batch():
    return batch()


def _mse(target):
    return mse_to(target)


def test_sqrt_in_a_where_selected_away_branch_is_found_with_the_frames_and_the_double_where_fix():
    inputs, target = _batch()
    model = MelPredictor(energy=Energy())
    assert torch.isfinite(_mse(target)(model(*inputs)))                  # forward and loss are finite
    o = find_first_nonfinite_backward(model, inputs, _mse(target))
    assert o.found and o.direction == "backward"
    assert o.backward_op == "SqrtBackward0" and o.op == "aten.sqrt.default" and o.module == "energy"
    assert o.record == "energy/sqrt.0" and o.masked
    assert "batch rows 1" in o.elements and "15 of 40 frames: 25, 26" in o.elements
    assert any("double-where" in d for d in o.diagnosis)
    assert "encoder.weight" in o.reaches and "decoder.weight" not in o.reaches   # upstream of energy only
    assert "examples/training.py" in o.source


def test_the_same_model_with_the_double_where_fix_is_clean_and_grads_are_restored():
    inputs, target = _batch()
    model = MelPredictor(energy=SafeEnergy())
    model.encoder.weight.grad = torch.full_like(model.encoder.weight, 7.0)
    o = find_first_nonfinite_backward(model, inputs, _mse(target))
    assert not o.found and o.ops_checked > 10 and "No NaN or Inf in the backward pass" in o.headline()
    assert torch.equal(model.encoder.weight.grad, torch.full_like(model.encoder.weight, 7.0))
    assert model.decoder.weight.grad is None


def test_hand_written_std_of_a_constant_segment_is_named_with_the_fix():
    inputs, target = _batch()
    model = MelPredictor(norm=SegmentNorm())
    inputs = (inputs[0], torch.ones_like(inputs[1]))
    inputs[0][0, :, :] = 0.0                     # an all-silent utterance: the encoder's output is its bias
    o = find_first_nonfinite_backward(model, inputs, _mse(target))
    assert o.found and o.backward_op == "SqrtBackward0" and o.module == "norm" and o.record == "norm/sqrt.0"
    # the zero variances of row 0 (the silent utterance): channels whose mean rounds exactly to the bias
    assert o.elements.split("; ")[1] == "batch rows 0"
    assert any("constant segment" in d and "F.layer_norm" in d for d in o.diagnosis)
    assert "encoder.weight" in o.reaches


def test_log_in_the_loss_is_found_in_the_loss():
    inputs, target = _batch()
    model = MelPredictor()
    voiced = inputs[1]

    def loss(mel):       # a log-magnitude loss on voiced frames, computed everywhere then masked
        mag = mel.abs() * voiced                  # silent frames are exactly 0
        log_mag = torch.where(voiced, torch.log(mag), torch.zeros_like(mag))
        return log_mag.mean()

    assert torch.isfinite(loss(model(*inputs)))
    o = find_first_nonfinite_backward(model, inputs, loss)
    assert o.found and o.direction == "backward" and o.module == "loss" and o.record == "loss/log.0"
    assert o.backward_op == "LogBackward0" and o.masked and any("double-where" in d for d in o.diagnosis)
    assert "decoder.weight" in o.reaches
    assert "loss/log.0" in o.note               # its -inf forward value was masked too


def test_a_nan_masked_before_any_parameter_is_reported_as_masked():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.sqrt(F.relu(self.lin(x)))   # sqrt at 0 where relu clips; relu's backward zeros it

    o = find_first_nonfinite_backward(Model(), (torch.randn(8, 4),), lambda y: y.sum())
    assert o.found and o.backward_op == "SqrtBackward0" and o.reaches == ()
    assert any("masks it" in d for d in o.diagnosis)


def test_a_forward_nan_is_reported_as_forward():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return torch.log(self.lin(x) - 100.0)

    o = find_first_nonfinite_backward(Model(), (torch.randn(3, 4),), lambda y: y.sum())
    assert o.found and o.direction == "forward" and o.op == "aten.log.default"
    assert any("not a backward NaN" in d for d in o.diagnosis)


def test_agrees_with_detect_anomaly_on_the_backward_function():
    inputs, target = _batch()
    model = MelPredictor(energy=Energy())
    with pytest.raises(RuntimeError, match="SqrtBackward0"), torch.autograd.detect_anomaly(check_nan=True):
        _mse(target)(model(*inputs)).backward()
    model.zero_grad(set_to_none=True)
    assert find_first_nonfinite_backward(model, inputs, _mse(target)).backward_op == "SqrtBackward0"


def test_bad_input_is_a_clear_error():
    from tensorprobe.errors import InputError

    with pytest.raises(InputError, match="scalar"):
        find_first_nonfinite_backward(MelPredictor(), _batch()[0], lambda mel: mel)
    with pytest.raises(InputError, match="loss function"):
        find_first_nonfinite_backward(MelPredictor(), _batch()[0], None)


def test_gradient_overflow_in_float16_is_named_as_overflow():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x) * 1000.0

    model = Model().half()
    # a GradScaler-like scale of 2^15: the loss's gradient fits float16, times 1000 it does not
    o = find_first_nonfinite_backward(model, (torch.randn(8, 4).half(),), lambda y: y.float().sum() * 32768.0)
    assert o.found and o.direction == "backward" and o.backward_op == "MulBackward0" and o.op == "aten.mul.Tensor"
    assert o.output.stats.nan == 0 and o.output.stats.posinf + o.output.stats.neginf == 32
    assert any("overflows float16" in d and "GradScaler" in d for d in o.diagnosis)
    assert set(o.reaches) == {"lin.weight", "lin.bias"}


def test_cli_backward_names_the_op_and_exits_1_and_0_on_the_fixed_step(tmp_path):
    import json
    import subprocess
    import sys

    run = [sys.executable, "-m", "tensorprobe", "nan", "--backward", "--json"]
    bad = subprocess.run(run + ["tensorprobe.examples.training:masked_energy_step"], capture_output=True, text=True)
    doc = json.loads(bad.stdout)
    assert bad.returncode == 1 and doc["origin"]["record"] == "energy/sqrt.0" and doc["origin"]["masked"]
    good = subprocess.run(run + ["tensorprobe.examples.training:fixed_energy_step"], capture_output=True, text=True)
    assert good.returncode == 0 and not json.loads(good.stdout)["origin"]["found"]
    (tmp_path / "t.py").write_text("import torch\ndef step():\n    return torch.nn.Linear(2, 2), (torch.ones(1, 2),)\n")
    wrong = subprocess.run(run[:-1] + [f"{tmp_path / 't.py'}:step"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "(model, inputs, loss_fn)" in wrong.stderr and "Traceback" not in wrong.stderr
    text = subprocess.run(run[:-1] + ["tensorprobe.examples.training:masked_energy_step"], capture_output=True,
                          text=True).stdout
    assert "SqrtBackward0" in text and "double-where" in text and "15 of 40 frames" in text


@pytest.mark.slow
def test_kokoro_decoder_under_a_spectral_loss_over_padding_names_the_losss_sqrt():
    """A model we did not write (Kokoro's decoder) and a loss as vocoder trainers write it: the NaN is born in
    the loss's √(re² + im²) at the padded bins (+∞ there, NaN one op later), forward and loss finite; the
    same backward function detect_anomaly names, plus the module, elements and the parameters it reaches."""
    pytest.importorskip("kokoro")
    from tensorprobe.examples.training import kokoro_decoder_step

    model, inputs, loss_fn = kokoro_decoder_step(seconds=0.3)
    o = find_first_nonfinite_backward(model, inputs, loss_fn)
    assert o.found and o.direction == "backward" and o.record == "loss/sqrt.0" and o.backward_op == "SqrtBackward0"
    assert o.output.stats.posinf + o.output.stats.neginf > 0 and o.output.stats.nan == 0 and not o.masked
    # the padded frames, and only they: 30% of the STFT frames at the end
    frames = int(o.elements.split(" of ")[-2].split("; ")[-1])
    assert o.elements.endswith("(81–112)") and frames == 32
    assert any("clamp_min" in d for d in o.diagnosis)
    assert "generator.conv_post.weight_v" in o.reaches and "encode.conv1.weight_v" in o.reaches
    # detect_anomaly checks for NaN only: it names the op after the origin, where the +Inf turns into NaN
    with pytest.raises(RuntimeError, match="PowBackward0"), torch.autograd.detect_anomaly(check_nan=True):
        loss_fn(model(*inputs)).backward()


def test_stopping_at_the_origin_names_the_same_op_and_where_the_gradient_can_flow():
    inputs, target = _batch()
    model = MelPredictor(energy=Energy())
    full = find_first_nonfinite_backward(model, inputs, _mse(target))
    fast = find_first_nonfinite_backward(model, inputs, _mse(target), full=False)
    assert (fast.record, fast.backward_op, fast.elements) == (full.record, full.backward_op, full.elements)
    assert fast.ops_checked < full.ops_checked and set(fast.reaches) == {"encoder.weight", "encoder.bias"}
    assert any("was not checked" in d for d in fast.diagnosis)
