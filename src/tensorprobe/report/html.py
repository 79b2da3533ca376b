"""A `DiffReport` as one self-contained HTML page (no network: inline CSS/JS, plots as data URIs).

The page: verdict and summary; the module tree (`report.modules`: collapsible `<details>`, each module's
worst SNR, failing and compared records, NaN/Inf and verdict, open from the model down to the first
divergence); per-record error of the comparable pairs grouped by module (SNR and correlation, accumulated
error from the diff beside the local error of `isolate` when given; pairs that could not be compared are
counted, not drawn); error over repeated calls; the
records table (sortable, filterable); for the first divergent record, reference-vs-candidate histograms
and per-channel error. Every name from a bundle is HTML-escaped (Jinja autoescape): bundles come from
anywhere.

    >>> write_diff_html(report, "report.html")                               # doctest: +SKIP
    >>> write_diff_html(report, "report.html", local_snr={"gen.conv_post": 41.0})  # doctest: +SKIP
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..bundle import Bundle, atomic_write_bytes
from ..diff.result import DiffReport, PairResult
from .modules import ModuleNode, ModuleTree, comparable, module_groups, module_tree
from .plots import figure_to_data_uri, new_figure
from .terminal import fmt, fmt_corr

SNR_CAP = 160.0          # dB drawn for identical tensors (SNR = inf)
MAX_HIST_ELEMENTS = 1 << 22


def render_diff_html(report: DiffReport, *, local_snr: Mapping[str, float] | None = None,
                     ref: Bundle | None = None, cand: Bundle | None = None) -> str:
    """The page as a string.

    Args:
        local_snr: optional local error per record (SNR dB of the candidate's layer run on reference
            inputs, from `isolate`), drawn on the same axes as the accumulated error.
        ref, cand: the bundles (opened from the report's paths when omitted) for the divergent tensor.
    """
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("tensorprobe.report", "templates"),
                             autoescape=jinja2.select_autoescape(["html"]))
    first = report.get(report.first_divergence)
    tensor_plots = _first_divergence_plots(report, first, ref, cand) if first else {}
    tree = module_tree(report)
    drawn = [p for p in report.pairs if comparable(p)]
    return env.get_template("diff.html").render(
        r=report, d=report.to_dict(), first=first, amp=report.strongest_amplifier, out=report.get(report.output),
        tree=tree, tree_html=_tree_html(tree, report), n_drawn=len(drawn),
        n_not_drawn=sum(1 for p in report.pairs if p.kind not in ("param", "buffer") and not comparable(p)),
        layer_plot=_layer_plot(report, local_snr, drawn), calls_plot=_calls_plot(report), tensor_plots=tensor_plots,
        has_local=bool(local_snr), local=local_snr or {}, fmt=fmt, fmt_corr=fmt_corr, sortval=_sortval)


def write_diff_html(report: DiffReport, path: str | Path, **kw: Any) -> Path:
    """Write the page atomically; returns its path. Keyword arguments as `render_diff_html`."""
    atomic_write_bytes(path, render_diff_html(report, **kw).encode("utf-8"))
    return Path(path)


def _sortval(v: Any) -> str:
    """A number for the table's data-v attribute (sorting); infinities as large finite numbers."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    if isinstance(v, float) and math.isinf(v):
        return "1e308" if v > 0 else "-1e308"
    return repr(float(v))


def _snr(p: PairResult) -> float:
    v = p.metric("snr_db")
    if v is None:
        return math.nan
    return min(v, SNR_CAP) if v != -math.inf else -20.0


def _layer_plot(report: DiffReport, local_snr: Mapping[str, float] | None,
                pairs: list[PairResult] | None = None) -> str | None:
    """SNR and 1 - correlation of the comparable pairs only, grouped by module (shaded bands, labelled), in
    execution order inside each group: a pair that was not compared value by value has no SNR to draw."""
    pairs = [p for p in report.pairs if comparable(p)] if pairs is None else pairs
    if not pairs:
        return None
    groups = module_groups(pairs)
    pairs = [p for _, g in groups for p in g]
    fig, ax = new_figure(10, 3.9)
    x = np.arange(len(pairs))
    start = 0
    for i, (name, g) in enumerate(groups):
        if len(groups) > 1:
            if i % 2 == 0:
                ax.axvspan(start - 0.5, start + len(g) - 0.5, color="#000000", alpha=0.05, lw=0)
            if len(groups) <= 24 and len(g) >= len(pairs) / 60:
                ax.text(start + len(g) / 2 - 0.5, 1.0, name or "<root>", transform=ax.get_xaxis_transform(),
                        fontsize=6, rotation=30 if len(groups) > 6 else 0, ha="left" if len(groups) > 6 else "center",
                        va="bottom", color="#555555")
        start += len(g)
    snr = np.array([_snr(p) for p in pairs])
    failed = np.array([p.failed for p in pairs])
    ax.plot(x, snr, lw=0.6, color="#1f77b4", alpha=0.5)
    ax.scatter(x[~failed], snr[~failed], s=6, color="#1f77b4", label="accumulated error (diff): SNR dB, pass")
    ax.scatter(x[failed], snr[failed], s=10, color="#d62728", label="accumulated error: fail")
    if local_snr:
        loc = [min(local_snr[p.name], SNR_CAP) if p.name in local_snr else math.nan for p in pairs]
        ax.plot(x, loc, lw=1.0, ls="--", marker=".", color="#2ca02c", label="local error (isolate): SNR dB")
    if report.criteria.min_snr is not None:
        ax.axhline(report.criteria.min_snr, color="#d62728", lw=0.8, ls=":", label=f"min SNR {report.criteria.min_snr:g} dB")
    ax.set_ylabel("SNR (dB, higher is better)")
    ax.set_xlabel("comparable record, grouped by module" if len(groups) > 1 else "comparable record in execution order")
    ax.set_xlim(-0.5, len(pairs) - 0.5)
    ax2 = ax.twinx()
    corr = [p.metric("pearson") for p in pairs]
    ax2.plot(x, [max(1 - c, 1e-12) if c is not None else math.nan for c in corr], lw=0.7, color="#ff7f0e",
             alpha=0.6, label="1 − correlation (right axis)")
    ax2.set_yscale("log")
    ax2.set_ylabel("1 − correlation (log)")
    _mark(ax, pairs, report.first_divergence, "#d62728", "first divergence")
    if report.strongest_amplifier:
        _mark(ax, pairs, report.strongest_amplifier.name, "#9467bd", "strongest amplifier")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, loc="lower left", fontsize=7, framealpha=0.8)
    return figure_to_data_uri(fig)


