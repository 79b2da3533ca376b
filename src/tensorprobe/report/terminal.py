"""Terminal rendering of a `DiffReport` (rich): the summary, the records that matter, amplifiers, calls.

    >>> from rich.console import Console
    >>> render_diff(Console(), report)          # doctest: +SKIP
"""

from __future__ import annotations

import math

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..numbers import fmt_number
from ..diff.result import (METHOD_DIGEST, METHOD_EXACT, METHOD_STATS, STATUS_FAIL, STATUS_NOT_COMPARABLE,
                           STATUS_NOT_PROVEN, STATUS_PASS, STATUS_SHAPE, DiffReport, PairResult)

_STATUS_STYLE = {STATUS_PASS: "green", STATUS_FAIL: "red", STATUS_SHAPE: "magenta", STATUS_NOT_COMPARABLE: "yellow",
                 STATUS_NOT_PROVEN: "dim green"}


fmt = fmt_number   # one rule for printing numbers (tensorprobe.numbers)


def fmt_corr(v: float | None) -> str:
    """Correlations near 1 need their nines: 0.99999712."""
    if v is None:
        return "–"
    return f"{v:.8f}" if v > 0.99 else f"{v:.4f}"


def render_diff(console: Console, report: DiffReport, *, limit: int = 40, show_all: bool = False) -> None:
    """Print the verdict and summary, then a table of the notable records (all with `show_all`)."""
    style = {"match": "bold green", "diverged": "bold red"}.get(report.verdict, "bold yellow")
    console.print(f"[{style}]{report.verdict.upper().replace('_', ' ')}[/]  {escape(report.summary)}", highlight=False)
    if report.weights_differ:
        console.print(_weights_table(report))
    rows = _rows(report, limit, show_all)
    if rows:
        console.print(_pairs_table(report, rows))
        hidden = len(report.pairs) - len(rows)
        if hidden > 0:
            console.print(f"[dim]{hidden} more records not shown (all pass or are not notable); "
                          "--all shows every record, --json or --html everything[/]")
    _print_floors(console, report)
    if report.amplifiers:
        console.print(_amplifier_table(report))
    _print_calls(console, report)
    _print_unmatched(console, report)
    for p in report.not_comparable[:5]:
        console.print(f"[yellow]not comparable[/] {escape(p.name)} ({p.dtype}) ← {escape(p.cand_name)} ({p.cand_dtype}): "
                      f"{escape('; '.join(p.reasons))}", highlight=False)
    for note in list(report.environment_notes) + list(report.notes):
        console.print(f"[yellow]note:[/] {escape(note)}", highlight=False)


def _rows(report: DiffReport, limit: int, show_all: bool) -> list[PairResult]:
    if show_all or len(report.pairs) <= limit:
        return list(report.pairs)
    notable = ({report.first_divergence, report.worst, report.output, report.first_difference}
               | {a.name for a in report.amplifiers[:3]} | set(report.outputs))
    keep = [p for p in report.pairs if p.name in notable]
    failing = [p for p in report.pairs if p.failed and p.name not in notable]
    keep += failing[: max(0, limit - len(keep))]
    return sorted(keep, key=lambda p: p.order)


def _marks(report: DiffReport, p: PairResult) -> str:
    m = []
    if p.name == report.first_divergence:
        m.append("first")
    if report.amplifiers and p.name == report.amplifiers[0].name:
        m.append("amplifier")
    if p.name == report.worst:
        m.append("worst")
    if p.name == report.output:
        m.append("output")
    if p.angle is not None and p.angle.flips:
        m.append(f"{p.angle.flips} 2π flips")
    return ", ".join(m)


def _pairs_table(report: DiffReport, rows: list[PairResult]) -> Table:
    t = Table(show_edge=False, pad_edge=False, title="records (execution order)", title_justify="left")
    t.add_column("record  [dim]op[/]", min_width=20, overflow="fold", ratio=1)
    for col in ("status", "SNR dB", "correlation", "max abs", "rel err", "floor", "gain", "cause"):
        t.add_column(col, no_wrap=True, justify="left" if col in ("status", "cause") else "right")
    for p in rows:
        st = _STATUS_STYLE.get(p.status, "yellow")
        cell = escape(p.name) + (f" [dim]← {escape(p.cand_name)}[/]" if p.cand_name != p.name else "")
        cell += f"  [dim]{escape(_short(p.op))}[/]"
        marks = _marks(report, p)
        cell += f"  [bold yellow]◀ {escape(marks)}[/]" if marks else ""
        t.add_row(cell, f"[{st}]{p.status.replace('_', ' ')}[/]", snr_cell(p), fmt_corr(p.metric("pearson")),
                  _max_abs_cell(p), _rel_cell(p), fmt(p.floor, 2) if report.criteria.noise else "–",
                  fmt(p.gain, 3), p.cause or "")
    return t


