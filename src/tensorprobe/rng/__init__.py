"""Randomness, recorded and replayed.

Capture stores the output of every random op (kind "rng", always with its tensor). `RngReplay` feeds
those tensors back, in call order, the next time the model runs: two runs that differ only in their
random generators (another seed, another framework's RNG) then compare equal, and a diff shows what
the port really changes.

    >>> import torch, tensorprobe as tp
    >>> class Noisy(torch.nn.Module):
    ...     def forward(self, x):
    ...         return torch.tanh(x + torch.randn_like(x))
    >>> model, x = Noisy(), torch.zeros(4)
    >>> ref = tp.capture(model, x, level="op", keep="full")                  # torch.randn_like recorded
    >>> again = tp.capture(model, x, level="op", keep="full", replay_rng=ref)
    >>> bool((ref.tensor("<root>/tanh.0") == again.tensor("<root>/tanh.0")).all())
    True

Matching: each random op asks for the record of the same name (`<module>[@call]/<op>.<k>`); when the
name is not in the recording (a port with other module paths, or a run without module hooks) it takes the
next unused random record in call order that draws alike. Shape or dtype mismatches and a recording that
runs out are `InputError`s naming the op and its source line. A recorded tensor is fed only to the same
kind of draw (`draws`: distribution, parameters, kind of number): an op that draws otherwise keeps its own
draw and is listed in `RngReplay.refused`, so replay never hides a port that draws `rand_like` where the
reference draws `randn_like` (`diff` then reports it at that op). The random op itself still runs, so the generator
advances as it would have, and in-place ops (`normal_`, `uniform_`, `bernoulli_`, dropout's mask) get the
recorded values copied into their target. Dropout in train mode is replayed through its mask.

- `draws`       `Draw` (what a random op draws), `DrawMismatch`; torch-free
- `noise_file`  `NoiseEntry`, `export_noise`, `load_noise` (the file a port loads; NumPy)
- `replay`      `RngReplay`, `as_replay` (torch)
- `suspects`    `unreplayed_rng_before` (diff integration; NumPy)

For a port in another language, `export_noise(bundle, "noise.safetensors")` writes the recorded noise;
see `export_noise` for the layout a Swift/MLX/C++ port reads. `unreplayed_rng_before` tells a diff
whether its first divergence sits right after a random op whose noise was not replayed.
"""

from __future__ import annotations

from typing import Any

from .draws import Draw, DrawMismatch, draw_of
from .noise_file import NOISE_FORMAT, NOISE_VERSION, NoiseEntry, export_noise, load_noise
from ..record import TAG_REPLAYED
from .suspects import RngSuspect, unreplayed_rng_before


def __getattr__(name: str) -> Any:
    if name in ("RngReplay", "as_replay"):   # torch: imported on first use
        from . import replay

        return getattr(replay, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["Draw", "DrawMismatch", "NOISE_FORMAT", "NOISE_VERSION", "RngReplay", "draw_of", "RngSuspect", "NoiseEntry", "as_replay", "export_noise",
           "load_noise", "unreplayed_rng_before", "TAG_REPLAYED"]
