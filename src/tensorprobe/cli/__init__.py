"""The `tensorprobe` command: a thin layer over the library.

Each command group lives in its own module and registers itself on `app`; every command calls one
library function and renders its result with `tensorprobe.report`. Library errors (`TensorprobeError`)
become one red line on stderr and exit code 2; findings exit 1; clean results exit 0.
"""

from __future__ import annotations

import os
import sys
from typing import Any, TextIO

from ._common import app, run_app

# Importing a command module registers its commands on `app`.
from . import core  # noqa: F401,E402
from . import audio  # noqa: F401,E402
from . import tts  # noqa: F401,E402
from . import diff  # noqa: F401,E402
from . import compare  # noqa: F401,E402
from . import isolate  # noqa: F401,E402
from . import rng  # noqa: F401,E402
from . import preflight  # noqa: F401,E402
from . import sweep  # noqa: F401,E402
from . import train  # noqa: F401,E402
from . import explore  # noqa: F401,E402


class _ReaderMayClose:
    """stdout for a reader that may stop reading (`tensorprobe diff ... | head`): once the pipe is closed,
    what is left of the output goes to /dev/null and the command runs on to its own exit code (0 for a
    match), where Python would print a BrokenPipeError and rich and click would exit 1 ("a finding")."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._reader_closed()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._reader_closed()

    def _reader_closed(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self._stream.fileno())    # the buffered rest is flushed there, silently
        os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main() -> None:
    """The `tensorprobe` entry point. For every command, a reader that closes the pipe early ends the
    output quietly and leaves the exit code to the command (`_ReaderMayClose`)."""
    sys.stdout = _ReaderMayClose(sys.stdout)   # type: ignore[assignment]
    run_app()


__all__ = ["app", "main"]
