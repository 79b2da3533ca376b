"""Runtime adapters: one module per runtime, registered here by name.

Adding a runtime = adding `runtimes/<name>.py` with one `RuntimeAdapter` subclass (the interface is in
`base.py`) and one line in `_REGISTRY` below. Heavy packages are imported inside the adapter only, so this
module imports with no extras installed. docs/CONTRIBUTING.md walks through it.
"""

from __future__ import annotations

import importlib

from ..errors import InputError
from .base import RuntimeAdapter, RuntimeTensor, Selection

# name -> "module:Class", imported on first use.
_REGISTRY: dict[str, str] = {
    "onnxruntime": "onnxruntime:OnnxRuntimeAdapter",
    "onnx": "onnxruntime:OnnxRuntimeAdapter",
    "tvm": "tvm:TvmAdapter",
    "executorch": "executorch:ExecuTorchAdapter",
    "executorch-xnnpack": "executorch:ExecuTorchXnnpackAdapter",
    "inductor": "inductor:InductorAdapter",
    "aot_eager": "inductor:AotEagerAdapter",
}


def runtime_names() -> list[str]:
    return sorted(_REGISTRY)


def runtime_for_artifact(path: str) -> str | None:
    """The runtime that opens an artifact file by its suffix (`model.onnx` -> 'onnxruntime'), from each
    adapter's `artifact_suffixes`; None when no runtime claims it."""
    for name in runtime_names():
        cls = _adapter_class(name)
        if any(str(path).endswith(sfx) for sfx in cls.artifact_suffixes):
            return cls.name or name
    return None


def _adapter_class(name: str) -> type[RuntimeAdapter]:
    mod_name, cls_name = _REGISTRY[name].split(":")
    return getattr(importlib.import_module(f"{__name__}.{mod_name}"), cls_name)


def get_runtime(name: str) -> RuntimeAdapter:
    """The adapter for `name` (e.g. 'onnxruntime'); raises InputError listing known names."""
    if name not in _REGISTRY:
        raise InputError(f"unknown runtime {name!r}; known runtimes: {', '.join(runtime_names()) or 'none'}")
    return _adapter_class(name)()


__all__ = ["RuntimeAdapter", "RuntimeTensor", "Selection", "get_runtime", "runtime_for_artifact", "runtime_names"]
