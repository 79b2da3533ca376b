"""tensorprobe.testing.assert_parity inside pytest: fails naming the first divergence and the amplifier."""

import math

import pytest
import torch

import tensorprobe as tp
from tensorprobe.testing import assert_parity


class Sine(torch.nn.Module):
    def forward(self, f0):
        return torch.sin(torch.cumsum(2 * math.pi * f0 / 24000, dim=-1))


def test_assert_parity_message(tmp_path):
    f0 = torch.full((1, 8000), 300.0)
    ref = tp.capture(Sine(), f0, level="op", keep="full", out=tmp_path / "ref")
    cand = tp.capture(Sine(), f0 * 1.001, level="op", keep="full", out=tmp_path / "cand")
    with pytest.raises(AssertionError) as e:
        assert_parity(ref, cand, min_snr=80)
    msg = str(e.value)
    assert "first divergence: input.0" in msg
    assert "strongest amplifier: <root>/sin.0 (aten.sin.default)" in msg


def test_assert_parity_passes_and_returns_the_report(tmp_path):
    f0 = torch.full((1, 800), 300.0)
    ref = tp.capture(Sine(), f0, level="op", keep="full", out=tmp_path / "ref")
    report = assert_parity(ref, ref, atol=0, rtol=0)
    assert report.passed and len(report.pairs) == 6  # input, mul, div, cumsum, sin, the model's output
