"""A conv/norm net to compile, for docs/guide-compile.md. TARGETs:

- `build`: two conv -> InstanceNorm1d -> LeakyReLU blocks (the second called twice), a projection and a tuple
  output: compiles faithfully;
- `planted`: the same net whose second block's norm computes its statistics in float16 on the compiled path
  only (the kind of lowering a wrong decomposition makes): eager is unchanged, the compiled model parts.
- `wrong_decomposition`: the net with an RMS norm after its second block, a custom op (`tp_example::rms`) whose
  decomposition for Inductor divides by n - 1 where the op divides by n: eager is right, Inductor parts.
"""

from __future__ import annotations

import torch


class Block(torch.nn.Module):
    def __init__(self, c: int = 8):
        super().__init__()
        self.conv = torch.nn.Conv1d(c, c, 3, padding=1)
        self.norm = torch.nn.InstanceNorm1d(c, affine=True)
        self.act = torch.nn.LeakyReLU(0.2)

    def forward(self, x):
        return self.act(self.norm(self.conv(x)))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = torch.nn.Conv1d(4, 8, 1)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.proj = torch.nn.Linear(8, 3)

    def forward(self, x):
        h = self.pre(x)
        h = self.blocks[0](h)
        h = h + self.blocks[1](h)
        h = self.blocks[1](h)                      # a second call: blocks.1@1
        return self.proj(h.transpose(1, 2)), h.mean(-1)


class LowPrecisionNorm(torch.nn.Module):
    """An instance norm whose compiled path (only) computes its statistics in float16."""

    def __init__(self, original: torch.nn.InstanceNorm1d):
        super().__init__()
        self.weight, self.bias, self.eps = original.weight, original.bias, original.eps

    def forward(self, x):
        if torch.compiler.is_compiling():
            xh = x.half()
            mean = xh.mean(-1, keepdim=True).float()
            var = (xh * xh).mean(-1, keepdim=True).float() - mean * mean
        else:
            mean = x.mean(-1, keepdim=True)
            var = x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight[:, None] + self.bias[:, None]


def build():
    torch.manual_seed(0)
    return Net().eval(), (torch.randn(1, 4, 64) * 3 + 1,)


def planted():
    model, inputs = build()
    model.blocks[1].norm = LowPrecisionNorm(model.blocks[1].norm)
    return model, inputs


class Rms(torch.nn.Module):
    """`tp_example::rms`: x / sqrt(mean(x^2) + eps) over the last dimension."""

    def forward(self, x):
        return torch.ops.tp_example.rms(x)


def _register_rms() -> None:
    """Define `tp_example::rms` (right in eager) and give Inductor a wrong decomposition of it, once."""
    if hasattr(torch.ops.tp_example, "rms"):
        return
    global _LIB   # the library must outlive this call, or the op is unregistered
    _LIB = torch.library.Library("tp_example", "DEF")
    _LIB.define("rms(Tensor x) -> Tensor")
    _LIB.impl("rms", lambda t: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5), "CompositeExplicitAutograd")
    torch.library.register_fake("tp_example::rms", lambda t: torch.empty_like(t), lib=_LIB)
    from torch._inductor.decomposition import decompositions, fast_random_decomps

    def wrong(t):   # the biased/unbiased mix-up of a hand-written lowering: the sum of squares over n - 1
        return t * torch.rsqrt(t.pow(2).sum(-1, keepdim=True) / (t.shape[-1] - 1) + 1e-5)

    decompositions[torch.ops.tp_example.rms.default] = wrong
    fast_random_decomps.cache_clear()   # Inductor's table is a cached copy of `decompositions`


def wrong_decomposition():
    _register_rms()
    model, inputs = build()
    model.blocks[1].act = torch.nn.Sequential(model.blocks[1].act, Rms())
    return model, inputs
