"""Real ports of three architectures, made by the usual tools, for the tests of `diff`'s verdicts.

Nothing here is built to pass: each port is what a user gets from onnxruntime.quantization (dynamic int8,
static QDQ int8), onnxruntime's float16 converter, a float64 cast, or a weight-conversion bug (a transposed
linear, a scaled conv, a wrong norm epsilon). `tests/diff/test_ports_corpus.py` asserts what `diff` says.

Architectures: a transformer encoder (`nn.TransformerEncoder`), a conv + norm + LSTM stack (the shape of a
mel front end), and the Kokoro-82M decoder (the PyPI `kokoro` package's code, seeded weights); VITS from
`transformers` (a structured `ModelOutput`) where it can go (float64, weight bugs).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn as nn

import tensorprobe as tp


def assert_nothing_incomparable_ranked(r: tp.DiffReport) -> None:
    ranked = {a.name for a in r.amplifiers} | {r.first_divergence, r.worst}
    bad = [p.name for p in r.not_comparable if p.name in ranked]
    assert not bad, f"incomparable pairs ranked: {bad}"
    assert all(p.method for p in r.pairs if p.name in ranked and p.name), "a ranked pair was never compared"


class ConvLSTM(nn.Module):
    """Conv1d -> GroupNorm -> GELU -> Conv1d -> BatchNorm -> GELU -> 2-layer LSTM -> Linear (mel in, mel out)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv1d(80, 128, 5, padding=2)
        self.norm1 = nn.GroupNorm(8, 128)
        self.act = nn.GELU()
        self.conv2 = nn.Conv1d(128, 128, 3, padding=1)
        self.norm2 = nn.BatchNorm1d(128)
        self.lstm = nn.LSTM(128, 96, num_layers=2, batch_first=True)
        self.proj = nn.Linear(96, 80)

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        x = self.act(self.norm1(self.conv1(mel)))
        x = self.act(self.norm2(self.conv2(x)))
        y, _ = self.lstm(x.transpose(1, 2))
        return self.proj(y).transpose(1, 2)


def transformer() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True, dropout=0.0)
    model = nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False).eval()
    return model, (torch.randn(2, 50, 64, generator=torch.Generator().manual_seed(1)),)


def convlstm() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = ConvLSTM().eval()
    with torch.no_grad():
        model.norm2.running_mean.normal_(0, 0.1)
        model.norm2.running_var.uniform_(0.5, 2.0)
    return model, (torch.randn(1, 80, 200, generator=torch.Generator().manual_seed(1)),)


def decoder() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from tensorprobe.examples import kokoro

    return kokoro.exportable_decoder(), kokoro.decoder_inputs(0.1, voiced=True)


def vits() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    from transformers import VitsConfig, VitsModel

    torch.manual_seed(0)
    cfg = VitsConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, ffn_dim=64,
                     flow_size=16, spectrogram_bins=33, upsample_initial_channel=32, upsample_rates=[4, 4],
                     upsample_kernel_sizes=[8, 8], resblock_kernel_sizes=[3], resblock_dilation_sizes=[[1, 3]],
                     prior_encoder_num_flows=2, prior_encoder_num_wavenet_layers=1, duration_predictor_num_flows=2,
                     duration_predictor_filter_channels=32, posterior_encoder_num_wavenet_layers=1,
                     speaker_embedding_size=0, noise_scale=0.0, noise_scale_duration=0.0)
    model = VitsModel(cfg).eval()
    return model, (torch.randint(0, 40, (1, 12), generator=torch.Generator().manual_seed(1)),)


ARCHITECTURES: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "transformer": transformer, "convlstm": convlstm, "decoder": decoder}


@dataclass
class OnnxPorts:
    """Bundles of one architecture: the fp32 ONNX model and the int8/fp16 ports made from that file."""

    fp32: Path
    int8_dynamic: Path
    int8_qdq: Path
    fp16: Path


