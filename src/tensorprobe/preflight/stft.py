"""An STFT/iSTFT made of real convolutions, for targets without complex tensors or FFT ops (ExecuTorch, TVM,
Core ML), and the rewrite rule that swaps it in.

`ConvSTFT` computes what `torch.stft(..., center=True, pad_mode="reflect", onesided=True)` and
`torch.istft(..., center=True)` compute, with the window and the DFT folded into convolution kernels: the
forward transform is one strided `conv1d` (real and imaginary rows), the inverse one `conv_transpose1d`
(overlap-add included) divided by the window's squared overlap-add envelope.

The rule `conv_stft` replaces modules that follow the iSTFTNet `TorchSTFT` interface (StyleTTS2, Kokoro and
the vocoders that copy it): attributes `filter_length`, `hop_length`, `win_length`, `window`, and methods
`transform(x) -> (magnitude, phase)` and `inverse(magnitude, phase) -> audio[:, None]`.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .functions import guarded_atan2


class ConvSTFT(nn.Module):
    """STFT and iSTFT with real convolutions; `transform`/`inverse`/`forward` as iSTFTNet's `TorchSTFT`.

        >>> stft = ConvSTFT(16, 4, 16, torch.hann_window(16))
        >>> x = torch.randn(1, 256)
        >>> mag, phase = stft.transform(x)
        >>> bool(torch.allclose(stft.inverse(mag, phase)[:, 0], x, atol=1e-5))
        True
    """

    def __init__(self, n_fft: int, hop: int, win_length: int, window: torch.Tensor):
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        win = window.detach().to(torch.float64).cpu()
        left = (n_fft - win_length) // 2                 # torch.stft centres a shorter window in the frame
        win = F.pad(win, (left, n_fft - win_length - left))
        k = torch.arange(n_fft // 2 + 1, dtype=torch.float64)[:, None]
        n = torch.arange(n_fft, dtype=torch.float64)[None, :]
        angle = 2 * math.pi * k * n / n_fft
        forward = torch.cat([torch.cos(angle), -torch.sin(angle)]) * win       # [2·bins, n_fft]
        # irfft: DC and Nyquist once, the other bins twice (their conjugates); imaginary DC/Nyquist ignored
        weight = torch.full((n_fft // 2 + 1, 1), 2.0, dtype=torch.float64)
        weight[0] = 1.0
        if n_fft % 2 == 0:
            weight[-1] = 1.0
        inverse = torch.cat([weight * torch.cos(angle), -weight * torch.sin(angle)]) * win / n_fft
        self.register_buffer("forward_kernel", forward[:, None, :].float(), persistent=False)
        self.register_buffer("inverse_kernel", inverse[:, None, :].float(), persistent=False)
        self.register_buffer("window_sq", (win * win)[None, None, :].float(), persistent=False)

    def spectrum(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Real and imaginary parts, [batch, bins, frames], of `torch.stft(x, center=True)` for x [batch, time]."""
        pad = self.n_fft // 2
        frames = F.conv1d(F.pad(x[:, None, :], (pad, pad), mode="reflect"), self.forward_kernel, stride=self.hop)
        return frames.chunk(2, dim=1)

    def transform(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        real, imag = self.spectrum(x)
        return torch.sqrt(real * real + imag * imag), guarded_atan2(imag, real)

    def inverse(self, magnitude: torch.Tensor, phase: torch.Tensor) -> torch.Tensor:
        """`torch.istft(magnitude · e^{i·phase}, center=True).unsqueeze(-2)`: [batch, 1, time]."""
        spec = torch.cat([magnitude * torch.cos(phase), magnitude * torch.sin(phase)], dim=1)
        audio = F.conv_transpose1d(spec, self.inverse_kernel, stride=self.hop)
        ones = torch.ones(1, 1, magnitude.shape[-1], dtype=audio.dtype, device=audio.device)
        envelope = F.conv_transpose1d(ones, self.window_sq.to(audio.dtype), stride=self.hop)
        pad = self.n_fft // 2
        end = audio.shape[-1] - pad
        return audio[..., pad:end] / envelope[..., pad:end]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inverse(*self.transform(x))


def _looks_like_torch_stft(m: nn.Module) -> bool:
    return (all(hasattr(m, a) for a in ("filter_length", "hop_length", "win_length", "window"))
            and callable(getattr(m, "transform", None)) and callable(getattr(m, "inverse", None))
            and isinstance(m.window, torch.Tensor) and not isinstance(m, ConvSTFT))


def conv_stft(model: nn.Module, *inputs: Any) -> tuple[nn.Module, list[str]]:
    """iSTFTNet-style `TorchSTFT` modules (complex `torch.stft`/`torch.istft`) -> `ConvSTFT`."""
    changed = []
    for path, m in list(model.named_modules()):
        if _looks_like_torch_stft(m):
            new = ConvSTFT(int(m.filter_length), int(m.hop_length), int(m.win_length), m.window)
            if not path:
                return new.to(m.window.device), ["<root>"]
            parent, _, name = path.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, name, new.to(m.window.device))
            changed.append(path)
    return model, changed
