"""Core commands: capture, nan, show, demo.

Commands that read bundles (`show`, `nan BUNDLE`) never import torch; the library pieces that run a model
(capture, the live NaN search, target loading) are imported inside the commands that run one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from ..errors import EXIT_FINDING, EXIT_OK, InputError, TensorprobeError
from ._common import JsonOption, app, console, emit_json, load_input_arrays, parse_options, progress, with_options

if TYPE_CHECKING:
    from ..bundle import Bundle
    from ..nan import NanOrigin

_BUNDLE_SUFFIXES = (".npz", ".safetensors")


def _is_bundle_path(spec: str) -> bool:
    p = Path(spec)
    return (p.is_dir() and ((p / "manifest.json").exists() or (p / "records.jsonl").exists())) or (
        p.suffix in _BUNDLE_SUFFIXES and ":" not in spec)


def _names_a_bundle(spec: str) -> bool:
    """`nan SPEC` reads a bundle unless SPEC looks like a model TARGET (`file.py:factory`, a `.py` file, an
    importable `package.module`): a path that does not exist is then "no such bundle", not a TARGET's syntax."""
    if _is_bundle_path(spec) or Path(spec).exists() and not spec.endswith(".py"):
        return True
    return ":" not in spec and not spec.endswith(".py") and not _is_module(spec)


def _is_module(spec: str) -> bool:
    """An importable dotted module path (`tensorprobe.examples.kokoro`): a TARGET missing its `:factory`."""
    import importlib.util
    import re

    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+", spec):
        return False
    try:
        return importlib.util.find_spec(spec) is not None
    except (ImportError, ValueError):
        return False


def _run_forward(what: str, fn, *args, **kwargs):
    """Run a user's forward; its own exceptions become one clear line (exit 2)."""
    try:
        return fn(*args, **kwargs)
    except TensorprobeError:
        raise
    except Exception as e:
        raise InputError(f"{what}: the model's forward raised {type(e).__name__}: {e}") from None


@app.command()
def capture(
    target: str = typer.Argument(..., help="path/to/file.py:factory, package.module:factory, or an artifact (model.onnx)."),
    out: Path = typer.Option(..., "-o", "--out", help="Bundle directory to write."),
    level: str = typer.Option("module", help="module (one record per module call) or op (every aten op)."),
    keep: str = typer.Option("stats", help="stats (statistics only) or full (also the tensors)."),
    include: Optional[str] = typer.Option(None, help="Regex: keep only records whose name matches."),
    exclude: Optional[str] = typer.Option(None, help="Regex: drop records whose name matches."),
    runtime: Optional[str] = typer.Option(None, help="Capture in another runtime (e.g. onnxruntime) instead of PyTorch."),
    inputs: Optional[Path] = typer.Option(None, help=".npz of named inputs, for an artifact TARGET (model.onnx)."),
    option: list[str] = typer.Option([], "-O", "--option", metavar="KEY=VALUE",
                                     help="Runtime option, repeatable (e.g. -O exporter=legacy, -O backend=xnnpack, -O kernels=true, -O rules=map.txt)."),
    record_inputs: bool = typer.Option(False, "--record-inputs", help="Also record each module call's inputs."),
    replay_rng: Optional[Path] = typer.Option(None, "--replay-rng", metavar="BUNDLE",
                                              help="Feed random ops the tensors recorded in BUNDLE (or a noise .safetensors), in call order."),
    compile_: bool = typer.Option(False, "--compile", help="Capture the model as torch.compile runs it (statistics "
                                  "computed inside the compiled graph, eager record names; graph breaks reported)."),
    backend: str = typer.Option("inductor", "--backend", help="With --compile: the torch.compile backend "
                                "(inductor, aot_eager, eager, any registered one; op level: aot_eager, inductor)."),
    mode: Optional[str] = typer.Option(None, "--mode", help="With --compile --backend inductor: default, "
                                       "reduce-overhead, max-autotune, max-autotune-no-cudagraphs."),
    json_out: bool = JsonOption,
) -> None:
    """Capture every intermediate tensor of TARGET into a bundle directory."""
    from ..capture import capture as capture_model
    from ..capture import check_output_dir
    from ..targets import load_target

    t0 = time.perf_counter()
    options = parse_options(option)
    check_output_dir(out)      # a bad -o is named before anything loads or runs
    from ..bundle.lock import release_reservation, reserve

    # the directory is this capture's from now on, not from when its writer opens after a load or export
    # that can take minutes: a second capture started meanwhile is refused instead of being replaced
    reserve(out)
    try:
        from ..runtimes import runtime_for_artifact

        artifact_runtime = runtime_for_artifact(target) if ":" not in target else None
        if artifact_runtime is not None:
            bundle = _capture_artifact(target, out, runtime or artifact_runtime, inputs, keep, include, exclude,
                                       options)
        else:
            tgt = load_target(target)
            if (backend != "inductor" or mode) and not compile_:
                raise InputError("--backend and --mode are torch.compile settings: add --compile")
            if compile_ and runtime and runtime not in ("pytorch", "torch"):
                raise InputError("--compile captures PyTorch's compiled model; it does not combine with --runtime")
            compile_options = {"compile": True, "backend": backend, "mode": mode} if compile_ else {}
            if runtime and runtime not in ("pytorch", "torch"):
                from ..runtimes import get_runtime

                adapter = get_runtime(runtime)
                bundle = _run_forward(target, with_options(adapter.capture, runtime), tgt.model, tgt.args, out,
                                      keep=keep, include=include, exclude=exclude, **options)
            else:
                with progress(f"capturing {target}", enabled=not json_out) as advance:
                    try:
                        bundle = _run_forward(target, capture_model, tgt.model, *tgt.args, level=level, keep=keep,
                                              include=include, exclude=exclude, out=out, record_inputs=record_inputs,
                                              replay_rng=str(replay_rng) if replay_rng else None,
                                              on_record=lambda r: advance(), **compile_options, **tgt.kwargs)
                    except InputError as e:
                        if (out / "manifest.json").exists() and "forward raised" in str(e):
                            raise InputError(f"{e} — the records made before the failure are in {out} "
                                             f"(marked incomplete): tensorprobe show {out}") from None
                        raise
    finally:
        release_reservation(out)
    _report_capture(bundle, time.perf_counter() - t0, json_out)


