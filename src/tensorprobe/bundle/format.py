"""The bundle layout's constants, atomic writes and safetensors headers (shared by reader and writer)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

FORMAT = "tensorprobe-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
JOURNAL = "records.jsonl"
DEFAULT_SHARD_BYTES = 128 << 20

STATUS_COMPLETE = "complete"
STATUS_INCOMPLETE = "incomplete"
STATUS_RUNNING = "running"



def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, sync: bool = True) -> None:
    """Write `data` to `path` through a temporary file renamed into place: readers never see half a file.
    `sync`: fsync the data before the rename (so a power cut leaves the old file or the new one, whole);
    False for a provisional file that a later write replaces (an fsync costs ~10 ms on this project's VMs)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def safetensors_header(entries: Any, metadata: dict[str, str] | None = None, align: int = 8) -> bytes:
    """The head of a safetensors file: u64 length + JSON, space-padded so the data starts at a multiple of
    `align` (the format allows trailing spaces in the header).

    `entries` yields `(name, dtype code, shape, begin, end)`, offsets relative to the data section.

    >>> len(safetensors_header([("x", "F32", (2,), 0, 8)], align=64))
    64
    """
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    for name, code, shape, begin, end in entries:
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [begin, end]}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-(8 + len(head)) % align)
    return struct.pack("<Q", len(head)) + head


def read_safetensors_header(path: str | os.PathLike) -> tuple[dict[str, Any], int]:
    """(header without `__metadata__`, byte offset of the data section) of a safetensors file."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


# safetensors dtype codes -> dtype names used in records
DTYPE_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "I64": "int64",
               "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "U16": "uint16", "U32": "uint32",
               "U64": "uint64", "BOOL": "bool"}
# safetensors dtype codes NumPy reads directly (little-endian, as the format stores them); BF16 is widened
NUMPY_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
                "U8": "u1", "U16": "<u2", "U32": "<u4", "U64": "<u8", "BOOL": "?", "C64": "<c8"}

