"""Precision stress: run the PyTorch model with every op in the target's arithmetic, before any export.

`stress(model, *inputs, emulate="fp16")` captures the model in float32 and again under emulation
(`tensorprobe.emulate`: every float32 operand and result rounded to float16 or bfloat16, overflow to ±inf
included; or TF32 operands of convolutions and matmuls), then reuses `nan` and `diff`: where the first
non-finite value is born under that arithmetic, and the error of every layer against float32.

    >>> report = stress(model, x, emulate="fp16")          # doctest: +SKIP
    >>> print(report.summary())                            # doctest: +SKIP
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError

EMULATIONS = ("fp16", "bf16", "tf32")


@dataclass(frozen=True)
class StressReport:
    """What the model does in the emulated arithmetic (JSON: docs/json-preflight.md, `stress`)."""

    emulate: str
    origin: Any                 # NanOrigin under emulation
    diff: Any                   # DiffReport: float32 capture vs emulated capture
    output_snr_db: float | None

    @property
    def finding(self) -> bool:
        """True when the emulated arithmetic makes a non-finite value."""
        return bool(self.origin.found)

    def layers(self, n: int = 10) -> list[tuple[str, float | None]]:
        """The `n` records with the lowest SNR against float32, in execution order."""
        scored = [(p.name, p.metrics.get("snr_db")) for p in self.diff.pairs if p.metrics.get("snr_db") is not None]
        worst = sorted(scored, key=lambda x: x[1])[:n]
        keep = {name for name, _ in worst}
        return [x for x in scored if x[0] in keep]

    def summary(self) -> str:
        where = (f"In {self.emulate} the first non-finite value is born at {self.origin.op} in "
                 f"{self.origin.module or '<root>'}." if self.origin.found else
                 f"In {self.emulate} every value stays finite.")
        snr = "" if self.output_snr_db is None else (
            f" The output differs from float32 by SNR {self.output_snr_db:.1f} dB." if math.isfinite(self.output_snr_db)
            else " The output equals float32's.")
        worst = self.layers(1)
        low = f" Lowest layer SNR: {worst[0][0]} ({worst[0][1]:.1f} dB)." if worst else ""
        return where + snr + low

    def to_dict(self) -> dict[str, Any]:
        from ..numbers import json_number

        return {"emulate": self.emulate, "finding": self.finding, "summary": self.summary(),
                "origin": self.origin.to_dict(), "output_snr_db": json_number(self.output_snr_db),
                "worst_layers": [{"record": n, "snr_db": json_number(v)} for n, v in self.layers()]}


def stress(model: torch.nn.Module, *inputs: Any, emulate: str = "fp16") -> StressReport:
    """Run `model` in float32 and in the emulated arithmetic `emulate` (fp16, bf16, tf32); see module docstring."""
    from ..capture import capture
    from ..diff import diff
    from ..nan.live import find_first_nonfinite

    if emulate not in EMULATIONS:
        raise InputError(f"unknown emulation {emulate!r}; known: {', '.join(EMULATIONS)}")
    model = model.eval()
    with tempfile.TemporaryDirectory(prefix="tensorprobe-stress-") as d:
        ref = capture(model, *inputs, level="module", keep="full", out=Path(d) / "ref")
        with _arithmetic(emulate):
            cand = capture(model, *inputs, level="module", keep="full", out=Path(d) / "cand")
            origin = find_first_nonfinite(model, *inputs, spread=False)
        report = diff(ref, cand)
        out = report.get(report.output) if report.output else None
        snr = out.metrics.get("snr_db") if out is not None else None
    return StressReport(emulate=emulate, origin=origin, diff=report, output_snr_db=snr)


def _arithmetic(emulate: str) -> Any:
    from ..emulate import reduced_precision, tf32

    return tf32() if emulate == "tf32" else reduced_precision({"fp16": "float16", "bf16": "bfloat16"}[emulate])