def _capture_artifact(target: str, out: Path, runtime: str, inputs: Optional[Path], keep: str,
                      include: Optional[str], exclude: Optional[str], options: dict) -> Bundle:
    from ..runtimes import get_runtime

    if inputs is None:
        raise InputError(f"{target}: an artifact needs --inputs inputs.npz (arrays named as the graph's inputs)")
    named = load_input_arrays(inputs)
    adapter = get_runtime(runtime)
    return with_options(adapter.capture_artifact, runtime)(target, named, out, keep=keep, include=include,
                                                           exclude=exclude, **options)


def _report_capture(bundle: Bundle, seconds: float, json_out: bool) -> None:
    from ..nan import find_nonfinite_in_bundle

    nonfinite = [r for r in bundle if not r.stats.all_finite]
    stored = sum(1 for r in bundle if r.has_tensor)
    # ±Inf a constant writes on purpose (a mask), consumed before any output, is no warning: `nan` tells
    origin = find_nonfinite_in_bundle(bundle) if nonfinite else None
    masks = origin.masks if origin is not None else ()
    if json_out:
        emit_json("capture", "ok", {"bundle": str(bundle.path), "records": len(bundle), "stored_tensors": stored,
                                    "nonfinite_records": len(nonfinite), "nan_finding": bool(origin and origin.found),
                                    "masks": [m.to_dict() for m in masks], "seconds": round(seconds, 3),
                                    "complete": bundle.complete, "warnings": list(bundle.manifest.get("warnings") or [])})
        return
    console.print(f"wrote [bold]{escape(str(bundle.path))}[/]: {len(bundle)} records ({stored} with tensors) "
                  f"in {seconds:.2f}s")
    for w in bundle.manifest.get("warnings") or ():   # draws module level could not see, replays refused
        console.print(f"[yellow]warning:[/] {escape(str(w))}")
    if origin is not None and masks and not origin.found:
        console.print(f"info: {len(nonfinite)} record{'s hold' if len(nonfinite) > 1 else ' holds'} ±Inf written on purpose "
                      f"(masks: {escape(', '.join(m.record for m in masks[:4]))}), consumed before any output")
    elif nonfinite:
        masked = {m.record for m in masks} | {n for m in masks for n in m.carried_by}
        first = next((r for r in nonfinite if r.name not in masked), nonfinite[0])
        console.print(f"[red]{len(nonfinite)} records hold NaN/Inf; first: {escape(first.name)}[/] "
                      f"(run `tensorprobe nan {escape(str(bundle.path))}` for the origin)")


