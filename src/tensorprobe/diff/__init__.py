"""Diff a candidate bundle against a reference bundle: `tensorprobe.diff(ref, cand)`.

- `align`    pair records (exact name, mapping rules, order and shape within a module)
- `metrics`  the one-pass metrics (a registry of small functions of float64 sums)
- `core`     `diff()`: compare every pair, streaming
- `compat`   what can be compared with what; what statistics alone prove
- `noise`    the noise-or-divergence rule (rounding floors) and the causes of a divergence
- `explain`  op families, the gains their data allow, plain-words explanations of amplifiers
- `analysis` error gain, causes, first divergence and amplifiers, repeated calls, random ops
- `summary`  the plain-words paragraph
- `result`   the findings (`DiffReport`, `PairResult`, ...), frozen dataclasses with `to_dict()`
"""

from .align import Rule, align, load_rules, parse_rule
from .core import diff
from .metrics import METRICS, compare, metric
from .result import (AngleResult, Amplifier, CallSeries, Criteria, DbResult, DiffReport, PairResult)

__all__ = ["Amplifier", "AngleResult", "CallSeries", "Criteria", "DbResult", "DiffReport", "METRICS",
           "PairResult", "Rule", "align", "compare", "diff", "load_rules", "metric", "parse_rule"]


from .._api import make_callable  # noqa: E402

make_callable(__name__, diff)  # `tp.diff(...)` calls it; `tensorprobe.diff.<submodule>` still imports
