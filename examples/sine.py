"""A sine source of the shape of Kokoro's (sin of a cumulative phase) then a small convolution, for
docs/guide-diff.md. TARGETs: `examples/sine.py:reference` (220 Hz for 1 s at 24 kHz) and `examples/sine.py:port`,
the same model fed a 0.1% frequency error, which the phase accumulation turns into an output that no longer
correlates."""

from __future__ import annotations

import math

import torch
from torch import nn


class SineSource(nn.Module):
    def forward(self, f0: torch.Tensor) -> torch.Tensor:
        phase = torch.cumsum(2 * math.pi * f0 / 24000, dim=-1)
        return 0.1 * torch.sin(phase)


class SineModel(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.src = SineSource()
        self.post = nn.Conv1d(1, 1, 3, padding=1)

    def forward(self, f0: torch.Tensor) -> torch.Tensor:
        return self.post(self.src(f0))


def reference():
    return SineModel().eval(), (torch.full((1, 1, 24000), 220.0),)


def port():
    return SineModel().eval(), (torch.full((1, 1, 24000), 220.0 * 1.001),)     # the port's F0 is 0.1% off
