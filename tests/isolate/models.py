"""Models whose modules use a child's parameters in their own code, and ports of them with one bug each.

None of them was written for isolate: the transformer is `torch.nn`'s own; the weight-normed block and the
recurrent cell follow the way HiFi-GAN/StyleTTS vocoders and hand-written RNN cells are commonly coded.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn


def transformer(seed: int = 0) -> nn.Module:
    """A standard post-norm `nn.TransformerEncoder` (4 layers, eval mode: dropout off)."""
    torch.manual_seed(seed)
    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
    model = nn.Sequential()
    model.add_module("encoder", nn.TransformerEncoder(layer, num_layers=4, enable_nested_tensor=False))
    return model.eval()


def transformer_inputs(seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(2, 10, 32)


def transposed_out_proj(model: nn.Module, layer: int = 2) -> nn.Module:
    """The port's converter wrote one attention output projection transposed (a square matrix: shapes agree)."""
    port = copy.deepcopy(model)
    w = port.encoder.layers[layer].self_attn.out_proj.weight
    with torch.no_grad():
        w.copy_(w.detach().t().clone())
    return port


class WeightNormedBlock(nn.Module):
    """conv → tanh, where the block computes the conv's weight norm itself (g · v / ‖v‖) and calls
    `F.conv1d` with it: the `conv` child holds v and the bias but is never called."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(channels, channels, 5, padding=2)
        self.g = nn.Parameter(torch.rand(channels, 1, 1) + 0.5)
        self.act = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.conv.weight
        w = self.g * v / v.norm(dim=(1, 2), keepdim=True)
        return x + self.act(F.conv1d(x, w, self.conv.bias, padding=2))


class Vocoder(nn.Module):
    """pre conv → 3 weight-normed residual blocks → post conv."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.pre = nn.Conv1d(1, channels, 7, padding=3)
        self.blocks = nn.ModuleList(WeightNormedBlock(channels) for _ in range(3))
        self.post = nn.Conv1d(channels, 1, 7, padding=3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.pre(x)
        for b in self.blocks:
            h = b(h)
        return torch.tanh(self.post(h))


def vocoder(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return Vocoder().eval()


def vocoder_inputs(seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(1, 1, 400)


def flipped_kernel(model: nn.Module, block: int = 1) -> nn.Module:
    """The port's converter flipped one conv's kernel (correlation vs convolution): its norm is unchanged."""
    port = copy.deepcopy(model)
    v = port.blocks[block].conv.weight
    with torch.no_grad():
        v.copy_(v.detach().flip(-1))
    return port


class RecurrentCell(nn.Module):
    """h_t = tanh(W x_t + U h_{t-1} + b), written by hand with the weights of two `nn.Linear` children
    (`inp`, `rec`) that it never calls, as custom RNN cells often are."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.inp = nn.Linear(size, size)
        self.rec = nn.Linear(size, size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.new_zeros(x.shape[0], x.shape[2])
        out = []
        for t in range(x.shape[1]):
            h = torch.tanh(x[:, t] @ self.inp.weight.T + self.inp.bias + h @ self.rec.weight.T)
            out.append(h)
        return torch.stack(out, 1)


class Tagger(nn.Module):
    """embed (Linear) → cell → cell again (the same module, called twice) → head (Linear)."""

    def __init__(self, size: int = 12) -> None:
        super().__init__()
        self.embed = nn.Linear(size, size)
        self.cell = RecurrentCell(size)
        self.head = nn.Linear(size, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.cell(self.cell(self.embed(x))))


def tagger(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return Tagger().eval()


def tagger_inputs(seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(2, 6, 12)


def scaled_recurrent_row(model: nn.Module) -> nn.Module:
    """The port's recurrent matrix has one row scaled by 1.5 (a per-gate scale applied twice)."""
    port = copy.deepcopy(model)
    with torch.no_grad():
        port.cell.rec.weight[3] *= 1.5
    return port


class FlowBlock(nn.Module):
    """A DiT-style block of a flow-matching decoder: LayerNorm → Linear → GELU → Linear, residual."""

    def __init__(self, size: int, approximate: str = "none") -> None:
        super().__init__()
        self.norm = nn.LayerNorm(size)
        self.up = nn.Linear(size, 4 * size)
        self.act = nn.GELU(approximate=approximate)
        self.down = nn.Linear(4 * size, size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(self.act(self.up(self.norm(x))))


class FlowDecoder(nn.Module):
    def __init__(self, size: int = 32, depth: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(FlowBlock(size) for _ in range(depth))
        self.out = nn.Linear(size, size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.out(x)


def flow_decoder(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return FlowDecoder().eval()


def flow_inputs(seed: int = 1) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.randn(2, 20, 32)


def tanh_gelu(model: nn.Module, block: int = 2) -> nn.Module:
    """The port uses the tanh approximation of GELU in one block (relative error ~1e-4)."""
    port = copy.deepcopy(model)
    port.blocks[block].act = nn.GELU(approximate="tanh")
    return port
