"""The preflight report for a terminal: the summary, then one row per finding, most severe first."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..preflight.findings import ERROR, WARNING, PreflightReport

_STYLE = {ERROR: "bold red", WARNING: "yellow"}


def render_preflight(console: Console, report: PreflightReport) -> None:
    style = "bold red" if report.finding else ("yellow" if report.findings else "bold green")
    console.print(f"[{style}]{escape(report.summary())}[/]")
    if report.exported is not None:
        console.print(f"export for {escape(report.target.name)}: {'ok' if report.exported else 'failed'}")
    if not report.findings:
        return
    table = Table(show_edge=False, pad_edge=False)
    for col in ("severity", "kind", "where", "finding", "fix"):
        table.add_column(col, overflow="fold")
    for f in report.findings:
        where = f.module or "<root>"
        if f.source:
            where += f"\n{f.source}"
        count = f" (×{f.count})" if f.count > 1 else ""
        checked = ""
        if f.observed:
            mark = {True: "[green]confirmed[/]", False: "[yellow]not confirmed[/]"}.get(f.confirmed, "[dim]unchecked[/]")
            checked = f"\n{mark}: {escape(f.observed)}"
        table.add_row(f"[{_STYLE.get(f.severity, 'dim')}]{f.severity}[/]", f.kind, escape(where),
                      escape(f.message + count) + checked, escape(f.fix or ""))
    console.print(table)
    for note in report.notes:
        console.print(f"[dim]note: {escape(note)}[/]")
