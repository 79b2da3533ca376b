"""`tensorprobe diff REF CAND`: a thin wrapper over `tensorprobe.diff`.

Exit codes: 0 match (or "consistent": nothing compared value by value and the statistics prove no
difference, which the first line says), 1 a divergence (or a shape mismatch, or nothing compared at all),
2 bad input (missing or corrupt bundle, bad rule or regex).
JSON schema: docs/json-diff.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from ..errors import EXIT_FINDING, EXIT_OK, TensorprobeError
from ._common import JsonOption, app, console, emit_json, fail, progress


@app.command("diff")
def diff_cmd(
    ref: Path = typer.Argument(..., help="Reference bundle (directory, .safetensors or .npz)."),
    cand: Path = typer.Argument(..., help="Candidate bundle (the port, another dtype or runtime)."),
    atol: Optional[float] = typer.Option(None, "--atol", help="Element-wise absolute tolerance."),
    rtol: Optional[float] = typer.Option(None, "--rtol", help="Element-wise relative tolerance (x |ref|)."),
    min_corr: Optional[float] = typer.Option(None, "--min-corr", help="Minimum Pearson correlation."),
    min_snr: Optional[float] = typer.Option(None, "--min-snr",
                                            help="Minimum SNR in dB (default 60 when no criterion is given)."),
    map_: Optional[List[str]] = typer.Option(None, "--map", metavar="REGEX=REPL",
                                             help="Rename candidate records into reference names (repeatable)."),
    rules: Optional[Path] = typer.Option(None, "--rules", help="File of REGEX=REPL mapping rules, one per line."),
    angle: Optional[List[str]] = typer.Option(None, "--angle", metavar="REGEX",
                                              help="Compare matching records modulo 2π (atan2 outputs are automatic)."),
    db: Optional[List[str]] = typer.Option(None, "--db", metavar="REGEX[=SCALE]",
                                           help="Also report dB error for spectrogram records; SCALE: mag, power, ln, db."),
    html: Optional[Path] = typer.Option(None, "--html", help="Also write a self-contained HTML report here."),
    local: Optional[Path] = typer.Option(None, "--local", metavar="ISOLATE_JSON",
                                         help="Plot local error from `tensorprobe isolate --json` beside the accumulated error (HTML)."),
    model_explorer: Optional[Path] = typer.Option(None, "--model-explorer", metavar="OUT_DIR",
                                                  help="Also write Model Explorer node-data overlays (SNR dB, findings, "
                                                       "NaN) for the candidate's graph into OUT_DIR (see `explore`)."),
    graph: Optional[Path] = typer.Option(None, "--graph", metavar="MODEL.onnx",
                                         help="The ONNX file the candidate ran, to key overlays by node name "
                                              "(default: the file its manifest names, when it still exists)."),
    show_all: bool = typer.Option(False, "--all", help="Show every record in the table."),
    json_out: bool = JsonOption,
) -> None:
    """Compare every intermediate of CAND with REF: first divergence, strongest error amplifier, whether
    the error reaches the output, per-call error growth. Exits 1 on a divergence."""
    from ..diff import diff
    from ..diff.align import load_rules, parse_rule
    from ..report.terminal import render_diff

    try:
        rule_list = [parse_rule(m) for m in map_ or []] + (load_rules(rules) if rules else [])
        with progress("comparing", enabled=not json_out) as advance:
            report = diff(ref, cand, atol=atol, rtol=rtol, min_corr=min_corr, min_snr=min_snr, rules=rule_list,
                          angles=angle or [], db=db or [], progress=lambda name: advance(1, escape(name)))
        if html is not None:
            from ..isolate import local_snr_from_json
            from ..report.html import write_diff_html
            write_diff_html(report, html, local_snr=local_snr_from_json(local) if local else None)
        overlays = None
        if model_explorer is not None:
            from ..report.explorer import write_diff_node_data
            overlays = write_diff_node_data(report, model_explorer, graph=graph)
    except TensorprobeError as e:
        fail(str(e))
    code = EXIT_OK if report.verdict in ("match", "consistent") else EXIT_FINDING
    if json_out:
        emit_json("diff", "ok" if code == EXIT_OK else "finding", {
            "report": report.to_dict(), "html": str(html) if html else None,
            "model_explorer": {k: str(v) for k, v in overlays.items()} if overlays else None})
    else:
        render_diff(console, report, show_all=show_all)
        if html is not None:
            console.print(f"HTML report: {html}")
        if overlays:
            console.print(f"Model Explorer overlays: {', '.join(str(p) for p in overlays.values())}")
    raise typer.Exit(code)