def _rel_cell(p: PairResult) -> str:
    """Relative L2 error, or for a pair compared by statistics its proven lower bound ('≥0.01')."""
    if p.method == METHOD_STATS:
        lo = p.metric("rel_l2_err_lower")
        return f"≥{fmt(lo, 2)}" if lo else "–"
    return fmt(p.rel_err, 2)


def _print_floors(console: Console, report: DiffReport) -> None:
    """Why the floor is what it is, for the records a reader looks at: the outputs and the first divergence."""
    if not report.criteria.noise:
        return
    names = list(dict.fromkeys([n for n in (report.first_divergence, *report.outputs) if n]))
    for p in (report.get(n) for n in names):
        if p is not None and p.floor_reason and p.method not in (None, METHOD_EXACT, METHOD_DIGEST):
            console.print(f"[dim]floor[/] {escape(p.name)} {fmt(p.floor, 2)}: {escape(p.floor_reason)}", highlight=False)


def snr_cell(p: PairResult) -> str:
    """The SNR, or for a pair compared by statistics the proven upper bound ('≤40.0'), 'exact' for integers."""
    if p.metric("nonfinite_cand_only") or p.metric("nonfinite_ref_only"):
        return "[red]-inf[/]"
    if p.method == METHOD_STATS:
        lo = p.metric("rel_l2_err_lower")
        if lo == math.inf:
            return "[red]-inf[/]"
        return f"≤{-20 * math.log10(lo):.1f}" if lo else "[dim]stats[/]"
    if p.method == METHOD_EXACT:
        n = p.metric("mismatches")
        return "exact" if not n else f"{int(n):,} differ"
    if p.method == METHOD_DIGEST:
        return "identical"
    return fmt(p.metric("snr_db"), 3)


def _max_abs_cell(p: PairResult) -> str:
    if p.method == METHOD_STATS:
        lo = p.metric("max_abs_err_lower")
        return f"≥{lo:.3g}" if lo else "–"
    return fmt(p.metric("max_abs_err"), 3)


def _weights_table(report: DiffReport) -> Table:
    t = Table(show_edge=False, pad_edge=False, title="weights that differ", title_justify="left")
    for col in ("weight", "shape", "dtypes", "how compared", "relative error", "why"):
        t.add_column(col, overflow="fold")
    for p in report.weights_differ[:10]:
        rel = p.rel_err if p.rel_err is not None else p.metric("rel_l2_err_lower")
        rel_s = ("≥" if p.rel_err is None and rel is not None else "") + fmt(rel, 3)
        t.add_row(escape(p.name), "×".join(map(str, p.shape)), f"{p.dtype} / {p.cand_dtype}", p.method or "–", rel_s,
                  escape("; ".join(p.reasons)))
    return t


def _short(op: str) -> str:
    return op.removeprefix("aten.").removesuffix(".default")


def _amplifier_table(report: DiffReport) -> Table:
    t = Table(show_edge=False, pad_edge=False, title="strongest error amplifiers", title_justify="left")
    for col in ("record", "op", "gain", "input rel err", "output rel err"):
        t.add_column(col)
    for a in report.amplifiers[:5]:
        t.add_row(escape(a.name), escape(_short(a.op)), fmt(a.gain, 4), fmt(a.input_rel_err, 3),
                  fmt(a.output_rel_err, 3))
    return t


def _print_calls(console: Console, report: DiffReport) -> None:
    series = [s for s in report.call_series if "/" not in s.key] or list(report.call_series)
    series = [s for s in series if s.first_failing_call is not None or any(v is not None for v in s.snr_db)]
    for s in series[:5]:
        snrs = " ".join(fmt(v, 3) for v in s.snr_db)
        enter = f"error enters at call {s.first_failing_call}" if s.first_failing_call is not None else "all calls pass"
        console.print(f"[bold]calls[/] {escape(s.key)} ×{len(s.calls)}: {enter}; SNR dB per call: {snrs}",
                      highlight=False)


def _print_unmatched(console: Console, report: DiffReport, n: int = 8) -> None:
    for label, names in (("reference only", report.ref_only), ("candidate only", report.cand_only),
                         ("shape mismatch", report.shape_mismatches)):
        if names:
            more = f" … (+{len(names) - n})" if len(names) > n else ""
            console.print(f"[magenta]{label}[/] ({len(names)}): {escape(', '.join(names[:n]))}{more}",
                          highlight=False)
