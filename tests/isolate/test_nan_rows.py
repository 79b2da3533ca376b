"""An isolate row whose output is NaN/Inf says why in the table (issue 32 item 3), not only in the summary/JSON.

Two models: a three-conv stack and the Silero VAD (tensorprobe.examples.silero). In each the candidate's one
layer has a NaN bias: that row reads "candidate all NaN/Inf, born here (also when run alone)", the rows after
it "from its input (finite when run alone)", the model output "candidate all NaN/Inf". Twins: a finite bias
error of the same layer (no why column: nothing is NaN), and the same candidate judged as the reference
(the sides swap).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn
from rich.console import Console

from tensorprobe.examples.silero import SileroVAD
from tensorprobe.isolate import isolate
from tensorprobe.report.isolate import render_isolate


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = nn.Conv1d(4, 8, 3, padding=1)
        self.b = nn.Conv1d(8, 8, 3, padding=1)
        self.c = nn.Conv1d(8, 1, 1)

    def forward(self, x):
        return self.c(torch.tanh(self.b(torch.tanh(self.a(x)))))


def _stack():
    return Stack(), (torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(1)),), "b", "c"


def _vad():
    torch.manual_seed(0)
    return SileroVAD(), (0.1 * torch.randn(1, 512), torch.zeros(2, 1, 128)), "conv2", "conv3"


def _text(report) -> str:
    console = Console(record=True, width=240)
    render_isolate(console, report, show_all=True)
    return console.export_text()


def _row(text: str, name: str) -> str:
    return next(line for line in text.splitlines() if line.split("│")[0].strip() == name)


@pytest.mark.parametrize("case", [_stack, _vad], ids=["conv-stack", "silero-vad"])
def test_a_nan_row_gives_its_reason_in_the_table(case):
    ref, inputs, layer, after = case()
    cand = copy.deepcopy(ref)
    with torch.no_grad():
        getattr(cand, layer).bias.fill_(float("nan"))
    report = isolate(ref, cand, *inputs)
    assert report.culprit == layer, report.summary()
    text = _text(report)
    assert "why" in text.splitlines()[text.splitlines().index(next(x for x in text.splitlines() if "verdict" in x))]
    assert "candidate all NaN/Inf, born here (also when run alone)" in _row(text, layer), text
    assert "candidate all NaN/Inf, from its input (finite when run alone)" in _row(text, after), text
    assert "born here" not in _row(text, after)
    first = report.layers[0]
    assert first.name != layer and "NaN" not in _row(text, first.name)   # a finite row before it says nothing
    assert any("(model)" in line and "candidate all NaN/Inf" in line for line in text.splitlines())

    # the sides swapped: the NaN is the reference's
    text = _text(isolate(cand, ref, *inputs))
    assert "reference all NaN/Inf" in _row(text, layer) and "candidate all NaN" not in _row(text, layer), text


@pytest.mark.parametrize("case", [_stack, _vad], ids=["conv-stack", "silero-vad"])
def test_a_finite_error_in_the_same_layer_has_no_why_column(case):
    ref, inputs, layer, _ = case()
    cand = copy.deepcopy(ref)
    with torch.no_grad():
        getattr(cand, layer).bias.add_(0.5)
    report = isolate(ref, cand, *inputs)
    assert report.culprit == layer
    text = _text(report)
    assert "NaN/Inf" not in text and "why" not in next(x for x in text.splitlines() if "verdict" in x)
