"""`--verify`: run the target where it is installed and mark each numerical prediction confirmed or not.

ONNX Runtime, ExecuTorch and TVM capture the model at statistics level (records named by PyTorch module
path); a one-pass-variance prediction is confirmed when the predicted norm comes out with NaN channels, all
of them among the predicted ones. The `fp16` target runs `model.half()` in PyTorch and looks for where its
first non-finite value is born; an overflow or near-zero prediction is confirmed when that is the predicted op.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from ..errors import InputError, TensorprobeError
from .findings import Finding, Target
from .rewrite import clone_module

PREDICTIONS = ("one_pass_variance", "overflow", "near_zero")


def verify(model: torch.nn.Module, inputs: tuple, target: Target, findings: list[Finding]) -> tuple[list[Finding], str]:
    """The findings with `confirmed` / `observed` filled in for the numerical predictions, and a note saying
    what ran."""
    if target.name == "fp16":
        return _verify_half(model, inputs, findings)
    adapter, missing = _installed(target)
    if adapter is None:
        return findings, f"--verify: {missing}"
    runtime = adapter.name
    with tempfile.TemporaryDirectory(prefix="tensorprobe-verify-") as d:
        try:
            bundle, how = _capture(adapter, model, inputs, Path(d) / runtime)
        except TensorprobeError as e:
            return findings, f"--verify: {runtime} could not run the model ({e})"
        checked = [_check_norm(f, bundle, runtime) if f.kind == "one_pass_variance" else f for f in findings]
    return checked, f"--verify: ran {runtime}{how}"


def verify_fixed(model: torch.nn.Module, inputs: tuple, target: Target) -> tuple[bool | None, str]:
    """Run the target on the model `--fix` made: (True when every value it records is finite, a note)."""
    if target.name == "fp16":
        try:
            origin = _half_origin(model, inputs)
        except Exception as e:   # an op without a float16 CPU kernel
            return None, f"--fix --verify: model.half() did not run ({type(e).__name__})"
        return (not origin.found, "--fix --verify: the fixed model in float16 " +
                (f"still makes a non-finite value at {origin.op} in {origin.module or '<root>'}" if origin.found
                 else "keeps every value finite"))
    adapter, missing = _installed(target)
    if adapter is None:
        return None, f"--fix --verify: {missing}"
    runtime = adapter.name
    with tempfile.TemporaryDirectory(prefix="tensorprobe-verify-") as d:
        try:
            bundle, how = _capture(adapter, model, inputs, Path(d) / runtime)
        except TensorprobeError as e:
            return False, f"--fix --verify: {runtime} could not run the fixed model ({e})"
        bad = [r.name for r in sorted(bundle, key=lambda r: r.order) if not r.stats.all_finite]
        n = len(bundle)
    if bad:
        return False, f"--fix --verify: {runtime}{how} still makes NaN/Inf in the fixed model: {len(bad)} of {n} " \
                      f"records, first {bad[0]}"
    return True, f"--fix --verify: {runtime}{how} ran the fixed model with every value finite ({n} records)"


def _installed(target: Target) -> tuple[Any, str | None]:
    """The adapter that runs `target` here, or None and why not."""
    if target.runtime is None:
        return None, f"no runtime to run {target.name} here"
    from ..runtimes import get_runtime

    adapter = get_runtime(target.runtime)
    if not adapter.available():
        return None, f"{adapter.package} is not installed (pip install 'tensorprobe[{adapter.extra}]')"
    return adapter, None


def _half_origin(model: torch.nn.Module, inputs: tuple) -> Any:
    """Where `model.half()` makes its first non-finite value on `inputs` (raises where float16 has no kernel)."""
    from ..nan.live import find_first_nonfinite

    half = clone_module(model).half()
    args = [t.half() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs]
    return find_first_nonfinite(half, *args, spread=False)


def _capture(adapter: Any, model: torch.nn.Module, inputs: tuple, out: Path) -> tuple[Any, str]:
    try:
        return adapter.capture(clone_module(model), inputs, out=out, keep="stats"), ""
    except InputError as e:
        if "random='zeros'" not in str(e) and "random=zeros" not in str(e):
            raise
    # the importer takes no random ops: zeros, allowed only when the outputs do not depend on them
    return (adapter.capture(clone_module(model), inputs, out=out, keep="stats", random="zeros"),
            " with random ops replaced by zeros (the outputs do not depend on them)")


def _check_norm(f: Finding, bundle: Any, runtime: str) -> Finding:
    rec = bundle.get(f.module)
    if rec is None:
        return replace(f, confirmed=None, observed=f"{runtime} has no record of {f.module}")
    st = rec.stats
    if st.all_finite:
        return replace(f, confirmed=False, observed=f"{runtime}: {f.module} is finite")
    # the norm's inputs (module outputs run inside it or before it) already hold NaN: it came from upstream
    inside = [r.order for r in bundle if r.module == f.module or r.module.startswith(f"{f.module}.")]
    start = min(inside, default=rec.order)
    upstream = next((r for r in sorted(bundle, key=lambda r: r.order)
                     if r.order < start and not r.stats.all_finite and r.kind == "output"), None)
    if upstream is not None:
        return replace(f, confirmed=None, observed=f"{runtime}: NaN reaches {f.module} from upstream "
                       f"({upstream.name}): not judged")
    broken = list(st.nonfinite_channel_idx)
    predicted = set(f.evidence.get("channels", ()))
    inside = [c for c in broken if c in predicted]
    words = (f"{runtime}: NaN in {st.nonfinite_channels} of {st.channels} channels of {f.module} "
             f"({', '.join(map(str, broken[:12]))}{'…' if len(broken) > 12 else ''}), "
             + ("all among the predicted" if len(inside) == len(broken) else
                f"{len(broken) - len(inside)} not predicted"))
    return replace(f, confirmed=len(inside) == len(broken), observed=words)


def _verify_half(model: torch.nn.Module, inputs: tuple, findings: list[Finding]) -> tuple[list[Finding], str]:
    try:
        origin = _half_origin(model, inputs)
    except Exception as e:   # an op without a float16 CPU kernel
        return findings, f"--verify: model.half() did not run on this machine ({type(e).__name__}: {e})"
    out = []
    for f in findings:
        if f.kind in ("overflow", "near_zero"):
            hit = origin.found and origin.module == f.module and f.op and f.op in (origin.op or "")
            seen = (f"float16: first non-finite value at {origin.op} in {origin.module or '<root>'}"
                    if origin.found else "float16: every value finite")
            f = replace(f, confirmed=bool(hit), observed=seen)
        out.append(f)
    return out, "--verify: ran model.half() in PyTorch"