def onnx_ports(name: str, root: Path) -> OnnxPorts:
    """Export `name` to ONNX (fp32), make the three ports with onnxruntime's own tools, capture all four."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, \
        quantize_static
    from onnxruntime.transformers.float16 import convert_float_to_float16

    import onnx
    from tensorprobe.runtimes import get_runtime
    from tensorprobe.runtimes.onnxruntime import export_onnx

    model, inputs = ARCHITECTURES[name]()
    root.mkdir(parents=True, exist_ok=True)
    fp32 = export_onnx(model, inputs, root / f"{name}.onnx", exporter="dynamo")
    graph_inputs = [i.name for i in onnx.load(str(fp32), load_external_data=False).graph.input]
    feeds = {n: t.numpy() for n, t in zip(graph_inputs, inputs)}

    class Reader(CalibrationDataReader):   # calibration: the input and two perturbed copies
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.items = iter([{k: (v + 0.1 * rng.standard_normal(v.shape)).astype(v.dtype) if v.dtype.kind == "f"
                                else v for k, v in feeds.items()} for _ in range(2)] + [feeds])

        def get_next(self):
            return next(self.items, None)

    files = {"fp32": fp32, "int8_dynamic": root / f"{name}_int8.onnx", "int8_qdq": root / f"{name}_qdq.onnx",
             "fp16": root / f"{name}_fp16.onnx"}
    quantize_dynamic(str(fp32), str(files["int8_dynamic"]), weight_type=QuantType.QInt8)
    quantize_static(str(fp32), str(files["int8_qdq"]), Reader(), quant_format=QuantFormat.QDQ,
                    weight_type=QuantType.QInt8, activation_type=QuantType.QUInt8)
    onnx.save(convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True), str(files["fp16"]))
    ort = get_runtime("onnxruntime")
    out = {}
    for kind, path in files.items():
        out[kind] = root / f"b_{name}_{kind}"
        ort.capture_artifact(path, feeds, out=out[kind], keep="full")
    return OnnxPorts(**out)


# ---- weight-conversion bugs, as a hand-written port would have them -----------------------------------
def transposed_linear(model: nn.Module, path: str) -> nn.Module:
    """The classic conversion bug: a square Linear's weight loaded transposed."""
    lin = dict(model.named_modules())[path]
    with torch.no_grad():
        lin.weight.copy_(lin.weight.t().clone())
    return model


def scaled_weight(model: nn.Module, path: str, attr: str = "weight", factor: float = 1.01) -> nn.Module:
    with torch.no_grad():
        getattr(dict(model.named_modules())[path], attr).mul_(factor)
    return model


def wrong_eps(model: nn.Module, path: str, eps: float) -> nn.Module:
    dict(model.named_modules())[path].eps = eps
    return model


def capture_pair(name: str, root: Path, make_candidate: Callable[[nn.Module], nn.Module], *, level: str = "op",
                 keep: str = "full", cast: torch.dtype | None = None) -> tuple[Path, Path]:
    """Capture the reference and a candidate made from a copy of it (a bug, or a cast to `cast`)."""
    factory = ARCHITECTURES.get(name) or globals()[name]
    model, inputs = factory()
    ref = root / f"{name}_ref_{level}_{keep}"
    if not ref.exists():
        torch.manual_seed(0)
        tp.capture(model, *inputs, level=level, keep=keep, out=ref)
    cand_model, _ = factory()
    cand_model = make_candidate(cand_model)
    cand_inputs = inputs
    if cast is not None:
        cand_model = cand_model.to(cast)
        cand_inputs = tuple(t.to(cast) if t.is_floating_point() else t for t in inputs)
    cand = root / f"{name}_cand_{level}_{keep}_{abs(hash((make_candidate, cast)))}"
    draws = any(r.kind == "rng" for r in tp.open_bundle(ref))
    torch.manual_seed(0)
    tp.capture(cand_model, *cand_inputs, level=level, keep=keep, out=cand, replay_rng=ref if draws else None)
    return ref, cand