@app.command()
def nan(
    target: str = typer.Argument(..., help="TARGET (file.py:factory, package.module:factory) or a bundle (dir, .npz, .safetensors)."),
    backward: bool = typer.Option(False, "--backward", help="TARGET is a training step, (model, inputs, loss_fn): "
                                  "find the backward op whose gradient is born non-finite."),
    stop_at_origin: bool = typer.Option(False, "--stop-at-origin", help="With --backward: end the backward at the "
                                        "origin (as fast as detect_anomaly); parameters are then those the gradient "
                                        "flows to, masking after it unchecked."),
    model_explorer: Optional[Path] = typer.Option(None, "--model-explorer", metavar="OUT_DIR",
                                                  help="With a bundle: also write a Model Explorer node-data overlay "
                                                       "(where NaN/Inf is born, its channels, where it spreads)."),
    graph: Optional[Path] = typer.Option(None, "--graph", metavar="MODEL.onnx",
                                         help="The ONNX file the bundle ran, to key the overlay by node name."),
    json_out: bool = JsonOption,
) -> None:
    """Find the op where NaN or Inf is born (exit 1 if found); with --backward, in a training step's gradients."""
    from ..bundle import Bundle
    from ..nan import find_nonfinite_in_bundle

    if backward:
        from ..nan.backward import find_first_nonfinite_backward
        from ..targets import load_training_step

        if _is_bundle_path(target):
            raise InputError("--backward needs a training-step TARGET (file.py:factory returning (model, inputs, "
                             "loss_fn)), not a bundle")
        step = load_training_step(target)
        with progress(f"checking every backward op of {target}", enabled=not json_out):
            origin = _run_forward(target, find_first_nonfinite_backward, step.model, step.args, step.loss_fn,
                                  full=not stop_at_origin)
    elif _names_a_bundle(target):
        if not Path(target).exists() and not Path(target).suffix:
            # a bare name could have meant either: say what both look like
            raise InputError(f"{target}: no such bundle (expected a directory with manifest.json, a .safetensors or "
                             "a .npz file), and not a model TARGET, which must look like file.py:factory or "
                             "package.module:factory")
        bundle = Bundle.open(target)
        origin = find_nonfinite_in_bundle(bundle)
        if model_explorer is not None:
            from ..report.explorer import nan_node_data, write_node_data
            written = write_node_data(nan_node_data(origin, bundle, graph=graph), model_explorer)
            if not json_out:
                console.print(f"Model Explorer overlay: {written['nan']}")
    else:
        if model_explorer is not None:
            raise InputError("--model-explorer needs a bundle (a capture of the graph the runtime ran), not a model "
                             "TARGET")
        from ..nan.live import find_first_nonfinite
        from ..targets import load_target

        tgt = load_target(target)
        with progress(f"checking every op of {target}", enabled=not json_out):
            origin = _run_forward(target, find_first_nonfinite, tgt.model, *tgt.args, **tgt.kwargs)
    _report_nan(origin, json_out)


def _report_nan(origin: NanOrigin, json_out: bool) -> None:
    from ..report.core import render_nan_origin

    # a bundle cut short is not a clean run: what it lacks was never checked
    status = "finding" if origin.found else "incomplete" if origin.incomplete else "ok"
    if json_out:
        emit_json("nan", status, {"origin": origin.to_dict()})
    else:
        render_nan_origin(console, origin)
    raise typer.Exit(EXIT_OK if status == "ok" else EXIT_FINDING)


@app.command()
def show(
    bundle_path: Path = typer.Argument(..., metavar="BUNDLE", help="Bundle directory, .npz or .safetensors."),
    name: Optional[str] = typer.Option(None, "--filter", "-f", help="Regex on record names."),
    nonfinite: bool = typer.Option(False, "--nonfinite", help="Only records holding NaN/Inf."),
    limit: int = typer.Option(60, help="Rows to print (0 = all)."),
    json_out: bool = JsonOption,
) -> None:
    """Print a bundle's records and statistics as a table."""
    from ..bundle import Bundle
    from ..report.core import render_bundle, select_records

    b = Bundle.open(bundle_path)
    try:
        chosen = list(select_records(b, name, nonfinite))
    except Exception as e:  # re.error from a bad --filter
        raise InputError(f"invalid --filter regex {name!r}: {e}") from None
    if json_out:
        emit_json("show", "ok", {"bundle": str(b.path), "manifest": {k: v for k, v in b.manifest.items() if k != "records"},
                                 "records": [r.to_dict() for r in chosen]})
        return
    render_bundle(console, b, chosen[:limit] if limit else chosen, len(chosen))


@app.command()
def demo(
    seconds: float = typer.Option(3.0, help="Length of the decoder input, in seconds of 24 kHz audio."),
    json_out: bool = JsonOption,
) -> None:
    """Find where NaN is born in a faulty Kokoro-82M decoder (random weights, nothing downloaded)."""
    from ..report.core import render_nan_origin

    from ..examples import kokoro
    from ..nan.live import find_first_nonfinite

    if not json_out:
        console.rule("[bold]tensorprobe demo[/]: Kokoro-82M decoder (kokoro.istftnet, seeded random weights)")
        console.print(escape("The faulty variant lowers InstanceNorm1d the way a broken backend does (seed 000: "
                             "TVM and ExecuTorch): variance = E[x²] − E[x]², accumulated in float16.\n"))
    ref_model, inputs = kokoro.decoder(seconds)
    ref = find_first_nonfinite(ref_model, *inputs)
    model, inputs = kokoro.faulty_decoder(seconds)
    t0 = time.perf_counter()
    origin = find_first_nonfinite(model, *inputs)
    dt = time.perf_counter() - t0
    if json_out:
        emit_json("demo", "finding" if origin.found else "ok", {"reference": ref.to_dict(), "origin": origin.to_dict(),
                                                                  "seconds": round(dt, 3)})
        return
    console.print(f"reference decoder: [green]{escape(ref.headline())}[/]")
    console.print(f"faulty decoder ({dt:.2f}s):")
    render_nan_origin(console, origin)
    console.print("\nNext: [bold]tensorprobe capture tensorprobe.examples.kokoro:faulty_decoder -o faulty --level op[/] "
                  "then [bold]tensorprobe show faulty --nonfinite[/].")
