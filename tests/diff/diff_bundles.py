"""Write bundles directly with BundleWriter: exactly what another runtime's dump looks like."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

import torch

from tensorprobe.bundle import Bundle, BundleWriter
from tensorprobe.record import Record
from tensorprobe.stats import compute_stats


def write_bundle(path: Path, items: Iterable[tuple[str, torch.Tensor] | tuple[str, torch.Tensor, dict[str, Any]]]
                 ) -> Bundle:
    """items: (name, tensor[, Record fields such as module, op, inputs, kind, call, tags]); a field
    `stats_only=True` records the tensor's statistics without the tensor."""
    with BundleWriter(path) as w:
        for i, item in enumerate(items):
            name, t = item[0], item[1]
            extra = dict(item[2]) if len(item) > 2 else {}
            extra.setdefault("module", name.split("/")[0].split("@")[0].split(":")[0])
            extra.setdefault("op", "tensor")
            stats_only = extra.pop("stats_only", False)
            w.add(Record(name=name, order=i, shape=tuple(t.shape), dtype=str(t.dtype).removeprefix("torch."),
                         stats=compute_stats(t), **extra), None if stats_only else t)
    return Bundle.open(path)
