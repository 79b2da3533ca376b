"""Amplifiers over comparable pairs (issue 29 item 3): a gain that comes only from near-zero reference values (a
difference of two nearly equal values) never ranks, unless what reads it brings that relative error back to the
values' scale (a division by its own spread), where the cancellation is the amplifier. The port is real: the
same model with its weights rounded to float16, as a conversion makes it."""

from __future__ import annotations

import pytest
import torch

import tensorprobe as tp


class Cancels(torch.nn.Module):
    """`a(x) - b(x)` with b's weights 1e-5 off a's (its result ~1e-4 of its operands), then what `use` does
    with it; beside it `exp` of arguments up to ~10, a true amplifier (relative gain |x|)."""

    def __init__(self, use: str):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.a, self.b, self.c = (torch.nn.Linear(32, 32) for _ in range(3))
        with torch.no_grad():
            self.b.weight.copy_(self.a.weight + 1e-5 * torch.randn(32, 32, generator=g))
            self.b.bias.copy_(self.a.bias)
            self.c.weight.mul_(8.0)
        self.use = use

    def forward(self, x):
        d = self.a(x) - self.b(x)
        if self.use == "normalised":
            d = d / d.std()                 # its relative error becomes the output's, at full scale
        elif self.use == "residual":
            d = d + self.a(x)               # a tiny term added to a large one: its error is heard nowhere
        return d, torch.exp(self.c(x))


def _amplifiers(tmp_path, use: str) -> list[str]:
    torch.manual_seed(0)
    x = torch.randn(4, 32)
    ref = Cancels(use)
    cand = Cancels(use)
    cand.load_state_dict(ref.state_dict())
    with torch.no_grad():
        for p in cand.parameters():
            p.copy_(p.half().float())
    tp.capture(ref, x, level="op", keep="full", out=str(tmp_path / "ref"))
    tp.capture(cand, x, level="op", keep="full", out=str(tmp_path / "cand"))
    return [a.name for a in tp.diff(str(tmp_path / "ref"), str(tmp_path / "cand")).amplifiers]


@pytest.mark.parametrize("use", ["output", "residual"])
def test_a_cancellation_whose_error_is_heard_nowhere_never_ranks(tmp_path, use):
    names = _amplifiers(tmp_path, use)
    assert "<root>/sub.0" not in names
    assert names[0] == "<root>/exp.0"


def test_a_cancellation_brought_back_to_scale_is_the_amplifier(tmp_path):
    names = _amplifiers(tmp_path, "normalised")
    assert names[0] == "<root>/sub.0" and "<root>/exp.0" in names
