"""A training run directory: what `Monitor` writes and `tensorprobe train report` reads.

    RUN/steps.jsonl      one JSON object per logged step: `step`, `loss`, `loss/<term>`, and per parameter
                         `grad_norm/<name>`, `grad_absmax/<name>`, `update_ratio/<name>` (and
                         `grad_nonfinite/<name>` where non-zero), per watched module `out_mean|out_std|
                         out_absmax|out_nonfinite/<module>`, `skipped`, `scale`
    RUN/findings.jsonl   one JSON object per finding, as it is made
    RUN/meta.json        the model's class, parameter names and the monitor's settings

Rows are appended and flushed one at a time (a run that dies keeps every row written; a line cut short is
skipped), so memory does not grow with the number of steps; `pandas.read_json(RUN/steps.jsonl, lines=True)`
reads it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Iterator

STEPS, FINDINGS, META = "steps.jsonl", "findings.jsonl", "meta.json"


def _clean(v: Any) -> Any:
    """JSON has no NaN/Inf: they are written as the strings "nan", "inf", "-inf"."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def as_float(v: Any) -> float | None:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, str):
        return {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}.get(v)
    return float(v)


class RunWriter:
    """Appends rows and findings to a run directory (created; reopened to resume)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._steps = open(self.root / STEPS, "a", encoding="utf-8")
        self._findings = open(self.root / FINDINGS, "a", encoding="utf-8")

    def write_meta(self, meta: dict[str, Any]) -> None:
        tmp = self.root / f".{META}.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(meta, indent=1))
        os.replace(tmp, self.root / META)

    def row(self, row: dict[str, Any]) -> None:
        self._steps.write(json.dumps({k: _clean(v) for k, v in row.items()}) + "\n")
        self._steps.flush()

    def finding(self, finding: dict[str, Any]) -> None:
        self._findings.write(json.dumps({k: _clean(v) for k, v in finding.items()}) + "\n")
        self._findings.flush()

    def close(self) -> None:
        self._steps.close()
        self._findings.close()


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """The complete lines of a JSONL file (a last line cut short by a crash is skipped)."""
    if not path.exists():
        return
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue


def count_lines(path: Path) -> int:
    if not path.exists():
        return 0
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def read_rows(root: str | os.PathLike) -> Iterator[dict[str, Any]]:
    return read_jsonl(Path(root) / STEPS)


def read_findings(root: str | os.PathLike) -> list[dict[str, Any]]:
    return list(read_jsonl(Path(root) / FINDINGS))


def read_meta(root: str | os.PathLike) -> dict[str, Any]:
    path = Path(root) / META
    if not path.exists():
        from ..errors import InputError

        raise InputError(f"{root} is not a training run directory (no {META}): write one with "
                         "tensorprobe.train.Monitor(model, run_dir=...)")
    return json.loads(path.read_text())
