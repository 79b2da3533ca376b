"""The sweep report: a terminal summary and a self-contained HTML page (distribution plots, a sortable table
of items, links to the kept bundles of failing items)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..sweep.results import SweepSummary, _value


def render_sweep(console: Console, summary: SweepSummary, out: str | os.PathLike) -> None:
    style = "bold red" if summary.finding else "bold green"
    console.print(f"[{style}]{escape(summary.headline())}[/]")
    if summary.first_divergence:
        table = Table(title="most frequent first divergence", show_edge=False, title_justify="left")
        table.add_column("items", justify="right")
        table.add_column("layer")
        for layer, n in summary.first_divergence[:8]:
            table.add_row(str(n), escape(layer))
        console.print(table)
    if summary.nonfinite_groups:
        table = Table(title="non-finite output, by where NaN/Inf is born", show_edge=False, title_justify="left")
        for col in ("items", "side", "born at", "diagnosis", "example"):
            table.add_column(col, justify="right" if col == "items" else "left")
        for g in summary.nonfinite_groups[:8]:
            table.add_row(str(g["items"]), g["side"], escape(g["module"]), escape(g["diagnosis"]), escape(g["example"]))
        console.print(table)
    if summary.divergence_groups:
        table = Table(title="findings with finite output, by first divergence and cause", show_edge=False,
                      title_justify="left")
        for col in ("items", "first divergence", "cause", "example"):
            table.add_column(col, justify="right" if col == "items" else "left")
        for g in summary.divergence_groups[:8]:
            table.add_row(str(g["items"]), escape(g["layer"]), escape(g["cause"]), escape(g["example"]))
        console.print(table)
    if summary.worst_snr:
        table = Table(title="worst items by output SNR", show_edge=False, title_justify="left")
        for col in ("item", "SNR dB", "verdict", "first divergence"):
            table.add_column(col)
        for w in summary.worst_snr[:8]:
            table.add_row(escape(w["item"]), _show(w["output_snr_db"]) + _nonfinite(w.get("output_nonfinite")),
                          str(w["verdict"]), escape(w["first_divergence"] or ""))
        console.print(table)
    for e in summary.errors[:5]:
        console.print(f"[magenta]failed[/] {escape(e['item'])}: {escape(str(e['error']))}")
    console.print(f"results: {out}/items.jsonl, {out}/summary.json, {out}/report.html")


def _nonfinite(counts: dict[str, Any] | None) -> str:
    """" (non-finite on the candidate side: N)" for an output finite on one side only."""
    if not counts or not counts.get("candidate_only"):
        return ""
    return f" (non-finite on the candidate side: {counts['candidate_only']})"


def write_sweep_html(path: str | os.PathLike, summary: SweepSummary, records: list[dict[str, Any]],
                     target: str) -> Path:
    import jinja2

    path = Path(path)
    env = jinja2.Environment(loader=jinja2.PackageLoader("tensorprobe.report", "templates"),
                             autoescape=jinja2.select_autoescape(["html"]))

    def rel(p: str) -> str:
        return os.path.relpath(p, path.parent)

    html = env.get_template("sweep.html").render(s=summary, records=records, target=target, plots=_plots(records),
                                                 num=_num_attr, show=_show, rel=rel)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, path)
    return path


def _plots(records: list[dict[str, Any]]) -> list[tuple[str, str]]:
    from .plots import figure_to_data_uri, new_figure

    snr = [_value(r.get("output_snr_db")) for r in records if r.get("status") == "done"]
    snr = [min(v, 200.0) for v in snr if v is not None and not math.isnan(v) and v > -math.inf]
    secs = [float(r.get("seconds", 0.0)) for r in records]

    def histogram(values: list[float], xlabel: str, color: str) -> str:
        fig, ax = new_figure(5.2, 3.0)
        ax.hist(values, bins=min(40, max(5, len(values) // 3)), color=color)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("items")
        return figure_to_data_uri(fig)

    return ([("output SNR distribution", histogram(snr, "output SNR (dB; identical outputs at 200)", "#4c72b0"))]
            if snr else []) + ([("time per item", histogram(secs, "seconds per item", "#55a868"))] if secs else [])


def _num_attr(v: Any) -> str:
    x = _value(v)
    return "" if x is None or math.isnan(x) else ("1e308" if x == math.inf else ("-1e308" if x == -math.inf else repr(x)))


def _show(v: Any, digits: int = 1) -> str:
    x = _value(v)
    if x is None:
        return "–"
    if isinstance(v, str):
        return v
    return f"{x:.{digits}f}"
