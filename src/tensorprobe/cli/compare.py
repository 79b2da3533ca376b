"""`tensorprobe compare TARGET --runtime X`: PyTorch reference, capture in X, diff, first NaN, in one command.

Exit codes: 0 the runtime matches PyTorch, 1 a divergence or a NaN born in the runtime only, 2 bad input.
JSON schema: docs/json-compare.md.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from ..errors import EXIT_FINDING, EXIT_OK, TensorprobeError
from ..numbers import fmt_number
from ._common import JsonOption, app, console, emit_json, fail, parse_options, progress, with_options


@app.command("compare")
def compare_cmd(
    target: str = typer.Argument(..., help="path/to/file.py:factory or package.module:factory returning (model, inputs)."),
    runtime: str = typer.Option("onnxruntime", "--runtime", "-r", help="Runtime to compare with PyTorch."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Keep both bundles here (OUT/ref, OUT/<runtime>)."),
    artifact: Optional[Path] = typer.Option(None, "--artifact", help="Run this exported artifact (model.onnx) "
                                            "instead of exporting TARGET's model."),
    exporter: Optional[str] = typer.Option(None, "--exporter", help="ONNX exporter: dynamo (default) or legacy."),
    rules: Optional[Path] = typer.Option(None, "--rules", help="Runtime mapping rules (REGEX -> MODULE per line)."),
    option: list[str] = typer.Option([], "-O", "--option", metavar="KEY=VALUE",
                                     help="Runtime option, repeatable, as for `capture -O` "
                                          "(e.g. -O random=zeros, -O backend=xnnpack, -O kernels=true)."),
    min_snr: Optional[float] = typer.Option(None, "--min-snr", help="Minimum SNR in dB (default 60)."),
    min_corr: Optional[float] = typer.Option(None, "--min-corr", help="Minimum Pearson correlation."),
    replay_rng: bool = typer.Option(False, "--replay-rng", help="Run RUNTIME first and give the PyTorch reference "
                                    "its random draws, so a model with noise compares value by value."),
    referee: Optional[str] = typer.Option(None, "--referee", metavar="fp64",
                                          help="Also run the model in float64 and say which side is closer to it "
                                               "(a runtime at least as close as PyTorch at every output: exit 0)."),
    bisect: bool = typer.Option(False, "--bisect", help="With --runtime inductor/aot_eager, on a divergence: "
                                "recompile stage by stage (PyTorch's compiler bisector) and name the stage, "
                                "decomposition, lowering or setting it comes from."),
    json_out: bool = JsonOption,
) -> None:
    """Run TARGET in PyTorch and in RUNTIME; report the first divergence and the first NaN. Exits 1 on a finding."""
    from ..compare import compare
    from ..targets import load_target

    from ..bundle.lock import release_reservation, reserve

    # OUT's two bundles are this run's from now on, not from when their writers open after the export (as
    # `capture` does): a second compare into OUT started meanwhile is refused instead of mixing bundles
    reserved: list[Path] = []
    made_out = out is not None and not out.exists()
    try:
        opts = parse_options(option)
        opts.update({k: v for k, v in {"exporter": exporter, "rules": str(rules) if rules else None}.items() if v})
        if out is not None:
            from ..capture import check_output_dir

            for d in (out / "ref", out / runtime):
                check_output_dir(d)
                reserve(d)
                reserved.append(d)
        tgt = load_target(target)
        if tgt.kwargs:
            fail(f"TARGET {target!r} returns keyword inputs; compare needs positional inputs")
        with progress(f"comparing {target} in {runtime}", enabled=not json_out) as advance:
            res = with_options(compare, runtime)(tgt.model, tgt.args, runtime, out=out, min_snr=min_snr, min_corr=min_corr,
                          artifact=artifact, runtime_options=opts, replay_rng=replay_rng, referee=referee,
                          bisect=bisect,
                          progress=lambda text: advance(1, escape(text)))
    except TensorprobeError as e:
        fail(str(e))
    finally:
        for d in reserved:
            release_reservation(d)
        if made_out and out.is_dir() and not any(out.iterdir()):
            out.rmdir()     # a run that failed before writing leaves no OUT behind
    code = EXIT_FINDING if res.finding else EXIT_OK
    if json_out:
        emit_json("compare", "finding" if res.finding else "ok", {"compare": res.to_dict()})
    else:
        _render(res)
    raise typer.Exit(code)


def _render(res) -> None:
    from ..nan import CAUSE_MODEL_INPUT

    style = "red" if res.finding else "green"
    console.print(f"[bold {style}]{escape(res.summary)}[/]")
    info = res.runtime_info
    console.print(f"runtime: {escape(str(info.get('name')))} {escape(str(info.get('version')))}"
                  + (f", exporter {escape(str(info['exporter']))}" if info.get("exporter") else ""))
    nan = res.cand_nan
    if nan.found:
        if nan.cause == CAUSE_MODEL_INPUT:
            console.print(f"model input {escape(str(nan.record))} holds ±Inf, as given")
        else:
            console.print(f"first non-finite value in {escape(res.runtime)}: {escape(str(nan.record))}"
                          + (f" ({escape(str(nan.op))})" if nan.op else ""))
    for p in _worst_pairs(res.diff.pairs):
        console.print(f"  SNR {_fmt(p.metrics.get('snr_db'))} dB  corr {_fmt(p.metrics.get('pearson'), 6)}  "
                      f"{escape(p.name)}{escape(_nonfinite(p.metrics))}")
    if res.referee is not None:
        console.print(f"[bold]float64 referee:[/] {escape(res.referee.summary())}")
        for note in res.referee.notes:
            console.print(f"  {escape(note)}")
    if res.bisect is not None:
        console.print(f"[bold]bisect:[/] {escape(res.bisect.summary())}")
    for note in res.notes:
        console.print(f"[dim]note: {escape(note)}[/]")
    if res.ref_bundle and Path(res.ref_bundle).exists():
        console.print(f"bundles: {escape(res.ref_bundle)}  {escape(res.cand_bundle)} "
                      f"(`tensorprobe diff` them for the full table)")


def _worst_pairs(pairs, n: int = 5) -> list:
    """The pairs with the lowest SNR; a pair whose elements are non-finite on one side only has SNR -inf."""
    scored = [p for p in pairs if isinstance(p.metrics.get("snr_db"), float) and not math.isnan(p.metrics["snr_db"])]
    return sorted(scored, key=lambda p: p.metrics["snr_db"])[:n]


def _nonfinite(metrics) -> str:
    parts = [f"non-finite on the {side} side: {int(metrics[key])} elements"
             for side, key in (("candidate", "nonfinite_cand_only"), ("reference", "nonfinite_ref_only"))
             if metrics.get(key)]
    return f"  ({'; '.join(parts)})" if parts else ""


def _fmt(v, digits: int = 1) -> str:
    if not isinstance(v, float):
        return "-"
    return f"{v:.{digits}f}" if math.isfinite(v) else fmt_number(v)
