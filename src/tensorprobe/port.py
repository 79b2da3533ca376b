"""The port's side: dump named tensors from MLX, NumPy, JAX, C++ or Swift code, and line them up with PyTorch.

A hand-written port has no graph to instrument; it only needs to write what it computed, by name, in the
order it computed it. `Recorder` collects arrays as the port runs and `save`s one safetensors file that
`Bundle.open("port.safetensors")` reads as a bundle (statistics computed on load, execution order kept):

    >>> import numpy as np
    >>> from tensorprobe.port import Recorder
    >>> rec = Recorder()
    >>> _ = rec("generator.noise_res.0.adain1.0.norm", np.zeros((1, 4, 8), np.float32))
    >>> _ = rec("generator.noise_res.0.adain1.0.norm", np.ones((1, 4, 8), np.float32))   # second call
    >>> rec.names
    ['generator.noise_res.0.adain1.0.norm', 'generator.noise_res.0.adain1.0.norm@1']

File layout (for writers in other languages). A standard safetensors file:
    8 bytes      little-endian u64 N, the length of the JSON header
    N bytes      JSON: {"<name>": {"dtype": "F32", "shape": [1, 128, 300], "data_offsets": [begin, end]}, ...,
                        "__metadata__": {"format": "tensorprobe-port"}}  (metadata optional)
    data         each tensor's bytes, C order, little-endian, at [begin, end) after the header
- Names: PyTorch module paths (`generator.noise_res.0.adain1.0.norm`), `@k` for the k-th repeated call, `:i`
  for the i-th output of a call; or any names plus a rules file (below).
- Order: tensors are read in order of their data offsets, so write them in the order the port computed them
  (that is what "first NaN" and "first divergence" use). Writers that reorder tensors (the safetensors
  library's own `save` sorts them) still line up by name, but lose the order; `Recorder`/`dump` keep it.
  From Swift: `try MLX.save(arrays: ["generator.noise_res.0.adain1.0.norm": x], url: url)` works as is.
- dtypes: F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL.

Mapping rules. When the port's names are its own (`dec.gen.nr0.n1`), `diff` maps them with the rules
of `tensorprobe.diff.align` (one `PATTERN=REPLACEMENT` per line, full match, `\\1` groups):

    dec\\.gen\\.nr(\\d+)\\.n1=generator.noise_res.\\1.adain1.0.norm

    >>> tensorprobe.diff("ref_bundle", "port.safetensors", rules="port.rules")   # doctest: +SKIP
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from .bundle import atomic_write_bytes, safetensors_header
from .errors import InputError

FORMAT = "tensorprobe-port"
_DTYPES = {
    np.dtype("float32"): "F32", np.dtype("float16"): "F16", np.dtype("float64"): "F64",
    np.dtype("int64"): "I64", np.dtype("int32"): "I32", np.dtype("int16"): "I16", np.dtype("int8"): "I8",
    np.dtype("uint8"): "U8", np.dtype("bool"): "BOOL",
}


def to_numpy(x: Any) -> np.ndarray:
    """NumPy view of an MLX, NumPy, PyTorch or JAX array (convert at the edge; bfloat16 becomes float32)."""
    mod = type(x).__module__
    if mod.startswith("mlx"):
        import mlx.core as mx

        if x.dtype == mx.bfloat16:
            x = x.astype(mx.float32)
        return np.array(x, copy=False)
    if mod.startswith("torch"):
        t = x.detach().cpu()
        return (t.float() if str(t.dtype) == "torch.bfloat16" else t).numpy()
    arr = np.asarray(x)
    if arr.dtype not in _DTYPES:
        raise InputError(f"can't dump an array of dtype {arr.dtype}; convert it to float32 first")
    return arr


class Recorder:
    """Collect named arrays in call order; `save(path)` writes them as one safetensors file.

    A name seen again becomes `name@1`, `name@2`... (the record grammar's repeated calls).
    """

    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}
        self._calls: dict[str, int] = {}

    def __call__(self, name: str, array: Any) -> Any:
        """Record `array` under `name` and return it unchanged (so it can wrap an expression)."""
        call = self._calls.get(name, 0)
        self._calls[name] = call + 1
        key = name if call == 0 else f"{name}@{call}"
        self._arrays[key] = np.ascontiguousarray(to_numpy(array)).copy()
        return array

    @property
    def names(self) -> list[str]:
        return list(self._arrays)

    def save(self, path: str | os.PathLike) -> Path:
        return dump(path, self._arrays)


def dump(path: str | os.PathLike, arrays: dict[str, Any] | None = None, **named: Any) -> Path:
    """Write named arrays to a safetensors file, data in the given order (atomically).

    Example:
        >>> dump("port.safetensors", {"encode": enc, "decode.0": d0})      # doctest: +SKIP
        >>> dump("port.safetensors", encode=enc)                            # doctest: +SKIP
    """
    items = {**(arrays or {}), **named}
    if not items:
        raise InputError("nothing to dump: give at least one named array")
    entries, chunks, offset = [], [], 0
    for name, value in items.items():
        arr = np.ascontiguousarray(to_numpy(value))
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        entries.append((name, _DTYPES[arr.dtype], arr.shape, offset, offset + len(data)))
        chunks.append(data)
        offset += len(data)
    path = Path(path)
    atomic_write_bytes(path, safetensors_header(entries, {"format": FORMAT}) + b"".join(chunks))
    return path
