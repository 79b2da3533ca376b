"""`stress`: what its summary says of the model output must follow the output itself. The truth each test
judges by is a real float16 run (`model.half()`), counted here, never taken from stress."""

from __future__ import annotations

import copy
import pathlib
import subprocess
import sys

import pytest
import torch
from torch import nn

from tensorprobe.errors import InputError
from tensorprobe.preflight.stress import stress

from ._models import ExpNet, exp_inputs

ROOT = pathlib.Path(__file__).resolve().parents[2]


class Squares(nn.Module):
    """conv -> square -> conv: a fp16 conversion gone wrong when the squared activations pass 65,504."""

    def __init__(self, gain: float):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Conv1d(4, 8, 1), nn.Conv1d(8, 1, 1)
        with torch.no_grad():
            self.a.weight.mul_(gain)
            self.b.weight.div_(gain)

    def forward(self, x):
        h = self.a(x)
        return self.b(h * h / 1000)


def _squares_input() -> torch.Tensor:
    return torch.randn(1, 4, 200, generator=torch.Generator().manual_seed(0))


def _half_nonfinite_where_float32_is_finite(model: nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """(elements non-finite in the real float16 output where float32's is finite, output size)."""
    with torch.no_grad():
        ref, half = model(x), copy.deepcopy(model).half()(x.half())
    return int((torch.isfinite(ref) & ~torch.isfinite(half)).sum()), ref.numel()


@pytest.mark.parametrize("model,x", [(ExpNet(reach=20), exp_inputs()), (ExpNet(reach=30), exp_inputs()),
                                     (Squares(gain=3000.0), _squares_input())],
                         ids=["exp-reach-20", "exp-reach-30", "squares-past-65504"])
def test_an_output_non_finite_in_float16_is_counted_and_never_called_equal(model, x):
    """Two architectures (an exp between linears, squares between convs); two reaches of the exp keep the
    truth. The summary once said "The output equals float32's" for an SNR of -inf."""
    model.eval()
    broken, size = _half_nonfinite_where_float32_is_finite(model, x)
    assert broken > 0                                          # the premise: float16 really breaks the output
    r = stress(model, x, emulate="fp16")
    assert r.output_snr_db == float("-inf") and r.finding
    assert f"The output holds NaN/Inf at {broken:,} of its {size:,} elements where float32's is finite" in r.summary()
    assert "equals" not in r.summary() and r.to_dict()["output_snr_db"] == "-inf"


@pytest.mark.parametrize("model,x", [(ExpNet(reach=6), exp_inputs()), (Squares(gain=3.0), _squares_input())],
                         ids=["exp-reach-6", "squares-in-range"])
def test_an_output_finite_in_float16_gets_its_snr(model, x):
    """The same architectures with the truth changed: float16 keeps every value finite."""
    model.eval()
    assert _half_nonfinite_where_float32_is_finite(model, x)[0] == 0
    r = stress(model, x, emulate="fp16")
    assert not r.finding and 20 < r.output_snr_db < 200
    assert f"The output differs from float32's by SNR {r.output_snr_db:.1f} dB." in r.summary()


class Double(nn.Module):
    def forward(self, x):
        return x * 2


def test_equals_only_when_every_value_is_finite_and_identical():
    x = torch.arange(-8.0, 8.0).reshape(1, 16)       # integers: exact in float16, doubled exactly
    r = stress(Double(), x, emulate="fp16")
    assert r.output_snr_db == float("inf") and "The output equals float32's." in r.summary()
    assert "Lowest layer" not in r.summary()        # every record identical: no layer is lowest
    x[0, 3] = float("nan")                          # the same NaN on both sides: identical, but not "equal"
    r = stress(Double(), x, emulate="fp16")
    assert r.float32_origin is not None and r.output_snr_db == float("inf")
    assert "The output's finite values equal float32's; both hold NaN/Inf at the same 1 of its 16 elements." \
        in r.summary() and "The output equals" not in r.summary()
    assert ".." not in r.summary()


def test_a_forward_that_raises_is_bad_input_in_one_line(tmp_path):
    model = nn.Conv1d(4, 8, 3)
    with pytest.raises(InputError, match=r"the model's forward raised RuntimeError: .*channels"):
        stress(model, torch.randn(1, 3, 64), emulate="fp16")         # 3 channels into a 4-channel conv
    (tmp_path / "m.py").write_text("import torch\n"
                                   "def build():\n    return torch.nn.Conv1d(4, 8, 3), (torch.randn(1, 3, 64),)\n")
    p = subprocess.run([sys.executable, "-m", "tensorprobe", "stress", f"{tmp_path / 'm.py'}:build", "--emulate",
                        "fp16"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == [p.stderr.strip()] and "forward raised RuntimeError" in p.stderr
