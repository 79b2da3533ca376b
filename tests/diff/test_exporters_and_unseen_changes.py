"""Verdicts the accuracy benchmark found wrong on real ports (bench/accuracy, docs/accuracy.md), asserted on
models of their own:

- torch.onnx's dynamo exporter stores a Linear's weight transposed under a new name (`val_12`, read by the
  Linear's MatMul): a weight bug in the port read "the error is its own" because the weight had no counterpart.
  Weights now pair through the module that reads them (`align.MATCH_READER_T`) and are compared transposed.
- A bias the port zeroed is dropped from the export (the Conv reads no bias at all): the cause is that weight,
  not the conv's code (`fusion.missing_weights`); a model whose bias really is zero is no finding.
- Statistics cannot see two output channels swapped or a kernel reversed in time; in a float16 port the weights'
  fingerprints cannot either (every weight is rounded): sketches (`stats.sketch`) see it at the module itself.
- At op level, an op only the port has (a gain from frame 20 on, inside a module) was found at the next
  module's op; it is now named where it changes the value that op reads (`diff.port_ops`).

Each case varied: one change that keeps the truth (faithful, or the same op that changes nothing), one that
changes it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import tensorprobe as tp
from tensorprobe.diff.align import MATCH_READER_T
from tensorprobe.diff.result import TAG_PORT_OP, TAG_WEIGHT_MISSING


class Mixer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(12, 24)
        self.mix = nn.Linear(24, 24)          # square: only what reads it tells its layout
        self.out = nn.Linear(24, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.mix(torch.relu(self.inp(x)))))


class GainedConv(nn.Conv1d):
    """A Conv1d; in the port, its output scaled from frame N on (an op the reference does not have)."""

    def __init__(self, *args, gain_from: int | None = None, gain: float = 0.9) -> None:
        super().__init__(*args)
        self.gain_from, self.gain = gain_from, gain

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = super().forward(x)
        if self.gain_from is None:
            return h
        return torch.cat([h[..., :self.gain_from], h[..., self.gain_from:] * self.gain], dim=-1)


class Front(nn.Module):
    def __init__(self, gain_from: int | None = None, gain: float = 0.9) -> None:
        super().__init__()
        self.pre = GainedConv(4, 16, 3, 1, 1, gain_from=gain_from, gain=gain)
        self.body = nn.Conv1d(16, 16, 3, padding=1)
        self.post = nn.Conv1d(16, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.post(torch.relu(self.body(torch.relu(self.pre(x)))))


def _seeded(cls, *args):
    torch.manual_seed(0)
    return cls(*args).eval()


def _onnx_diff(tmp_path, ref: nn.Module, port: nn.Module, x: torch.Tensor, keep: str = "stats") -> tp.DiffReport:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from tensorprobe.runtimes import get_runtime
    from tensorprobe.runtimes.onnxruntime import export_onnx

    tmp_path.mkdir(parents=True, exist_ok=True)
    path = export_onnx(port, (x,), tmp_path / "port.onnx", exporter="dynamo")
    cand = get_runtime("onnxruntime").capture_artifact(path, [x.numpy()], tmp_path / "cand", keep=keep)
    return tp.diff(tp.capture(ref, x, keep=keep, out=tmp_path / "ref"), cand)


@pytest.mark.parametrize("keep", ["stats", "full"])
def test_a_transposed_renamed_weight_pairs_through_its_reader(tmp_path, keep):
    model, x = _seeded(Mixer), torch.randn(2, 5, 12)
    faithful = _onnx_diff(tmp_path / "f", model, model, x, keep)
    assert faithful.verdict == "match", faithful.summary
    w = faithful.get("mix.weight")
    assert w is not None and w.match == MATCH_READER_T and not w.failed
    port = _seeded(Mixer)
    with torch.no_grad():
        port.mix.weight.mul_(1.02)
    r = _onnx_diff(tmp_path / "b", model, port, x, keep)
    first = r.get(r.first_divergence)
    assert r.first_divergence == "mix" and first.cause == "weights" and first.origin == "mix.weight", r.summary
    assert r.get("mix.weight").failed


def test_a_bias_the_port_does_not_read_is_the_cause(tmp_path):
    model, x = _seeded(Front), torch.randn(1, 4, 40)
    port = _seeded(Front)
    with torch.no_grad():
        port.pre.bias.zero_()              # exported as a Conv with no bias input
    r = _onnx_diff(tmp_path / "b", model, port, x)
    first = r.get(r.first_divergence)
    assert r.first_divergence == "pre" and first.cause == "weights" and TAG_WEIGHT_MISSING in first.tags, r.summary
    assert "no counterpart" in r.summary
    # the same graph is faithful when the reference's bias is zero too
    with torch.no_grad():
        model.pre.bias.zero_()
    assert _onnx_diff(tmp_path / "f", model, port, x).verdict == "match"


@pytest.mark.parametrize("bug", ["swap", "flip"])
def test_a_float16_port_that_reorders_values_is_found_at_the_module_by_statistics(tmp_path, bug):
    model, x = _seeded(Front), torch.randn(1, 4, 64)
    ref = tp.capture(model, x, out=tmp_path / "ref")           # default: module level, statistics only
    faithful = tp.diff(ref, tp.capture(_seeded(Front).half(), x.half(), out=tmp_path / "f"))
    assert faithful.verdict == "match", faithful.summary
    port = _seeded(Front)
    with torch.no_grad():
        w = port.body.weight
        if bug == "swap":                                     # two output channels swapped, with their biases
            w[[0, 1]] = w[[1, 0]].clone()
            port.body.bias[[0, 1]] = port.body.bias[[1, 0]].clone()
        else:                                                 # convolution against cross-correlation
            w.copy_(w.flip(-1))
    r = tp.diff(ref, tp.capture(port.half(), x.half(), out=tmp_path / "b"))
    assert r.first_divergence == "body", r.summary
    assert r.get("body").metrics.get("rel_l2_err_estimate", 0) > 0.05


def test_an_op_only_the_port_has_is_named_where_it_changes_what_the_next_op_reads(tmp_path):
    model, x = _seeded(Front), torch.randn(1, 4, 48)
    ref = tp.capture(model, x, level="op", keep="full", out=tmp_path / "ref")
    port = _seeded(Front, 20)
    r = tp.diff(ref, tp.capture(port, x, level="op", keep="full", out=tmp_path / "b"))
    first = r.get(r.first_divergence)
    assert TAG_PORT_OP in first.tags and first.origin.startswith("pre/cat"), r.summary
    assert "first divergence at pre (pre/cat" in r.summary
    # the same ops changing nothing: no divergence at all
    same = _seeded(Front, 20, 1.0)
    assert tp.diff(ref, tp.capture(same, x, level="op", keep="full", out=tmp_path / "f")).verdict == "match"


class Inject(nn.Module):
    """Noise injection: multiplicative then additive, both normal; the port draws the first one uniform."""

    def __init__(self, uniform: bool) -> None:
        super().__init__()
        self.lin, self.uniform = nn.Linear(8, 8), uniform

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        h = self.lin(h)
        a = (torch.rand_like(h) - 0.5) * 3.464 if self.uniform else torch.randn_like(h)
        return h * (1 + 0.1 * a) + 0.05 * torch.randn_like(h)


def test_a_draw_the_replay_could_not_feed_is_not_told_to_use_replay(tmp_path):
    """rng_uniform_misnamed: with --replay-rng used, the summary said "--replay-rng feeds the reference's"."""
    x = torch.randn(3, 8)
    torch.manual_seed(1)
    ref = tp.capture(_seeded(Inject, False), x, out=tmp_path / "ref")
    torch.manual_seed(2)
    same = tp.diff(ref, tp.capture(_seeded(Inject, False), x, out=tmp_path / "same", replay_rng=ref))
    assert same.verdict == "match", same.summary
    r = tp.diff(ref, tp.capture(_seeded(Inject, True), x, out=tmp_path / "uni", replay_rng=ref))
    assert r.verdict == "diverged" and r.get(r.first_divergence).kind == "rng", r.summary
    assert "feeds the reference's" not in r.summary and "use --replay-rng" not in r.summary, r.summary
    assert "replay them (--replay-rng)" not in r.summary


class Recurrent(nn.Module):
    def __init__(self, cell: str) -> None:
        super().__init__()
        self.front = nn.Conv1d(6, 12, 3, padding=1)
        self.rnn = getattr(nn, cell)(12, 10, num_layers=2, batch_first=True)
        self.head = nn.Linear(10, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(torch.relu(self.front(x)).transpose(1, 2))
        return self.head(h)


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
def test_an_onnx_recurrent_weight_pairs_in_its_gate_order(tmp_path, cell):
    """torch.onnx stores layer k's weight_ih/weight_hh as W and R of the k-th LSTM/GRU node, gates re-packed
    (LSTM iofc for ifgo): paired through that node and compared in PyTorch's gate order. Two gates swapped in
    the port (a converter's order) is a weight bug of layer 1, not "the error is its own"."""
    model, x = _seeded(Recurrent, cell), torch.randn(1, 6, 30)
    faithful = _onnx_diff(tmp_path / "f", model, model, x, keep="full")
    assert faithful.verdict == "match", faithful.summary
    assert faithful.get("rnn.weight_hh_l1").match == f"reader_repacked:{cell}"
    port, h = _seeded(Recurrent, cell), 10
    with torch.no_grad():
        for name in ("weight_ih_l1", "weight_hh_l1", "bias_ih_l1", "bias_hh_l1"):
            p = getattr(port.rnn, name)
            p[:2 * h] = torch.cat([p[h:2 * h], p[:h]]).clone()
    r = _onnx_diff(tmp_path / "b", model, port, x, keep="full")
    first = r.get(r.first_divergence)
    assert first.module == "rnn" and first.cause == "weights" and first.origin.startswith("rnn.weight_"), r.summary


class Spectrum(nn.Module):
    """An STFT as a strided conv (real and imaginary rows), power, a filterbank, time last -> time first:
    the dynamo exporter folds the trailing transpose into the LSTM's own input Transpose."""

    def __init__(self, bins: int = 33, mels: int = 12) -> None:
        super().__init__()
        self.stft = nn.Conv1d(1, 2 * bins, 64, stride=16, bias=False)
        self.register_buffer("fb", torch.rand(mels, bins) / bins)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        re, im = self.stft(wav.unsqueeze(1)).chunk(2, 1)
        return (self.fb @ (re * re + im * im)).transpose(1, 2)


class SpeakerEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.front = Spectrum()
        self.lstm = nn.LSTM(12, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, 8)

    def forward(self, wav: torch.Tensor) -> torch.Tensor:
        h, _ = self.lstm(self.front(wav))
        return self.head(h[:, -1])


@pytest.mark.parametrize("keep", ["stats", "full"])
def test_an_int8_file_is_judged_against_pytorch_as_it_is_against_its_float_file(tmp_path, keep):
    """ORT's quantize_dynamic of a faithful export, against the PyTorch model: the quantizer's nodes carry
    no scope, and the Split after the STFT conv's ConvInteger was taken into `front.stft` (a 33-row half
    paired with the 66-row conv); the front end's value, held transposed and carrying int8's error, was a
    shape mismatch of its own. Both now: the conv paired with its rescale, the transposed value compared in
    the reference's layout (by statistics too); a match as a quantized port. The same file with the head's
    weight scale doubled diverges at `head`, cause its weight."""
    pytest.importorskip("onnxruntime")
    import onnx
    from onnx import numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from tensorprobe.runtimes import get_runtime
    from tensorprobe.runtimes.onnxruntime import export_onnx

    model, x = _seeded(SpeakerEncoder), 0.3 * torch.randn(1, 4000, generator=torch.Generator().manual_seed(1))
    fp32 = export_onnx(model, (x,), tmp_path / "enc.onnx", exporter="dynamo")
    quantize_dynamic(str(fp32), str(tmp_path / "int8.onnx"), weight_type=QuantType.QInt8)
    q = onnx.load(str(tmp_path / "int8.onnx"))
    for init in q.graph.initializer:
        if init.name.startswith("head.") and init.name.endswith("scale"):
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 2, init.name))
    onnx.save(q, str(tmp_path / "int8_2x.onnx"))
    ref = tp.capture(model, x, keep=keep, out=tmp_path / "ref")
    ort = get_runtime("onnxruntime")

    def against(name: str) -> tp.DiffReport:
        return tp.diff(ref, ort.capture_artifact(tmp_path / name, [x.numpy()], tmp_path / f"{name}.b", keep=keep))

    r = against("int8.onnx")
    assert r.verdict == "match" and "as a quantized port" in r.summary, r.summary
    stft, front = r.get("front.stft"), r.get("front")
    assert stft.cause == "quantized" and tuple(stft.shape) == tuple(stft.cand_shape) == (1, 66, 247)
    assert front.cause == "inherited" and "compared_transposed" in front.tags, front
    bad = against("int8_2x.onnx")
    first = bad.get(bad.first_divergence)
    assert bad.verdict == "diverged" and bad.first_divergence == "head" and first.cause == "weights", bad.summary
