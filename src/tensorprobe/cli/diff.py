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
    referee: Optional[str] = typer.Option(None, "--referee", metavar="fp64|BUNDLE",
                                          help="Judge which side is closer to float64: 'fp64' runs the reference "
                                               "model (--referee-target) in float64; or a float64 bundle."),
    referee_target: Optional[str] = typer.Option(None, "--referee-target", metavar="TARGET",
                                                 help="With --referee fp64: the reference model's TARGET "
                                                      "(file.py:factory), run on its own inputs in float64."),
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
    the error reaches the output, per-call error growth. Exits 1 on a divergence; with --referee, 0 when the
    candidate is at least as close to float64 as the reference at every output (not a bug)."""
    from ..diff import diff
    from ..diff.align import load_rules, parse_rule
    from ..report.terminal import render_diff

    try:
        rule_list = [parse_rule(m) for m in map_ or []] + (load_rules(rules) if rules else [])
        with progress("comparing", enabled=not json_out) as advance:
            report = diff(ref, cand, atol=atol, rtol=rtol, min_corr=min_corr, min_snr=min_snr, rules=rule_list,
                          angles=angle or [], db=db or [], progress=lambda name: advance(1, escape(name)))
        judged = _referee(ref, cand, referee, referee_target) if referee else None
        fact = _kernel_fact(ref, cand, report)
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
    if judged is not None and judged.verdict in ("closer", "as_close") and not report.shape_mismatches:
        code = EXIT_OK   # it parts from the reference, but is as close to the exact answer: rounding, not a bug
    if json_out:
        emit_json("diff", "ok" if code == EXIT_OK else "finding", {
            "report": report.to_dict(), "referee": judged.to_dict() if judged else None, "inductor": fact,
            "html": str(html) if html else None,
            "model_explorer": {k: str(v) for k, v in overlays.items()} if overlays else None})
    else:
        render_diff(console, report, show_all=show_all)
        if fact:
            console.print(f"[bold]kernels:[/] {escape(fact)}")
        if judged is not None:
            console.print(f"[bold]float64 referee:[/] {escape(judged.summary())}")
            for note in judged.notes:
                console.print(f"  {escape(note)}")
        if html is not None:
            console.print(f"HTML report: {html}")
        if overlays:
            console.print(f"Model Explorer overlays: {', '.join(str(p) for p in overlays.values())}")
    raise typer.Exit(code)


def _referee(ref: Path, cand: Path, referee: str, target: Optional[str]):
    """The float64 referee's judgement: `fp64` captures the reference TARGET in float64 (into a temporary
    bundle, at the reference bundle's level), anything else is a float64 bundle already captured."""
    from ..bundle import Bundle
    from ..diff.referee import referee as judge
    from ..errors import InputError

    ref_b, cand_b = Bundle.open(ref), Bundle.open(cand)
    compiled = _label(cand_b, "") and not _label(ref_b, "")   # eager against its compiled self
    labels = dict(ref_label=_label(ref_b, "eager" if compiled else "reference"), cand_label=_label(cand_b, "candidate"))
    if referee != "fp64":
        return judge(ref_b, cand_b, Bundle.open(referee), **labels)
    target = target or (ref_b.manifest.get("model") or {}).get("target")
    if not target:
        raise InputError("--referee fp64 needs the reference model: --referee-target file.py:factory")
    import tempfile

    from ..referee import capture_fp64
    from ..targets import load_target

    tgt = load_target(target)
    level = (ref_b.manifest.get("capture") or {}).get("level", "module")
    tmp = tempfile.TemporaryDirectory(prefix="tensorprobe-fp64-")
    with tmp:
        fp64 = capture_fp64(tgt.model, *tgt.args, level=level, out=Path(tmp.name) / "fp64", replay_rng=ref_b,
                            **tgt.kwargs)   # the float64 run draws the reference's random tensors
        return judge(ref_b, cand_b, fp64, **labels)


def _kernel_fact(ref: Path, cand: Path, report) -> Optional[str]:
    """What Inductor did with the first divergence, when the candidate is an Inductor capture that recorded its
    kernels (`tensorprobe.inductor_kernels`)."""
    from ..bundle import Bundle
    from ..inductor_kernels import divergence_fact

    if report.verdict != "diverged" or not report.first_divergence:
        return None
    return divergence_fact(Bundle.open(ref), Bundle.open(cand), report.first_divergence)


def _label(bundle, default: str) -> str:
    """How the referee's sentence names a side: `compiled (inductor)` for a compiled capture, else `default`."""
    comp = (bundle.manifest.get("capture") or {}).get("compile")
    return f"compiled ({comp.get('backend')})" if isinstance(comp, dict) else default
