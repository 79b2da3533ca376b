"""A model's training flags, left as the user set them.

A port is exported and run in eval mode, but the model the user hands over is theirs: one kept partly in
training mode on purpose (dropout on at inference, a Tacotron prenet, MC dropout) must still be so when its
reference is captured after the export. `eval_mode` puts every module in eval mode for the block and restores
each flag after.

    >>> import torch
    >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Dropout(0.5)); _ = m.eval(); _ = m[1].train()
    >>> with eval_mode(m):
    ...     m[1].training
    False
    >>> m[1].training, m.training
    (True, False)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """`model` in eval mode inside, every module's training flag as it was after."""
    flags = [(m, m.training) for m in model.modules()]
    try:
        yield model.eval()
    finally:
        for m, training in flags:
            m.training = training
