"""The top-level module is a module, not the loss (issue 32 item 2).

An op in the root module's own `forward` is "in the model's own forward (Class.forward, file:line)"; "the
loss" is only what runs inside `loss_fn`. Two architectures: the Silero VAD (tensorprobe.examples.silero),
whose own forward takes the STFT magnitude with a `sqrt` (a silent frame is 0 there: an infinite derivative),
and a small GRU pitch tracker whose own forward takes a frame's RMS energy. Each has its twins: the same sqrt
in a child module (named by its path), the same step on a non-silent frame (no NaN at all), and a NaN truly
born in the loss function (an RMSE of a batch already fitted: sqrt of 0), also when the model holds a
submodule named `loss`.
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn as nn

from tensorprobe.examples.silero import SileroVAD
from tensorprobe.nan import find_first_nonfinite
from tensorprobe.nan.backward import find_first_nonfinite_backward


class Magnitude(nn.Module):
    """The VAD's STFT magnitude, moved into a child module (the same ops, another owner)."""

    def __init__(self, cutoff: int):
        super().__init__()
        self.cutoff = cutoff

    def forward(self, x):
        return (x[:, :self.cutoff] ** 2 + x[:, self.cutoff:] ** 2).sqrt()


class ChildMagnitudeVAD(SileroVAD):
    """SileroVAD with its magnitude in `self.mag`: everything else as the original forward."""

    def __init__(self):
        super().__init__()
        self.mag = Magnitude(self.cutoff)

    def forward(self, x, state):
        x = nn.functional.pad(x, (0, self.pad), mode="reflect").unsqueeze(1)
        x = self.mag(self.stft_conv(x))
        x = self.conv4(self.conv3(self.conv2(self.conv1(x).relu()).relu()).relu()).relu().squeeze(-1)
        h, c = self.lstm_cell(x, (state[0], state[1]))
        x = self.final_conv(h.unsqueeze(-1).relu()).sigmoid()
        return x.squeeze(1).mean(dim=1, keepdim=True), torch.stack([h, c])


class Energy(nn.Module):
    def forward(self, frames):
        return frames.pow(2).mean(-1, keepdim=True).sqrt()


class GruPitch(nn.Module):
    """Frames -> projection -> its RMS energy (own code, or a child `energy`) concatenated to it -> GRU -> pitch logits."""

    def __init__(self, child: bool = False):
        super().__init__()
        self.proj = nn.Linear(16, 16, bias=False)  # a silent frame stays 0 through it
        self.energy = Energy() if child else None
        self.gru = nn.GRU(17, 16, batch_first=True)
        self.head = nn.Linear(16, 8)

    def forward(self, frames):                     # (batch, time, 16)
        h = self.proj(frames)
        if self.energy is not None:
            rms = self.energy(h)
        else:
            rms = h.pow(2).mean(-1, keepdim=True).sqrt()
        y, _ = self.gru(torch.cat([h, rms], -1))
        return self.head(y)


def _vad(model_cls, silent: bool):
    torch.manual_seed(0)
    model = model_cls()
    frame = torch.zeros(2, 512) if silent else 0.1 * torch.randn(2, 512)
    return model, (frame, torch.zeros(2, 2, 128))


def _pitch(child: bool, silent: bool):
    torch.manual_seed(0)
    model = GruPitch(child)
    frames = 0.1 * torch.randn(2, 6, 16)
    if silent:
        frames[1, 2:4] = 0                        # two silent frames in the second clip
    return model, (frames,)


def _sum_loss(out):
    return (out[0] if isinstance(out, tuple) else out).sum()


def _line_of(cls, text: str) -> int:
    lines, start = inspect.getsourcelines(cls.forward)
    return start + next(i for i, line in enumerate(lines) if text in line)


CASES = [
    pytest.param(lambda s: _vad(SileroVAD, s), lambda s: _vad(ChildMagnitudeVAD, s), SileroVAD, ").sqrt()",
                 "mag", id="silero-vad"),
    pytest.param(lambda s: _pitch(False, s), lambda s: _pitch(True, s), GruPitch, "keepdim=True).sqrt()",
                 "energy", id="gru-pitch"),
]


