"""`tensorprobe sweep SWEEP_TARGET -o RESULTS`: a port over a corpus, on a local pool, Ray or Dask.

Exit codes: 0 every item matches, 1 an item has a finding (divergence, NaN, bad audio) or failed to run,
2 bad input. JSON schema: docs/json-sweep.md.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from ..errors import EXIT_FINDING, EXIT_OK, TensorprobeError
from ._common import JsonOption, app, console, emit_json, fail, parse_options


@app.command("sweep")
def sweep_cmd(
    target: str = typer.Argument(..., help="path/to/file.py:factory or package.module:factory returning a "
                                 "tensorprobe.sweep.Sweep (or (model, items))."),
    out: Path = typer.Option(..., "-o", "--out", help="RESULTS directory (reused to resume)."),
    runtime: Optional[str] = typer.Option(None, "--runtime", "-r", help="Candidate runtime (default: the "
                                          "factory's, else onnxruntime)."),
    cand: Optional[str] = typer.Option(None, "--cand", help="Candidate instead of an export of the reference: "
                                       "an exported artifact (model.onnx, model.pte; run by --runtime, else by "
                                       "the runtime its suffix names) or file.py:factory returning a PyTorch model."),
    workers: Optional[int] = typer.Option(None, "--workers", "-j", help="Worker processes (default: cores)."),
    engine: str = typer.Option("local", "--engine", help="local, ray or dask."),
    address: Optional[str] = typer.Option(None, "--address", "--scheduler", help="Ray address (auto, "
                                          "ray://HOST:PORT) or Dask scheduler (tcp://HOST:PORT); default: a "
                                          "local cluster of --workers."),
    option: list[str] = typer.Option([], "-O", "--option", metavar="KEY=VALUE", help="Runtime option, repeatable."),
    limit: Optional[int] = typer.Option(None, "--limit", help="Run at most this many items not yet done."),
    replay_rng: Optional[bool] = typer.Option(None, "--replay-rng/--no-replay-rng", help="Reference and candidate "
                                              "draw the same random numbers (default: the Sweep's replay_rng)."),
    sample_passing: int = typer.Option(0, "--sample-passing", metavar="N", min=0, help="Also capture and diff N "
                                       "items (evenly spread) whatever their plain run says, to show the "
                                       "distribution of the passing ones."),
    capture_all: bool = typer.Option(False, "--capture-all", help="Capture and diff every item (no plain run "
                                     "first): slower, a statistics-only bundle only where there is a finding."),
    model_explorer: Optional[Path] = typer.Option(None, "--model-explorer", metavar="OUT_DIR",
                                                  help="Also write a Model Explorer overlay: per node of the "
                                                       "candidate's ONNX graph, the share of items first diverging there."),
    json_out: bool = JsonOption,
) -> None:
    """Run every item of SWEEP_TARGET through reference and candidate, write one JSON line per item to
    RESULTS/items.jsonl as it finishes, and summarize: worst items, NaN origins, the layers that diverge first
    most often. Each item runs plainly first; only those whose outputs do not match are captured and diffed
    (what `compare` runs). A rerun skips the items done and reuses RESULTS/prepared (the runtime export)."""
    from ..report.sweep import render_sweep
    from ..sweep import ENGINES, sweep

    if engine not in ENGINES:
        fail(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    try:
        options = parse_options(option)
        with _progress_bar(enabled=not json_out and sys.stderr.isatty()) as on_item:
            summary = sweep(target, out, runtime=runtime, cand=cand, workers=workers, engine=engine, address=address,
                            options=options, limit=limit, replay_rng=replay_rng, sample_passing=sample_passing,
                            capture_all=capture_all, on_item=on_item)
        overlays = None
        if model_explorer is not None and summary.first_divergence:
            from ..report.explorer import sweep_node_data, write_node_data
            overlays = write_node_data(sweep_node_data(out), model_explorer)
    except TensorprobeError as e:
        fail(str(e))
    if json_out:
        emit_json("sweep", "finding" if summary.finding else "ok", {
            "sweep": summary.to_dict(), "out": str(out),
            "model_explorer": {k: str(v) for k, v in overlays.items()} if overlays else None})
    else:
        render_sweep(console, summary, out)
        if overlays:
            console.print(f"Model Explorer overlays: {', '.join(str(p) for p in overlays.values())}")
    raise typer.Exit(EXIT_FINDING if summary.finding else EXIT_OK)


class _progress_bar:
    """A rich progress bar with ETA on a terminal (stderr); nothing otherwise."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bar = None

    def __enter__(self):
        if not self.enabled:
            return None
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self.bar = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                            TextColumn("{task.description}"), console=Console(stderr=True), transient=True)
        self.bar.start()
        self.task = None
        return self._update

    def _update(self, record, done: int, total: int) -> None:
        if self.task is None:
            self.task = self.bar.add_task("", total=total)
        self.bar.update(self.task, completed=done, description=str(record.get("item", "")))

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
