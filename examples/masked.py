"""A deliberate -inf mask, for docs/guide-nan.md: attention scores over padded frames are filled with -inf
before a softmax, which turns them into 0 weights. `tensorprobe nan examples/masked.py:build` reports the
mask as information and exits 0; `reaching_output` returns the masked scores themselves, which is a finding."""

import torch
from torch import nn


class Attention(nn.Module):
    def __init__(self, return_scores: bool = False):
        super().__init__()
        self.query = nn.Linear(8, 8)
        self.return_scores = return_scores

    def forward(self, x, keep):
        scores = self.query(x) @ x.transpose(1, 2)
        scores = scores.masked_fill(~keep[:, None, :], float("-inf"))     # padded frames: never attended
        return scores if self.return_scores else torch.softmax(scores, dim=-1) @ x


def _inputs():
    torch.manual_seed(1)
    keep = torch.ones(1, 6, dtype=torch.bool)
    keep[:, 4:] = False                                # the last two frames are padding
    return torch.randn(1, 6, 8), keep


class Model(nn.Module):
    def __init__(self, return_scores: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.attn = Attention(return_scores)

    def forward(self, x, keep):
        return self.attn(x, keep)


def build():
    return Model().eval(), _inputs()


def reaching_output():
    return Model(return_scores=True).eval(), _inputs()
