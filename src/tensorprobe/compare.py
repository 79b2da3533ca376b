"""`compare`: run a model in PyTorch and in another runtime, and say where the runtime goes wrong.

One call does the whole everyday job of a port: a module-level PyTorch capture (keep="full") as the
reference, a capture in the runtime (every intermediate, named by PyTorch module path), a diff of the
two, and the first non-finite value on each side.

    >>> import tensorprobe as tp
    >>> res = tp.compare(model, inputs, runtime="onnxruntime", out="cmp")       # doctest: +SKIP
    >>> print(res.summary)                                                      # doctest: +SKIP
    onnxruntime diverges from PyTorch at generator.conv_post (SNR 12.0 dB); 279 records compared.
    >>> res.first_divergence                                                    # doctest: +SKIP
    'generator.conv_post'
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .bundle import Bundle
from .diff.views import module_view
from .errors import InputError
from .nan import CAUSE_MODEL_INPUT, NanOrigin, find_nonfinite_in_bundle
from .record import KIND_OUTPUT, KIND_RNG, TAG_DRAWS_RANDOM, TAG_QUANTIZED, TAG_REPLAYED, parse_name
from .rng.draws import Draw, draw_of
from .rng.replay import RngReplay
from .runtimes.base import workdir


@dataclass(frozen=True)
class CompareResult:
    """What `compare` found (JSON schema: docs/json-compare.md)."""

    runtime: str
    runtime_info: dict[str, Any]
    ref_bundle: str
    cand_bundle: str
    compared: int                      # reference records paired with a runtime record
    first_divergence: str | None       # first reference record (execution order) whose pair fails
    ref_nan: NanOrigin
    cand_nan: NanOrigin                # op-level: the first runtime node whose output is non-finite
    cand_nan_escapes: bool             # ... and it reaches a module-level record (not masked inside the graph)
    diff: Any                          # tensorprobe.diff.DiffReport
    summary: str
    notes: tuple[str, ...] = field(default_factory=tuple)
    output: dict[str, Any] | None = None   # the model output's non-finite elements per side (OutputPair.to_dict)
    replayed: tuple[str, ...] = ()         # the runtime's draws the reference took (replay_rng)
    referee: Any = None                    # tensorprobe.diff.referee.RefereeReport, with referee="fp64"
    bisect: Any = None                     # tensorprobe.compile_bisect.CompileBisect, with bisect=True

    @property
    def finding(self) -> bool:
        """True when the runtime diverges from PyTorch or produces a non-finite value PyTorch does not. A
        divergence is no finding when the float64 referee finds the runtime at least as close to float64 as
        PyTorch at every output: the two round differently, and neither is wrong."""
        rounding = self.referee is not None and self.referee.verdict in ("closer", "as_close")
        return ((self.diff.verdict == "diverged" and not rounding)
                or (self.cand_nan_escapes and not self.ref_nan.found)
                or bool(self.output and self.output["candidate_only"]))

    def to_dict(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime, "runtime_info": self.runtime_info, "ref_bundle": self.ref_bundle,
            "cand_bundle": self.cand_bundle, "compared": self.compared, "first_divergence": self.first_divergence,
            "finding": self.finding, "summary": self.summary, "notes": list(self.notes),
            "output": self.output, "replayed": list(self.replayed),
            "ref_nan": self.ref_nan.to_dict(), "cand_nan": self.cand_nan.to_dict(),
            "cand_nan_escapes": self.cand_nan_escapes, "diff": self.diff.to_dict(),
            "referee": self.referee.to_dict() if self.referee is not None else None,
            "bisect": self.bisect.to_dict() if self.bisect is not None else None,
        }


def compare(model: torch.nn.Module, inputs: Sequence[Any], runtime: str = "onnxruntime", *,
            out: str | os.PathLike | None = None, min_snr: float | None = None, min_corr: float | None = None,
            atol: float | None = None, rtol: float | None = None, rules: Any = None,
            artifact: str | os.PathLike | None = None, runtime_options: dict[str, Any] | None = None,
            progress: Callable[[str], None] | None = None, prepared: Any = None,
            replay_rng: bool = False, referee: str | None = None, bisect: bool = False) -> CompareResult:
    """Capture `model` in PyTorch and in `runtime`, diff them, find the first NaN on each side.

    Args:
        model, inputs: the PyTorch model and its positional inputs.
        runtime: a registered runtime name (`tensorprobe.runtimes.runtime_names()`).
        out: directory for the two bundles (`OUT/ref`, `OUT/<runtime>`); default a temporary directory
            (the bundles are then gone after the call; the result keeps every figure).
        min_snr, min_corr, atol, rtol, rules: passed to `tensorprobe.diff` (default: 60 dB SNR).
        artifact: an already exported artifact of `model` (e.g. `model.onnx`) to run instead of exporting;
            its inputs are `inputs` in graph-input order.
        runtime_options: passed to the runtime's `capture` (e.g. `{"exporter": "legacy"}`).
        prepared: an artifact from `get_runtime(runtime).prepare(model, inputs, workdir)`, run instead of
            exporting again (a sweep prepares once per worker and input shape).
        progress: called with a short description of each stage.
        replay_rng: run the runtime first and give the PyTorch reference the runtime's random draws
            (`RuntimeDraws`), so that a model with noise (a vocoder's source) compares value by value.
        referee: "fp64" runs `model` once more in float64 (its random draws replayed from the reference) and
            judges which side is closer to it, per module and at the outputs (`tensorprobe.diff.referee`).
        bisect: with a torch.compile runtime (inductor, aot_eager), when the compiled model diverges, recompile
            it stage by stage with PyTorch's compiler bisector and name the stage, decomposition, lowering or
            Inductor setting the difference comes from (`tensorprobe.compile_bisect`).

    Returns:
        A `CompareResult`; `result.finding` is True on a divergence or a NaN born in the runtime only.

    Example:
        >>> res = compare(model, (x,), "onnxruntime", runtime_options={"exporter": "legacy"})  # doctest: +SKIP
        >>> res.cand_nan.record                                                              # doctest: +SKIP
        'generator/Div.0'
    """
    from .capture import capture
    from .diff import diff
    from .runtimes import get_runtime

    if isinstance(inputs, dict):
        raise InputError("compare needs positional inputs (a tuple), not keyword inputs")
    if referee not in (None, "fp64"):
        raise InputError(f"unknown referee {referee!r}: the referee compare runs is 'fp64'")
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    check_finite_inputs(inputs)
    adapter = get_runtime(runtime)
    adapter.require()
    adapter.check_options(runtime_options or {}, artifact=artifact is not None)
    if bisect and not _compiled(runtime):
        raise InputError(f"--bisect recompiles the model with torch.compile: it needs --runtime inductor or "
                         f"aot_eager, not {runtime}")
    step = progress or (lambda text: None)

    # a compiled model draws from torch's generator as eager does: both runs start from the same state, so the
    # same seed gives the same draws (aot_eager), and only a compiler's own generator (Inductor's) draws otherwise
    start = _RngState() if _compiled(runtime) else None

    def capture_runtime(root: Path) -> Bundle:
        step(f"capturing in {runtime}")
        if start is not None:
            start.restore()
        where, opts = root / runtime, runtime_options or {}
        if prepared is not None:
            return adapter.capture_prepared(prepared, inputs, out=where, keep="full")
        if artifact is not None:
            return adapter.capture_artifact(artifact, inputs, out=where, keep="full", **opts)
        return adapter.capture(model, inputs, out=where, keep="full", **opts)

    with workdir(out, prefix="tensorprobe-compare-") as root:
        draws = None
        if replay_rng:
            cand = capture_runtime(root)
            draws = RuntimeDraws.of(cand)
        step("capturing the PyTorch reference" + (" with the runtime's random draws" if draws else ""))
        if start is not None:
            start.restore()
        ref = forward_or_input_error(capture, model, *inputs, level="module", keep="full", out=root / "ref",
                                     replay_rng=draws)
        if not replay_rng:
            cand = capture_runtime(root)
        step("comparing")
        view = module_view(cand, shared_draws=draws.shared if draws else (), differ=draws.differ if draws else ())
        report = diff(ref, view, min_snr=min_snr, min_corr=min_corr, atol=atol, rtol=rtol, rules=rules, progress=None)
        ref_nan, cand_nan = find_nonfinite_in_bundle(ref), find_nonfinite_in_bundle(cand)
        escapes = cand_nan.found and find_nonfinite_in_bundle(view).found
        first = report.first_divergence if report.verdict == "diverged" else None
        output = output_pair(ref, view, report)
        notes = (_notes(ref, cand, report, cand_nan, escapes, draws) + _compile_notes(cand)
                 + _kernel_notes(ref, cand, first))
        judged = None
        if referee:
            step("running the model in float64 (the referee)")
            judged = _referee_fp64(model, inputs, ref, view, root, runtime)
        bisected = None
        if bisect:
            from .compile_bisect import CompileBisect, bisect_compile

            bisected = CompileBisect(math.nan, bisected=False)   # asked, and told why nothing was bisected
            if report.verdict == "diverged":
                step("bisecting the compile (PyTorch's compiler bisector)")
                opts = runtime_options or {}
                at = ref[first] if first in ref else None
                parted = report.get(first).metrics.get("rel_l2_err") if report.get(first) is not None else None
                bisected = bisect_compile(model, inputs, backend=opts.get("backend") or adapter.default_backend,
                                          mode=opts.get("mode"), inductor_config={
                                              k: opts[k] for k in ("emulate_precision_casts", "fallback_random")
                                              if opts.get(k) is not None},
                                          region=(at.module, at.call, parted) if at is not None and at.module
                                          and parted is not None else None)
        return CompareResult(
            runtime=runtime, runtime_info=dict(cand.runtime), ref_bundle=str(ref.path), cand_bundle=str(cand.path),
            compared=len(report.pairs), first_divergence=first, ref_nan=ref_nan, cand_nan=cand_nan,
            cand_nan_escapes=escapes, diff=report,
            summary=_summary(runtime, report, ref_nan, cand_nan, escapes, output), notes=notes,
            output=output.to_dict() if output is not None else None,
            replayed=tuple(draws.shared) if draws else (), referee=judged, bisect=bisected)


class _RngState:
    """torch's random generators as they are now (CPU, and CUDA once initialised), to start a run from."""

    def __init__(self):
        self.cpu = torch.random.get_rng_state()
        self.cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None

    def restore(self) -> None:
        torch.random.set_rng_state(self.cpu)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


def _compile_notes(cand: Bundle) -> tuple[str, ...]:
    """The graph breaks of a compiled run: the code between its graphs ran eagerly (capture --compile warns of
    each; compare says so too)."""
    breaks = (cand.runtime.get("compile") or {}).get("graph_breaks") or []
    breaks = list({(b.get("where"), b.get("reason")): b for b in breaks}.values())   # explain repeats a break
    notes = []
    for b in breaks[:3]:
        at = f" at {b['where']}" if b.get("where") else ""
        notes.append(f"graph break{at}: {b.get('reason', '')} (the code between compiled graphs ran eagerly)")
    if len(breaks) > 3:
        notes.append(f"{len(breaks) - 3} more graph breaks (--json: runtime_info.compile.graph_breaks)")
    return tuple(notes)


def _kernel_notes(ref: Bundle, cand: Bundle, first: str | None) -> tuple[str, ...]:
    """What Inductor did with the module call where a compiled model first parts from eager (the kernels it
    recorded while compiling: `tensorprobe.inductor_kernels`); nothing for other runtimes."""
    from .inductor_kernels import divergence_fact

    fact = divergence_fact(ref, cand, first) if first else None
    return (fact,) if fact else ()


def _compiled(runtime: str) -> bool:
    """True for a torch.compile runtime (inductor, aot_eager): its reference is eager, its port a compile."""
    from .runtimes import get_runtime
    from .runtimes.inductor import InductorAdapter

    return isinstance(get_runtime(runtime), InductorAdapter)


def _referee_fp64(model: torch.nn.Module, inputs: tuple, ref: Bundle, cand: Bundle, root: Path, runtime: str) -> Any:
    """The float64 referee's judgement of `cand` against `ref`: `model` captured in float64 at module level,
    drawing the reference's random tensors (widened) where the reference drew any."""
    from .diff.referee import referee as judge
    from .referee import capture_fp64

    fp64 = capture_fp64(model, *inputs, level="module", out=root / "fp64", replay_rng=ref)
    compiled = _compiled(runtime)   # torch.compile: eager against compiled
    return judge(ref, cand, fp64, ref_label="eager" if compiled else "PyTorch",
                 cand_label=f"compiled ({runtime})" if compiled else runtime)


def check_finite_inputs(inputs: Sequence[Any]) -> None:
    """InputError when a model input holds NaN: no runtime can be judged on it (every value downstream is
    NaN on both sides, and the first non-finite value found would be the input itself). ±Inf is left alone:
    an additive attention mask holds -inf on purpose.

    >>> check_finite_inputs((torch.tensor([1.0, float("nan")]),))
    Traceback (most recent call last):
    ...
    tensorprobe.errors.InputError: model input 0 holds NaN (1 of 2 elements, first at index (1,)): compare needs finite inputs; `tensorprobe nan` shows what the model makes of them
    """
    import numpy as np

    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and x.dtype in (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2):
            x = x.float()   # NumPy has no such dtype; widening keeps every NaN where it is
        arr = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else x
        if not isinstance(arr, np.ndarray) or arr.dtype.kind not in "fc":
            continue
        nan = np.isnan(arr)
        n = int(np.count_nonzero(nan))
        if n:
            first = tuple(int(k) for k in np.argwhere(nan)[0])
            raise InputError(f"model input {i} holds NaN ({n} of {arr.size} elements, first at index {first}): "
                             "compare needs finite inputs; `tensorprobe nan` shows what the model makes of them")


def forward_or_input_error(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run something that runs the user's forward; an exception of the model's own code (a wrong input shape)
    becomes one InputError line naming it, as `capture` and `nan` say it."""
    from .errors import TensorprobeError

    try:
        return fn(*args, **kwargs)
    except TensorprobeError:
        raise
    except Exception as e:
        first = next((line for line in str(e).splitlines() if line.strip()), "")
        raise InputError(f"the model's forward raised {type(e).__name__}: {first}".rstrip(": ")) from None


class RuntimeDraws(RngReplay):
    """A runtime's random draws, fed to the PyTorch reference (`compare(..., replay_rng=True)`).

    A runtime names a draw by module path and its own op (`generator.m_source.l_sin_gen/RandomNormalLike.0`),
    so each PyTorch draw takes the runtime's next unused draw of the same module call, shape and kind of draw
    (distribution and parameters, `rng.draws`: `randn_like` takes a RandomNormalLike of mean 0 and scale 1). A
    PyTorch draw with no such counterpart (one whose result the exporter removed as dead code, or one the port
    draws otherwise) keeps its own values. `shared` names the runtime draws the reference took; `differ` those
    of the same module call and shape that draw otherwise than the PyTorch draw left without a counterpart
    (`diff` pairs and reports them).
    """

    def __init__(self, bundle: Bundle, draws: list[Any]):
        super().__init__({r.name: torch.from_numpy(bundle.numpy(r.name).copy()) for r in draws})
        self.own: list[str] = []          # the reference's draws with no runtime counterpart
        self.differ: list[str] = []       # runtime draws that stand where the reference draws otherwise
        self.queues: dict[tuple[str, int], list[str]] = {}
        self.drawn = {r.name: draw_of(r) for r in draws}
        for r in draws:
            self.queues.setdefault((r.module, r.call), []).append(r.name)

    @classmethod
    def of(cls, bundle: Bundle) -> "RuntimeDraws | None":
        """The draws of a runtime capture, or None when it drew nothing."""
        draws = [r for r in bundle.records if r.kind == KIND_RNG and r.has_tensor]
        return cls(bundle, draws) if draws else None

    @property
    def shared(self) -> list[str]:
        return list(self.replayed)

    def _next(self, func: Any, like: torch.Tensor, name: str | None, source: str | None,
              draw: Draw | None = None) -> torch.Tensor:
        module, call = parse_name(name) if name else ("", 0)
        mine = draw.with_kind(like.dtype) if draw is not None else Draw("bernoulli")    # a dropout's mask
        queue = self.queues.get((module, call), [])
        for i, key in enumerate(queue):
            t = self.tape.loader(key)
            if tuple(t.shape) == tuple(like.shape) and _alike(mine, self.drawn.get(key)):
                queue.pop(i)
                self.tape.used[self.tape.by_name[key]] = True
                self.replayed.append(key)
                return t.to(dtype=like.dtype, device=like.device)
        self.own.append(name or str(func))
        self.differ += [k for k in queue if tuple(self.tape.loader(k).shape) == tuple(like.shape)
                        and k not in self.differ][:1]
        return like


def _alike(mine: Draw, theirs: Draw | None) -> bool:
    """The runtime's draw can stand for this PyTorch draw: one distribution and parameters, whatever kind of
    number each stores (the runtime's draw is cast to this run's dtype)."""
    return theirs is not None and mine.conflict(Draw(theirs.distribution, theirs.params)) is None


def _summary(runtime: str, report: Any, ref_nan: NanOrigin, cand_nan: NanOrigin, escapes: bool,
             output: "OutputPair | None") -> str:
    parts = []
    if output is not None and output.candidate_only:
        parts.append(f"{runtime}'s output {output.name} is non-finite where PyTorch's is finite "
                     f"({output.nonfinite_text()}).")
    if escapes and not ref_nan.found:
        parts.append(f"{runtime} produces non-finite values that PyTorch does not: first at {cand_nan.record}"
                     + (f" ({cand_nan.output.stats.channel_pattern()})"
                        if cand_nan.output and cand_nan.output.stats.channel_pattern() else "") + ".")
    elif ref_nan.found:
        shared = (f" {runtime}'s output fails the same check ({output.both} elements non-finite on both sides): "
                  "a property of the model, not a finding of the port."
                  if output is not None and output.both and not output.one_sided else "")
        if ref_nan.cause == CAUSE_MODEL_INPUT:   # ±Inf given on purpose (a mask): the same on both sides
            parts.append(f"The model inputs hold ±Inf ({ref_nan.record}), the same for both runs.{shared}")
        else:
            parts.append(f"PyTorch itself produces non-finite values, first at {ref_nan.record}.{shared}")
    if report.verdict == "diverged":
        parts.append(f"{runtime} diverges from PyTorch. {report.summary}")
    elif report.verdict == "match":
        parts.append(f"{runtime} matches PyTorch: {report.summary}")
    else:
        parts.append(f"{runtime} could not be compared with PyTorch value by value: {report.summary}")
    return " ".join(parts)


def _notes(ref: Bundle, cand: Bundle, report: Any, cand_nan: NanOrigin, escapes: bool,
           draws: "RuntimeDraws | None") -> tuple[str, ...]:
    notes = []
    if cand_nan.found and not escapes:
        notes.append(f"a non-finite value is born at {cand_nan.record} ({cand_nan.op}) inside the graph and masked "
                     "before any module output (e.g. atan2 lowered as a division whose 0/0 a Where replaces)")
    if draws is not None:
        notes.append(f"the PyTorch reference drew the runtime's random tensors ({len(draws.shared)} of "
                     f"{len(draws.tape.entries)})" + (f"; {len(draws.own)} of its draws have no runtime counterpart "
                                                     f"and kept their own values, e.g. {draws.own[0]}" if draws.own else ""))
    unmatched = [n for n in report.ref_only if not n.startswith("input.")]
    if unmatched:
        notes.append(f"{len(unmatched)} reference records have no {cand.runtime.get('name', 'runtime')} "
                     f"counterpart (identity modules like Dropout, values merged by the exporter's optimizer, "
                     f"unused tuple outputs), e.g. {', '.join(unmatched[:3])}")
    return tuple(notes)


# ---- the model's output, judged on both sides: what is the port's, what is the model's --------------------
@dataclass(frozen=True)
class OutputPair:
    """The model output of both sides as arrays, and how their non-finite elements compare."""

    name: str
    reference: Any                     # np.ndarray
    candidate: Any
    candidate_only: int                # elements finite in the reference, NaN/Inf in the candidate
    reference_only: int                # ... and the other way round
    both: int                          # non-finite on both sides

    @property
    def one_sided(self) -> bool:
        """Some element is finite on one side only: total error, whatever the finite elements say."""
        return bool(self.candidate_only or self.reference_only)

    def nonfinite_text(self) -> str | None:
        parts = [f"non-finite on the {side} side: {n} element{'s' if n != 1 else ''}"
                 for side, n in (("candidate", self.candidate_only), ("reference", self.reference_only)) if n]
        return "; ".join(parts) or None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "candidate_only": self.candidate_only, "reference_only": self.reference_only,
                "both": self.both}


def output_pair(ref: Bundle, cand: Bundle, report: Any) -> OutputPair | None:
    """The model output `report` pairs, read from both bundles (None when either side kept no tensor)."""
    import numpy as np

    pair = report.get(report.output)
    if pair is None:
        return None
    r, c = ref.get(pair.name), cand.get(pair.cand_name)
    if r is None or c is None or not r.has_tensor or not c.has_tensor:
        return None
    a, b = ref.numpy(pair.name), cand.numpy(pair.cand_name)
    if a.shape != b.shape:
        return None
    fa, fb = np.isfinite(a), np.isfinite(b)
    return OutputPair(pair.name, a, b, candidate_only=int(np.count_nonzero(fa & ~fb)),
                      reference_only=int(np.count_nonzero(fb & ~fa)), both=int(np.count_nonzero(~fa & ~fb)))


def outputs_agree(report: Any, out: OutputPair | None) -> bool:
    """The two outputs are the same signal: the output pair passes the diff's criteria, element-wise, and no
    element is finite on one side only. An audio check that fires on one side only is then a threshold
    crossed by rounding, not something the port did."""
    from .diff.result import METHOD_DIGEST, METHOD_ELEMENTWISE, METHOD_EXACT, STATUS_PASS

    pair = report.get(report.output)
    return (out is not None and not out.one_sided and pair is not None and pair.status == STATUS_PASS
            and pair.method in (METHOD_ELEMENTWISE, METHOD_EXACT, METHOD_DIGEST))


@dataclass(frozen=True)
class AudioJudgement:
    """The audio checks of the candidate's output, each judged against the reference's output.

    A check the candidate fails counts against the port only when the reference's output passes it and the two
    outputs differ; when the reference's output fails the same check, or the outputs agree, it is a property
    of the model (`model_problems`), reported and never a finding.
    """

    candidate: Any                         # audio.AudioReport of the candidate's output
    reference: Any                         # ... of the reference's output
    port_problems: tuple[str, ...]         # error checks of the candidate the reference does not explain
    model_problems: tuple[str, ...]        # error checks that are the model's
    reasons: tuple[tuple[str, str], ...]   # (code, sentence) per port problem (code "audio.<check>", "audio.diff")
    model_reasons: tuple[tuple[str, str], ...]
    diff: Any = None                       # audio.AudioDiff, or None when it could not run
    diff_skipped: str | None = None

    @property
    def finding(self) -> bool:
        return bool(self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.candidate.status, "reference_check": self.reference.status,
                "problems": list(self.port_problems), "model_problems": list(self.model_problems),
                "diff": self.diff.verdict if self.diff is not None else None, "diff_skipped": self.diff_skipped,
                "finding": self.finding}


def judge_audio(out: OutputPair, sample_rate: float, agree: bool) -> AudioJudgement:
    """`audio check` on both outputs and `audio diff` of the two; `agree`: from `outputs_agree`."""
    import numpy as np

    from . import audio

    ref, cand = out.reference.squeeze(), out.candidate.squeeze()
    ref_check = audio.check(ref, sample_rate, source="reference output")
    cand_check = audio.check(cand, sample_rate, source="candidate output")
    port, model, reasons, model_reasons = [], [], [], []
    for v in cand_check.errors:
        rv = ref_check.verdict(v.check)
        code = f"audio.{v.check}"
        if rv.status == "error":
            model.append(v.check)
            model_reasons.append((code, f"audio {v.check}: the reference's output fails the same check "
                                        f"({rv.message})"))
        elif agree:
            model.append(v.check)
            model_reasons.append((code, f"audio {v.check}: the outputs agree and the reference's output sits at the "
                                        f"same place, on the other side of the threshold ({rv.message})"))
        else:
            port.append(v.check)
            reasons.append((code, f"audio {v.check}: {v.message} (the reference's output passes: {rv.message})"))
    # non-finite or empty outputs too: audio diff says which side holds what, and where (it never raises on them)
    d = audio.diff(ref, cand, sample_rate)
    if d.status == "finding":
        reasons.append(("audio.diff", f"audio diff: {d.label} ({'; '.join(d.reasons)})"))
    return AudioJudgement(cand_check, ref_check, tuple(port), tuple(model), tuple(reasons), tuple(model_reasons),
                          d, None)


from ._api import make_callable  # noqa: E402

make_callable(__name__, compare)  # `tp.compare(...)` calls it; `tensorprobe.compare.<submodule>` still imports
