"""Numbers as tensorprobe writes them: one rule for JSON, one for people.

JSON has no infinities or NaN. Every `--json` document, manifest and noise file spells them as the strings
`"inf"`, `"-inf"` and `"nan"` (an SNR of identical tensors is `"inf"`, the level of digital silence
`"-inf"`); `from_json_number` reads them back. Tables and HTML pages print `fmt_number`: `–` for a missing
figure, `inf` / `-inf` / `nan` for non-finite ones, and `digits` significant digits otherwise.

    >>> json_number(float("inf")), json_number(2.5), from_json_number("-inf")
    ('inf', 2.5, -inf)
    >>> fmt_number(None), fmt_number(float("-inf")), fmt_number(3.14159, 3)
    ('–', '-inf', '3.14')
"""

from __future__ import annotations

import math
from typing import Any

MISSING = "–"


def json_number(v: Any) -> Any:
    """`v` made JSON-safe: NumPy scalars become Python numbers, non-finite floats the strings above;
    lists and tuples are converted element by element. Anything else is returned as is."""
    if isinstance(v, (list, tuple)):
        return [json_number(x) for x in v]
    if hasattr(v, "item") and getattr(v, "ndim", None) == 0:   # NumPy scalar (no NumPy import needed)
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def from_json_number(v: Any) -> Any:
    """Inverse of `json_number` for one value."""
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    return v


def fmt_number(v: Any, digits: int = 4) -> str:
    """A figure for a table or a page (see the module docstring)."""
    if v is None:
        return MISSING
    if hasattr(v, "item") and getattr(v, "ndim", None) == 0:
        v = v.item()
    if isinstance(v, bool) or isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return f"{v:.{digits}g}"
    return str(v)


__all__ = ["MISSING", "fmt_number", "from_json_number", "json_number"]
