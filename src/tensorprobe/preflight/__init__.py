"""Preflight: predict where a model will break on a port target before porting it.

First, whether the model already fails in float32 PyTorch on the inputs (`nan`'s answer, the first finding);
then two lints, each finding with its module path, source line, evidence and fix:

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
from .findings import (ERROR, FLOAT32, INFO, TARGETS, WARNING, Finding, Float32Check, PreflightReport, Target,
                       get_target, sorted_findings)
from .numbers import lint_numbers


def preflight(model: torch.nn.Module, *inputs: Any, target: str = "executorch", code: bool = True,
              numbers: bool = True, verify: bool = False, fix: bool = False, importer: bool = True) -> PreflightReport:
    """Predict what breaks when `model` is ported to `target` (one of `TARGETS`).

    Args:
        model, inputs: the PyTorch model and representative inputs (the numbers lint runs on them). The
            model is run in eval mode and left as it was (training flags, modules, weights).
        target: executorch, tvm, onnx, coreml, mlx or fp16.
        code, numbers: run the code lint (an export) and the numbers lint (one forward). The numbers lint runs
            first and says whether float32 PyTorch already makes NaN/Inf on `inputs` (`report.float32`): if so,
            that is the first finding, with `nan`'s origin, and no target finding is made where float32 fails.
        importer: with `code`, hand the export to the target's importer or lowering where its runtime is
            installed (TVM's Relax importer, ExecuTorch's `to_edge`, an ONNX Runtime session), without
            compiling or running it; what it rejects is an `import_error` finding.
        verify: run the target where it is installed and mark each numerical prediction confirmed or not
            (`Finding.confirmed`, `Finding.observed`).
        fix: apply the rewrite rules the findings point to (`Finding.rule`), each kept only if it proves
            equivalent on `inputs` (`tensorprobe.rewrite`); `report.rewrite.model` is the fixed model, linted
            again (`report.remaining`). With `verify` too, the target runs the fixed model (`report.fixed_ok`).

    Returns:
        A `PreflightReport`; `report.finding` is True when something will break (after `fix`: on the fixed
        model).
    """
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"preflight needs a torch.nn.Module, got {type(model).__name__}")
    from .rewrite import eval_mode

    t = get_target(target)
    with eval_mode(model):
        findings, exported, notes, float32 = _lint(model, inputs, t, code=code, numbers=numbers, importer=importer)
        notes = ([t.note] if t.note else []) + notes
        if verify:
            from .verify import verify as run_target

            findings, note = run_target(model, inputs, t, list(findings))
            notes.append(note)
        fixed, fixed_ok, remaining = None, None, None
        if fix:
            fixed, fixed_ok, remaining, fix_notes = _fix(model, inputs, t, findings, verify=verify, code=code,
                                                        numbers=numbers, importer=importer)
            notes += fix_notes
    return PreflightReport(target=t, findings=sorted_findings(findings), exported=exported, notes=tuple(notes),
                           rewrite=fixed, fixed_ok=fixed_ok, float32=float32, remaining=remaining)


def _lint(model: torch.nn.Module, inputs: tuple, t: Target, *, code: bool, numbers: bool,
          importer: bool) -> tuple[list[Finding], bool | None, list[str], Float32Check | None]:
    """(findings, whether the export went through, notes, the float32 check). The model runs first: what
    float32 already breaks is said before anything about the target."""
    first: list[Finding] = []
    from_numbers: list[Finding] = []
    from_code: list[Finding] = []
    float32 = None
    if numbers:
        from_numbers, float32 = lint_numbers(model, inputs, t)
        first = [f] if (f := float32.finding()) else []
    exported, import_note = None, None
    if code:
        from_code, exported, import_note = lint_code(model, inputs, t, importer=importer)
    # code findings before number findings of the same severity, as `--fix` has always applied their rules
    return first + from_code + from_numbers, exported, [import_note] if import_note else [], float32


def _fix(model: torch.nn.Module, inputs: tuple, t: Target, findings: list[Finding], *, verify: bool,
         **lints: bool) -> tuple[Any, bool | None, tuple[Finding, ...] | None, list[str]]:
    """Apply the rules the findings name (worst problem first), then lint the fixed model again: what is
    left there decides the exit code. Returns (rewrite result, fixed_ok, remaining findings, notes)."""
    from .rewrite import rewrite

    rules = list(dict.fromkeys(f.rule for f in sorted_findings(findings) if f.rule))
    if not rules:
        return None, None, None, ["--fix: no finding has a rewrite rule"]
    fixed = rewrite(model, *inputs, rules=rules)
    notes = [f"--fix: {fixed.summary()}"]
    if not any(r.applied for r in fixed.rules):
        return fixed, None, None, notes
    left, _, _, _ = _lint(fixed.model, inputs, t, **lints)
    fixed_ok = None
    if verify:
        from .verify import verify_fixed

        fixed_ok, note = verify_fixed(fixed.model, inputs, t)
        notes.append(note)
    return fixed, fixed_ok, sorted_findings(left), notes


__all__ = ["ERROR", "FLOAT32", "INFO", "TARGETS", "WARNING", "Finding", "Float32Check", "PreflightReport", "Target",
           "preflight"]

from .._api import make_callable  # noqa: E402

make_callable(__name__, preflight)  # `tp.preflight(...)` calls it; `tensorprobe.preflight.<submodule>` still imports
