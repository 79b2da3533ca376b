"""Terminal rendering of the core findings: a NaN origin and a bundle's records."""

from __future__ import annotations

import re
from typing import Iterable

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..bundle import Bundle
from ..nan import NanOrigin, TensorSummary
from ..record import Record
from ..numbers import fmt_number
from ..stats import TensorStats


fmt = fmt_number


def _stats_cells(s: TensorStats) -> list[str]:
    finite = f"{s.finite_frac:.2%}" if s.finite_frac < 1 else "100%"
    return [finite, str(s.nan), str(s.posinf + s.neginf), fmt(s.min), fmt(s.max), fmt(s.mean), fmt(s.std)]


_STATS_HEAD = ["finite", "NaN", "±Inf", "min", "max", "mean", "std"]


def render_nan_origin(console: Console, origin: NanOrigin) -> None:
    """The finding, its evidence table (inputs and output), the diagnosis and how the damage spreads."""
    style = "bold red" if origin.found else "bold yellow" if origin.incomplete else "bold green"
    console.print(f"[{style}]{escape(origin.headline())}[/]")
    if not origin.found:
        _render_masks(console, origin)
        return
    if origin.record:
        console.print(f"  record: [cyan]{escape(origin.record)}[/]")
    if origin.module_type:
        console.print(f"  module type: {escape(origin.module_type)}")
    if origin.source:
        console.print(f"  source: {escape(origin.source)}")
    if origin.elements:
        console.print(f"  elements: {escape(origin.elements)}")
    if origin.reaches:
        shown = ", ".join(origin.reaches[:6]) + (f" and {len(origin.reaches) - 6} more" if len(origin.reaches) > 6 else "")
        console.print(f"  reaches the gradients of: {escape(shown)}")
    table = Table(title="evidence", title_justify="left", show_edge=False, pad_edge=False)
    for col in ["tensor", "shape", "dtype", *_STATS_HEAD]:
        table.add_column(col, no_wrap=True)
    rows: list[TensorSummary] = list(origin.inputs) + ([origin.output] if origin.output else [])
    for i, t in enumerate(rows):
        label = t.name if origin.direction == "backward" or i < len(rows) - 1 else "output"
        table.add_row(escape(label), "×".join(map(str, t.shape)) or "scalar", t.dtype, *_stats_cells(t.stats))
    console.print(table)
    console.print("[bold]diagnosis[/]")
    for d in origin.diagnosis:
        console.print(f"  • {escape(d)}")
    if origin.spread:
        console.print("[bold]spread[/] (module outputs after the origin)")
        for s in origin.spread:
            console.print(f"  {escape(s.module)}: {s.finite_frac:.2%} finite" + (f" — {escape(s.pattern)}" if s.pattern else ""))
    if origin.note:
        console.print(f"[yellow]note:[/] {escape(origin.note)}")
    _render_masks(console, origin)


def _render_masks(console: Console, origin: NanOrigin) -> None:
    """Deliberate ±Inf (masks) met on the way: information, not findings."""
    for m in origin.masks:
        console.print(f"[dim]info:[/] deliberate mask: {escape(m.describe())}")


def select_records(bundle: Bundle, pattern: str | None = None, nonfinite_only: bool = False) -> Iterable[Record]:
    rx = re.compile(pattern) if pattern else None
    for r in bundle:
        if rx is not None and not rx.search(r.name):
            continue
        if nonfinite_only and r.stats.all_finite:
            continue
        yield r


def render_bundle(console: Console, bundle: Bundle, records: list[Record], total: int) -> None:
    m = bundle.manifest
    status = m.get("status", "?")
    color = "green" if status == "complete" else "yellow"
    rt = m.get("runtime", {})
    console.print(f"[bold]{escape(str(bundle.path))}[/]  [{color}]{status}[/]  runtime: {escape(str(rt.get('name', '?')))} "
                  f"{escape(str(rt.get('version', '')))}  records: {len(bundle)}")
    if not bundle.complete:
        console.print(f"[bold yellow]incomplete:[/] {escape(bundle.incomplete_note() or '')}")
    for warning in m.get("warnings", []):
        console.print(f"[yellow]warning:[/] {escape(str(warning))}")
    table = Table(show_edge=False)
    for col in ["#", "name", "op", "shape", "dtype", *_STATS_HEAD, "channels"]:
        table.add_column(col, overflow="fold")
    for r in records:
        style = None if r.stats.all_finite else "red"
        table.add_row(str(r.order), escape(r.name), escape(r.op), str(list(r.shape)), r.dtype, *_stats_cells(r.stats),
                      escape(r.stats.channel_pattern() or ""), style=style)
    console.print(table)
    if len(records) < total:
        console.print(f"[dim]{total - len(records)} more records (use --limit 0 for all)[/]")
