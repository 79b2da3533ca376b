"""The `tensorprobe` command: a thin layer over the library.

Each command group lives in its own module and registers itself on `app`; every command calls one
library function and renders its result with `tensorprobe.report`. Library errors (`TensorprobeError`)
become one red line on stderr and exit code 2; findings exit 1; clean results exit 0.
"""

from __future__ import annotations

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


def main() -> None:
    run_app()


__all__ = ["app", "main"]
