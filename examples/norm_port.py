"""Small models to port, for docs/guide-preflight.md. TARGETs:

- `build`: what a vocoder block looks like to a backend: a weight-normed 1x1 convolution, an instance norm over
  16 channels of mean 100 whose spread runs from 0.001 to 1 (the trap for a norm lowered as E[x²] − E[x]², which
  TVM and ExecuTorch do), a noise source (`randn_like`) and a convolution mixing the channels;
- `onepass`: a norm written in the model's own code as `(x*x).mean(-1) - m*m` then `rsqrt`, on channels of
  mean 30 and spread 0.01: NaN already in float32 PyTorch, before any port.
"""

from __future__ import annotations

import torch
from torch import nn

C, T = 16, 400


def _mean100(seed: int = 0) -> torch.Tensor:
    """16 channels of mean 100 and standard deviation from 1e-3 to 1 (log-spaced)."""
    g = torch.Generator().manual_seed(seed)
    std = torch.logspace(-3, 0, C)
    return 100 + std[None, :, None] * torch.randn(1, C, T, generator=g)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.utils.parametrizations.weight_norm(nn.Conv1d(C, C, 1))
        self.norm = nn.InstanceNorm1d(C)
        self.post = nn.Conv1d(C, C, 3, padding=1)
        with torch.no_grad():                      # an identity conv: the channels keep their mean of 100
            self.pre.parametrizations.weight.original1.copy_(torch.eye(C)[:, :, None])
            self.pre.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.pre(x))
        return self.post(h + 0.01 * torch.randn_like(h))      # a noise source, as vocoders add


def build():
    torch.manual_seed(0)
    return Block().eval(), (_mean100(),)


class OnePassNorm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        m = x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True) - m * m            # cancels to rounding noise of either sign
        return (x - m) * torch.rsqrt(var + 1e-5)


class OnePass(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Conv1d(8, 8, 1)
        self.norm = OnePassNorm()
        self.post = nn.Conv1d(8, 1, 3, padding=1)
        with torch.no_grad():
            self.pre.weight.copy_(torch.eye(8)[:, :, None])
            self.pre.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.norm(self.pre(x)))


def onepass():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    return OnePass().eval(), (30 + 0.01 * torch.randn(1, 8, 4000, generator=g),)


class LoneNorm(nn.Module):
    """An InstanceNorm1d(16) and a convolution that spreads any NaN channel over every channel."""

    def __init__(self):
        super().__init__()
        self.norm = nn.InstanceNorm1d(C)
        self.conv = nn.Conv1d(C, C, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.norm(x))


def lone_norm():
    """The instance norm alone on the channels of mean 100 (docs/guide-runtimes.md): TVM and ExecuTorch, which
    compute its variance in one pass, make some channels NaN; ONNX Runtime and PyTorch do not."""
    torch.manual_seed(0)
    return LoneNorm().eval(), (_mean100(),)
