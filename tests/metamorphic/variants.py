"""Variations of a real model that keep or change what a verdict must say, shared by the metamorphic tests.

Each variation is made the way a user's code would make it: a model wrapped under another name (its records
renamed, mapped back with rules), an output scaled by 1+eps in the forward (a wrong gain in a port), a weight
changed as a conversion bug changes it. Nothing here knows tensorprobe's internals.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch import nn

import tensorprobe as tp

PREFIX = "net"
# a wrapped model's names back onto the model's own: `net.conv1` -> `conv1`, `net/relu.0` -> `<root>/relu.0`
RENAME_RULES = [rf"{PREFIX}\.(.*)=\1", rf"{PREFIX}/(.*)=<root>/\1", rf"{PREFIX}=<root>"]


class Renamed(nn.Module):
    """`model` one level down, under the attribute `net`: every record of it is renamed."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.net = model

    def forward(self, *args: Any) -> Any:
        return self.net(*args)


def with_scaled_output(model: nn.Module, factor: float) -> nn.Module:
    """`model` whose forward multiplies its (first) output by `factor`: a wrong gain in a port. The class is
    swapped for a subclass, so every module keeps its name and the multiplication is an op of the root."""
    base = type(model)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = base.forward(self, *args, **kwargs)
        if isinstance(out, tuple):
            return (out[0] * factor, *out[1:])
        return out * factor

    model.__class__ = type(base.__name__, (base,), {"forward": forward})
    return model


def renamed_rules(rules: str) -> list[str]:
    """A rules file's rules for the wrapped candidate: each pattern under `net.` (the model inputs, which a
    wrapper does not rename, stay as they are)."""
    out = []
    for line in rules.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        out.append(line if line.startswith("input") else rf"{PREFIX}\.{line}")
    return out


def capture_in(root: Path, name: str, model: nn.Module, inputs: tuple, **options: Any) -> tp.Bundle:
    """A capture of `model` into a fresh folder `root/name-N` (hypothesis calls a test many times)."""
    root.mkdir(parents=True, exist_ok=True)
    n = sum(1 for _ in root.glob(f"{name}-*"))
    return tp.capture(model, *inputs, out=root / f"{name}-{n}", **options)


def first_cause(report: tp.DiffReport) -> tuple[str | None, str | None, str | None]:
    """(first divergence, its cause, its origin): what a user reads first."""
    pair = report.get(report.first_divergence)
    return report.first_divergence, pair and pair.cause, pair and pair.origin


def output_pair(report: tp.DiffReport):
    return report.pair(report.output)