def _tree_html(tree: ModuleTree, report: DiffReport) -> Any:
    """The module tree as nested <details> (escaped here: module and record names come from any bundle).
    Open by default: the root and every module on the way to the first divergence."""
    from markupsafe import Markup, escape

    opened = set(tree.open_path) | {""}
    amp = report.strongest_amplifier

    def figures(n: ModuleNode) -> str:
        bits = [f'<span class="badge {n.verdict.replace(" ", "_")}">{escape(n.verdict)}</span>']
        if n.worst_snr is not None:
            bits.append(f'worst SNR <b>{escape(fmt(n.worst_snr, 3))}</b> dB')
        if n.snr_bound is not None and (n.worst_snr is None or n.snr_bound < n.worst_snr):
            # a statistics capture: the worst error its statistics prove, where no tensor shows a worse one
            bits.append(f'SNR <b>≤ {escape(fmt(n.snr_bound, 3))}</b> dB by statistics')
        # failing among the records judged, value by value or by statistics (a statistics-proven divergence
        # counted against value-by-value records only read "75 of 8 failing" on a statistics capture)
        bits.append(f"{n.failed} of {n.judged} failing" if n.judged else "nothing compared")
        if n.by_stats:
            bits.append(f"{n.by_stats} by statistics only")
        if n.incomparable:
            bits.append(f"{n.incomparable} not comparable")
        if n.nonfinite:
            bits.append(f'<span class="nan">{n.nonfinite:,} NaN/Inf</span>')
        if n.first_divergence:
            bits.append('<span class="mark first">first divergence</span>')
        if n.amplifier:
            bits.append('<span class="mark amp">strongest amplifier</span>')
        return " · ".join(bits)

    def row(p: PairResult) -> str:
        cls = p.status + (" first" if p.name == report.first_divergence else "") + (
            " amp" if amp is not None and p.name == amp.name else "")
        snr = fmt(p.metric("snr_db"), 4) if comparable(p) else "not comparable" if p.status == "not_comparable" else "–"
        why = f"{p.cause}" if p.failed and p.cause else ""
        return (f'<tr class="{cls}"><td class="name"><code>{escape(p.name)}</code></td><td>{escape(p.op)}</td>'
                f'<td class="st">{escape(p.status)}</td><td class="n">{escape(snr)}</td><td>{escape(why)}</td></tr>')

    def node(n: ModuleNode) -> str:
        attrs = f' data-path="{escape(n.label)}"' + (" open" if n.path in opened else "")
        cls = "mod " + n.verdict.replace(" ", "_") + (" has-first" if n.first_divergence else "")
        own = ""
        if n.pairs:
            own = ('<table class="own"><tr><th>record</th><th>op</th><th>status</th><th>SNR dB</th><th>cause</th></tr>'
                   + "".join(row(p) for p in n.pairs) + "</table>")
        kids = "".join(node(c) for c in n.children)
        return (f'<details class="{cls}"{attrs}><summary><span class="mname">{escape(n.name if n.path else n.label)}'
                f'</span> {figures(n)}</summary><div class="kids">{kids}{own}</div></details>')

    return Markup(node(tree.root))


