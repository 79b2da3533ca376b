"""The training-run report: findings in the terminal, and a self-contained HTML page (loss terms, per-layer
gradient norms and update ratios as heatmaps over steps, watched outputs' spread, each incident marked: a line
at its first finding, its span shaded, its number)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..train.report import MAX_POINTS, RunSummary

_STYLE = {"error": "bold red", "warning": "yellow"}


def render_train(console: Console, s: RunSummary) -> None:
    console.print(f"[{'bold red' if s.errors else 'yellow' if s.finding else 'bold green'}]{escape(s.headline())}[/]")
    if not s.findings:
        return
    table = Table(show_edge=False)
    for col in ("#", "step", "kind", "layer", "what"):
        table.add_column(col, overflow="fold")
    for inc in s.incidents[:40]:
        f = inc.first
        what = f["message"] + (f"\norigin: {f['origin_headline']}" if f.get("origin_headline") else "")
        if f.get("cause"):
            what += f"\nlikely cause: {f['cause']}\nfix: {f['fix']}"
        if inc.following:
            what += f"\n{inc.follows()}"
        table.add_row(str(inc.number), str(f["step"]), f"[{_STYLE.get(f['severity'], '')}]{escape(f['kind'])}[/]",
                      escape(str(f.get("layer", ""))), escape(what))
    console.print(table)
    if len(s.incidents) > 40:
        console.print(f"... and {len(s.incidents) - 40} more incidents (--json lists them all)")


def write_train_html(path: str | os.PathLike, s: RunSummary) -> Path:
    import jinja2

    path = Path(path)
    env = jinja2.Environment(loader=jinja2.PackageLoader("tensorprobe.report", "templates"),
                             autoescape=jinja2.select_autoescape(["html"]))
    html = env.get_template("train.html").render(s=s, plots=_plots(s), max_points=MAX_POINTS)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, path)
    return path


def _plots(s: RunSummary) -> list[tuple[str, str]]:
    out = []
    marks = [(i.number, i.start, i.end) for i in s.incidents]
    if s.losses:
        out.append(("Loss terms", _curves(s, s.losses, "loss", marks, log=True)))
    if s.grad_norm:
        out.append(("Gradient norm per layer (log10; largest parameter of the layer)",
                    _heatmap(s, s.grad_norm, marks, "log10 gradient norm")))
    if s.update_ratio:
        out.append(("Update ratio |Δw|/|w| per layer (log10)", _heatmap(s, s.update_ratio, marks, "log10 update ratio")))
    if s.outputs:
        out.append(("Watched outputs: std across batch and time", _curves(s, s.outputs, "std", marks, log=True)))
    return out


def _curves(s: RunSummary, series: dict[str, list[float]], ylabel: str, marks: list[int], log: bool) -> str:
    from .plots import figure_to_data_uri, new_figure

    fig, ax = new_figure(10, 3.2)
    for name, values in series.items():
        xs = s.step_index[:len(values)]
        ys = [v if math.isfinite(v) and (v > 0 or not log) else math.nan for v in values]
        ax.plot(xs, ys, label=name, linewidth=1.2)
    if log:
        ax.set_yscale("log")
    _mark(ax, marks)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    if len(series) <= 12:
        ax.legend(fontsize=7, loc="best")
    return figure_to_data_uri(fig)


def _heatmap(s: RunSummary, series: dict[str, list[float]], marks: list[int], label: str) -> str:
    import numpy as np

    from .plots import figure_to_data_uri, new_figure

    layers = list(series)
    n = len(s.step_index)
    grid = np.full((len(layers), n), np.nan)
    for i, layer in enumerate(layers):
        values = np.asarray(series[layer] + [math.nan] * (n - len(series[layer])), dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            grid[i] = np.where(np.isfinite(values) & (values > 0), np.log10(np.where(values > 0, values, 1.0)),
                               np.nan)
    height = min(14.0, 1.5 + 0.22 * len(layers))
    fig, ax = new_figure(10, height)
    x0, x1 = (s.step_index[0], s.step_index[-1]) if s.step_index else (0, 1)
    im = ax.imshow(grid, aspect="auto", interpolation="nearest", cmap="viridis",
                   extent=(x0 - 0.5, x1 + 0.5, len(layers) - 0.5, -0.5))
    ax.set_yticks(range(len(layers)))
    ax.set_yticklabels(layers, fontsize=7 if len(layers) < 40 else 5)
    _mark(ax, marks)
    ax.set_xlabel("step")
    fig.colorbar(im, ax=ax, label=label)
    return figure_to_data_uri(fig)


def _mark(ax: Any, marks: list[tuple[int, int, int]]) -> None:
    """Each incident: a red line at its first finding, its span shaded, its number on top."""
    for number, start, end in marks[:50]:
        ax.axvline(start, color="#d62728", linewidth=0.9, alpha=0.7)
        if end > start:
            ax.axvspan(start, end, color="#d62728", alpha=0.12, linewidth=0)
        ax.annotate(f"#{number}", xy=(start, 1.0), xycoords=("data", "axes fraction"), xytext=(2, -10),
                    textcoords="offset points", color="#d62728", fontsize=8, fontweight="bold")
