"""What the examples' `python -m tensorprobe.examples.NAME DIR` commands share."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np


def output_dir(argv: list[str] | None, example: str) -> Path | None:
    """The one DIR argument of `python -m tensorprobe.examples.<example> DIR`; None (usage printed) otherwise."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print(f"usage: python -m tensorprobe.examples.{example} DIR", file=sys.stderr)
        return None
    return Path(args[0])


def save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Named arrays as an `.npz` file (`--inputs` reads it), written atomically."""
    from ..bundle import atomic_write_bytes

    data = io.BytesIO()
    np.savez(data, **arrays)
    atomic_write_bytes(path, data.getvalue())