def _mark(ax: Any, pairs: list[PairResult], name: str | None, color: str, label: str) -> None:
    idx = next((i for i, p in enumerate(pairs) if p.name == name), None)
    if idx is not None:
        ax.axvline(idx, color=color, lw=1.0, alpha=0.7, label=label)


def _calls_plot(report: DiffReport) -> str | None:
    series = [s for s in report.call_series if "/" not in s.key] or list(report.call_series)
    series = [s for s in series if any(v for v in s.rel_err)][:6]
    if not series:
        return None
    fig, ax = new_figure(10, 2.8)
    for s in series:
        ax.plot(s.calls, [max(v, 1e-16) if v is not None else math.nan for v in s.rel_err], marker="o", ms=3,
                lw=1, label=s.key[:60])
    ax.set_yscale("log")
    ax.set_xlabel("call")
    ax.set_ylabel("relative error")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title("error over repeated calls", fontsize=10, loc="left")
    return figure_to_data_uri(fig)


def _first_divergence_plots(report: DiffReport, first: PairResult, ref: Bundle | None,
                            cand: Bundle | None) -> dict[str, str]:
    """Histograms of reference vs candidate values, and per-channel error, of the first divergence."""
    if not first.metrics:
        return {}
    try:
        ref = ref or Bundle.open(report.ref)
        cand = cand or Bundle.open(report.cand)
        r = ref.tensor(first.name).detach().double().numpy()
        c = cand.tensor(first.cand_name).detach().double().numpy().reshape(r.shape)
    except Exception:  # the page is still useful without the tensor plots
        return {}
    return {"hist": _hist_plot(r, c), **({"channels": _channel_plot(r, c)} if r.ndim >= 2 else {})}


def _hist_plot(r: np.ndarray, c: np.ndarray) -> str:
    step = max(1, r.size // MAX_HIST_ELEMENTS)
    rf, cf = r.reshape(-1)[::step], c.reshape(-1)[::step]
    rf, cf = rf[np.isfinite(rf)], cf[np.isfinite(cf)]
    fig, ax = new_figure(5, 3)
    both = np.concatenate([rf, cf]) if rf.size + cf.size else np.zeros(1)
    bins = np.linspace(float(both.min()), float(both.max()) + 1e-12, 80)
    ax.hist(rf, bins=bins, alpha=0.55, color="#1f77b4", label="reference")
    ax.hist(cf, bins=bins, alpha=0.55, color="#d62728", label="candidate")
    ax.set_yscale("log")
    ax.legend(fontsize=7)
    ax.set_title("values", fontsize=10, loc="left")
    return figure_to_data_uri(fig)


def _channel_plot(r: np.ndarray, c: np.ndarray) -> str:
    rc = np.moveaxis(r, 1, 0).reshape(r.shape[1], -1)
    cc = np.moveaxis(c, 1, 0).reshape(r.shape[1], -1)
    err = np.sqrt(np.nansum((cc - rc) ** 2, axis=1))
    ref = np.sqrt(np.nansum(rc ** 2, axis=1))
    rel = np.where(ref > 0, err / np.where(ref > 0, ref, 1), np.where(err > 0, np.inf, 0))
    fig, ax = new_figure(5, 3)
    ax.bar(np.arange(rel.size), np.clip(rel, 1e-16, 1e16), width=1.0, color="#d62728")
    ax.set_yscale("log")
    ax.set_xlabel("channel (dim 1)")
    ax.set_ylabel("relative error")
    ax.set_title("per-channel error", fontsize=10, loc="left")
    return figure_to_data_uri(fig)
