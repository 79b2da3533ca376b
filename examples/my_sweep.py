"""A SWEEP_TARGET for docs/guide-sweep.md: a small vocoder head (16 mel bins -> a 0.1 s waveform at 16 kHz) over
8 utterances of rising loudness, compared with ONNX Runtime (`tensorprobe sweep examples/my_sweep.py:build`).

`clipped_port` is a port whose converter added a hard limit on the waveform at ±0.25: it matches on the quiet
items and diverges on the loud ones (`--cand examples/my_sweep.py:clipped_port`).
"""

from __future__ import annotations

import torch
from torch import nn

from tensorprobe.sweep import Sweep

FRAMES, SAMPLE_RATE = 1600, 16000


class Head(nn.Module):
    def __init__(self, limit: float | None = None):
        super().__init__()
        torch.manual_seed(0)
        self.pre = nn.Conv1d(16, 32, 3, padding=1)
        self.post = nn.Conv1d(32, 1, 1)
        self.limit = limit

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        wave = self.post(torch.tanh(self.pre(mel)))
        return wave if self.limit is None else wave.clamp(-self.limit, self.limit)   # the port's limiter


def inputs(name: str) -> tuple[torch.Tensor]:
    """utt00 is the quietest; each next one louder (the same seed per name, in every worker)."""
    i = int(name[3:])
    g = torch.Generator().manual_seed(i)
    return (0.02 * (i + 1) * torch.randn(1, 16, FRAMES, generator=g),)


def build() -> Sweep:
    names = [f"utt{i:02d}" for i in range(8)]
    return Sweep(Head().eval(), names, inputs=inputs, candidate="onnxruntime", sample_rate=SAMPLE_RATE)


def clipped_port() -> nn.Module:
    return Head(limit=0.25).eval()
