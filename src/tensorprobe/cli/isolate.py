"""`tensorprobe isolate REF_TARGET CAND_TARGET`: a thin wrapper over `tensorprobe.isolate`.

Exit codes: 0 no module call fails on its own (accumulated drift alone is reported, not a finding),
1 some module call's local error fails the criteria (an isolated one, or one found above them), 2 bad input. JSON schema: docs/json-isolate.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..errors import EXIT_FINDING, EXIT_OK, InputError, TensorprobeError
from ..isolate import INHERITED, LOCAL, IsolateReport, isolate
from ..targets import load_target
from ._common import JsonOption, app, console, emit_json, fail

_RNG_CHOICES = {"auto": True, "state": "state", "tensors": "tensors", "off": False}
_STYLE = {LOCAL: "bold red", INHERITED: "yellow", "ok": "green", "unknown": "dim"}


@app.command("isolate")
def isolate_cmd(
    ref: str = typer.Argument(..., help="Reference TARGET (path/to/file.py:factory or package.module:factory)."),
    cand: str = typer.Argument(..., help="Candidate TARGET with the same module paths (another dtype, a patched "
                                         "or rewritten module); run on REF's inputs."),
    modules: Optional[str] = typer.Option(None, "--modules", help="Regex of module paths (default: leaf modules)."),
    depth: Optional[int] = typer.Option(None, "--depth", help="Isolate the modules at this depth of the tree."),
    atol: Optional[float] = typer.Option(None, "--atol", help="Element-wise absolute tolerance."),
    rtol: Optional[float] = typer.Option(None, "--rtol", help="Element-wise relative tolerance (x |ref|)."),
    min_corr: Optional[float] = typer.Option(None, "--min-corr", help="Minimum Pearson correlation."),
    min_snr: Optional[float] = typer.Option(None, "--min-snr", help="Minimum SNR in dB. With no criterion "
                                                                    "given, differences within each module's "
                                                                    "rounding noise pass (as in diff)."),
    replay_rng: str = typer.Option("auto", "--replay-rng", help="Randomness for the candidate: auto, state "
                                                               "(generator state), tensors (recorded noise), off."),
    no_accumulated: bool = typer.Option(False, "--no-accumulated", help="Skip the candidate's own run "
                                                                        "(local error only, ~2x a forward)."),
    html: Optional[Path] = typer.Option(None, "--html", help="Also write a self-contained HTML report here."),
    show_all: bool = typer.Option(False, "--all", help="Show every layer, not only those that fail."),
    json_out: bool = JsonOption,
) -> None:
    """Is a layer wrong, or inheriting error? Runs each CAND module on REF's recorded inputs (local error)
    beside the two models' own runs (accumulated error). When no isolated module explains where the
    accumulated error starts, runs the module calls around it alone, up the tree, and names the one whose
    own code is wrong. Exits 1 when a module call fails on its own."""
    try:
        if replay_rng not in _RNG_CHOICES:
            raise InputError(f"--replay-rng must be one of {', '.join(_RNG_CHOICES)}, got {replay_rng!r}")
        r, c = load_target(ref), load_target(cand)
        report = isolate(r.model, c.model, *r.args, modules=modules, depth=depth, atol=atol, rtol=rtol,
                         min_corr=min_corr, min_snr=min_snr, accumulated=not no_accumulated,
                         replay_rng=_RNG_CHOICES[replay_rng], **r.kwargs)
        if html is not None:
            from ..isolate.html import write_isolate_html
            write_isolate_html(report, html, title=f"{ref} vs {cand}")
    except TensorprobeError as e:
        fail(str(e))
    code = EXIT_FINDING if report.found else EXIT_OK
    if json_out:
        emit_json("isolate", "finding" if report.found else "ok",
                  {"ref": ref, "cand": cand, "report": report.to_dict(), "html": str(html) if html else None})
    else:
        render_isolate(console, report, show_all=show_all)
        if html is not None:
            console.print(f"HTML report: {escape(str(html))}")
    raise typer.Exit(code)


def _snr(m: dict | None) -> str:
    if m is None:
        return "–"
    v = m.get("snr_db")
    if v is None:
        return "–"
    return "∞" if v == float("inf") else f"{v:.1f}"


def _rel(m: dict | None) -> str:
    v = None if m is None else m.get("rel_l2_err")
    return "–" if v is None else f"{v:.1e}"


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
    last = -1
    for i in rows:
        if last >= 0 and i != last + 1:
            table.add_row("…", "", "", "", "", "")
        x = report.layers[i]
        v = x.verdict
        table.add_row(escape(x.name), _snr(x.accumulated), _rel(x.accumulated),
                      _snr(x.local), _rel(x.local), f"[{_STYLE.get(v, '')}]{v}[/]")
        last = i
    if rows:
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

