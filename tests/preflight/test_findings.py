"""The preflight summary joins messages that come with and without a closing full stop (a finding's message
has none, `nan`'s headline sometimes has one): every sentence must end with exactly one."""

from __future__ import annotations

import re

import torch
from torch import nn

from tensorprobe.nan import find_first_nonfinite
from tensorprobe.preflight import FLOAT32, preflight

from ..runtimes._export_models import NormConv, mean100_input


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.pre, self.out = nn.Conv1d(4, 8, 3, padding=1), nn.Conv1d(8, 1, 1)

    def forward(self, x):
        return self.out(torch.tanh(self.pre(x)))


def _joined_badly(text: str) -> list[str]:
    """Double full stops, and a sentence run into the next one without its full stop ("NaN After")."""
    return re.findall(r"\.\.(?!\.)|[a-z0-9)] (?:After|First|Nothing) ", text)


def test_a_nan_input_headline_joins_the_summary_with_one_full_stop():
    """The new-user walk-through: `preflight nanmodels.py:nan_input --target tvm` printed "...to blame..",
    and the headline's capital after the colon ("before any port: The model inputs")."""
    x = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(0))
    x[0, 0, 5] = float("nan")
    origin = find_first_nonfinite(Net().eval(), x)
    assert origin.headline().endswith(".")              # the premise: nan's headline brings its own full stop
    r = preflight(Net().eval(), x, target="tvm", code=False)
    assert r.findings[0].kind == FLOAT32
    assert "before any port: the model inputs are already non-finite (input.0)" in r.summary()
    assert not _joined_badly(r.summary()) and not r.findings[0].message.endswith(".")


def test_the_first_finding_ends_its_sentence_before_after_fix():
    """"... these can come out NaN After --fix ..." in the walk-through: the one-pass-variance message has
    no full stop of its own."""
    torch.manual_seed(0)
    r = preflight(NormConv(), mean100_input(), target="tvm", code=False, fix=True)
    assert r.errors[0].kind == "one_pass_variance" and r.remaining is not None
    assert f"First: {r.errors[0].message}. After --fix" in r.summary()
    assert not _joined_badly(r.summary())
