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

import os
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Sequence

import torch

from .bundle import Bundle
from .errors import InputError
from .nan import NanOrigin, find_nonfinite_in_bundle
from .record import KIND_OUTPUT, KIND_RNG, TAG_DRAWS_RANDOM, TAG_QUANTIZED, TAG_REPLAYED
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

    @property
    def finding(self) -> bool:
        """True when the runtime diverges from PyTorch or produces a non-finite value PyTorch does not."""
        return self.diff.verdict == "diverged" or (self.cand_nan_escapes and not self.ref_nan.found)

    def to_dict(self) -> dict[str, Any]:
        return {
            "runtime": self.runtime, "runtime_info": self.runtime_info, "ref_bundle": self.ref_bundle,
            "cand_bundle": self.cand_bundle, "compared": self.compared, "first_divergence": self.first_divergence,
            "finding": self.finding, "summary": self.summary, "notes": list(self.notes),
            "ref_nan": self.ref_nan.to_dict(), "cand_nan": self.cand_nan.to_dict(),
            "cand_nan_escapes": self.cand_nan_escapes, "diff": self.diff.to_dict(),
        }


def compare(model: torch.nn.Module, inputs: Sequence[Any], runtime: str = "onnxruntime", *,
            out: str | os.PathLike | None = None, min_snr: float | None = None, min_corr: float | None = None,
            atol: float | None = None, rtol: float | None = None, rules: Any = None,
            artifact: str | os.PathLike | None = None, runtime_options: dict[str, Any] | None = None,
            progress: Callable[[str], None] | None = None, prepared: Any = None) -> CompareResult:
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
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    adapter = get_runtime(runtime)
    adapter.require()
    adapter.check_options(runtime_options or {}, artifact=artifact is not None)
    step = progress or (lambda text: None)
    with workdir(out, prefix="tensorprobe-compare-") as root:
        step("capturing the PyTorch reference")
        ref = capture(model, *inputs, level="module", keep="full", out=root / "ref")
        step(f"capturing in {runtime}")
        opts = runtime_options or {}
        if prepared is not None:
            cand = adapter.capture_prepared(prepared, inputs, out=root / runtime, keep="full")
        elif artifact is not None:
            cand = adapter.capture_artifact(artifact, inputs, out=root / runtime, keep="full", **opts)
        else:
            cand = adapter.capture(model, inputs, out=root / runtime, keep="full", **opts)
        step("comparing")
        report = diff(ref, module_view(cand), min_snr=min_snr, min_corr=min_corr, atol=atol, rtol=rtol,
                      rules=rules, progress=None)
        ref_nan, cand_nan = find_nonfinite_in_bundle(ref), find_nonfinite_in_bundle(cand)
        escapes = cand_nan.found and find_nonfinite_in_bundle(module_view(cand)).found
        first = report.first_divergence if report.verdict == "diverged" else None
        notes = _notes(ref, cand, report, cand_nan, escapes)
        return CompareResult(
            runtime=runtime, runtime_info=dict(cand.runtime), ref_bundle=str(ref.path), cand_bundle=str(cand.path),
            compared=len(report.pairs), first_divergence=first, ref_nan=ref_nan, cand_nan=cand_nan,
            cand_nan_escapes=escapes, diff=report, summary=_summary(runtime, report, ref_nan, cand_nan, escapes),
            notes=notes)


def module_view(bundle: Bundle) -> Bundle:
    """The module-level records of a runtime bundle (names without an `/<op>.<k>` part).

    A PyTorch module capture has no op records; leaving the runtime's op records out keeps `diff`
    from pairing them by order with reference records that have no runtime counterpart. What those op
    records tell of their module stays as tags of its records: quantized arithmetic (an int8 port's
    ConvInteger) and random draws not replayed (a RandomNormalLike), so that `diff` gives the cause.
    """
    carried: dict[str, set[str]] = {}
    for r in bundle.records:
        if "/" not in r.name:
            continue
        if TAG_QUANTIZED in r.tags:
            carried.setdefault(r.module, set()).add(TAG_QUANTIZED)
        if r.kind == KIND_RNG and TAG_REPLAYED not in r.tags:
            carried.setdefault(r.module, set()).add(TAG_DRAWS_RANDOM)
    keep = [r if r.kind != KIND_OUTPUT or not carried.get(r.module)
            else replace(r, tags=tuple(sorted(set(r.tags) | carried[r.module])))
            for r in bundle.records if "/" not in r.name]
    return Bundle(bundle.path, bundle.manifest, keep, bundle._source)


def _summary(runtime: str, report: Any, ref_nan: NanOrigin, cand_nan: NanOrigin, escapes: bool) -> str:
    parts = []
    if escapes and not ref_nan.found:
        parts.append(f"{runtime} produces non-finite values that PyTorch does not: first at {cand_nan.record}"
                     + (f" ({cand_nan.output.stats.channel_pattern()})"
                        if cand_nan.output and cand_nan.output.stats.channel_pattern() else "") + ".")
    elif ref_nan.found:
        parts.append(f"PyTorch itself produces non-finite values, first at {ref_nan.record}.")
    if report.verdict == "diverged":
        parts.append(f"{runtime} diverges from PyTorch. {report.summary}")
    elif report.verdict == "match":
        parts.append(f"{runtime} matches PyTorch: {report.summary}")
    else:
        parts.append(f"{runtime} could not be compared with PyTorch value by value: {report.summary}")
    return " ".join(parts)


def _notes(ref: Bundle, cand: Bundle, report: Any, cand_nan: NanOrigin, escapes: bool) -> tuple[str, ...]:
    notes = []
    if cand_nan.found and not escapes:
        notes.append(f"a non-finite value is born at {cand_nan.record} ({cand_nan.op}) inside the graph and masked "
                     "before any module output (e.g. atan2 lowered as a division whose 0/0 a Where replaces)")
    unmatched = [n for n in report.ref_only if not n.startswith("input.")]
    if unmatched:
        notes.append(f"{len(unmatched)} reference records have no {cand.runtime.get('name', 'runtime')} "
                     f"counterpart (identity modules like Dropout, values merged by the exporter's optimizer, "
                     f"unused tuple outputs), e.g. {', '.join(unmatched[:3])}")
    return tuple(notes)


from ._api import make_callable  # noqa: E402

make_callable(__name__, compare)  # `tp.compare(...)` calls it; `tensorprobe.compare.<submodule>` still imports
