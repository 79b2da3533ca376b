"""What a run directory says: its findings, and per-layer series decimated to a bounded number of points
(for a report of a million-step run without reading it all into memory)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .detect import module_of
from .run import STEPS, as_float, count_lines, read_findings, read_meta, read_rows

MAX_POINTS = 400     # columns of the heatmaps and points of the curves


@dataclass
class RunSummary:
    """Findings of a run, and its per-step series (at most MAX_POINTS steps, evenly spaced)."""

    run: str
    model: str
    steps: int
    findings: list[dict[str, Any]]
    step_index: list[int] = field(default_factory=list)
    losses: dict[str, list[float]] = field(default_factory=dict)
    grad_norm: dict[str, list[float]] = field(default_factory=dict)      # per layer (module): the largest norm
    update_ratio: dict[str, list[float]] = field(default_factory=dict)
    outputs: dict[str, list[float]] = field(default_factory=dict)        # watched modules' std

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [f for f in self.findings if f.get("severity") == "error"]

    @property
    def finding(self) -> bool:
        return any(f.get("severity") in ("error", "warning") for f in self.findings)

    def headline(self) -> str:
        if not self.findings:
            return f"{self.steps} steps of {self.model}: no finding."
        first = self.findings[0]
        kinds = sorted({f["kind"] for f in self.findings})
        n = len(self.findings)
        return (f"{self.steps} steps of {self.model}: {n} finding{'' if n == 1 else 's'} ({', '.join(kinds)}); first at "
                f"step {first['step']}: {first['message']}")

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "model": self.model, "steps": self.steps, "headline": self.headline(),
                "finding": self.finding, "findings": self.findings}


def summarize(run: str | os.PathLike) -> RunSummary:
    """Read RUN (streaming) into a `RunSummary`.

    >>> s = summarize("runs/a")                 # doctest: +SKIP
    >>> [(f["step"], f["kind"], f["layer"]) for f in s.findings]         # doctest: +SKIP
    """
    meta = read_meta(run)
    total = count_lines(Path(run) / STEPS)     # the stride only: no need to parse every row twice
    stride = max(1, math.ceil(total / MAX_POINTS))
    s = RunSummary(str(run), meta.get("model", "model"), 0, read_findings(run))
    for i, row in enumerate(read_rows(run)):
        s.steps = max(s.steps, int(row.get("step", -1)) + 1)
        if i % stride:
            continue
        s.step_index.append(int(row.get("step", i)))
        col = len(s.step_index) - 1
        layers: dict[str, float] = {}
        ratios: dict[str, float] = {}
        for key, value in row.items():
            v = as_float(value)
            if v is None:
                continue
            kind, _, name = key.partition("/")
            if key == "loss" or kind == "loss":
                _put(s.losses, key, col, v)
            elif kind == "grad_norm":
                layer = module_of(name)
                layers[layer] = v if not math.isfinite(v) else max(layers.get(layer, 0.0), v)
            elif kind == "update_ratio":
                layer = module_of(name)
                ratios[layer] = max(ratios.get(layer, 0.0), v)
            elif kind == "out_std":
                _put(s.outputs, name, col, v)
        for layer, v in layers.items():
            _put(s.grad_norm, layer, col, v)
        for layer, v in ratios.items():
            _put(s.update_ratio, layer, col, v)
    return s


def _put(series: dict[str, list[float]], name: str, col: int, v: float) -> None:
    values = series.setdefault(name, [])
    values.extend([math.nan] * (col - len(values)))
    values.append(v)


def run_exists(run: str | os.PathLike) -> bool:
    return (Path(run) / "meta.json").exists()
