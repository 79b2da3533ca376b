"""tensorprobe: numerical forensics for neural audio models.

    >>> import tensorprobe as tp
    >>> bundle = tp.capture(model, asr, f0, n, s, level="op", out="ref_bundle")   # doctest: +SKIP
    >>> origin = tp.find_first_nonfinite(model, asr, f0, n, s)                     # doctest: +SKIP
    >>> print(origin.summary())                                                    # doctest: +SKIP
"""

__version__ = "0.1.0"

from .errors import (  # noqa: E402
    BundleError, InputError, RuntimeUnavailable, TargetError, TensorprobeError,
)
from .stats import TensorStats, compute_stats  # noqa: E402
from .record import Record  # noqa: E402
from .bundle import Bundle, BundleWriter  # noqa: E402
from .capture import Capture, capture  # noqa: E402
from .nan import NanOrigin, find_first_nonfinite, find_nonfinite_in_bundle  # noqa: E402
from .diff import DiffReport, diff  # noqa: E402  (the function shadows the subpackage attribute; import submodules with `from tensorprobe.diff.X import ...`)

from .isolate import IsolateReport, isolate  # noqa: E402
from .compare import CompareResult, compare  # noqa: E402
from . import rng  # noqa: E402

open_bundle = Bundle.open

__all__ = [
    "__version__", "Bundle", "BundleWriter", "BundleError", "Capture", "InputError", "NanOrigin",
    "Record", "RuntimeUnavailable", "TargetError", "TensorStats", "TensorprobeError", "capture",
    "compute_stats", "find_first_nonfinite", "find_nonfinite_in_bundle", "open_bundle",
    "DiffReport", "diff", "IsolateReport", "isolate", "CompareResult", "compare", "rng",
]
