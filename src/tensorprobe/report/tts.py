"""Terminal rendering of a `StageReport`: one row per stage (its figures and flags), then the timings."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..tts.stages import StageReport
from .audio import fmt

_STYLE = {"error": "bold red", "warning": "yellow", "ok": "green"}
_SUMMARY_KEYS = ("symbols", "unknown", "count", "min", "max", "vocab_size", "tokens", "total_frames", "mean",
                 "std", "shape", "duration_s", "peak", "peak_dbfs", "rms_dbfs", "health", "chars", "preview")


def _summary_text(summary: dict[str, Any]) -> str:
    parts = []
    for k in _SUMMARY_KEYS:
        if k in summary and summary[k] is not None:
            v = summary[k]
            parts.append(f"{k} {v if isinstance(v, (str, list)) else fmt(v)}")
    return ", ".join(parts)


def _mib(n: int | None) -> str:
    return "–" if n is None else f"{n / 2**20:.1f} MiB"


def render_stage_report(console: Console, report: StageReport) -> None:
    style = _STYLE[report.status]
    head = f"[bold]{escape(report.source or 'pipeline')}[/]  [{style}]{report.status.upper()}[/]"
    if report.first_bad_stage:
        head += f"  first bad stage: [bold]{escape(report.first_bad_stage)}[/]"
    console.print(head)
    table = Table(show_edge=False, box=None, pad_edge=False)
    for col in ("stage", "status", "figures", "findings"):
        table.add_column(col, overflow="fold")
    stages = list(report.summaries) + [f.stage for f in report.findings if f.stage not in report.summaries]
    for stage in dict.fromkeys(stages):
        fs = report.stage_findings(stage)
        status = "error" if any(f.severity == "error" for f in fs) else "warning" if fs else "ok"
        text = "\n".join(f"{f.severity}: {f.message}" for f in fs)
        table.add_row(escape(stage), f"[{_STYLE[status]}]{status}[/]",
                      escape(_summary_text(report.summaries.get(stage, {}))), escape(text))
    console.print(table)
    for stage, summary in report.summaries.items():
        for note in summary.get("notes", ()):
            console.print(f"  [dim]note ({escape(stage)}): {escape(note)}[/]")
    if report.stopped_after:
        console.print(f"[yellow]stopped after stage {escape(report.stopped_after)}[/] (later stages not run)")
    if report.timings:
        tt = Table(title="time and memory per stage", title_justify="left", show_edge=False, box=None)
        for col in ("stage", "wall", "python peak", "RSS peak growth"):
            tt.add_column(col)
        for t in report.timings:
            tt.add_row(escape(t.stage), f"{t.wall_s * 1000:.1f} ms", _mib(t.py_peak_bytes),
                       _mib(t.rss_peak_growth_bytes))
        console.print(tt)
