"""Keeping other packages' noise off the user's terminal.

Runtimes and their dependencies print on import and while compiling: torchao's "Failed to load
..._C_mxfp8...so", torch's `_pytree` Enum notices, TVM's C++ `Warning: Fast mode segfaults...` lines.
Users read them as "something is broken". The CLI calls `quiet_third_party()` unless `--verbose`;
library users keep their own logging and warnings setup, untouched.

    >>> from tensorprobe.logs import quiet_third_party, native_stderr_silenced
    >>> quiet_third_party()                                   # doctest: +SKIP
    >>> with native_stderr_silenced():                        # doctest: +SKIP
    ...     executable = tvm.compile(mod, target="llvm")
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import warnings
from contextlib import contextmanager
from typing import Iterator

# Loggers of the runtimes and their dependencies that log below ERROR on import or while compiling.
THIRD_PARTY_LOGGERS = ("torch", "torchao", "executorch", "onnxscript", "onnx", "onnxruntime", "tvm", "numba",
                       "matplotlib", "PIL", "mlx", "coremltools")

_quiet = False


def quiet_third_party() -> None:
    """Silence warnings, third-party log lines below ERROR and native (C++) stderr of compilers.

    tensorprobe's own findings are never warnings, so nothing of ours is hidden.
    """
    global _quiet
    _quiet = True
    warnings.filterwarnings("ignore")
    os.environ.setdefault("PYTHONWARNINGS", "ignore")   # subprocesses (ExecuTorch, TVM builds) too
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    # torch sets its loggers' levels when it is imported (often after this call: commands import it lazily);
    # its own variable keeps them at ERROR whenever that happens, unless the user set TORCH_LOGS
    os.environ.setdefault("TORCH_LOGS", "-all")
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)


def is_quiet() -> bool:
    """True once `quiet_third_party()` has run (the CLI without --verbose)."""
    return _quiet


@contextmanager
def native_stderr_silenced() -> Iterator[None]:
    """While `quiet_third_party()` is in force, send what native code writes to file descriptor 2 to a
    temporary file (C++ LOG(WARNING) bypasses Python's logging). A no-op otherwise. If the block raises,
    what native code wrote is passed on to stderr: it is what explains the error (a missing kernel)."""
    if not _quiet:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        failed = False
        try:
            yield
        except BaseException:
            failed = True
            raise
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            if failed:
                sink.seek(0)
                sys.stderr.write(sink.read().decode(errors="replace"))
