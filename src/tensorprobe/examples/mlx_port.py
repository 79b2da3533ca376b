"""A hand-written MLX port of one Kokoro decoder block (`AdaINResBlock1`), dumping its intermediates.

This is what the port's side of seed 004 looks like with tensorprobe: the port loads the PyTorch weights,
runs, and records each value under the PyTorch module path it corresponds to (`tensorprobe.port.Recorder`);
tensorprobe then opens the dump as a bundle and lines it up with a PyTorch capture of the same block.
Runs on Linux CPU with `pip install 'mlx[cpu]'` (plain `mlx` installs but does not import on Linux).

    >>> from tensorprobe.examples import mlx_port                                    # doctest: +SKIP
    >>> block, x, s = mlx_port.reference_block()                                     # doctest: +SKIP
    >>> mlx_port.run_port(block, x, s, "port.safetensors")                           # doctest: +SKIP
    >>> tensorprobe.diff(tensorprobe.capture(block, x, s, keep="full"), "port.safetensors").passed  # doctest: +SKIP
    True

Layout: MLX's `conv1d` works on (batch, length, channels); the port keeps that layout inside and transposes
to PyTorch's (batch, channels, length) only when it records, converting at the edge.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..errors import RuntimeUnavailable
from ..port import Recorder


def _mx():
    try:
        import mlx.core as mx
    except ImportError as e:
        raise RuntimeUnavailable(f"the MLX port example needs MLX ({e}): pip install 'tensorprobe[mlx]'") from None
    return mx


def reference_block(channels: int = 64, style_dim: int = 32, frames: int = 200, seed: int = 0):
    """The PyTorch `kokoro.istftnet.AdaINResBlock1` with seeded random weights, and inputs `(x, s)`."""
    from .kokoro import _istftnet

    istftnet = _istftnet()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        block = istftnet.AdaINResBlock1(channels, 3, (1, 3, 5), style_dim).eval()
        for p in block.parameters():  # non-trivial norms and snakes, so every term matters
            if p.dim() == 3 and p.shape[-1] == 1:
                p.data.uniform_(0.5, 1.5)
        x = torch.randn(1, channels, frames)
        s = torch.randn(1, style_dim)
    return block, x, s


def conv_weight(conv: torch.nn.Conv1d, *, raw_v: bool = False) -> np.ndarray:
    """The effective weight of a (weight-normed) Conv1d, as MLX wants it: (out, kernel, in).

    `raw_v=True` reproduces a classic porting bug: loading `weight_v` from the state dict and forgetting
    the weight-norm scale `weight_g / ||weight_v||`."""
    if hasattr(conv, "weight_g") and raw_v:
        w = conv.weight_v
    elif hasattr(conv, "weight_g"):
        w = torch._weight_norm(conv.weight_v, conv.weight_g, 0)
    else:
        w = conv.weight
    return w.detach().permute(0, 2, 1).contiguous().numpy()


class MlxAdaINResBlock1:
    """AdaINResBlock1 in MLX: three (AdaIN -> Snake -> dilated conv -> AdaIN -> Snake -> conv) + residual."""

    def __init__(self, block: torch.nn.Module, *, bug: str | None = None):
        mx = _mx()
        self.mx = mx
        arr = lambda t: mx.array(t.detach().numpy() if isinstance(t, torch.Tensor) else t)  # noqa: E731
        raw = bug == "weight_v"  # the deliberate porting bug of `conv_weight(raw_v=True)`, in convs2 only
        self.convs1 = [(arr(conv_weight(c)), arr(c.bias), c.dilation[0], c.padding[0]) for c in block.convs1]
        self.convs2 = [(arr(conv_weight(c, raw_v=raw)), arr(c.bias), c.dilation[0], c.padding[0])
                       for c in block.convs2]
        self.adain1 = [self._adain_params(a, arr) for a in block.adain1]
        self.adain2 = [self._adain_params(a, arr) for a in block.adain2]
        self.alpha1 = [arr(a.reshape(1, 1, -1)) for a in block.alpha1]  # (1, 1, C) for NLC
        self.alpha2 = [arr(a.reshape(1, 1, -1)) for a in block.alpha2]

    @staticmethod
    def _adain_params(adain: torch.nn.Module, arr) -> dict[str, Any]:
        return {"fc_w": arr(adain.fc.weight), "fc_b": arr(adain.fc.bias), "n_w": arr(adain.norm.weight),
                "n_b": arr(adain.norm.bias), "eps": adain.norm.eps}

    def adain(self, x, s, p: dict, name: str, rec: Recorder):
        mx = self.mx
        h = s @ p["fc_w"].T + p["fc_b"]                       # (B, 2C)
        rec(f"{name}.fc", h)
        mean = mx.mean(x, axis=1, keepdims=True)               # instance norm over time, two-pass variance
        var = mx.mean(mx.square(x - mean), axis=1, keepdims=True)
        xn = (x - mean) * mx.rsqrt(var + p["eps"]) * p["n_w"] + p["n_b"]
        rec(f"{name}.norm", _ncl(xn))
        gamma, beta = mx.split(h[:, None, :], 2, axis=-1)      # (B, 1, C) each
        y = (1 + gamma) * xn + beta
        rec(name, _ncl(y))
        return y

    def conv(self, x, params, name: str, rec: Recorder):
        w, b, dilation, padding = params
        y = self.mx.conv1d(x, w, stride=1, padding=padding, dilation=dilation) + b
        rec(name, _ncl(y))
        return y

    def __call__(self, x_ncl: np.ndarray, s: np.ndarray, rec: Recorder) -> np.ndarray:
        mx = self.mx
        x = mx.array(np.ascontiguousarray(x_ncl.transpose(0, 2, 1)))  # NCL -> NLC
        s = mx.array(s)
        for i in range(3):
            xt = self.adain(x, s, self.adain1[i], f"adain1.{i}", rec)
            a1 = self.alpha1[i]
            xt = xt + (1 / a1) * mx.square(mx.sin(a1 * xt))       # Snake1D
            xt = self.conv(xt, self.convs1[i], f"convs1.{i}", rec)
            xt = self.adain(xt, s, self.adain2[i], f"adain2.{i}", rec)
            a2 = self.alpha2[i]
            xt = xt + (1 / a2) * mx.square(mx.sin(a2 * xt))
            xt = self.conv(xt, self.convs2[i], f"convs2.{i}", rec)
            x = xt + x
        out = _ncl(x)
        rec("<root>", out)
        return np.array(out)


def _ncl(x):
    """NLC -> NCL for recording (a transpose at the edge; the port computes in NLC)."""
    return x.transpose(0, 2, 1)


def run_port(block: torch.nn.Module, x: torch.Tensor, s: torch.Tensor, out: str, *,
             bug: str | None = None) -> Recorder:
    """Run the MLX port of `block` on `(x, s)` and dump every intermediate to `out` (safetensors).

    `bug="weight_v"` runs the port with the weight-norm loading bug in `convs2` (see `conv_weight`).
    """
    rec = Recorder()
    MlxAdaINResBlock1(block, bug=bug)(x.numpy(), s.numpy(), rec)
    rec.save(out)
    return rec
