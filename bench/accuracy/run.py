"""Run truth-known cases through tensorprobe as a user would (capture both sides and diff them, or `compare` against
an exported file) and score each verdict against the truth it was built with.

    from bench.accuracy.run import run_case
    outcome = run_case(Case.from_id("rnn-gru/torch/module-stats/gate_order@rnn/s7"))
    outcome["localized"], outcome["cause_right"]

A case's reference is the architecture as built; its candidate is a second build of the same seed with the bug
planted (or none), made into the port: run in PyTorch as is, cast to float16/bfloat16, compiled by aot_eager, or
exported to ONNX (dynamo or legacy exporter; or dynamo then ONNX Runtime's `quantize_dynamic`, int8 weights) and
run in ONNX Runtime. A bug whose effect on its module's own
output is below the port's rounding has no truth to find: such a case is `void` and not scored.
"""

from __future__ import annotations

import multiprocessing
import sys
import tempfile
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch

import tensorprobe as tp
from tensorprobe.record import KIND_MODEL_OUTPUT, parse_name

from .archs import ARCHS, Built
from .bugs import BUGS
from .cases import COMPILED, LEVELS, ONNX_PORTS, SIXTEEN_BIT, Case

def _build(case: Case, planted: bool) -> Built:
    built = ARCHS[case.arch](case.seed)
    if planted and case.bug is not None:
        BUGS[case.bug].plant(built.model, case.site, case.strength)
    return built


