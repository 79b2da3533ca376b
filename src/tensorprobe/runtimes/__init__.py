"""Runtime adapters: one module per runtime, registered here by name.

Adding a runtime = adding `runtimes/<name>.py` with one `RuntimeAdapter` subclass and one line below.
Heavy packages are imported inside the adapter only, so this module imports with no extras installed.
"""

from __future__ import annotations

import importlib

from ..errors import InputError
from .base import RuntimeAdapter, RuntimeTensor

# name -> "module:Class", imported on first use.
_REGISTRY: dict[str, str] = {
    "onnxruntime": "onnxruntime:OnnxRuntimeAdapter",
    "onnx": "onnxruntime:OnnxRuntimeAdapter",
    "tvm": "tvm:TvmAdapter",
    "executorch": "executorch:ExecuTorchAdapter",
    "executorch-xnnpack": "executorch:ExecuTorchXnnpackAdapter",
}


def runtime_names() -> list[str]:
    return sorted(_REGISTRY)


def get_runtime(name: str) -> RuntimeAdapter:
    """The adapter for `name` (e.g. 'onnxruntime'); raises InputError listing known names."""
    try:
        spec = _REGISTRY[name]
    except KeyError:
        raise InputError(f"unknown runtime {name!r}; known runtimes: {', '.join(runtime_names()) or 'none'}") from None
    mod_name, cls_name = spec.split(":")
    cls = getattr(importlib.import_module(f"{__name__}.{mod_name}"), cls_name)
    return cls()


__all__ = ["RuntimeAdapter", "RuntimeTensor", "get_runtime", "runtime_names"]
