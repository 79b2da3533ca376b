"""Small models whose float32 run breaks (or not) the way real ones do, for the float32-first tests.

A norm written in the model's own code as a one-pass variance, `(x*x).mean(-1) - m*m` then rsqrt (as hand
ports and older vocoders write it), is NaN in plain float32 PyTorch on channels whose mean is large against
their spread: the subtraction cancels to rounding noise of either sign.
"""

from __future__ import annotations

import torch
from torch import nn

CHANNELS, FRAMES = 8, 4000
EPS = 1e-5


def one_pass_normalise(x: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    m = x.mean(-1, keepdim=True)
    var = (x * x).mean(-1, keepdim=True) - m * m
    return (x - m) * torch.rsqrt(var + eps)


def one_pass_variance(x: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    """What the rsqrt receives, computed as the model computes it (float32): the truth the tests judge by."""
    m = x.mean(-1, keepdim=True)
    return ((x * x).mean(-1, keepdim=True) - m * m + eps)[0, :, 0]


class OnePassNorm(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return one_pass_normalise(x)


class NormNet(nn.Module):
    """conv (identity) -> a one-pass norm in a submodule -> conv mixing the channels."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Conv1d(CHANNELS, CHANNELS, 1)
        self.norm = OnePassNorm()
        self.post = nn.Conv1d(CHANNELS, 1, 3, padding=1)
        with torch.no_grad():
            self.pre.weight.copy_(torch.eye(CHANNELS)[:, :, None])
            self.pre.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(self.norm(self.pre(x)))


class RootNormNet(NormNet):
    """The same computation with the norm moved into the root's own forward."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pre(x)
        m = h.mean(-1, keepdim=True)
        var = (h * h).mean(-1, keepdim=True) - m * m
        return self.post((h - m) * torch.rsqrt(var + EPS))


def offset_channels(mean: float = 30.0, spread: float = 0.01, seed: int = 0) -> torch.Tensor:
    """[1, CHANNELS, FRAMES]: every channel at `mean` with standard deviation `spread`."""
    g = torch.Generator().manual_seed(seed)
    return mean + spread * torch.randn(1, CHANNELS, FRAMES, generator=g)


def build_norm_net(mean: float = 30.0, spread: float = 0.01, seed: int = 0, root: bool = False):
    torch.manual_seed(seed)
    return (RootNormNet() if root else NormNet()).eval(), (offset_channels(mean, spread, seed),)


class ExpNet(nn.Module):
    """fc1 -> exp -> fc2: fc1's outputs reach `reach` (exp overflows float16 above 11.09, float32 above 88.72),
    and fc2 mixes whatever exp made (inf - inf = NaN in float32 when exp overflows there)."""

    def __init__(self, reach: float):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(4, 8), nn.Linear(8, 4)
        with torch.no_grad():
            self.fc1.weight.copy_(torch.linspace(-reach, reach, 32).reshape(8, 4) / 2)
            self.fc1.bias.zero_()
            self.fc2.weight.copy_(torch.linspace(-1, 1, 32).reshape(4, 8))
            self.fc2.bias.zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.exp(self.fc1(x)))


def exp_inputs() -> torch.Tensor:
    return torch.linspace(-1, 1, 64).reshape(16, 4)
