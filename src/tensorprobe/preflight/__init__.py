"""Preflight: predict where a model will break on a port target before porting it.

Two lints, each finding with its module path, source line, evidence and fix:

- `code`     export the model the way the target does (`torch.export` + Core ATen decomposition, or
             `torch.onnx.export`) and list what it trips on: ops outside Core ATen, random ops, complex
             tensors and FFTs, weight norms computed at run time, what the exporter rejects;
- `numbers`  run it once on the user's inputs and find the values the target's arithmetic breaks:
             instance-norm channels a one-pass variance cancels on, exp inputs near overflow, values
             beyond float16.

    >>> import tensorprobe as tp
    >>> report = tp.preflight(model, *inputs, target="executorch")          # doctest: +SKIP
    >>> print(report.summary())                                             # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InputError
from .code import lint_code
from .findings import ERROR, INFO, TARGETS, WARNING, Finding, PreflightReport, Target, get_target, sorted_findings
from .numbers import lint_numbers


def preflight(model: torch.nn.Module, *inputs: Any, target: str = "executorch", code: bool = True,
              numbers: bool = True, verify: bool = False, fix: bool = False, importer: bool = True) -> PreflightReport:
    """Predict what breaks when `model` is ported to `target` (one of `TARGETS`).

    Args:
        model, inputs: the PyTorch model and representative inputs (the numbers lint runs on them).
        target: executorch, tvm, onnx, coreml, mlx or fp16.
        code, numbers: run the code lint (an export) and the numbers lint (one forward).
        importer: with `code`, hand the export to the target's importer or lowering where its runtime is
            installed (TVM's Relax importer, ExecuTorch's `to_edge`, an ONNX Runtime session), without
            compiling or running it; what it rejects is an `import_error` finding.
        verify: run the target where it is installed and mark each numerical prediction confirmed or not
            (`Finding.confirmed`, `Finding.observed`).
        fix: apply the rewrite rules the findings point to (`Finding.rule`), each kept only if it proves
            equivalent on `inputs` (`tensorprobe.rewrite`); `report.rewrite.model` is the fixed model. With
            `verify` too, the target runs the fixed model (`report.fixed_ok`).

    Returns:
        A `PreflightReport`; `report.finding` is True when something is predicted to break.
    """
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"preflight needs a torch.nn.Module, got {type(model).__name__}")
    t = get_target(target)
    model = model.eval()
    findings: list[Finding] = []
    exported = None
    import_note = None
    if code:
        found, exported, import_note = lint_code(model, inputs, t, importer=importer)
        findings += found
    if numbers:
        findings += lint_numbers(model, inputs, t)
    notes = ([t.note] if t.note else []) + ([import_note] if import_note else [])
    if verify:
        from .verify import verify as run_target

        findings, note = run_target(model, inputs, t, findings)
        notes.append(note)
    fixed, fixed_ok = None, None
    if fix:
        from .rewrite import rewrite

        rules = list(dict.fromkeys(f.rule for f in sorted_findings(findings) if f.rule))   # worst problem first
        fixed = rewrite(model, *inputs, rules=rules) if rules else None
        notes.append(f"--fix: {fixed.summary()}" if fixed else "--fix: no finding has a rewrite rule")
        if verify and fixed is not None:
            from .verify import verify_fixed

            fixed_ok, note = verify_fixed(fixed.model, inputs, t)
            notes.append(note)
    return PreflightReport(target=t, findings=sorted_findings(findings), exported=exported, notes=tuple(notes),
                           rewrite=fixed, fixed_ok=fixed_ok)


__all__ = ["ERROR", "INFO", "TARGETS", "WARNING", "Finding", "PreflightReport", "Target", "preflight"]

from .._api import make_callable  # noqa: E402

make_callable(__name__, preflight)  # `tp.preflight(...)` calls it; `tensorprobe.preflight.<submodule>` still imports
