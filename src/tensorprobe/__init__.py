"""tensorprobe: numerical forensics for neural audio models.

    >>> import tensorprobe as tp
    >>> bundle = tp.capture(model, asr, f0, n, s, level="op", out="ref_bundle")   # doctest: +SKIP
    >>> origin = tp.find_first_nonfinite(model, asr, f0, n, s)                     # doctest: +SKIP
    >>> print(origin.summary())                                                    # doctest: +SKIP
    >>> report = tp.diff("ref_bundle", "port_bundle")                              # doctest: +SKIP

Names are imported on first use: `import tensorprobe` costs milliseconds, and reading bundles, diffing
them and checking audio never import torch. `tp.capture`, `tp.compare`, `tp.diff` and `tp.isolate` are
modules that can be called as their verb (`tensorprobe.diff.core` imports as a module too).
"""

from __future__ import annotations

import importlib
from typing import Any

from ._version import __version__  # noqa: E402

from .errors import (  # noqa: E402  (light: no third-party imports)
    BundleError, InputError, RuntimeUnavailable, TargetError, TensorprobeError,
)

# public name -> (module, attribute); attribute None = the module itself (a callable verb module or a namespace)
_LAZY: dict[str, tuple[str, str | None]] = {
    "TensorStats": (".stats", "TensorStats"), "compute_stats": (".stats", "compute_stats"),
    "Record": (".record", "Record"),
    "Bundle": (".bundle", "Bundle"), "BundleWriter": (".bundle", "BundleWriter"),
    "Capture": (".capture", "Capture"), "capture": (".capture", None),
    "NanOrigin": (".nan", "NanOrigin"), "find_first_nonfinite": (".nan", "find_first_nonfinite"),
    "find_first_nonfinite_backward": (".nan.backward", "find_first_nonfinite_backward"),
    "find_nonfinite_in_bundle": (".nan", "find_nonfinite_in_bundle"),
    "DiffReport": (".diff", "DiffReport"), "diff": (".diff", None),
    "IsolateReport": (".isolate", "IsolateReport"), "isolate": (".isolate", None),
    "CompareResult": (".compare", "CompareResult"), "compare": (".compare", None),
    "rng": (".rng", None),
    "preflight": (".preflight", "preflight"), "PreflightReport": (".preflight", "PreflightReport"),
    "stress": (".preflight.stress", "stress"), "rewrite": (".preflight.rewrite", "rewrite"),
    "sweep": (".sweep", "sweep"), "Sweep": (".sweep", "Sweep"),
}


def open_bundle(path: Any) -> Any:
    """`Bundle.open(path)`: a bundle directory, or a plain `.safetensors` / `.npz` file of named tensors."""
    from .bundle import Bundle

    return Bundle.open(path)


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'tensorprobe' has no attribute {name!r}") from None
    module = importlib.import_module(module_name, __name__)
    return module if attr is None else getattr(module, attr)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "__version__", "Bundle", "BundleWriter", "BundleError", "Capture", "InputError", "NanOrigin",
    "Record", "RuntimeUnavailable", "TargetError", "TensorStats", "TensorprobeError", "capture",
    "compute_stats", "find_first_nonfinite", "find_first_nonfinite_backward", "find_nonfinite_in_bundle", "open_bundle",
    "DiffReport", "diff", "IsolateReport", "isolate", "CompareResult", "compare", "rng", "preflight",
    "PreflightReport", "rewrite", "stress", "sweep", "Sweep",
]
