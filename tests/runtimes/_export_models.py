"""Tiny real models shared by the ExecuTorch, TVM and per-component tests."""

from __future__ import annotations

import torch
from torch import nn

C, T = 16, 400


def mean100_input(seed: int = 0) -> torch.Tensor:
    """16 channels of mean 100 and std from 1e-3 to 1 (log-spaced): the seed-000 trap for E[x²]−E[x]²."""
    g = torch.Generator().manual_seed(seed)
    std = torch.logspace(-3, 0, C)
    return 100 + std[None, :, None] * torch.randn(1, C, T, generator=g)


class NormConv(nn.Module):
    """A lone InstanceNorm1d(16) followed by a conv that spreads any NaN channel over all channels."""

    def __init__(self):
        super().__init__()
        self.norm = nn.InstanceNorm1d(C)
        self.conv = nn.Conv1d(C, C, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(self.norm(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.InstanceNorm1d(C, affine=True)
        self.act = nn.LeakyReLU(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(x))


class Net(nn.Module):
    """conv (moves every channel to mean 100, std 1e-3…1) -> two norm blocks in a ModuleList -> conv."""

    def __init__(self):
        super().__init__()
        self.pre = nn.Conv1d(C, C, 1)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.post = nn.Conv1d(C, 1, 3, padding=1)
        with torch.no_grad():
            self.pre.weight.copy_(torch.diag(torch.logspace(-3, 0, C))[:, :, None])
            self.pre.bias.fill_(100.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pre(x)
        for b in self.blocks:
            x = b(x)
        return self.post(x)


def nan_channels(a) -> list[int]:
    """Channels (dim 1) holding any NaN."""
    import numpy as np

    a = np.asarray(a)
    return sorted(int(c) for c in np.nonzero(np.isnan(a).reshape(a.shape[0], a.shape[1], -1).any(axis=(0, 2)))[0])


class StopGateDecoder(nn.Module):
    """An autoregressive decoder that runs until a stop gate fires (at most MAX_STEPS): scripted and exported
    by torch.onnx's TorchScript exporter, the `while` becomes a Loop whose body computes its condition."""

    MAX_STEPS = 40

    def __init__(self):
        super().__init__()
        self.inp, self.rec, self.proj, self.stop = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 1)
        with torch.no_grad():   # the gate opens as the state drifts: a few steps, not the cap
            self.stop.weight.fill_(0.4)
            self.stop.bias.fill_(-0.5)

    def step(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
        h = torch.tanh(self.inp(x) + self.rec(h))
        x = torch.tanh(self.proj(h))
        return x, h, bool(torch.sigmoid(self.stop(h)).sum() < 0.5)

    def forward(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.zeros_like(h)
        total = torch.zeros_like(h)
        steps = 0
        go = True
        while go and steps < 40:
            x, h, go = self.step(x, h)
            total = total + x
            steps += 1
        return total, torch.tensor(steps)

    @torch.jit.ignore
    def states(self, h: torch.Tensor) -> list[torch.Tensor]:
        """The state after each step, in eager PyTorch."""
        x, out, go = torch.zeros_like(h), [], True
        while go and len(out) < self.MAX_STEPS:
            x, h, go = self.step(x, h)
            out.append(h)
        return out