@pytest.mark.parametrize("root_case, child_case, cls, text, child", CASES)
def test_a_sqrt_in_the_roots_own_forward_is_the_models_own_forward_never_the_loss(root_case, child_case, cls, text,
                                                                                  child):
    model, inputs = root_case(True)
    o = find_first_nonfinite_backward(model, inputs, _sum_loss)
    assert o.found and o.direction == "backward" and o.backward_op == "SqrtBackward0"
    assert o.record == "<root>/sqrt.0" and o.module == "" and not o.in_loss
    line = _line_of(cls, text)
    where = f"in the model's own forward ({cls.__name__}.forward, {inspect.getsourcefile(cls)}:{line})"
    assert where in o.headline(), o.headline()
    assert "the loss" not in o.headline().split("forward and loss finite")[0]
    assert o.to_dict()["in_loss"] is False


@pytest.mark.parametrize("root_case, child_case, cls, text, child", CASES)
def test_its_twin_with_the_sqrt_in_a_child_names_the_child(root_case, child_case, cls, text, child):
    model, inputs = child_case(True)
    o = find_first_nonfinite_backward(model, inputs, _sum_loss)
    assert o.found and o.record == f"{child}/sqrt.0" and not o.in_loss
    assert f"of aten.sqrt.default in {child} ({child}/sqrt.0)" in o.headline()
    assert "model's own forward" not in o.headline() and "the loss" not in o.headline().split("forward and")[0]


@pytest.mark.parametrize("root_case, child_case, cls, text, child", CASES)
def test_the_same_step_without_silence_is_clean(root_case, child_case, cls, text, child):
    for case in (root_case, child_case):
        model, inputs = case(False)
        o = find_first_nonfinite_backward(model, inputs, _sum_loss)
        assert not o.found, o.headline()


def rmse_to(target):
    def rmse(out):
        y = out[0] if isinstance(out, tuple) else out
        return (y - target).pow(2).mean().sqrt()
    return rmse


@pytest.mark.parametrize("root_case, child_case, cls, text, child", CASES)
def test_a_nan_truly_born_in_the_loss_function_is_the_loss(root_case, child_case, cls, text, child):
    model, inputs = root_case(False)                       # the model's own sqrt is away from 0 here
    with torch.no_grad():
        out = model(*inputs)
    target = (out[0] if isinstance(out, tuple) else out).clone()   # a batch already fitted: RMSE = sqrt(0)
    o = find_first_nonfinite_backward(model, inputs, rmse_to(target))
    assert o.found and o.in_loss and o.record == "loss/sqrt.0" and o.module == "loss"
    assert "of aten.sqrt.default in the loss (rmse) (loss/sqrt.0)" in o.headline()
    assert "model's own forward" not in o.headline()


def test_a_model_holding_a_submodule_named_loss_keeps_it_apart_from_the_loss_function():
    class WithCriterion(GruPitch):
        def __init__(self):
            super().__init__(child=False)
            self.loss = Energy()                           # a child called `loss`, used in the forward

        def forward(self, frames):
            return super().forward(frames) * self.loss(frames)

    torch.manual_seed(0)
    model = WithCriterion()
    frames = 0.1 * torch.randn(2, 6, 16)
    frames[0, 1] = 0                                       # the child `loss`'s sqrt at 0: the model, not the loss
    o = find_first_nonfinite_backward(model, (frames,), _sum_loss)
    assert o.found and not o.in_loss and o.module in ("", "loss")
    assert "in the loss" not in o.headline()
    frames = 0.1 * torch.randn(2, 6, 16)
    with torch.no_grad():
        target = model(frames).clone()
    o = find_first_nonfinite_backward(model, (frames,), rmse_to(target))
    assert o.found and o.in_loss and o.record == "<loss>/sqrt.0"
    assert "in the loss (rmse) (<loss>/sqrt.0)" in o.headline()


def test_a_forward_nan_in_the_roots_own_code_is_the_models_own_forward():
    _, (frames,) = _pitch(False, False)

    class NegEnergy(GruPitch):
        def forward(self, frames):
            return torch.sqrt(super().forward(frames))     # logits < 0 somewhere: NaN born here

    torch.manual_seed(0)
    m = NegEnergy()
    o = find_first_nonfinite(m, frames)
    assert o.found and o.module == ""
    line = _line_of(NegEnergy, "torch.sqrt(super()")
    assert f"in the model's own forward (NegEnergy.forward, {__file__}:{line})" in o.headline(), o.headline()
