"""Precision stress: run the PyTorch model with every op in the target's arithmetic, before any export.

`stress(model, *inputs, emulate="fp16")` captures the model in float32 and again under emulation, then
reuses `nan` and `diff`: where the first non-finite value is born under that arithmetic, and the error of
every layer against float32. Emulations (`tensorprobe.emulate`):

- fp16, bf16: every float32 operand and result rounded to the format, overflow to ±inf included;
- fp16-accum: fp16, and the partial sums of sums, means, convolutions and matmuls rounded as well;
- tf32: the operands of convolutions and matmuls rounded to TF32;
- int8-weights: the weights of every convolution and linear layer quantized to int8 (symmetric, one scale
  per output channel, as ONNX Runtime's and XNNPACK's weight quantizers do) and run in float32.

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
from ..record import KIND_MODEL_INPUT
from .findings import inner_clause

EMULATIONS = ("fp16", "bf16", "fp16-accum", "tf32", "int8-weights")


@dataclass(frozen=True)
class StressReport:
    """What the model does in the emulated arithmetic (JSON: docs/json-preflight.md, `stress`)."""

    emulate: str
    origin: Any                 # NanOrigin under emulation
    diff: Any                   # DiffReport: float32 capture vs emulated capture
    output_snr_db: float | None
    float32_origin: Any = None  # NanOrigin of the float32 run when it already makes NaN/Inf (None: finite)

    @property
    def finding(self) -> bool:
        """True when the emulated arithmetic makes a non-finite value, or float32 itself already does."""
        return bool(self.origin.found) or self.float32_origin is not None

    def layers(self, n: int = 10) -> list[tuple[str, float | None]]:
        """The `n` records with the lowest SNR against float32, in execution order."""
        scored = [(p.name, p.metrics.get("snr_db")) for p in self.diff.pairs
                  if p.metrics.get("snr_db") is not None and p.kind != KIND_MODEL_INPUT]      # inputs: identical by design
        worst = sorted(scored, key=lambda x: x[1])[:n]
        keep = {name for name, _ in worst}
        return [x for x in scored if x[0] in keep]

    def summary(self) -> str:
        f32, o = self.float32_origin, self.origin
        parts = [f"Already non-finite in float32, before any emulation: {inner_clause(f32.headline())}."
                 if f32 is not None else ""]
        if not (f32 is not None and o.found and (o.module, o.op) == (f32.module, f32.op)):
            parts.append(f"In {self.emulate} the first non-finite value is born at {o.op} in {o.module or '<root>'}."
                         if o.found else f"In {self.emulate} every value stays finite.")
        parts.append(self._output_words())
        worst = self.layers(1)
        if worst and worst[0][1] != math.inf:          # every layer identical: nothing is lowest
            parts.append(f"Lowest layer SNR: {worst[0][0]} ({worst[0][1]:.1f} dB).")
        return " ".join(p for p in parts if p)

    def _output_words(self) -> str:
        """The model output against float32's. "Equals" only when the SNR is +inf and every value is finite;
        an SNR of -inf is an element finite on one side only (or an all-zero float32 output), never equality."""
        snr = self.output_snr_db
        if snr is None:
            return ""
        if math.isfinite(snr):
            return f"The output differs from float32's by SNR {snr:.1f} dB."
        pair = self.diff.get(self.diff.output)
        metrics = pair.metrics if pair is not None else {}
        size = math.prod(pair.shape) if pair is not None else 0
        if snr > 0:        # +inf: every element finite on both sides is identical
            both = round((1.0 - (metrics.get("ref_finite_frac") or 1.0)) * size)
            return ("The output equals float32's." if not both else
                    f"The output's finite values equal float32's; both hold NaN/Inf at the same {both:,} of its "
                    f"{size:,} elements.")
        cand_only, ref_only = metrics.get("nonfinite_cand_only") or 0, metrics.get("nonfinite_ref_only") or 0
        sides = ([f"the output holds NaN/Inf at {int(cand_only):,} of its {size:,} elements where float32's is "
                  "finite"] if cand_only else []) + ([f"float32's output holds NaN/Inf at {int(ref_only):,} of its "
                                                      f"{size:,} elements where {self.emulate}'s is finite"]
                                                     if ref_only else [])
        if sides:
            text = "; ".join(sides)
            return f"{text[0].upper()}{text[1:]} (SNR -inf dB)."
        return "The output differs from float32's, which is zero everywhere (SNR -inf dB)."

    def to_dict(self) -> dict[str, Any]:
        from ..numbers import json_number

        return {"emulate": self.emulate, "finding": self.finding, "summary": self.summary(),
                "origin": self.origin.to_dict(),
                "float32_origin": self.float32_origin.to_dict() if self.float32_origin is not None else None,
                "output_snr_db": json_number(self.output_snr_db),
                "worst_layers": [{"record": n, "snr_db": json_number(v)} for n, v in self.layers()]}


def stress(model: torch.nn.Module, *inputs: Any, emulate: str = "fp16") -> StressReport:
    """Run `model` in float32 and in the emulated arithmetic `emulate` (fp16, bf16, tf32); see module docstring."""
    from ..capture import capture
    from ..diff import diff
    from ..nan.live import find_first_nonfinite
    from .rewrite import eval_mode, forward_errors, seeded

    if emulate not in EMULATIONS:
        raise InputError(f"unknown emulation {emulate!r}; known: {', '.join(EMULATIONS)}")
    with eval_mode(model), tempfile.TemporaryDirectory(prefix="tensorprobe-stress-") as d:
        emulated = quantize_weights(model) if emulate == "int8-weights" else model
        with forward_errors(), seeded():      # both runs draw the same random numbers
            ref = capture(model, *inputs, level="module", keep="full", out=Path(d) / "ref")
        float32_origin = None
        if not all(r.stats.all_finite for r in ref):    # float32 already fails: said first, with its origin
            with forward_errors(), seeded():
                float32_origin = find_first_nonfinite(model, *inputs, spread=False)
        in_emulation = f"the model's forward in {emulate} emulation"
        with forward_errors(in_emulation), _arithmetic(emulate), seeded():
            cand = capture(emulated, *inputs, level="module", keep="full", out=Path(d) / "cand")
        with forward_errors(in_emulation), _arithmetic(emulate), seeded():
            origin = find_first_nonfinite(emulated, *inputs, spread=False)
        report = diff(ref, cand)
        out = report.get(report.output) if report.output else None
        snr = out.metrics.get("snr_db") if out is not None else None
    return StressReport(emulate=emulate, origin=origin, diff=report, output_snr_db=snr,
                        float32_origin=float32_origin if float32_origin is not None and float32_origin.found else None)


def quantize_weights(model: torch.nn.Module, bits: int = 8) -> torch.nn.Module:
    """A copy of `model` whose convolution and linear weights are rounded to `bits`-bit integers (symmetric,
    one scale per output channel) and stored back as float32; weight norms are folded first, since a
    quantizer sees the weight the norm computes."""
    from .rewrite import clone_module, fold_weight_norm

    q, _ = fold_weight_norm(clone_module(model).eval())
    top = 2 ** (bits - 1) - 1
    with torch.no_grad():
        for m in q.modules():
            w = getattr(m, "weight", None)
            if not isinstance(m, (torch.nn.Linear, torch.nn.modules.conv._ConvNd)) or not isinstance(w, torch.Tensor):
                continue
            out_dim = 1 if isinstance(m, torch.nn.modules.conv._ConvTransposeNd) else 0
            scale = w.abs().amax(dim=[d for d in range(w.dim()) if d != out_dim], keepdim=True) / top
            scale = torch.where(scale > 0, scale, torch.ones_like(scale))
            w.copy_(torch.clamp(torch.round(w / scale), -top, top) * scale)
    return q


def _arithmetic(emulate: str) -> Any:
    import contextlib

    from ..emulate import reduced_precision, tf32

    if emulate == "tf32":
        return tf32()
    if emulate == "int8-weights":
        return contextlib.nullcontext()
    low = {"fp16": "float16", "bf16": "bfloat16", "fp16-accum": "float16"}[emulate]
    return reduced_precision(low, accumulate=emulate == "fp16-accum")
