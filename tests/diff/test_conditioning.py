"""A normalization's own change told from the error it inherits, measured on both sides' values
(`diff.conditioning`), and what a match of a float16 port cannot rule out (`summary._blind_spot_words`).

Statistics bound a norm's conditioning by max|x|/sqrt(eps) (hundreds): an eps of 0.1 for 1e-5 in a float16
port read "amplified rounding". With the values kept, the inherited part is computed per group; a norm over
near-constant channels, which really does amplify its input's rounding, stays `amplified`.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import tensorprobe as tp
from tensorprobe.diff.conditioning import inherited_norm_error


class Frames(nn.Module):
    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.norm, self.out = nn.Linear(16, 64), norm, nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.norm(self.inp(x))))


class Channels(nn.Module):
    """A conv, then an instance norm over time; `offset` lifts every channel far above its spread."""

    def __init__(self, eps: float = 1e-5, offset: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv, self.norm = nn.Conv1d(4, 8, 3, padding=1), nn.InstanceNorm1d(8, eps=eps, affine=True)
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.conv(x)
        return self.norm(h + self.offset if self.offset else h)


def _diff(tmp_path, ref: nn.Module, port: nn.Module, x: torch.Tensor, dtype=torch.float16) -> tp.DiffReport:
    a = tp.capture(ref.eval(), x, keep="full", out=tmp_path / "ref")
    b = tp.capture(port.to(dtype).eval(), x.to(dtype), keep="full", out=tmp_path / "port")
    return tp.diff(a, b)


@pytest.mark.parametrize("eps, verdict", [(1e-5, "match"), (1e-3, "match"), (1e-1, "diverged")])
def test_a_float16_layer_norm_with_another_eps_is_its_own_where_it_shows(tmp_path, eps, verdict):
    x = torch.randn(1, 50, 16, generator=torch.Generator().manual_seed(1))
    r = _diff(tmp_path, Frames(nn.LayerNorm(64)), Frames(nn.LayerNorm(64, eps=eps)), x)
    assert r.verdict == verdict, r.summary
    if verdict == "diverged":
        first = r.get(r.first_divergence)
        assert r.first_divergence == "norm" and first.cause == "own", r.summary    # was "amplified" (x431)
        assert "carried through the normalization as measured" in first.explanation
    else:                   # within float16's floors: the match says what it cannot rule out
        assert "What a match cannot rule out here" in r.summary and "is not judged" in r.summary, r.summary


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_an_instance_norm_eps_change_is_its_own_and_near_constant_channels_stay_amplified(tmp_path, dtype):
    x = torch.randn(1, 4, 200, generator=torch.Generator().manual_seed(2))
    changed = _diff(tmp_path / "eps", Channels(), Channels(eps=0.5), x, dtype)
    first = changed.get(changed.first_divergence)
    assert changed.first_divergence == "norm" and first.cause == "own", changed.summary
    # the same norm after a large offset: subtracting the mean cancels, and the port's rounding of the
    # offset values is what is left of them: amplified, not the norm's own
    lifted = _diff(tmp_path / "lift", Channels(offset=300.0), Channels(offset=300.0), x, dtype)
    if dtype == torch.float32:
        assert lifted.verdict == "match", lifted.summary
    else:       # float16 holds 300 to within 0.25: the channels' spread is mostly rounding, amplified
        first = lifted.get(lifted.first_divergence)
        assert lifted.first_divergence == "norm" and first.cause == "amplified", lifted.summary


def test_the_inherited_error_follows_each_groups_spread():
    """Two groups, one near-constant: an input error the size of its spread there is passed on whole; so is
    the norm's own rounding of a variance whose mean dwarfs it (float32: 8 units x E[x²]/var, 2.5e9 here)."""
    rng = np.random.default_rng(0)
    x = np.stack([rng.normal(size=400), 5 + 1e-4 * rng.normal(size=400)])[None]        # (1, 2, 400)
    y = (x - x.mean(-1, keepdims=True)) / x.std(-1, keepdims=True)
    d = np.zeros_like(x)
    d[0, 1] = 1e-4 * rng.normal(size=400)                                              # error ~ its spread
    assert inherited_norm_error(x, x + d, y, unit=0.0) > 0.5
    d = np.zeros_like(x)
    d[0, 0] = 1e-4 * rng.normal(size=400)
    assert inherited_norm_error(x, x + d, y, unit=0.0) < 1e-3
    assert inherited_norm_error(x, x + d, y) > 100                                        # the silent group's rounding
    x[0, 1] -= 5                                                                          # the offset gone
    assert inherited_norm_error(x, x + d, y) < 1e-3
    assert inherited_norm_error(x, x + d, y[..., :-1]) is None                           # shapes differ
