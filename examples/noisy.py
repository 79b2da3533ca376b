"""A tiny model with a random source, for docs/guide-rng.md: a vocoder-like noise source (`randn_like`, scaled)
added to its input, then a 1x1 convolution. TARGETs (`tensorprobe capture examples/noisy.py:build`):

- `build`: the reference, its generator seeded 0 after building;
- `reseeded`: the same weights and input, another seed: other noise, the same model;
- `uniform_port`: a port whose source draws uniform `rand_like` where the reference draws normal noise.
"""

from __future__ import annotations

import torch
from torch import nn


class Source(nn.Module):
    def __init__(self, uniform: bool = False):
        super().__init__()
        self.uniform = uniform

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        noise = torch.rand_like(x) if self.uniform else torch.randn_like(x)
        return x + 0.1 * noise


class Noisy(nn.Module):
    def __init__(self, uniform: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.src = Source(uniform)
        self.proj = nn.Conv1d(4, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.src(x))


def _target(uniform: bool, seed: int):
    model = Noisy(uniform).eval()
    x = torch.linspace(-1, 1, 64).reshape(1, 4, 16)
    torch.manual_seed(seed)                # the noise the run draws
    return model, (x,)


def build():
    return _target(False, 0)


def reseeded():
    return _target(False, 1)


def uniform_port():
    return _target(True, 0)
