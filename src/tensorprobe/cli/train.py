"""`tensorprobe train report RUN`: the findings of a run a `tensorprobe.train.Monitor` wrote.

Exit codes: 0 no finding, 1 a finding (error or warning), 2 bad input (not a run directory).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..errors import EXIT_FINDING, EXIT_OK, TensorprobeError
from ._common import JsonOption, app, console, emit_json, fail

train_app = typer.Typer(help="Training runs a tensorprobe.train.Monitor recorded.", no_args_is_help=True)
app.add_typer(train_app, name="train")


@train_app.command("report")
def report_cmd(
    run: Path = typer.Argument(..., help="The run directory (Monitor(run_dir=...))."),
    html: Optional[Path] = typer.Option(None, "--html", help="Write the HTML page here (default RUN/report.html)."),
    json_out: bool = JsonOption,
) -> None:
    """Print a run's findings (step, kind, layer) and write its HTML page: loss terms, per-layer gradient
    norms and update ratios over steps, watched outputs."""
    from ..report.train import render_train, write_train_html
    from ..train import summarize

    try:
        summary = summarize(run)
        page = write_train_html(html or run / "report.html", summary)
    except TensorprobeError as e:
        fail(str(e))
    if json_out:
        emit_json("train report", "finding" if summary.finding else "ok", {**summary.to_dict(), "html": str(page)})
    else:
        render_train(console, summary)
        console.print(f"HTML report: {page}")
    raise typer.Exit(EXIT_FINDING if summary.finding else EXIT_OK)
