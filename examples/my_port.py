"""A TARGET for docs/guide-nan.md: a small mel post-net whose frame energy is the log of a convolution's
output, which goes negative on some frames: NaN is born at that log. `tensorprobe nan examples/my_port.py:build`."""

import torch
from torch import nn


class LogEnergy(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.proj = nn.Conv1d(channels, 1, 1)

    def forward(self, h):
        return torch.log(self.proj(h))             # the bug: the conv output is not always positive


class PostNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Conv1d(16, 32, 3, padding=1)
        self.energy = LogEnergy(32)
        self.post = nn.Conv1d(33, 16, 1)

    def forward(self, mel):
        h = torch.tanh(self.pre(mel))
        return self.post(torch.cat([h, self.energy(h)], dim=1))


def build():
    torch.manual_seed(0)
    return PostNet().eval(), (torch.randn(1, 16, 40),)
