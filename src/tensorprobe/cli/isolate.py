"""`tensorprobe isolate REF_TARGET CAND_TARGET`: a thin wrapper over `tensorprobe.isolate`.

Exit codes: 0 no module call fails on its own (accumulated drift alone is reported, not a finding),
1 some module call's local error fails the criteria (an isolated one, or one found above them), 2 bad input. JSON schema: docs/json-isolate.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from ..errors import EXIT_FINDING, EXIT_OK, InputError, TensorprobeError
from ._common import JsonOption, app, console, emit_json, fail

_RNG_CHOICES = {"auto": True, "state": "state", "tensors": "tensors", "off": False}


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
    model_explorer: Optional[Path] = typer.Option(None, "--model-explorer", metavar="OUT_DIR",
                                                  help="Also write Model Explorer node-data overlays (local and "
                                                       "accumulated SNR dB, findings) for the candidate's graph "
                                                       "into OUT_DIR, with the graph as OUT_DIR/candidate.pt2 "
                                                       "(see `explore`)."),
    graph: Optional[Path] = typer.Option(None, "--graph", metavar="MODEL.onnx",
                                         help="With --model-explorer: key the overlays by the nodes of this ONNX "
                                              "export of CAND instead of exporting CAND with torch.export."),
    show_all: bool = typer.Option(False, "--all", help="Show every layer, not only those that fail."),
    json_out: bool = JsonOption,
) -> None:
    """Is a layer wrong, or inheriting error? Runs each CAND module on REF's recorded inputs (local error)
    beside the two models' own runs (accumulated error). When no isolated module explains where the
    accumulated error starts, runs the module calls around it alone, up the tree, and names the one whose
    own code is wrong. Exits 1 when a module call fails on its own."""
    from ..report.isolate import render_isolate

    from ..isolate import isolate
    from ..targets import load_target

    try:
        if replay_rng not in _RNG_CHOICES:
            raise InputError(f"--replay-rng must be one of {', '.join(_RNG_CHOICES)}, got {replay_rng!r}")
        r, c = load_target(ref), load_target(cand)
        report = isolate(r.model, c.model, *r.args, modules=modules, depth=depth, atol=atol, rtol=rtol,
                         min_corr=min_corr, min_snr=min_snr, accumulated=not no_accumulated,
                         replay_rng=_RNG_CHOICES[replay_rng], **r.kwargs)
        if html is not None:
            from ..report.isolate import write_isolate_html
            write_isolate_html(report, html, title=f"{ref} vs {cand}")
        overlays = None
        if model_explorer is not None:
            from ..report.explorer import write_isolate_node_data
            overlays = write_isolate_node_data(report, model_explorer, graph=graph, model=c.model, args=r.args,
                                               kwargs=r.kwargs)
    except TensorprobeError as e:
        fail(str(e))
    code = EXIT_FINDING if report.found else EXIT_OK
    if json_out:
        emit_json("isolate", "finding" if report.found else "ok",
                  {"ref": ref, "cand": cand, "report": report.to_dict(), "html": str(html) if html else None,
                   "model_explorer": {k: str(v) for k, v in overlays.items()} if overlays else None})
    else:
        render_isolate(console, report, show_all=show_all)
        if html is not None:
            console.print(f"HTML report: {escape(str(html))}")
        if overlays:
            console.print(f"Model Explorer overlays: {escape(', '.join(str(p) for p in overlays.values()))}")
    raise typer.Exit(code)
