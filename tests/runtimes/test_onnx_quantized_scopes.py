"""int8 ports of blocks whose modules the quantizer splits: the nodes `quantize_dynamic` puts between two children
of a Sequential (a DynamicQuantizeLinear before each conv) must not end the Sequential's call, and a gain the port
applies after a ConvTranspose the quantizer leaves in float is the port's bug, not int8's error.

Each model is compared as a user does (`tp.compare(model, inputs, "onnxruntime", artifact=<int8 file>)`), faithful
and with one change that moves the truth."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import tensorprobe as tp

pytest.importorskip("onnxruntime", reason="needs the onnx extra: pip install 'tensorprobe[onnx]'")
pytest.importorskip("onnxscript", reason="needs the onnx extra: pip install 'tensorprobe[onnx]'")


class Separable(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.depth = nn.Conv1d(c, c, 7, padding=3, groups=c)
        self.point = nn.Conv1d(c, c, 1)
        self.norm = nn.GroupNorm(2, c)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.norm(self.point(self.depth(x))))


class SeparableStack(nn.Module):
    def __init__(self, c: int = 16):
        super().__init__()
        self.inp = nn.Conv1d(3, c, 5, padding=2)
        self.stack = nn.Sequential(*[Separable(c) for _ in range(4)])
        self.out = nn.Conv1d(c, 2, 3, padding=1)

    def forward(self, x):
        return self.out(self.stack(self.inp(x)))


class Upsampler(nn.Module):
    def __init__(self, c: int, gain_from: int | None = None):
        super().__init__()
        self.up = nn.ConvTranspose1d(c, c, 4, stride=2, padding=1)
        self.act = nn.LeakyReLU(0.1)
        self.gain_from = gain_from

    def forward(self, x):
        y = self.up(x)
        if self.gain_from is not None:    # the port's bug: a gain past a frame, as a cache past its size
            y = torch.cat([y[..., :self.gain_from], 1.6 * y[..., self.gain_from:]], dim=-1)
        return self.act(y)


class Vocoder(nn.Module):
    def __init__(self, gain_from: int | None = None):
        super().__init__()
        self.pre = nn.Conv1d(6, 12, 3, padding=1)
        self.up0 = Upsampler(12)
        self.up1 = Upsampler(12, gain_from)
        self.post = nn.Conv1d(12, 1, 5, padding=2)

    def forward(self, x):
        return torch.tanh(self.post(self.up1(self.up0(self.pre(x)))))


def _int8_compare(model: nn.Module, reference: nn.Module, x: torch.Tensor, tmp_path):
    from onnxruntime.quantization import quantize_dynamic

    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "m.onnx"
    torch.onnx.export(model.eval(), (x,), str(path), dynamo=True, verbose=False)
    quantize_dynamic(str(path), str(tmp_path / "m.int8.onnx"))
    return tp.compare(reference.eval(), (x,), "onnxruntime", artifact=tmp_path / "m.int8.onnx", out=tmp_path / "cmp")


def test_a_sequential_split_by_the_quantizer_keeps_one_call_and_its_own_output(tmp_path):
    torch.manual_seed(3)
    model = SeparableStack()
    x = torch.randn(1, 3, 240)
    faithful = _int8_compare(model, model, x, tmp_path / "faithful")
    assert faithful.diff.verdict == "match", faithful.diff.summary
    cand = tp.open_bundle(tmp_path / "faithful" / "cmp" / "onnxruntime")
    names = {r.name for r in cand.records if r.name.startswith("stack@")}
    assert not names, names                               # one call of the Sequential, not one per quantizer gap
    last = cand.get("stack")
    assert last is not None and cand.get("stack.3.act").runtime_name == last.runtime_name

    broken = SeparableStack()
    broken.load_state_dict(model.state_dict())
    with torch.no_grad():
        broken.stack[2].point.weight.mul_(1.4)
    found = _int8_compare(broken, model, x, tmp_path / "broken")
    first = found.diff.get(found.diff.first_divergence)
    assert found.diff.verdict == "diverged" and first.module == "stack.2.point" and first.cause == "weights", \
        found.diff.summary


def test_a_gain_after_a_float_convtranspose_of_an_int8_port_is_its_own_error(tmp_path):
    torch.manual_seed(8)
    reference = Vocoder()
    x = torch.randn(1, 6, 50)
    faithful = _int8_compare(reference, reference, x, tmp_path / "faithful")
    assert faithful.diff.verdict == "match", faithful.diff.summary

    port = Vocoder(gain_from=30)
    port.load_state_dict(reference.state_dict())
    found = _int8_compare(port, reference, x, tmp_path / "broken")
    assert found.diff.verdict == "diverged", found.diff.summary
    assert found.diff.first_place.startswith("up1") and found.diff.get(found.diff.first_divergence).cause == "own", \
        found.diff.summary


class NormedNoBias(nn.Module):
    """A weight-normed conv without a bias (HiFi-GAN's conv_pre is one): the exporter folds the computed weight
    into a constant (`mul`), so the int8 kernel reads no parameter of the module's name."""

    def __init__(self):
        super().__init__()
        self.pre = nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 8, 5, padding=2, bias=False))
        self.post = nn.Conv1d(8, 1, 3, padding=1)

    def forward(self, x):
        return self.post(torch.nn.functional.leaky_relu(self.pre(x), 0.1))


def test_an_int8_conv_with_a_computed_weight_keeps_its_module_through_the_quantizer(tmp_path):
    from onnxruntime.quantization import quantize_dynamic

    from tensorprobe.runtimes.onnxruntime import export_onnx

    torch.manual_seed(5)
    model, x = NormedNoBias().eval(), torch.randn(1, 4, 64)
    export_onnx(model, (x,), tmp_path / "m.onnx")
    quantize_dynamic(str(tmp_path / "m.onnx"), str(tmp_path / "m.int8.onnx"))
    found = tp.compare(model, (x,), "onnxruntime", artifact=tmp_path / "m.int8.onnx", out=tmp_path / "cmp")
    pre = found.diff.get("pre")
    # the quantizer dropped the nodes' metadata; the value `pre` made keeps its module through the file's own
    assert pre is not None and pre.compared and pre.cause == "quantized", found.diff.summary
    assert found.diff.verdict == "match", found.diff.summary
