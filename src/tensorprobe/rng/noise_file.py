"""The noise file: a bundle's recorded random tensors in one `.safetensors`, for a port in another language.

`NoiseEntry` describes one random draw; `export_noise` writes the file (NumPy, no torch), `load_noise` reads
it back as torch tensors for `RngReplay`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.numpy

from ..bundle import Bundle, atomic_write_bytes
from ..errors import BundleError, InputError
from ..record import KIND_RNG, Record
from .draws import Draw, draw_of

NOISE_FORMAT = "tensorprobe-noise"
NOISE_VERSION = 1


@dataclass(frozen=True)
class NoiseEntry:
    """One recorded random tensor: its record name, the op that drew it, what it draws (`draw`, e.g.
    "normal(mean=0,std=1):float"; None when unknown) and where it was called."""

    name: str
    op: str
    shape: tuple[int, ...]
    dtype: str
    order: int
    module: str = ""
    call: int = 0
    source: str | None = None
    draw: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "op": self.op, "shape": list(self.shape), "dtype": self.dtype,
                "order": self.order, "module": self.module, "call": self.call, "source": self.source,
                "draw": self.draw}

    def recorded_draw(self) -> Draw | None:
        return Draw.parse(self.draw) if self.draw else None

    @classmethod
    def from_record(cls, r: Record, order: int) -> "NoiseEntry":
        d = draw_of(r)
        return cls(r.name, r.op, tuple(r.shape), r.dtype, order, r.module, r.call, r.source,
                   d.text() if d is not None else None)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "NoiseEntry":
        return cls(str(d["name"]), str(d.get("op", "")), tuple(int(s) for s in d.get("shape", ())),
                   str(d.get("dtype", "")), int(d.get("order", 0)), str(d.get("module", "")),
                   int(d.get("call", 0)), d.get("source"), d.get("draw"))


def export_noise(bundle: Bundle | str | os.PathLike, path: str | os.PathLike) -> list[NoiseEntry]:
    """Write a bundle's recorded random tensors to one `.safetensors` file, for a port to load.

    Layout (readable by `safetensors` in any language; MLX: `mx.load(path, return_metadata=True)`,
    Swift: `MLX.loadArraysAndMetadata(url:)`):

        tensors     one per random op, keyed by record name in call order, e.g.
                    "generator.m_source.l_sin_gen/rand.0", "generator.m_source.l_sin_gen/randn_like.0"
                    (`<module path>[@<call>]/<op>.<k>`; `@<call>` for the 2nd+ call of a looped module;
                    `:<i>` for an op with several outputs, e.g. dropout's mask is `.../native_dropout.0:1`)
        metadata    "format": "tensorprobe-noise", "version": "1",
                    "entries": JSON list in call order of {name, op, shape, dtype, order, module, call, source,
                    draw}; draw is the distribution and its parameters, e.g. "normal(mean=0,std=1):float"

    The port replaces its own draws with these tensors, one per random call, in that order.

    Args:
        bundle: a captured bundle (random outputs are always stored), or its path.
        path: the `.safetensors` file to write (atomically).

    Returns:
        The entries written, in call order.

    Example:
        >>> export_noise("ref_bundle", "noise.safetensors")[0].name     # doctest: +SKIP
        'generator.m_source.l_sin_gen/rand.0'
    """
    b = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle)
    recs = [r for r in b if r.kind == KIND_RNG]
    if not recs:
        raise InputError(f"{b.path}: no random ops were recorded in this bundle, nothing to export")
    entries = [NoiseEntry.from_record(r, i) for i, r in enumerate(recs)]
    meta = {"format": NOISE_FORMAT, "version": str(NOISE_VERSION),
            "entries": json.dumps([e.to_dict() for e in entries])}
    if any(r.dtype == "bfloat16" for r in recs):   # NumPy has no bfloat16: write those exactly, with torch
        from safetensors.torch import save as save_torch

        data = save_torch({r.name: b.tensor(r.name).contiguous() for r in recs}, metadata=meta)
    else:
        data = safetensors.numpy.save({r.name: np.ascontiguousarray(b.numpy(r.name)) for r in recs}, metadata=meta)
    atomic_write_bytes(path, data)
    return entries


def load_noise(path: str | os.PathLike) -> tuple[dict[str, Any], list[NoiseEntry]]:
    """Read a noise file written by `export_noise`: (name -> tensor, entries in call order).

    Example:
        >>> tensors, entries = load_noise("noise.safetensors")          # doctest: +SKIP
        >>> tensors[entries[0].name].shape                              # doctest: +SKIP
        torch.Size([1, 9])
    """
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: no such noise file")
    if not _is_noise_file(p):
        raise BundleError(f"{p}: not a tensorprobe noise file (write one with `tensorprobe rng export`)")
    entries, tensors = _read_noise(p)
    return tensors, entries


def _is_noise_file(p: Path) -> bool:
    try:
        with safetensors.safe_open(str(p), framework="numpy") as f:
            return (f.metadata() or {}).get("format") == NOISE_FORMAT
    except Exception:
        return False


def _read_noise(p: Path) -> tuple[list[NoiseEntry], dict[str, Any]]:
    try:
        with safetensors.safe_open(str(p), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        entries = [NoiseEntry.from_dict(d) for d in json.loads(meta.get("entries", "[]"))]
    except Exception as e:
        raise BundleError(f"{p}: corrupt noise file ({e})") from None
    missing = [e.name for e in entries if e.name not in tensors]
    if missing:
        raise BundleError(f"{p}: noise file lists {missing[0]!r} but holds no such tensor")
    return sorted(entries, key=lambda e: e.order), tensors
