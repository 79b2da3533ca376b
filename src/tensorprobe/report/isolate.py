"""The `isolate` report, for a terminal (rich) and as one self-contained HTML page.

The page: summary, a plot of accumulated and local error per layer (SNR dB, execution order), and the table
of layers. No network needed to open it; names escaped.

    >>> render_isolate(console, report)                     # doctest: +SKIP
    >>> write_isolate_html(report, "isolate.html")          # doctest: +SKIP

To put the local error on `diff`'s own report instead: `write_diff_html(diff_report, path,
local_snr=report.local_snr())` (tensorprobe.report.html).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..bundle import atomic_write_bytes
from ..numbers import fmt_number
from ..isolate.report import INHERITED, LOCAL, IsolateReport

_STYLE = {LOCAL: "bold red", INHERITED: "yellow", "ok": "green", "unknown": "dim"}


def _snr(m: dict | None) -> str:
    if m is None:
        return "–"
    v = m.get("snr_db")
    if v is None:
        return "–"
    return fmt_number(v) if not math.isfinite(v) else f"{v:.1f}"


def _rel(m: dict | None) -> str:
    v = None if m is None else m.get("rel_l2_err")
    return "–" if v is None else f"{v:.1e}"


def _nonfinite_side(m: dict | None) -> str:
    """'candidate all NaN/Inf', 'reference 25% NaN/Inf', both joined; '' when both sides are finite."""
    parts = []
    for who, key in (("candidate", "cand_finite_frac"), ("reference", "ref_finite_frac")):
        f = None if m is None else m.get(key)
        if f is not None and math.isfinite(f) and f < 1:
            parts.append(f"{who} all NaN/Inf" if f == 0 else f"{who} {1 - f:.0%} NaN/Inf")
    return " and ".join(parts)


def nonfinite_why(accumulated: dict | None, local: dict | None = None) -> str:
    """Why a row's numbers are -inf/inf, in the table's words: which side's output holds NaN/Inf, and whether
    the layer makes it alone (run on the reference's input) or its input already held it.

    >>> nonfinite_why({"cand_finite_frac": 0.0, "ref_finite_frac": 1.0}, {"cand_finite_frac": 0.0, "ref_finite_frac": 1.0})
    'candidate all NaN/Inf, born here (also when run alone)'
    >>> nonfinite_why({"cand_finite_frac": 0.0, "ref_finite_frac": 1.0}, {"cand_finite_frac": 1.0, "ref_finite_frac": 1.0})
    'candidate all NaN/Inf, from its input (finite when run alone)'
    """
    acc, alone = _nonfinite_side(accumulated), _nonfinite_side(local)
    if alone:
        return (f"{acc}, born here (also when run alone)" if acc == alone
                else f"run alone: {alone}, born here")
    if acc and local is not None:
        return f"{acc}, from its input (finite when run alone)"
    return acc


def render_isolate(out: Console, report: IsolateReport, *, show_all: bool = False, context: int = 2) -> None:
    """Summary line, then per layer: accumulated and local error side by side, with a verdict."""
    style = "bold red" if report.found else ("yellow" if report.first_accumulated else "bold green")
    out.print(f"[{style}]{escape(report.summary())}[/]")
    rows = _rows(report, show_all, context)
    table = Table(show_edge=False, pad_edge=False, title_justify="left",
                  title=f"{len(report.layers)} module calls; criteria {report.criteria.describe()}; SNR in dB")
    table.add_column("layer", overflow="fold", min_width=20)
    for col in ("acc. SNR", "acc. rel", "local SNR", "local rel"):
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    outputs = [x for x in report.outputs if show_all or x.accumulated_fails]
    # a row whose output holds NaN/Inf says why in the table, not only in the summary or the JSON
    whys = {i: nonfinite_why(report.layers[i].accumulated, report.layers[i].local) for i in rows}
    out_whys = [nonfinite_why(x.accumulated) for x in outputs]
    why = any(whys.values()) or any(out_whys)
    if why:
        table.add_column("why", overflow="fold", min_width=16)
    last = -1
    for i in rows:
        if last >= 0 and i != last + 1:
            table.add_row("…", "", "", "", "", "", *([""] if why else []))
        x = report.layers[i]
        v = x.verdict
        table.add_row(escape(x.name), _snr(x.accumulated), _rel(x.accumulated),
                      _snr(x.local), _rel(x.local), f"[{_STYLE.get(v, '')}]{v}[/]",
                      *([escape(whys[i])] if why else []))
        last = i
    for x, w in zip(outputs, out_whys):   # the model's own outputs: accumulated error only
        v = "differs" if x.accumulated_fails else "ok"
        table.add_row(f"{escape(x.name)} (model)", _snr(x.accumulated), _rel(x.accumulated), "", "",
                      f"[{_STYLE[LOCAL if x.accumulated_fails else 'ok']}]{v}[/]", *([escape(w)] if why else []))
    if rows or outputs:
        out.print(table)
    if report.ascent is not None:
        _render_ascent(out, report)
    for x in report.layers:
        if x.note and (show_all or x.verdict != "ok"):
            out.print(f"  [dim]{escape(x.name)}: {escape(x.note)}[/]")
    for n in report.notes:
        out.print(f"  note: {escape(n)}")
    rng = {"state": "generator state restored per call", "tensors": "recorded noise replayed"}.get(report.rng or "")
    if rng and report.noise_replayed:
        out.print(f"  randomness: {rng} ({report.noise_replayed})")


def _render_ascent(out: Console, report: IsolateReport) -> None:
    """The module calls run alone above the isolated ones, innermost first, and what the answer reads."""
    a = report.ascent
    table = Table(show_edge=False, pad_edge=False, title_justify="left",
                  title=f"above the isolated modules, from {a.start}: {len(a.tested)} module calls run alone "
                        f"({a.passes} pass{'es' if a.passes != 1 else ''})")
    table.add_column("module call", overflow="fold", min_width=20)
    table.add_column("type", no_wrap=True)
    table.add_column("local SNR", justify="right", no_wrap=True)
    table.add_column("local rel", justify="right", no_wrap=True)
    table.add_column("alone", no_wrap=True)
    for x in a.tested:
        alone = LOCAL if x.local_fails else ("ok" if x.local is not None else "unknown")
        table.add_row(escape(x.name), escape(x.module_type), _snr(x.local), _rel(x.local),
                      f"[{_STYLE.get(alone, '')}]{'fails' if alone == LOCAL else alone}[/]")
    out.print(table)
    if a.found is not None and a.direct_params:
        out.print(f"  {escape(a.found)} reads directly: {escape(', '.join(a.direct_params))}")
    for name, rel in a.differing_params:
        words = "another shape" if rel is None else f"relative error {rel:.3g}"
        out.print(f"  [bold red]{escape(name)}[/] differs from the reference's ({words})")
    for n in a.notes:
        out.print(f"  note: {escape(n)}")


def _rows(report: IsolateReport, show_all: bool, context: int) -> list[int]:
    if show_all:
        return list(range(len(report.layers)))
    keep: set[int] = set()
    for i, x in enumerate(report.layers):
        if x.verdict == LOCAL:
            keep.update(range(max(0, i - context), min(len(report.layers), i + context + 1)))
    inherited = [i for i, x in enumerate(report.layers) if x.verdict == INHERITED]
    keep.update(inherited[:8] + inherited[-2:])
    return sorted(keep)


SNR_CAP = 160.0

_TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>tensorprobe isolate: {{ verdict }}</title>
<style>
 body { font-family: system-ui, sans-serif; margin: 1.5rem auto; max-width: 1150px; color: #222; padding: 0 1rem; }
 .verdict { font-weight: 600; padding: .35rem .7rem; border-radius: 4px; display: inline-block; }
 .local { background: #fde4e1; color: #8a1c0c; } .inherited { background: #fff3cd; color: #6b4e00; }
 .ok { background: #e3f5e5; color: #145a1e; }
 img { max-width: 100%; } code { background: #f3f3f3; padding: 0 .25rem; }
 table { border-collapse: collapse; width: 100%; font-size: .85rem; }
 th { background: #f7f7f7; text-align: left; padding: .25rem .4rem; border-bottom: 2px solid #ccc; }
 td { padding: .15rem .4rem; border-bottom: 1px solid #eee; } td.n { text-align: right; }
 tr.v-local td.v { color: #b3261e; font-weight: 600; } tr.v-inherited td.v { color: #8a6d00; }
 .muted { color: #777; font-size: .9rem; }
</style></head><body>
<h1>tensorprobe isolate</h1>
<p class="muted">{{ title }}</p>
<p><span id="verdict" class="verdict {{ verdict }}">{{ verdict_words }}</span></p>
<p id="summary">{{ r.summary() }}</p>
<p class="muted">criteria: {{ criteria }}; runner: {{ r.runner }}; randomness: {{ r.rng or "not replayed" }};
{{ r.layers | length }} module calls in {{ "%.2f" | format(r.seconds) }} s</p>
{% for n in r.notes %}<p class="muted">{{ n }}</p>{% endfor %}
{% if r.ascent %}<h2>Above the isolated modules</h2>
<p class="muted">No isolated module explained where the accumulated error starts ({{ r.ascent.start }}): these
module calls around it ran alone on the reference's inputs, innermost first.</p>
<table id="ascent"><tr><th>module call</th><th>type</th><th>local SNR dB</th><th>local rel err</th><th>alone</th></tr>
{% for x in r.ascent.tested %}<tr class="v-{{ 'local' if x.local_fails else 'ok' }}"><td><code>{{ x.name }}</code></td>
<td>{{ x.module_type }}</td><td class="n">{{ snr(x.local) }}</td><td class="n">{{ rel(x.local) }}</td>
<td class="v">{{ "fails" if x.local_fails else "passes" }}</td></tr>
{% endfor %}</table>
{% if r.ascent.direct_params %}<p>{{ r.ascent.found }} reads directly: {% for p in r.ascent.direct_params %}<code>{{ p }}</code> {% endfor %}</p>{% endif %}
{% endif %}
<h2>Error per layer</h2>
<p class="muted">Accumulated: the candidate's own run against the reference. Local: each candidate layer run on
the reference's inputs. SNR of identical tensors is drawn at {{ cap }} dB.</p>
<img id="layer-plot" alt="accumulated and local SNR per layer" src="{{ plot }}">
<h2>Layers</h2>
<table id="layers"><tr><th>#</th><th>layer</th><th>type</th><th>accum. SNR dB</th><th>accum. rel err</th>
<th>local SNR dB</th><th>local rel err</th><th>verdict</th><th>note</th></tr>
{% for x in r.layers %}<tr class="v-{{ x.verdict }}"><td class="n">{{ loop.index0 }}</td><td><code>{{ x.name }}</code></td>
<td>{{ x.module_type }}</td><td class="n">{{ snr(x.accumulated) }}</td><td class="n">{{ rel(x.accumulated) }}</td>
<td class="n">{{ snr(x.local) }}</td><td class="n">{{ rel(x.local) }}</td><td class="v">{{ x.verdict }}</td>
<td>{{ (x.local_reasons | join("; ")) or (x.note or "") }}</td></tr>
{% endfor %}</table>
</body></html>
"""


def render_isolate_html(report: IsolateReport, *, title: str = "") -> str:
    """The page as a string (see module docstring)."""
    from jinja2 import Environment, select_autoescape  # imported by the HTML page only

    env = Environment(autoescape=select_autoescape(default=True, default_for_string=True))
    verdict = "local" if report.found else ("inherited" if report.first_accumulated else "ok")
    words = {"local": "A MODULE IS WRONG ON ITS OWN" if report.first_local is None else "A LAYER IS WRONG ON ITS OWN", "inherited": "ERROR ACCUMULATES, NO LAYER WRONG ALONE",
             "ok": "MATCH"}[verdict]
    crit = report.criteria.describe()
    return env.from_string(_TEMPLATE).render(
        r=report, title=title, verdict=verdict, verdict_words=words, criteria=crit, cap=int(SNR_CAP),
        plot=_plot(report), snr=_snr, rel=_rel)


def write_isolate_html(report: IsolateReport, path: str | os.PathLike, *, title: str = "") -> Path:
    """Write the page atomically; returns its path."""
    p = Path(path)
    atomic_write_bytes(p, render_isolate_html(report, title=title).encode("utf-8"))
    return p


def _val(m: dict | None) -> float:
    v = None if m is None else m.get("snr_db")
    return math.nan if v is None else min(float(v), SNR_CAP)


def _plot(report: IsolateReport) -> str:
    from .plots import figure_to_data_uri, new_figure

    fig, ax = new_figure(10.0, 3.6)
    x = list(range(len(report.layers)))
    ax.plot(x, [_val(layer.accumulated) for layer in report.layers], lw=1.2, color="#1f77b4",
            label="accumulated error: SNR dB")
    ax.plot(x, [_val(layer.local) for layer in report.layers], lw=1.0, ls="--", marker=".", color="#2ca02c",
            label="local error (isolate): SNR dB")
    snr_min = report.criteria.min_snr
    if snr_min is not None:
        ax.axhline(snr_min, color="#999", lw=0.8, ls=":", label=f"criterion {snr_min:g} dB")
    bad = [i for i, layer in enumerate(report.layers) if layer.local_fails]
    if bad:
        ax.scatter(bad, [_val(report.layers[i].local) for i in bad], s=36, color="#d62728", zorder=3,
                   label=f"local failure (first: {report.first_local})")
    ax.set_xlabel("module call (execution order)")
    ax.set_ylabel("SNR dB")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=4, fontsize=8, frameon=False)
    return figure_to_data_uri(fig)
