"""Errors raised by tensorprobe. The library raises; the CLI catches, prints one line and exits 2.

    TensorprobeError            base of everything below; `str(err)` is a complete, user-facing sentence
    ├── BundleError             a bundle is missing, corrupt, truncated or unsafe (names the file)
    ├── TargetError             a TARGET (`file.py:factory`, `pkg.mod:factory`, `model.onnx`) can't be loaded
    ├── InputError              wrong shapes, empty or non-finite data where finite data is required, bad options
    └── RuntimeUnavailable      an optional runtime (onnxruntime, executorch, tvm, mlx) is not installed;
                                the message names the extra to install

Exit codes used by the CLI (documented in the README and docs/json.md):
    0  nothing found / everything passed
    1  a finding (a NaN origin, a divergence, an audio error verdict)
    2  usage error or bad input (any TensorprobeError)
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FINDING = 1
EXIT_BAD_INPUT = 2


class TensorprobeError(Exception):
    """Base class: every error tensorprobe raises on purpose derives from it."""


class BundleError(TensorprobeError):
    """A bundle (directory, .safetensors or .npz) can't be read or written."""


class TargetError(TensorprobeError):
    """A TARGET can't be imported, or its factory failed or returned the wrong thing."""


class InputError(TensorprobeError):
    """Input data or options are unusable (wrong shape, empty, non-finite where that is not allowed)."""


class RuntimeUnavailable(TensorprobeError):
    """An optional runtime package is missing.

    Example:
        >>> raise RuntimeUnavailable.missing("onnxruntime", extra="onnx")
        Traceback (most recent call last):
        ...
        tensorprobe.errors.RuntimeUnavailable: onnxruntime is not installed: pip install 'tensorprobe[onnx]'
    """

    @classmethod
    def missing(cls, package: str, extra: str) -> "RuntimeUnavailable":
        return cls(f"{package} is not installed: pip install 'tensorprobe[{extra}]'")
