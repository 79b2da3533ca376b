"""`tensorprobe preflight TARGET --target T`: what will break when TARGET's model is ported to T; `tensorprobe stress
TARGET --emulate fp16`: the model in the target's arithmetic; `tensorprobe rewrite TARGET`: verified rewrites.

Exit codes: 0 nothing predicted to break, 1 something will (an error-level finding; float32 PyTorch already
failing on the inputs is one), 2 bad input. With --fix the fixed model is judged: 0 when every rewrite that
applied is proven and nothing error-level is left on the fixed model (nor, with --verify, NaN/Inf when the
target runs it), 1 when something is left. JSON schema: docs/json-preflight.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import EXIT_FINDING, EXIT_OK, InputError, TensorprobeError
from ._common import JsonOption, app, console, emit_json, fail, progress


@app.command("preflight")
def preflight_cmd(
    target: str = typer.Argument(..., help="path/to/file.py:factory or package.module:factory returning (model, inputs)."),
    port_target: str = typer.Option("executorch", "--target", "-t",
                                    help="executorch, tvm, onnx, coreml, mlx or fp16."),
    code: bool = typer.Option(True, "--code/--no-code", help="Export the model the target's way and lint it."),
    numbers: bool = typer.Option(True, "--numbers/--no-numbers", help="Run it once and lint its values."),
    importer: bool = typer.Option(True, "--import/--no-import", help="Hand the export to the target's importer "
                                  "where its runtime is installed (no compile, no run)."),
    verify: bool = typer.Option(False, "--verify", help="Run the target where it is installed (ONNX Runtime, "
                                "ExecuTorch, TVM; float16 in PyTorch) and mark each prediction confirmed or not."),
    fix: bool = typer.Option(False, "--fix", help="Apply the rewrites the findings point to, each only if it "
                             "proves equivalent on TARGET's inputs, and lint the fixed model again: exit 0 when "
                             "nothing that breaks is left on it."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="With --fix: export the fixed model here (.pt2), "
                                       "also when something is left (the exit code says so)."),
    json_out: bool = JsonOption,
) -> None:
    """Predict where TARGET's model breaks on a port target: first whether it already fails in float32 on its
    inputs, then from its code (an export) and its own numbers (one run). Exits 1 when something will break;
    with --fix, when something is left on the fixed model."""
    from ..preflight import preflight
    from ..report.preflight import render_preflight
    from ..targets import load_target

    try:
        tgt = load_target(target)
        with progress(f"preflight of {target} for {port_target}", enabled=not json_out):
            report = preflight(tgt.model, *tgt.args, target=port_target, code=code, numbers=numbers, verify=verify,
                               fix=fix, importer=importer)
        if out is not None:
            if report.rewrite is None:
                raise InputError("-o needs --fix and a finding with a rewrite rule")
            _export(report.rewrite.model, tgt.args, out)
    except TensorprobeError as e:
        fail(str(e))
    if json_out:
        emit_json("preflight", "finding" if report.finding else "ok", {"preflight": report.to_dict()})
    else:
        render_preflight(console, report)
    raise typer.Exit(EXIT_FINDING if report.finding else EXIT_OK)


@app.command("stress")
def stress_cmd(
    target: str = typer.Argument(..., help="path/to/file.py:factory or package.module:factory returning (model, inputs)."),
    emulate: str = typer.Option("fp16", "--emulate", "-e", help="fp16, bf16, fp16-accum (partial sums in float16 too), tf32 or int8-weights."),
    json_out: bool = JsonOption,
) -> None:
    """Run TARGET's model with every op in fp16/bf16/TF32 arithmetic (emulated in float32): where the first
    non-finite value is born, and each layer's error against float32. Exits 1 on a non-finite value."""
    from rich.markup import escape

    from ..preflight.stress import stress
    from ..targets import load_target

    try:
        tgt = load_target(target)
        with progress(f"stress of {target} in {emulate}", enabled=not json_out):
            report = stress(tgt.model, *tgt.args, emulate=emulate)
    except TensorprobeError as e:
        fail(str(e))
    if json_out:
        emit_json("stress", "finding" if report.finding else "ok", {"stress": report.to_dict()})
    else:
        console.print(f"[{'bold red' if report.finding else 'bold green'}]{escape(report.summary())}[/]")
        for name, snr in report.layers():
            console.print(f"  SNR {snr:6.1f} dB  {escape(name)}")
    raise typer.Exit(EXIT_FINDING if report.finding else EXIT_OK)


@app.command("rewrite")
def rewrite_cmd(
    target: str = typer.Argument(..., help="path/to/file.py:factory or package.module:factory returning (model, inputs)."),
    rules: str = typer.Option("stable_norm,fold_weight_norm", "--rules", help="Comma-separated rules: stable_norm, "
                              "fold_weight_norm, guard_atan2, record_random, conv_stft."),
    rtol: Optional[float] = typer.Option(None, "--rtol", help="Accept a rule whose outputs move by up to this "
                                         "much (relative), beyond float32 rounding. Default: only what float32 "
                                         "rounding explains on this model, or a rule as accurate against float64 "
                                         "as the model."),
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Export the rewritten model here (torch.export, .pt2)."),
    json_out: bool = JsonOption,
) -> None:
    """Rewrite TARGET's model for a port (stable norms, weight norm folded, atan2 guarded, random draws recorded),
    keeping each rule only if its outputs on TARGET's inputs prove equivalent (within float32 rounding), or
    show it as accurate as the model. Exits 1 when a rule changed the outputs and was refused."""
    from ..preflight.rewrite import rewrite
    from ..targets import load_target

    try:
        tgt = load_target(target)
        result = rewrite(tgt.model, *tgt.args, rules=[r.strip() for r in rules.split(",") if r.strip()], rtol=rtol)
        if out is not None:
            _export(result.model, tgt.args, out)
    except TensorprobeError as e:
        fail(str(e))
    refused = any(not r.applied and r.changed for r in result.rules)
    if json_out:
        emit_json("rewrite", "finding" if refused else "ok", {"rewrite": result.to_dict(), "out": str(out) if out else None})
    else:
        console.print(result.summary())
        if out is not None:
            console.print(f"wrote {out}")
    raise typer.Exit(EXIT_FINDING if refused else EXIT_OK)


def _export(model, args, out: Path) -> None:
    import os

    import torch

    try:
        ep = torch.export.export(model, tuple(args), strict=False)
    except Exception as e:
        raise InputError(f"torch.export could not export the rewritten model: {type(e).__name__}: {e}") from None
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        torch.export.save(ep, str(tmp))
        os.replace(tmp, out)       # atomic: no half-written file that looks complete
    finally:
        tmp.unlink(missing_ok=True)
