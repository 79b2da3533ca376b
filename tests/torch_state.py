"""The process-wide state of torch (and of tensorprobe's quiet mode) that a test or a tensorprobe call can leave
changed for whatever runs next in the process.

`tests/conftest.py` saves it before every test and puts back what the test changed, so that no test depends on
the order the suite runs in (pytest-randomly shuffles it). `changes(before, after)` names what differs, for the
tests that check tensorprobe itself leaves it as it found it (`tests/test_global_state.py`).

    >>> before = save()
    >>> torch.set_default_dtype(torch.float64)
    >>> changes(before, save())
    ['default dtype: torch.float32 -> torch.float64']
    >>> restore(before)
    >>> changes(before, save())
    []

The compiler configs are read through `torch.utils._config_module` internals (a value set by the user and a
"hidden" flag per entry): pytest's monkeypatch (9.2+) undoes a patch of a config entry by `delattr`, which hides the
entry ("torch._functorch.config.enable_autograd_cache does not exist") for the rest of the process; the public
`get_config_copy()` does not show that, and `setattr` alone cannot put back "not set by anyone".
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Any

import torch

# torch.compile's settings; Lightning Fabric replaces torch.compile itself when it is imported
CONFIG_MODULES = ("torch._dynamo.config", "torch._inductor.config", "torch._functorch.config")
_LOGGERS = ("torch", "torchao", "executorch", "onnxscript", "onnx", "onnxruntime", "tvm", "numba", "matplotlib",
            "PIL", "mlx", "coremltools", "lightning", "transformers")


def _configs() -> dict[str, Any]:
    return {name: importlib.import_module(name) for name in CONFIG_MODULES}


def _entries(module: Any) -> dict[str, tuple[Any, bool]]:
    """Each entry's value as set by someone (an unset marker otherwise) and whether it is hidden."""
    return {key: (entry.user_override.get(), entry.hide) for key, entry in module._config.items()}


def _flags() -> dict[str, Any]:
    cudnn = torch.backends.cudnn
    return {
        "default dtype": torch.get_default_dtype(),
        "deterministic algorithms": (torch.are_deterministic_algorithms_enabled(),
                                     torch.is_deterministic_algorithms_warn_only_enabled()),
        "grad mode": torch.is_grad_enabled(),
        "anomaly mode": torch.is_anomaly_enabled(),
        "float32 matmul precision": torch.get_float32_matmul_precision(),
        "cudnn flags": (cudnn.enabled, cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32),
        "cuda matmul tf32": torch.backends.cuda.matmul.allow_tf32,
        "torch.compile": torch.compile,
    }


def save(rng: bool = False) -> dict[str, Any]:
    """torch's process-wide state now (and the CPU generator's state with `rng=True`)."""
    from tensorprobe import logs

    state = {
        "configs": {name: (_entries(module), module.get_config_copy()) for name, module in _configs().items()},
        "flags": _flags(),
        "environ": dict(os.environ),
        "quiet": logs._quiet,
        "loggers": {name: logging.getLogger(name).level for name in _LOGGERS},
    }
    if rng:
        state["rng"] = torch.random.get_rng_state()
    return state


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What differs between two `save()`s, one line each (a config entry by value, not by identity: reading a
    list-valued entry stores a copy of its default, which is no change)."""
    out = []
    for name, (entries, values) in before["configs"].items():
        after_entries, after_values = after["configs"][name]
        for key in entries:
            if entries[key][1] != after_entries[key][1]:
                out.append(f"{name}.{key}: {'hidden' if after_entries[key][1] else 'shown again'}")
            elif values.get(key) != after_values.get(key):
                out.append(f"{name}.{key}: {values.get(key)!r} -> {after_values.get(key)!r}")
    for key, value in before["flags"].items():
        if after["flags"][key] != value:
            out.append(f"{key}: {value} -> {after['flags'][key]}")
    for key in sorted(set(before["environ"]) | set(after["environ"])):
        if key.startswith("_TORCH"):
            continue   # torch's own (Inductor records an address in _TORCHINDUCTOR_PYOBJECT_TENSOR_DATA_PTR)
        if before["environ"].get(key) != after["environ"].get(key):
            out.append(f"environment variable {key}: {before['environ'].get(key)!r} -> "
                       f"{after['environ'].get(key)!r}")
    if before["quiet"] != after["quiet"]:
        out.append(f"tensorprobe quiet mode: {before['quiet']} -> {after['quiet']}")
    if "rng" in before and "rng" in after and not torch.equal(before["rng"], after["rng"]):
        out.append("torch's CPU random generator state")
    return out


def restore(before: dict[str, Any]) -> None:
    """Put back what changed since `before` was saved (only what changed: a config entry set again marks the
    config's hash dirty, which makes Inductor re-key its caches)."""
    from tensorprobe import logs

    for name, module in _configs().items():
        entries = before["configs"][name][0]
        for key, entry in module._config.items():
            value, hidden = entries.get(key, (None, False))
            if entry.user_override.get() is not value or entry.hide != hidden:
                entry.user_override.set(value)
                entry.hide = hidden
                module._hash_dirty_var.set(True)
                module._mark_get_dict_dirty(key)
    flags = before["flags"]
    if _flags() != flags:
        torch.set_default_dtype(flags["default dtype"])
        enabled, warn_only = flags["deterministic algorithms"]
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)
        torch.set_grad_enabled(flags["grad mode"])
        torch.autograd.set_detect_anomaly(flags["anomaly mode"])
        torch.set_float32_matmul_precision(flags["float32 matmul precision"])
        cudnn = torch.backends.cudnn
        cudnn.enabled, cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32 = flags["cudnn flags"]
        torch.backends.cuda.matmul.allow_tf32 = flags["cuda matmul tf32"]
        torch.compile = flags["torch.compile"]
    if dict(os.environ) != before["environ"]:
        os.environ.clear()
        os.environ.update(before["environ"])
    logs._quiet = before["quiet"]
    for name, level in before["loggers"].items():
        logging.getLogger(name).setLevel(level)
    if "rng" in before:
        torch.random.set_rng_state(before["rng"])
