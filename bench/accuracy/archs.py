"""Small audio architectures for the accuracy benchmark: each builds in milliseconds and runs in CPU-milliseconds,
with seeded weights and inputs, and names the modules a bug can be planted in (`Arch.sites`).

An architecture is a function `(seed) -> Built`; `ARCHS` holds them by name. The shapes of real audio models are
kept (channels first, a front end that transposes before an RNN, masks on attention, log magnitudes, flows with
exp, draws from randn_like) because those are where ports break and where verdicts have gone wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Built:
    model: nn.Module
    inputs: tuple[Any, ...]
    sites: dict[str, tuple[str, ...]]     # module path -> the bug kinds that apply to it (bugs.BUGS keys)
    time_axis: int = -1                   # the frames axis of the model's output (for bugs that bite late)


# ---- building blocks ------------------------------------------------------------------------------------------
class ChannelLayerNorm(nn.Module):
    """LayerNorm over the channels of a (B, C, T) tensor: transpose, normalise, transpose back."""

    def __init__(self, c: int, affine: bool = True):
        super().__init__()
        self.norm = nn.LayerNorm(c, elementwise_affine=affine)

    def forward(self, x):
        return self.norm(x.transpose(1, 2)).transpose(1, 2)


def norm_layer(kind: str, c: int, affine: bool) -> nn.Module:
    if kind == "instance":
        return nn.InstanceNorm1d(c, affine=affine)
    if kind == "group":
        return nn.GroupNorm(4, c, affine=affine)
    if kind == "layer":
        return ChannelLayerNorm(c, affine)
    if kind == "batch":
        return nn.BatchNorm1d(c, affine=affine)
    raise ValueError(kind)


class Snake(nn.Module):
    """x + sin²(αx)/α, BigVGAN's periodic activation."""

    def __init__(self, c: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.ones(1, c, 1))

    def forward(self, x):
        return x + torch.sin(self.alpha * x).pow(2) / (self.alpha + 1e-9)


class ConvNormNet(nn.Module):
    def __init__(self, norm: str, affine: bool, act: str):
        super().__init__()
        self.pre = nn.Conv1d(8, 16, 3, padding=1)
        self.blocks = nn.ModuleList()
        for _ in range(2):
            self.blocks.append(nn.Sequential(nn.Conv1d(16, 16, 3, padding=1), norm_layer(norm, 16, affine),
                                             nn.GELU() if act == "gelu" else nn.LeakyReLU(0.1)))
        self.post = nn.Conv1d(16, 4, 1)

    def forward(self, x):
        h = self.pre(x)
        for block in self.blocks:
            h = h + block(h)
        return self.post(h)


class ResBlock(nn.Module):
    def __init__(self, c: int, act: str):
        super().__init__()
        wn = nn.utils.parametrizations.weight_norm
        self.convs = nn.ModuleList([wn(nn.Conv1d(c, c, 3, dilation=d, padding=d)) for d in (1, 3)])
        self.acts = nn.ModuleList([Snake(c) if act == "snake" else nn.LeakyReLU(0.1) for _ in (1, 3)])

    def forward(self, x):
        for conv, act in zip(self.convs, self.acts):
            x = x + conv(act(x))
        return x


class HifiLike(nn.Module):
    def __init__(self, act: str):
        super().__init__()
        wn = nn.utils.parametrizations.weight_norm
        self.pre = wn(nn.Conv1d(16, 32, 7, padding=3))
        self.up = wn(nn.ConvTranspose1d(32, 16, 4, stride=2, padding=1))
        self.res = ResBlock(16, act)
        self.post = wn(nn.Conv1d(16, 1, 7, padding=3))

    def forward(self, mel):
        x = F.leaky_relu(self.pre(mel), 0.1)
        x = self.res(self.up(x))
        return torch.tanh(self.post(F.leaky_relu(x, 0.1)))


class FrontRNN(nn.Module):
    def __init__(self, cell: str):
        super().__init__()
        self.front = nn.Conv1d(20, 16, 3, padding=1)
        self.rnn = (nn.LSTM if cell == "lstm" else nn.GRU)(16, 24, num_layers=2, batch_first=True)
        self.head = nn.Linear(24, 8)

    def forward(self, feats):
        h = torch.relu(self.front(feats)).transpose(1, 2)        # (B, T, C) for the batch_first RNN
        y, _ = self.rnn(h)
        return self.head(y).transpose(1, 2)


