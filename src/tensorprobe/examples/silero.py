"""A PyTorch port of Silero VAD against the ONNX file its package ships: a diff with a rules file.

The `silero-vad` package (PyPI) ships the trained network three ways: ONNX exports, a TorchScript file,
and `silero_vad_16k.safetensors` with a small reference implementation written for tinygrad. Porting it
to PyTorch from those weights is what a user does to train, prune or re-export it; `SileroVAD` is that
port, line for line from the package's `tinygrad_model.py`, with the weights of the shipped ONNX file
(`weights_from_onnx`; nothing is unpickled). Its names (`conv1`, `lstm_cell`) are not the ONNX export's
(`model.encoder.0.reparam_conv`, an LSTM inside an `If`), so `RULES` maps one onto the other.

    >>> from tensorprobe.examples import silero                                     # doctest: +SKIP
    >>> import tensorprobe as tp                                                    # doctest: +SKIP
    >>> ort = tp.get_runtime("onnxruntime")                                          # doctest: +SKIP
    >>> ref = ort.capture_artifact(silero.onnx_file(), silero.onnx_feeds(), "onnx")  # doctest: +SKIP
    >>> model, inputs = silero.pytorch_port()                                       # doctest: +SKIP
    >>> port = tp.capture(model, *inputs, out="port")                               # doctest: +SKIP
    >>> tp.diff(ref, port, rules=silero.RULES).passed                               # doctest: +SKIP
    True

Command line: `python -m tensorprobe.examples.silero DIR` writes `DIR/frame.npz` (the ONNX feeds) and
`DIR/rules.txt`, and prints the three commands that capture and diff.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import InputError
from ._cli import output_dir, save_npz

SAMPLE_RATE = 16000
FRAME = 512          # samples per call at 16 kHz
STATE_SHAPE = (2, 1, 128)

# candidate (this port) = reference (the shipped ONNX export), one per line, as `diff --rules` reads them
RULES = r"""# PyTorch port (tensorprobe.examples.silero) -> silero_vad_16k_op15.onnx
input\.0=input.input
input\.1=input.state
stft_conv=model.stft/Conv.0
conv1=model.encoder.0.reparam_conv
conv2=model.encoder.1.reparam_conv
conv3=model.encoder.2.reparam_conv
conv4=model.encoder.3.reparam_conv
lstm_cell:0=model.decoder.If.then.model.decoder.rnn/Squeeze.0
lstm_cell:1=model.decoder.If.then.model.decoder.rnn/Squeeze.1
final_conv=model.decoder.decoder.2
# weights, so that a weight that differs is named as the cause
stft_conv\.weight=model.stft.forward_basis_buffer
conv1\.(weight|bias)=model.encoder.0.reparam_conv.\1
conv2\.(weight|bias)=model.encoder.1.reparam_conv.\1
conv3\.(weight|bias)=model.encoder.2.reparam_conv.\1
conv4\.(weight|bias)=model.encoder.3.reparam_conv.\1
lstm_cell\.(.*)=model.decoder.rnn.\1
final_conv\.(weight|bias)=model.decoder.decoder.2.\1
"""


class SileroVAD(nn.Module):
    """Silero VAD v5 at 16 kHz: a conv STFT, four conv+ReLU blocks, an LSTM cell, a 1×1 conv + sigmoid.

    `forward(x, state)` takes one frame `(batch, 512)` and the LSTM state `(2, batch, 128)` and returns the
    speech probability `(batch, 1)` and the new state, like the ONNX file's `output` and `stateN`."""

    def __init__(self) -> None:
        super().__init__()
        self.n_fft, self.stride, self.pad = 256, 128, 64
        self.cutoff = self.n_fft // 2 + 1
        self.stft_conv = nn.Conv1d(1, 2 * self.cutoff, kernel_size=self.n_fft, stride=self.stride, bias=False)
        self.conv1 = nn.Conv1d(129, 128, kernel_size=3, padding=1)
        self.conv2 = nn.Conv1d(128, 64, kernel_size=3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(64, 64, kernel_size=3, stride=2, padding=1)
        self.conv4 = nn.Conv1d(64, 128, kernel_size=3, padding=1)
        self.lstm_cell = nn.LSTMCell(128, 128)
        self.final_conv = nn.Conv1d(128, 1, 1)

    def forward(self, x: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = nn.functional.pad(x, (0, self.pad), mode="reflect").unsqueeze(1)
        x = self.stft_conv(x)
        x = (x[:, :self.cutoff] ** 2 + x[:, self.cutoff:] ** 2).sqrt()
        x = self.conv1(x).relu()
        x = self.conv2(x).relu()
        x = self.conv3(x).relu()
        x = self.conv4(x).relu().squeeze(-1)
        h, c = self.lstm_cell(x, (state[0], state[1]))
        x = self.final_conv(h.unsqueeze(-1).relu()).sigmoid()
        return x.squeeze(1).mean(dim=1, keepdim=True), torch.stack([h, c])


def package_file(name: str) -> Path:
    """A file of the installed `silero-vad` package's `data/` folder (InputError when it is missing)."""
    spec = importlib.util.find_spec("silero_vad")   # finds the files without importing the package (and torch.hub)
    if spec is None or not spec.submodule_search_locations:
        raise InputError("this example needs the silero-vad package: pip install 'silero-vad>=6,<7'")
    path = Path(spec.submodule_search_locations[0]) / "data" / name
    if not path.is_file():
        raise InputError(f"the installed silero-vad ships no data/{name}")
    return path


def onnx_file() -> Path:
    """The package's opset-15 ONNX export (an `If` on the sample rate around each half of the network)."""
    return package_file("silero_vad_16k_op15.onnx")


def frame(seed: int = 0) -> np.ndarray:
    """One 512-sample frame of a speech-like signal (a 140 Hz harmonic tone under noise), `(1, 512)`."""
    rng = np.random.default_rng(seed)
    t = np.arange(FRAME) / SAMPLE_RATE
    tone = sum(np.sin(2 * np.pi * 140 * k * t + rng.uniform(0, 2 * np.pi)) / k for k in range(1, 12))
    return (0.3 * tone + 0.02 * rng.standard_normal(FRAME)).astype(np.float32)[None]


def onnx_feeds(seed: int = 0) -> dict[str, np.ndarray]:
    """The ONNX file's inputs: a frame, a zero LSTM state and the sample rate."""
    return {"input": frame(seed), "state": np.zeros(STATE_SHAPE, np.float32), "sr": np.array(SAMPLE_RATE, np.int64)}


def weights_from_onnx(path: str | Path | None = None) -> dict[str, torch.Tensor]:
    """The port's state dict, converted from the ONNX file's initializers (renamed, nothing reshaped: the
    exporter kept PyTorch's layouts)."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(path or onnx_file())).graph
    rename = {"model.stft.forward_basis_buffer": "stft_conv.weight", "model.decoder.rnn.": "lstm_cell.",
              "model.decoder.decoder.2.": "final_conv.",
              **{f"model.encoder.{k}.reparam_conv.": f"conv{k + 1}." for k in range(4)}}
    state = {}
    for init in graph.initializer:
        prefix = next((p for p in rename if init.name.startswith(p)), None)
        if prefix is not None:
            state[rename[prefix] + init.name[len(prefix):]] = torch.from_numpy(numpy_helper.to_array(init).copy())
    return state


def pytorch_port(seed: int = 0) -> tuple[SileroVAD, tuple[torch.Tensor, torch.Tensor]]:
    """TARGET factory: the port with the weights of the shipped ONNX file (`weights_from_onnx`), and the
    same frame and zero state as `onnx_feeds`."""
    return _port(weights_from_onnx(), seed)


def safetensors_port(seed: int = 0) -> tuple[SileroVAD, tuple[torch.Tensor, torch.Tensor]]:
    """TARGET factory: the port with the package's `silero_vad_16k.safetensors` (read with safetensors).
    Those are not the weights of the package's ONNX or TorchScript files: only the STFT basis is the same,
    so `diff` against the ONNX capture names `conv1` as where the two part."""
    from safetensors.torch import load_file

    return _port(load_file(str(package_file("silero_vad_16k.safetensors"))), seed)


def _port(state: dict[str, torch.Tensor], seed: int) -> tuple[SileroVAD, tuple[torch.Tensor, torch.Tensor]]:
    model = SileroVAD()
    model.load_state_dict(state)
    feeds = onnx_feeds(seed)
    return model.eval(), (torch.from_numpy(feeds["input"]), torch.from_numpy(feeds["state"]))


def main(argv: list[str] | None = None) -> int:
    """Write `frame.npz` and `rules.txt` into DIR and print the commands that use them."""
    out = output_dir(argv, "silero")
    if out is None:
        return 2
    try:
        onnx = onnx_file()
    except InputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from ..bundle import atomic_write_bytes

    out.mkdir(parents=True, exist_ok=True)
    save_npz(out / "frame.npz", onnx_feeds())
    atomic_write_bytes(out / "rules.txt", RULES.encode())
    print(f"tensorprobe capture {onnx} --inputs {out / 'frame.npz'} -o {out / 'onnx'}\n"
          f"tensorprobe capture tensorprobe.examples.silero:pytorch_port -o {out / 'port'}\n"
          f"tensorprobe diff {out / 'onnx'} {out / 'port'} --rules {out / 'rules.txt'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
