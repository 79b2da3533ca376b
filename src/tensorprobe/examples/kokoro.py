"""The Kokoro-82M iSTFTNet decoder, from the PyPI `kokoro` package, with seeded random weights.

Real weights are never downloaded: the architecture is the package's own `kokoro.istftnet.Decoder`,
built with the Kokoro-82M configuration values below, and initialised from a fixed seed.

Two factories serve as TARGETs for the command line (`tensorprobe nan tensorprobe.examples.kokoro:faulty_decoder`):

- `decoder`: the reference decoder on 3 s of unvoiced input (finite output).
- `faulty_decoder`: the same decoder where every `InstanceNorm1d` is replaced by the lowering a broken
  backend produces (seed 000, issue 5: TVM and ExecuTorch): variance as E[x²]−E[x]², accumulated in
  float16. On channels whose mean is large against their spread the variance comes out negative, `rsqrt`
  returns NaN for those channels, and the next convolution spreads NaN everywhere.

    >>> from tensorprobe.examples import kokoro
    >>> model, inputs = kokoro.faulty_decoder()          # doctest: +SKIP
    >>> model(*inputs).isnan().all()                     # doctest: +SKIP
    tensor(True)
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn as nn

from ..errors import RuntimeUnavailable

SAMPLE_RATE = 24_000
# Kokoro-82M config.json values (hidden_dim, style_dim, n_mels and the "istftnet" block).
HIDDEN_DIM = 512
STYLE_DIM = 128
N_MELS = 80
ISTFTNET = dict(
    upsample_kernel_sizes=[20, 12],
    upsample_rates=[10, 6],
    gen_istft_hop_size=5,
    gen_istft_n_fft=20,
    resblock_dilation_sizes=[[1, 3, 5], [1, 3, 5], [1, 3, 5]],
    resblock_kernel_sizes=[3, 7, 11],
    upsample_initial_channel=512,
)
# Audio samples per decoder input frame: F0 runs at 2 values per frame, upsampled by 10*6*5 = 300.
SAMPLES_PER_FRAME = 2 * math.prod(ISTFTNET["upsample_rates"]) * ISTFTNET["gen_istft_hop_size"]


def _istftnet():
    try:
        from kokoro import istftnet
    except ImportError as e:
        raise RuntimeUnavailable(
            f"the Kokoro examples need the `kokoro` package ({e}): pip install 'tensorprobe[kokoro]'"
        ) from None
    return istftnet


def build_decoder(seed: int = 0, *, stable_source: bool = True) -> nn.Module:
    """The Kokoro-82M decoder with random weights from `seed`, in eval mode.

    Args:
        seed: weight seed (the global RNG state is left as it was).
        stable_source: silence the sine/noise source (sine_amp = 0), so that the random ops inside
            the source module no longer change the output: two runs give identical audio.
    """
    istftnet = _istftnet()
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # kokoro's own code uses the deprecated torch.nn.utils.weight_norm; not the user's concern here
        warnings.simplefilter("ignore", FutureWarning)
        torch.manual_seed(seed)
        decoder = istftnet.Decoder(dim_in=HIDDEN_DIM, style_dim=STYLE_DIM, dim_out=N_MELS, **ISTFTNET)
    if stable_source:
        decoder.generator.m_source.l_sin_gen.sine_amp = 0.0
    return decoder.eval()


def exportable_decoder(seed: int = 0) -> nn.Module:
    """The decoder as an ONNX/ExecuTorch port builds it: Kokoro's conv-based `CustomSTFT` (no complex ops, the
    `disable_complex=True` path of `kokoro.KModel`), weight norm folded into plain weights (int8 quantizers need
    constant weights), and the stable source with a zero source bias (the random source ops can't change the output).
    """
    from kokoro.custom_stft import CustomSTFT

    model = build_decoder(seed)
    g = model.generator
    n_fft, hop = ISTFTNET["gen_istft_n_fft"], ISTFTNET["gen_istft_hop_size"]
    g.stft = CustomSTFT(filter_length=n_fft, hop_length=hop, win_length=n_fft)
    with torch.no_grad():
        g.m_source.l_linear.bias.zero_()
    for mod in model.modules():
        if hasattr(mod, "weight_g"):
            torch.nn.utils.remove_weight_norm(mod)
    return model.eval()


def decoder_inputs(seconds: float = 3.0, seed: int = 0, *, voiced: bool = False) -> tuple[torch.Tensor, ...]:
    """Decoder inputs `(asr, F0_curve, N, s)` for `seconds` of 24 kHz audio.

    With `voiced=False` F0 is all zero (unvoiced), the setting in which seed 000's decoder went NaN.
    With `voiced=True` F0 is a smooth 110–220 Hz contour.
    """
    frames = max(2, round(seconds * SAMPLE_RATE / SAMPLES_PER_FRAME))
    g = torch.Generator().manual_seed(seed)
    asr = torch.randn(1, HIDDEN_DIM, frames, generator=g)
    t = torch.linspace(0, 1, 2 * frames)
    f0 = (165 + 55 * torch.sin(2 * math.pi * 1.5 * t)).unsqueeze(0) if voiced else torch.zeros(1, 2 * frames)
    n = torch.randn(1, 2 * frames, generator=g)
    s = torch.randn(1, STYLE_DIM, generator=g)
    return asr, f0, n, s


class FaultyInstanceNorm1d(nn.Module):
    """InstanceNorm1d as a broken backend lowers it: var = E[x²] − E[x]², accumulated in float16.

    Drop-in for `nn.InstanceNorm1d(affine=True)`; keeps its weight, bias and eps.
    """

    def __init__(self, original: nn.InstanceNorm1d):
        super().__init__()
        self.eps = original.eps
        self.weight = original.weight
        self.bias = original.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xh = x.to(torch.float16)
        mean = xh.mean(dim=-1, keepdim=True)
        mean_sq = (xh * xh).mean(dim=-1, keepdim=True)
        var = (mean_sq - mean * mean).to(x.dtype)
        y = (x - mean.to(x.dtype)) * torch.rsqrt(var + self.eps)
        if self.weight is not None:
            y = y * self.weight[:, None] + self.bias[:, None]
        return y


def inject_faulty_instance_norm(model: nn.Module) -> list[str]:
    """Replace every `nn.InstanceNorm1d` in `model` with `FaultyInstanceNorm1d`; returns the replaced paths."""
    replaced = []
    for path, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.InstanceNorm1d):
                setattr(module, child_name, FaultyInstanceNorm1d(child))
                replaced.append(f"{path}.{child_name}" if path else child_name)
    return replaced


def decoder(seconds: float = 3.0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """TARGET factory: the reference Kokoro decoder and 3 s of unvoiced input."""
    return build_decoder(), decoder_inputs(seconds)


def faulty_decoder(seconds: float = 3.0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """TARGET factory: the decoder with the broken instance-norm lowering, same inputs as `decoder`."""
    model = build_decoder()
    inject_faulty_instance_norm(model)
    return model, decoder_inputs(seconds)


def export_decoder(seconds: float = 3.0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """TARGET factory: `exportable_decoder()` and 3 s of unvoiced input (for `--runtime onnxruntime`)."""
    return exportable_decoder(), decoder_inputs(seconds)


def voiced_decoder(seconds: float = 3.0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """TARGET factory: the reference decoder with its random source on, and a voiced F0 contour."""
    return build_decoder(stable_source=False), decoder_inputs(seconds, voiced=True)


def decoder_sweep(items: int = 50, seconds: float = 0.1):
    """SWEEP_TARGET: the export decoder over `items` short inputs, half voiced (F0 110–220 Hz) and half
    unvoiced (F0 = 0, where seeds 000 and 001 went NaN), each from its own seed, against ONNX Runtime, with
    audio checks at 24 kHz."""
    from ..sweep import Sweep

    def inputs(name: str) -> tuple[torch.Tensor, ...]:
        kind, seed = name.split("-")
        return decoder_inputs(seconds, seed=int(seed), voiced=kind == "voiced")

    names = [f"{'voiced' if i % 2 else 'unvoiced'}-{i:03d}" for i in range(items)]
    return Sweep(exportable_decoder(), names, candidate="onnxruntime", inputs=inputs, sample_rate=SAMPLE_RATE)
