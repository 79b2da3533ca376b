"""`tensorprobe preflight TARGET --target T`: what will break when TARGET's model is ported to T.

Exit codes: 0 nothing predicted to break, 1 something will (an error-level finding), 2 bad input.
JSON schema: docs/json-preflight.md.
"""

from __future__ import annotations

import typer

from ..errors import EXIT_FINDING, EXIT_OK, TensorprobeError
from ._common import JsonOption, app, console, emit_json, fail, progress


@app.command("preflight")
def preflight_cmd(
    target: str = typer.Argument(..., help="path/to/file.py:factory or package.module:factory returning (model, inputs)."),
    port_target: str = typer.Option("executorch", "--target", "-t",
                                    help="executorch, tvm, onnx, coreml, mlx or fp16."),
    code: bool = typer.Option(True, "--code/--no-code", help="Export the model the target's way and lint it."),
    numbers: bool = typer.Option(True, "--numbers/--no-numbers", help="Run it once and lint its values."),
    verify: bool = typer.Option(False, "--verify", help="Run the target where it is installed (ONNX Runtime, "
                                "ExecuTorch, TVM; float16 in PyTorch) and mark each prediction confirmed or not."),
    json_out: bool = JsonOption,
) -> None:
    """Predict where TARGET's model breaks on a port target, from its code (an export) and its own numbers
    (one run on its inputs). Exits 1 when something will break."""
    from ..preflight import preflight
    from ..report.preflight import render_preflight
    from ..targets import load_target

    try:
        tgt = load_target(target)
        with progress(f"preflight of {target} for {port_target}", enabled=not json_out):
            report = preflight(tgt.model, *tgt.args, target=port_target, code=code, numbers=numbers, verify=verify)
    except TensorprobeError as e:
        fail(str(e))
    if json_out:
        emit_json("preflight", "finding" if report.finding else "ok", {"preflight": report.to_dict()})
    else:
        render_preflight(console, report)
    raise typer.Exit(EXIT_FINDING if report.finding else EXIT_OK)