def _floats(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value.detach().float()] if value.is_floating_point() else []
    if isinstance(value, dict):
        return [t for v in value.values() for t in _floats(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _floats(v)]
    return []


def _site_output(model: torch.nn.Module, site: str, inputs: tuple) -> list[torch.Tensor]:
    seen: list[torch.Tensor] = []
    handle = model.get_submodule(site).register_forward_hook(lambda m, a, out: seen.extend(_floats(out)))
    try:
        with torch.no_grad():
            torch.manual_seed(0)
            model(*inputs)
    finally:
        handle.remove()
    return seen


def effect(case: Case) -> float:
    """How far the planted bug moves its own module's output (relative L2, float32, same draws)."""
    ref, bad = _build(case, planted=False), _build(case, planted=True)
    return relative_change(_site_output(ref.model, case.site, ref.inputs),
                           _site_output(bad.model, case.site, bad.inputs))


def relative_change(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """‖b - a‖ / ‖a‖ over paired tensors (float64 sums; inf when only `b` is non-zero)."""
    num = sum(float((y - x).double().pow(2).sum()) for x, y in zip(a, b))
    den = sum(float(x.double().pow(2).sum()) for x in a)
    return (num / den) ** 0.5 if den > 0 else float("inf") if num > 0 else 0.0


def cast_floats(value: Any, dtype: torch.dtype) -> Any:
    """Every floating tensor in `value` (nested dicts, tuples, lists) cast to `dtype`."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: cast_floats(v, dtype) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(cast_floats(v, dtype) for v in value)
    return value


def _has_draws(bundle: Any) -> bool:
    return any(r.kind == "rng" for r in bundle)


def _torch_port(case: Case, ref_bundle: Any, cand: Built, out: Path) -> Any:
    level, keep = LEVELS[case.level]
    model, inputs = cand.model, cand.inputs
    options: dict[str, Any] = {}
    if case.port in SIXTEEN_BIT:
        dtype = torch.float16 if case.port == "fp16" else torch.bfloat16
        model, inputs = model.to(dtype), cast_floats(inputs, dtype)
    if case.port in COMPILED:
        options.update(compile=True, backend=case.port)
    if case.port == "inductor" and _has_draws(ref_bundle):
        # Inductor draws with its own generator unless told to draw eager's: what a user does to compare them
        options.update(inductor_config={"fallback_random": True})
    # a compiled graph draws from torch's generator as eager does: the same seed gives the same draws, and a
    # capture with compile=True takes no replay
    replay = ref_bundle if _has_draws(ref_bundle) and case.port not in COMPILED else None
    torch.manual_seed(0)
    cand_bundle = tp.capture(model, *inputs, level=level, keep=keep, out=out / "cand", replay_rng=replay, **options)
    return tp.diff(ref_bundle, cand_bundle)


def _onnx_port(case: Case, ref: Built, cand: Built, out: Path) -> Any:
    """The candidate exported by torch.onnx and captured in ONNX Runtime; the reference captured at the case's
    level, then diffed (`tensorprobe capture` of each, `tensorprobe diff`). A model with random draws goes through
    `compare --replay-rng` instead, which gives the reference ONNX Runtime's draws (the two generators differ)."""
    from tensorprobe.compare import compare
    from tensorprobe.runtimes import get_runtime
    from tensorprobe.runtimes.onnxruntime import export_onnx

    exporter = "legacy" if case.port == "onnx-legacy" else "dynamo"
    torch.manual_seed(0)
    path = export_onnx(cand.model, cand.inputs, out / "cand.onnx", exporter=exporter)
    if case.port == "onnx-int8":        # ONNX Runtime's own dynamic quantization of that export (int8 weights)
        path = _int8(path, out / "cand.int8.onnx")
    if case.port == "onnx-qdq":         # its static QDQ quantization (int8 weights and activations), calibrated
        path = _qdq(path, out / "cand.qdq.onnx", cand.inputs)
    if any("Noise" in type(m).__name__ for m in ref.model.modules()):
        torch.manual_seed(0)
        return compare(ref.model, ref.inputs, "onnxruntime", artifact=path, out=out / "cmp", replay_rng=True).diff
    level, keep = LEVELS[case.level]
    torch.manual_seed(0)
    ref_bundle = tp.capture(ref.model, *ref.inputs, level=level, keep=keep, out=out / "ref")
    cand_bundle = get_runtime("onnxruntime").capture_artifact(path, [t.numpy() for t in cand.inputs],
                                                              out / "cand", keep=keep)
    return tp.diff(ref_bundle, cand_bundle)


def _int8(path: Path, to: Path) -> Path:
    import logging

    from onnxruntime.quantization import QuantType, quantize_dynamic

    logging.getLogger().setLevel(logging.ERROR)      # "consider pre-processing": advice, not a result
    quantize_dynamic(str(path), str(to), weight_type=QuantType.QInt8)
    return to


def _qdq(path: Path, to: Path, inputs: tuple) -> Path:
    """`quantize_static` in QDQ format, per-channel int8 weights and uint8 activations, calibrated on the case's
    input and a few noisy copies of it (what a user calibrates on: a handful of inputs like the real ones)."""
    import logging

    import onnxruntime as ort
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    names = [i.name for i in ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).get_inputs()]
    gen = torch.Generator().manual_seed(0)
    feeds = [[t + 0.05 * t.std() * torch.randn(t.shape, generator=gen) if k and t.is_floating_point() else t
              for t in inputs] for k in range(4)]

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = iter([{n: t.numpy() for n, t in zip(names, feed)} for feed in feeds])

        def get_next(self) -> dict | None:
            return next(self.left, None)

    logging.getLogger().setLevel(logging.ERROR)
    quantize_static(str(path), str(to), Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                    activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return to


def _executorch_port(case: Case, ref: Built, cand: Built, out: Path) -> Any:
    """The candidate lowered to ExecuTorch (its portable kernels: the XNNPACK delegate refuses some tapped graphs,
    `ConvertToLinearPass`) and run in its runtime with ETDump debug outputs; the reference captured at the case's
    level."""
    from tensorprobe.runtimes import get_runtime

    level, keep = LEVELS[case.level]
    torch.manual_seed(0)
    ref_bundle = tp.capture(ref.model, *ref.inputs, level=level, keep=keep, out=out / "ref")
    cand_bundle = get_runtime("executorch").capture(cand.model, cand.inputs, out / "cand", keep=keep)
    return tp.diff(ref_bundle, cand_bundle)


def _module(record: str) -> str:
    """The module path of a record name ('' for the model's own: its outputs, ops in its forward)."""
    if record == "output" or record.startswith(("output.", "output:")):
        return ""
    return parse_name(record)[0]


def _within(module: str, site: str) -> bool:
    return module == site or module.startswith(site + ".")


INT8_CAUSES = ("quantized", "inherited", "amplified")     # int8's error, as the first divergence's cause


def judge(case: Case, report: Any) -> dict[str, Any]:
    """Score one verdict: a false alarm (faithful, diverged), a miss (planted, not diverged), the first divergence
    at the planted module (or inside it; or the module enclosing it when the port has no value of the planted
    module's own to compare), and its cause among those the bug allows."""
    verdict, first = report.verdict, report.first_divergence
    pair = report.get(first) if first else None
    cause = pair.cause if pair is not None else None
    out: dict[str, Any] = {"verdict": verdict, "first_divergence": first, "cause": cause,
                           "summary": report.summary.splitlines()[0] if report.summary else ""}
    if case.bug is None:
        # an int8 port is lossy by design: diverging by int8's error alone (its outputs miss the criterion of a
        # quantized port: a flow's log-determinant, a sum near zero, magnifies it) says so, and blames no bug;
        # so is a 16-bit port whose model output misses the output criterion by rounding its ops amplify
        by_int8 = case.port in ("onnx-int8", "onnx-qdq") and cause in INT8_CAUSES
        by_rounding = case.port in SIXTEEN_BIT and cause == "amplified" and pair is not None and \
            pair.kind == KIND_MODEL_OUTPUT
        out["false_alarm"] = verdict == "diverged" and not (by_int8 or by_rounding)
        out["lossy"] = verdict == "diverged" and (by_int8 or by_rounding)
        return out
    # the module the verdict names (`DiffReport.first_place`): the first compared record that fails, or where the
    # error enters before it (an op only the port has; a weight of a module the port has no value of)
    module = report.first_place if first else None
    site_compared = any(_within(_module(p.name), case.site) for p in report.pairs if p.name)
    enclosing = (module is not None and not site_compared and
                 (module == "" or case.site.startswith(module + ".")))
    out["detected"] = verdict == "diverged"
    fused = report.fused_with(first)          # "made in one of the two": the verdict names both
    out["localized"] = module is not None and (_within(module, case.site) or enclosing or (
        fused is not None and (_within(_module(fused), case.site) or _within(_module(first), case.site))))
    out["enclosing"] = bool(enclosing)
    out["cause_right"] = out["localized"] and cause in BUGS[case.bug].causes
    return out


def run_case(case: Case, workdir: str | Path | None = None) -> dict[str, Any]:
    """Build, port, capture, diff and judge one case; every failure to run is an outcome with its error."""
    return outcome_of(case, lambda: _port_and_judge(case, workdir))


def outcome_of(case: Any, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`run()`'s scores of `case` (a diff case or a `nan.NanCase`) with its id, cell, truth and seconds; a case
    that cannot run is an outcome with its error, never dropped."""
    started = time.perf_counter()
    outcome: dict[str, Any] = {"id": case.id, "cell": list(case.cell), "bug": case.bug}
    try:
        outcome.update(run())
    except Exception as exc:
        outcome["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        outcome["traceback"] = traceback.format_exc(limit=4)[-1500:]
    finally:
        outcome["seconds"] = round(time.perf_counter() - started, 3)
    return outcome


def _port_and_judge(case: Case, workdir: str | Path | None) -> dict[str, Any]:
    moved = effect(case) if case.bug is not None else None
    if moved is not None and moved < case.min_effect:
        return {"effect": moved, "void": True}
    with tempfile.TemporaryDirectory(dir=workdir, prefix="tp-acc-") as tmp:
        out = Path(tmp)
        ref, cand = _build(case, planted=False), _build(case, planted=True)
        if case.port in ONNX_PORTS:
            report = _onnx_port(case, ref, cand, out)
        elif case.port == "executorch":
            report = _executorch_port(case, ref, cand, out)
        else:
            level, keep = LEVELS[case.level]
            torch.manual_seed(0)
            ref_bundle = tp.capture(ref.model, *ref.inputs, level=level, keep=keep, out=out / "ref")
            report = _torch_port(case, ref_bundle, cand, out)
        scores = judge(case, report)
    return scores if moved is None else {"effect": moved, **scores}


def _init_worker() -> None:
    import warnings

    import torch

    from tensorprobe.logs import quiet_third_party

    quiet_third_party()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)     # the workers share the cores


def case_from_id(case_id: str) -> Any:
    """A diff case (`cases.Case`), a nan case (`nan.NanCase`, ids `nan/...`), an isolate case
    (`isolate.IsolateCase`, ids `isolate/...`) or a sweep case (`sweep.SweepCase`, ids `sweep/...`) from its id."""
    if case_id.startswith("nan/"):
        from .nan import NanCase

        return NanCase.from_id(case_id)
    if case_id.startswith("isolate/"):
        from .isolate import IsolateCase

        return IsolateCase.from_id(case_id)
    if case_id.startswith("sweep/"):
        from .sweep import SweepCase

        return SweepCase.from_id(case_id)
    return Case.from_id(case_id)


def _run(case_id: str) -> dict:
    case = case_from_id(case_id)
    if case_id.startswith("nan/"):
        from .nan import judge_nan

        return outcome_of(case, lambda: judge_nan(case))
    if case_id.startswith("isolate/"):
        from .isolate import judge_isolate

        return outcome_of(case, lambda: judge_isolate(case))
    if case_id.startswith("sweep/"):
        from .sweep import judge_sweep

        return outcome_of(case, lambda: judge_sweep(case))
    return run_case(case)


def run_population(cases: list[Any], jobs: int, progress: bool = True) -> list[dict]:
    """Every case's outcome, in the order given; `jobs` worker processes (1: in this process)."""
    ids = [c.id for c in cases]
    if jobs <= 1:
        _init_worker()
        return [_run(i) for i in ids]
    out = []
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), initializer=_init_worker) as ex:
        for n, outcome in enumerate(ex.map(_run, ids, chunksize=4), 1):
            out.append(outcome)
            if progress and n % 50 == 0:
                print(f"  {n}/{len(ids)} cases", file=sys.stderr, flush=True)
    return out