class AttnBlock(nn.Module):
    def __init__(self, d: int = 32):
        super().__init__()
        self.inp = nn.Linear(16, d)
        self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
        self.mix = nn.Linear(d, d)
        self.norm1 = nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 64), nn.GELU(), nn.Linear(64, d))
        self.norm2 = nn.LayerNorm(d)
        self.out = nn.Linear(d, 8)

    def forward(self, x, pad_mask):
        h = self.inp(x)
        a, _ = self.attn(h, h, h, key_padding_mask=pad_mask, need_weights=False)
        h = self.norm1(h + self.mix(a))
        h = self.norm2(h + self.ff(h))
        return self.out(h)


class MelDb(nn.Module):
    """A log-mel front end as a conv (a real DFT basis, no complex tensors) and 20·log10 of the clamped magnitude."""

    def __init__(self, n_fft: int = 64, hop: int = 16, n_mels: int = 12):
        super().__init__()
        t = torch.arange(n_fft, dtype=torch.float64)
        k = torch.arange(n_fft // 2 + 1, dtype=torch.float64)[:, None]
        window = torch.hann_window(n_fft, periodic=True, dtype=torch.float64)
        basis = torch.cat([torch.cos(2 * math.pi * k * t / n_fft), -torch.sin(2 * math.pi * k * t / n_fft)]) * window
        self.stft = nn.Conv1d(1, basis.shape[0], n_fft, stride=hop, bias=False)
        self.stft.weight.data.copy_(basis[:, None, :].float())
        self.mel = nn.Linear(n_fft // 2 + 1, n_mels, bias=False)
        self.mel.weight.data.copy_(torch.rand(n_mels, n_fft // 2 + 1))
        self.proj = nn.Conv1d(n_mels, 8, 3, padding=1)

    def forward(self, wav):
        spec = self.stft(wav)
        re, im = spec.chunk(2, dim=1)
        mag = torch.sqrt(re * re + im * im + 1e-12)
        mel = self.mel(mag.transpose(1, 2)).transpose(1, 2)
        db = 20 * torch.log10(torch.clamp(mel, min=1e-5))
        return self.proj(db)


class Coupling(nn.Module):
    def __init__(self, c: int = 8):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(c // 2, 16, 3, padding=1), nn.Tanh(), nn.Conv1d(16, c, 3, padding=1))

    def forward(self, x):
        xa, xb = x.chunk(2, dim=1)
        log_s, t = self.net(xa).chunk(2, dim=1)
        log_s = torch.tanh(log_s)
        return torch.cat([xa, xb * torch.exp(log_s) + t], dim=1), log_s.sum(dim=(1, 2))


class Flow(nn.Module):
    def __init__(self):
        super().__init__()
        self.flows = nn.ModuleList([Coupling(), Coupling()])

    def forward(self, x):
        logdet = 0
        for f in self.flows:
            x, ld = f(x)
            x = x.flip(1)
            logdet = logdet + ld
        return x, logdet


class NoiseInject(nn.Module):
    def __init__(self, c: int = 8):
        super().__init__()
        self.scale = nn.Parameter(torch.full((1, c, 1), 0.1))

    def forward(self, x):
        return x + self.scale * torch.randn_like(x)


class NoisyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Conv1d(4, 8, 3, padding=1)
        self.noise = NoiseInject()
        self.post = nn.Conv1d(8, 4, 3, padding=1)

    def forward(self, x):
        return self.post(torch.tanh(self.noise(self.pre(x))))


class DictNet(nn.Module):
    """Takes one dict and returns a dict, as TTS pipelines pass features around."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Conv1d(6, 12, 3, padding=1)
        self.cond = nn.Linear(4, 12)
        self.dec = nn.Conv1d(12, 6, 3, padding=1)

    def forward(self, batch):
        h = torch.relu(self.enc(batch["mel"]) + self.cond(batch["spk"])[:, :, None])
        return {"mel": self.dec(h), "energy": h.pow(2).mean(1)}


# ---- the registry ------------------------------------------------------------------------------------------
WEIGHT_BUGS = ("scale_weight", "permute_out", "drop_bias")
CONV_BUGS = WEIGHT_BUGS + ("flip_kernel", "late_frames")
LINEAR_BUGS = WEIGHT_BUGS


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def convnorm(norm: str, affine: bool, act: str) -> Callable[[int], Built]:
    def build(seed: int) -> Built:
        torch.manual_seed(seed)
        model = ConvNormNet(norm, affine, act).eval()
        if norm == "batch":
            with torch.no_grad():
                for b in model.blocks:
                    b[1].running_mean.normal_(0, 0.2, generator=_gen(seed + 7))
                    b[1].running_var.uniform_(0.5, 2.0, generator=_gen(seed + 8))
        norm_bugs = ("eps",) + (("one_pass_variance",) if norm in ("instance", "group", "layer") else ())
        norm_path = "blocks.{}.1" + (".norm" if norm == "layer" else "")
        sites = {"pre": CONV_BUGS, "blocks.0.0": CONV_BUGS, "blocks.1.0": CONV_BUGS, "post": CONV_BUGS,
                 norm_path.format(0): norm_bugs, norm_path.format(1): norm_bugs, "blocks.0": ("fp16_module",)}
        if act == "gelu":
            sites["blocks.1.2"] = ("approx_activation",)
        return Built(model, (torch.randn(1, 8, 64, generator=_gen(seed)),), sites)
    return build


def hifi(act: str) -> Callable[[int], Built]:
    def build(seed: int) -> Built:
        torch.manual_seed(seed)
        model = HifiLike(act).eval()
        sites = {"pre": ("scale_weight", "drop_bias", "late_frames"), "up": ("scale_weight", "drop_bias", "late_frames"),
                 "res.convs.0": ("scale_weight", "drop_bias", "flip_kernel"), "res.convs.1": ("scale_weight",),
                 "post": ("scale_weight", "late_frames"), "res": ("fp16_module",)}
        if act == "snake":
            sites["res.acts.0"] = ("scale_weight",)
        return Built(model, (torch.randn(1, 16, 32, generator=_gen(seed)),), sites)
    return build


def rnn(cell: str) -> Callable[[int], Built]:
    def build(seed: int) -> Built:
        torch.manual_seed(seed)
        model = FrontRNN(cell).eval()
        sites = {"front": CONV_BUGS, "rnn": ("gate_order", "scale_weight"), "head": LINEAR_BUGS}
        return Built(model, (torch.randn(1, 20, 40, generator=_gen(seed)),), sites)
    return build


def attention(seed: int) -> Built:
    torch.manual_seed(seed)
    model = AttnBlock().eval()
    x = torch.randn(2, 24, 16, generator=_gen(seed))
    mask = torch.zeros(2, 24, dtype=torch.bool)
    mask[1, 18:] = True                                       # the second item is padded
    sites = {"inp": LINEAR_BUGS, "mix": LINEAR_BUGS + ("transpose_weight",), "norm1": ("eps",), "norm2": ("eps",),
             "ff.0": LINEAR_BUGS, "ff.1": ("approx_activation",), "out": LINEAR_BUGS, "attn": ("scale_weight",)}
    return Built(model, (x, mask), sites)


def meldb(seed: int) -> Built:
    torch.manual_seed(seed)
    model = MelDb().eval()
    t = torch.arange(4000, dtype=torch.float32) / 16000
    wav = 0.3 * torch.sin(2 * math.pi * 220 * t) + 0.05 * torch.randn(4000, generator=_gen(seed))
    sites = {"mel": ("scale_weight", "permute_out"), "proj": CONV_BUGS, "stft": ("scale_weight",)}
    return Built(model, (wav[None, None, :],), sites)


def flow(seed: int) -> Built:
    torch.manual_seed(seed)
    model = Flow().eval()
    sites = {"flows.0.net.0": CONV_BUGS, "flows.1.net.2": ("scale_weight", "drop_bias"), "flows.1.net.1": ()}
    return Built(model, (torch.randn(1, 8, 32, generator=_gen(seed)),), {k: v for k, v in sites.items() if v})


def noisy(seed: int) -> Built:
    torch.manual_seed(seed)
    model = NoisyNet().eval()
    sites = {"pre": CONV_BUGS, "post": CONV_BUGS, "noise": ("uniform_for_normal",)}
    return Built(model, (torch.randn(1, 4, 48, generator=_gen(seed)),), sites)


def dictio(seed: int) -> Built:
    torch.manual_seed(seed)
    model = DictNet().eval()
    batch = {"mel": torch.randn(1, 6, 30, generator=_gen(seed)), "spk": torch.randn(1, 4, generator=_gen(seed + 1))}
    sites = {"enc": CONV_BUGS, "cond": LINEAR_BUGS, "dec": ("scale_weight", "drop_bias")}
    return Built(model, (batch,), sites)


ARCHS: dict[str, Callable[[int], Built]] = {
    **{f"convnorm-{n}-{'affine' if a else 'plain'}-{act}": convnorm(n, a, act)
       for n in ("instance", "group", "layer", "batch") for a in (True, False) for act in ("gelu", "leaky")},
    "hifi-leaky": hifi("leaky"), "hifi-snake": hifi("snake"),
    "rnn-lstm": rnn("lstm"), "rnn-gru": rnn("gru"),
    "attention": attention, "meldb": meldb, "flow": flow, "noisy": noisy, "dictio": dictio,
}
