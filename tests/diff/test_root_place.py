"""diff names an op of the top-level module's own forward as "the model's own forward (Class.forward, file:line)",
never by the bare `<root>` (issue 32 item 2).

Two architectures: the Silero VAD (tensorprobe.examples.silero), whose own forward takes the STFT magnitude,
and a small GRU pitch tracker whose own forward takes a frame's RMS energy. The candidate adds an eps inside
that sqrt. Twins: the same change with the sqrt in a child module (named by its path); the faithful model
against itself (a match); module-level captures (the root's code is unrecorded: what reads it says whose code
made its input).
"""

from __future__ import annotations

import inspect

import pytest
import torch
import torch.nn as nn

import tensorprobe as tp
from tensorprobe.examples.silero import SileroVAD

from ..nan.test_root_is_not_the_loss import ChildMagnitudeVAD, GruPitch, Magnitude


class EpsVAD(SileroVAD):
    """The VAD with an eps inside its own magnitude's sqrt."""

    def forward(self, x, state):
        x = nn.functional.pad(x, (0, self.pad), mode="reflect").unsqueeze(1)
        x = self.stft_conv(x)
        x = (x[:, :self.cutoff] ** 2 + x[:, self.cutoff:] ** 2 + 1e-2).sqrt()
        x = self.conv4(self.conv3(self.conv2(self.conv1(x).relu()).relu()).relu()).relu().squeeze(-1)
        h, c = self.lstm_cell(x, (state[0], state[1]))
        x = self.final_conv(h.unsqueeze(-1).relu()).sigmoid()
        return x.squeeze(1).mean(dim=1, keepdim=True), torch.stack([h, c])


class EpsMagnitude(Magnitude):
    def forward(self, x):
        return (x[:, :self.cutoff] ** 2 + x[:, self.cutoff:] ** 2 + 1e-2).sqrt()


class EpsPitch(GruPitch):
    def forward(self, frames):
        h = self.proj(frames)
        rms = (h.pow(2).mean(-1, keepdim=True) + 1e-2).sqrt() if self.energy is None else self.energy(h)
        y, _ = self.gru(torch.cat([h, rms], -1))
        return self.head(y)


class EpsEnergy(nn.Module):
    def forward(self, h):
        return (h.pow(2).mean(-1, keepdim=True) + 1e-2).sqrt()


def _pair(ref, cand):
    cand.load_state_dict(ref.state_dict())
    return ref, cand


def _vad(child: bool):
    torch.manual_seed(0)
    if not child:
        return _pair(SileroVAD(), EpsVAD()) + ((0.01 * torch.randn(1, 512), torch.zeros(2, 1, 128)),)
    ref, cand = _pair(ChildMagnitudeVAD(), ChildMagnitudeVAD())
    cand.mag = EpsMagnitude(cand.cutoff)
    return ref, cand, (0.01 * torch.randn(1, 512), torch.zeros(2, 1, 128))


def _pitch(child: bool):
    torch.manual_seed(0)
    ref, cand = _pair(GruPitch(child), EpsPitch(child))
    if child:
        cand.energy = EpsEnergy()
    return ref, cand, (0.1 * torch.randn(2, 6, 16),)


def _sqrt_line(cls, text: str) -> str:
    lines, start = inspect.getsourcelines(cls.forward)
    return f"{inspect.getsourcefile(cls)}:{start + next(i for i, x in enumerate(lines) if text in x)}"


CASES = [pytest.param(_vad, SileroVAD, "x[:, self.cutoff:] ** 2).sqrt()", "mag", id="silero-vad"),
         pytest.param(_pitch, GruPitch, "keepdim=True).sqrt()", "energy", id="gru-pitch")]


@pytest.mark.parametrize("case, cls, text, child", CASES)
@pytest.mark.parametrize("keep", ["full", "stats"])
def test_a_divergence_in_the_roots_own_forward_is_named_as_the_models_own_forward(tmp_path, case, cls, text, child,
                                                                                   keep):
    ref, cand, inputs = case(False)
    r = tp.diff(tp.capture(ref, *inputs, level="op", keep=keep, out=tmp_path / "r"),
                tp.capture(cand, *inputs, level="op", keep=keep, out=tmp_path / "c"))
    assert r.first_divergence == "<root>/sqrt.0", r.summary
    where = f"(aten.sqrt.default in the model's own forward ({cls.__name__}.forward, {_sqrt_line(cls, text)}))"
    assert f"first divergence at <root>/sqrt.0 {where}" in r.summary, r.summary
    assert "(<root>, " not in r.summary and "the loss" not in r.summary


@pytest.mark.parametrize("case, cls, text, child", CASES)
def test_its_twin_in_a_child_is_named_by_the_childs_path(tmp_path, case, cls, text, child):
    ref, cand, inputs = case(True)
    r = tp.diff(tp.capture(ref, *inputs, level="op", keep="full", out=tmp_path / "r"),
                tp.capture(cand, *inputs, level="op", keep="full", out=tmp_path / "c"))
    assert r.first_divergence == f"{child}/sqrt.0", r.summary
    assert f"first divergence at {child}/sqrt.0 ({child}, aten.sqrt.default)" in r.summary
    assert "model's own forward" not in r.summary


@pytest.mark.parametrize("case, cls, text, child", CASES)
def test_the_faithful_model_matches_and_module_level_names_whose_code_made_the_input(tmp_path, case, cls, text,
                                                                                    child):
    ref, cand, inputs = case(False)
    rb = tp.capture(ref, *inputs, level="module", keep="full", out=tmp_path / "r")
    assert tp.diff(rb, rb).passed
    r = tp.diff(rb, tp.capture(cand, *inputs, level="module", keep="full", out=tmp_path / "c"))
    assert not r.passed and f"made by the model's own forward ({cls.__name__}.forward)" in r.summary, r.summary
    assert "<root>'s own code" not in r.summary
