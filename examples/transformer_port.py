"""A torch.nn.TransformerEncoder and a port of it whose converter wrote one attention output projection
transposed (a square matrix: the shapes agree), for docs/guide-isolate.md and docs/guide-diff.md. TARGETs:
`examples/transformer_port.py:reference`, `examples/transformer_port.py:port` and `:renamed_port` (the port with
its layers named `blocks.N`, as a port that renamed its modules)."""

from __future__ import annotations

import torch


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, batch_first=True)
    return torch.nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False).eval()


def _inputs() -> tuple[torch.Tensor]:
    torch.manual_seed(1)
    return (torch.randn(2, 5, 16),)


def reference():
    return _model(), _inputs()


def port():
    model = _model()
    w = model.layers[2].self_attn.out_proj.weight
    with torch.no_grad():
        w.copy_(w.t().clone())          # the converter's bug
    return model, _inputs()


class _Renamed(torch.nn.Module):
    """The port's own module names: its layers are `blocks.N` where the reference's are `layers.N`."""

    def __init__(self, encoder: torch.nn.TransformerEncoder):
        super().__init__()
        self.blocks = encoder.layers

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def renamed_port():
    model, inputs = port()
    return _Renamed(model).eval(), inputs
