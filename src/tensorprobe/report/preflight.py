"""The preflight report for a terminal: the summary, where float32 already fails (nan's answer), then one row
per finding, most severe first; after `--fix`, what is left on the fixed model."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..preflight.findings import ERROR, WARNING, Finding, PreflightReport

_STYLE = {ERROR: "bold red", WARNING: "yellow"}


def render_preflight(console: Console, report: PreflightReport) -> None:
    style = "bold red" if report.finding else ("yellow" if report.findings else "bold green")
    console.print(f"[{style}]{escape(report.summary())}[/]")
    origin = report.float32.origin if report.float32 is not None else None
    if origin is not None and origin.found:      # nan's answer, as `tensorprobe nan` prints it
        console.print("[bold]where float32 fails[/] (tensorprobe nan):")
        console.print(escape("\n".join(f"  {line}" for line in origin.summary().splitlines())))
    if report.exported is not None:
        console.print(f"export for {escape(report.target.name)}: {'ok' if report.exported else 'failed'}")
    if report.findings:
        console.print(_table(report.findings))
    if report.remaining:
        console.print("[bold]left on the fixed model:[/]")
        console.print(_table(report.remaining))
    for note in report.notes:
        console.print(f"[dim]note: {escape(note)}[/]")


def _table(findings: tuple[Finding, ...]) -> Table:
    table = Table(show_edge=False, pad_edge=False)
    for col in ("severity", "kind", "where", "finding", "fix"):
        table.add_column(col, overflow="fold")
    for f in findings:
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
    return table
