"""Which stage of `torch.compile` makes a compiled model part from eager: PyTorch's own compiler bisector, judged
by the model's outputs.

`torch._inductor.compiler_bisector.CompilerBisector` recompiles a model with the stages of `torch.compile` added
one at a time — dynamo's trace alone (`eager`), AOT autograd (`aot_eager`), Inductor's decompositions
(`aot_eager_decomp_partition`), Inductor itself — and, inside the first stage that makes the difference, turns
its parts off (a configuration change, or a binary search over the decompositions or lowerings it applied) until
it finds the one whose removal makes the difference go away. tensorprobe gives it the test (the compiled outputs
are within a quarter of the full compile's error to eager) and three more configuration changes for Inductor while
it runs: fusion off (`max_fusion_size=1`), reductions not split (`split_reductions=False`), and the CPU kernels
unvectorised (`cpp.simdlen=1`), which change the order a reduction adds in.

    >>> from tensorprobe.compile_bisect import bisect_compile        # doctest: +SKIP
    >>> print(bisect_compile(model, (x,)).summary())                 # doctest: +SKIP
    the difference comes from Inductor's decomposition of tp_test.rms.default (number 8 of those applied): without it the compiled outputs match eager (found in 11 compiles, 5 s)
"""

from __future__ import annotations

import contextlib
import io
import math
import re
import time
from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch

from .errors import InputError
from .numbers import json_number

# The compiled outputs count as "the same as eager" once a change brings their error under this share of the
# full compile's error: a stage that explains the difference removes most of it. (A bfloat16 chain rounded as
# eager rounds, emulate_precision_casts, keeps a tenth of it: sin's own bfloat16 kernel differs.)
FIXED_SHARE = 0.25
# For a model whose outputs are float16/bfloat16, half: Inductor's own 16-bit kernels (a matmul, sin) round otherwise
# than eager's even when the rounding between ops is emulated, and leave up to 40% of the difference (a bfloat16
# Linear before six sin steps: 0.058 of 0.145 with emulate_precision_casts); at a quarter the bisector went on and
# blamed the lowering of `add`, whose removal only breaks the fusion up.
FIXED_SHARE_16BIT = 0.5
# Below this relative error at every output the compile is float32 rounding away from eager: nothing to bisect.
ROUNDING = 1e-6
SEED = 0   # every run (eager and compiled) starts from this seed, so random draws are the same where they can be
INPUT_NUDGE = 1e-6   # relative change of the float inputs in the sensitivity check: float32 rounding's size

# Inductor configuration changes tried after PyTorch's own, each with what it tells when it removes the difference
EXTRA_CHANGES = (("max_fusion_size", 1), ("split_reductions", False), ("cpp.simdlen", 1))
_STAGES = {
    "eager": "the graph dynamo traces: the model's code takes another path when compiled "
             "(torch.compiler.is_compiling(), a data-dependent branch, a guard)",
    "aot_eager": "AOT autograd's trace (the aten graph it records: functionalized, with ops traced through "
                 "to those they call)",
    "aot_eager_decomp_partition": "Inductor's decompositions, run without Inductor's code generation",
    "inductor": "Inductor's code generation",
}
_CHANGES = {
    "aot_eager_decomp_partition_cse": "common-subexpression elimination in the traced graph",
    "inductor_fallback_random": "Inductor's own random numbers (with fallback_random=True the compiled model "
                                "draws eager's; compare with --replay-rng to judge the rest)",
    "inductor_emulate_precision_casts": "Inductor keeping a float16/bfloat16 intermediate in float32 inside a "
                                        "fused kernel where eager rounds it (emulate_precision_casts=True rounds "
                                        "as eager does)",
    "inductor_layout_optimization": "Inductor's change of a tensor's memory layout",
    "inductor_comprehensive_padding": "Inductor's padding of tensor strides",
    "inductor_max_fusion_size": "a fusion: with fusion off (max_fusion_size=1) the compiled model matches eager",
    "inductor_split_reductions": "a split reduction (Inductor sums in two passes, in another order than eager)",
    "inductor_cpp.simdlen": "the order a vectorised CPU kernel adds in (with cpp.simdlen=1 it matches eager)",
}
_SUBSYSTEMS = {
    "decomposition": "Inductor's decomposition",
    "lowerings": "Inductor's lowering",
    "pre_grad_passes": "a pre-grad graph pass",
    "joint_graph_passes": "a joint-graph pass",
    "post_grad_passes": "a post-grad graph pass",
    "cudagraphs": "CUDA graphs",
}


@dataclass(frozen=True)
class CompileBisect:
    """Where a compiled model's difference from eager comes from (`bisect_compile`)."""

    error: float                 # the full compile's relative L2 error to eager, worst output
    stage: str | None = None     # the backend stage that first shows it: eager, aot_eager, ..., inductor
    part: str | None = None      # the subsystem or configuration change whose removal makes it go away
    number: int | None = None    # for a decomposition or lowering: which one, in the order applied
    detail: str | None = None    # its name (e.g. the decomposed op), from PyTorch's bisector
    compiles: int = 0
    seconds: float = 0.0
    bisected: bool = True        # False when nothing was bisected (see `summary`)
    sensitivity: float | None = None   # eager's own output change for inputs moved by float32 rounding
    region: RegionCheck | None = None  # the first divergence's module run eagerly / compiled alone
    region_bisected: bool = False      # the bisector ran on that module alone (its difference is its own)

    def summary(self) -> str:
        found = self._found()
        if self.region is None:
            return found
        if self.region_bisected:
            found += f"; bisected on {self.region.module} alone, with its inputs from the eager run"
        return f"{self.region.summary()}. {found[0].upper()}{found[1:]}"

    def _found(self) -> str:
        runs = f" (found in {self.compiles} compiles, {self.seconds:.0f} s)"
        if not self.bisected:
            if math.isnan(self.error):   # compare found no divergence: the bisector was not run
                return "nothing to bisect: the compiled model does not diverge from eager"
            if self.sensitivity is not None:
                return (f"not bisected: moving the inputs by float32 rounding ({INPUT_NUDGE:g}) already moves eager's "
                        f"outputs by {self.sensitivity:.2g} (relative), against {self.error:.2g} for the compile: the "
                        "model amplifies rounding, so every stage that rounds differently would be blamed. Compare "
                        "with --referee fp64 and look at the first divergence instead")
            return (f"nothing to bisect: the compiled outputs are within float32 rounding of eager "
                    f"(relative error {self.error:.2g})")
        if self.stage is None:
            return (f"the difference (relative error {self.error:.2g}) did not come back when PyTorch's bisector "
                    f"recompiled stage by stage: it depends on something else (a cache, the order of runs){runs}")
        where = _STAGES.get(self.stage, self.stage)
        if self.part is None:
            return f"the difference comes from {where}; no smaller part of it was found{runs}"
        if self.part in _CHANGES:
            return f"the difference comes from {_CHANGES[self.part]}{runs}"
        what = _SUBSYSTEMS.get(self.part, self.part)
        name = f" of {_op_name(self.detail)}" if self.detail else ""
        nth = f" (number {self.number} of those applied)" if self.number is not None else ""
        return f"the difference comes from {what}{name}{nth}: without it the compiled outputs match eager{runs}"

    def to_dict(self) -> dict[str, Any]:
        return {"error": json_number(self.error), "stage": self.stage, "part": self.part, "number": self.number,
                "detail": self.detail, "compiles": self.compiles, "seconds": round(self.seconds, 2),
                "bisected": self.bisected, "sensitivity": json_number(self.sensitivity)
                if self.sensitivity is not None else None,
                "region": self.region.to_dict() if self.region is not None else None,
                "region_bisected": self.region_bisected, "summary": self.summary()}


@dataclass(frozen=True)
class RegionCheck:
    """The first divergence's module taken out of the compile, two ways. `alone`: the module compiled by itself on
    the inputs eager gave it, judged at its own outputs (is the difference in its own compiled code?). `eager`:
    the whole model compiled with that module run eagerly, judged at the model's outputs (does taking it out of
    the compile remove the difference?). Errors are relative L2 errors to eager (the worst output); `alone` is
    set against `at`, the module's own error in the whole compile (the first divergence's)."""

    module: str
    full: float     # the model's outputs, the whole model compiled
    eager: float    # the model's outputs, the module run eagerly and the rest compiled
    alone: float    # the module's outputs, compiled alone on eager's inputs
    at: float       # the module's output, the whole model compiled

    @property
    def inside(self) -> bool:
        """The module's own compiled code parts from eager (alone, on eager's inputs)."""
        return self.alone >= FIXED_SHARE * self.at and self.alone > ROUNDING

    @property
    def removed(self) -> bool:
        """Running the module eagerly (the rest compiled) brings the outputs back to eager."""
        return self.eager <= FIXED_SHARE * self.full

    def summary(self) -> str:
        m = self.module
        alone = (f"compiled alone on the inputs eager gave it, {m} {{}} eager (relative error {self.alone:.2g}, "
                 f"{self.at:.2g} in the whole compile)")
        out = (f"with {m} run eagerly, the rest compiled, the outputs {{}} eager ({self.eager:.2g} against "
               f"{self.full:.2g})")
        if self.inside:
            head = f"{m}'s own compiled code makes the difference: {alone.format('parts from')}"
            tail = (out.format("match") if self.removed
                    else out.format("still part from") + ": other parts of the compile differ too")
        else:
            head = (f"{alone.format('matches')}: it parts in the whole compile from how it is fused with the code "
                    "around it (or the rounding it is handed)")
            tail = (out.format("match") if self.removed
                    else out.format("still part from") + ": later parts of the compile differ too")
        return f"{head}; {tail}"

    def to_dict(self) -> dict[str, Any]:
        return {"module": self.module, "full": json_number(self.full), "eager": json_number(self.eager),
                "alone": json_number(self.alone), "at": json_number(self.at), "inside": self.inside,
                "removed": self.removed, "summary": self.summary()}


def bisect_compile(model: torch.nn.Module, inputs: Sequence[Any], *, backend: str = "inductor",
                   mode: str | None = None, inductor_config: dict[str, Any] | None = None,
                   region: tuple[str, int, float] | None = None) -> CompileBisect:
    """Recompile `model` stage by stage with PyTorch's compiler bisector and say which stage, and which part of
    it, makes its outputs part from eager's when compiled with `backend` (inductor, aot_eager or one of the
    bisector's stages). Every run starts from the same seed; the model runs under no_grad.

    With `region` (the first divergence: its module path, call and relative error), that module is first taken
    out of the compile (`RegionCheck`); when its own compiled code makes the difference, the bisector runs on the
    module alone, on the inputs eager gave that call, so what it turns off is turned off for that region only.

    Each step is a fresh compile (`torch._dynamo.reset()`), with Inductor's and AOT autograd's persistent caches
    off while it runs (they key a compiled graph by the traced graph, not by the configuration being tested).

    Example:
        >>> res = bisect_compile(model, (x,))            # doctest: +SKIP
        >>> res.stage, res.part, res.detail              # doctest: +SKIP
        ('aot_eager_decomp_partition', 'decomposition', "<OpOverload(op='tp_test.rms', overload='default')>")
    """
    with _generators_kept():   # every run starts from SEED; the user's generators go on from where they were
        return _bisect(model, tuple(inputs), backend, mode, inductor_config, region)


def _generators_kept() -> contextlib.AbstractContextManager:
    """torch's CPU generator, and each CUDA device's once CUDA is initialised, as they are now, put back on exit."""
    cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
    return torch.random.fork_rng(devices=list(range(torch.cuda.device_count())) if cuda else [])


def _bisect(model: torch.nn.Module, inputs: tuple, backend: str, mode: str | None,
            inductor_config: dict[str, Any] | None, region: tuple[str, int, float] | None) -> CompileBisect:
    from torch._inductor import compiler_bisector as cb

    if backend not in cb.BACKENDS:
        raise InputError(f"bisect: backend {backend!r} is not one PyTorch's compiler bisector knows "
                         f"({', '.join(cb.BACKENDS)})")
    # the region's module records its inputs in the reference run (bisecting it alone runs it on them)
    with torch.no_grad(), _calls_of(model, region[0] if region and region[0] else None) as calls:
        torch.manual_seed(SEED)
        floats = _float_tensors(model(*inputs))
    if not floats:
        raise InputError("bisect: the model returns no floating-point tensor to compare")
    reference = [t.to(torch.float64) for t in floats]
    share = FIXED_SHARE_16BIT if all(t.dtype in (torch.float16, torch.bfloat16) for t in floats) else FIXED_SHARE
    started, compiles = time.monotonic(), 0

    def error(region_eager: bool = False) -> float:
        nonlocal compiles
        compiles += 1
        stage = cb.CompilerBisector.get_backend() or backend   # while bisecting, the stage it tests
        with _run_eagerly(model, region[0] if region_eager else None):
            return _compile_error(model, inputs, reference, stage, mode)

    import torch._inductor.config as inductor_config_module

    with _fresh_compiles(), inductor_config_module.patch(inductor_config or {}):
        full = error()
        if full <= ROUNDING:
            return CompileBisect(full, compiles=compiles, seconds=time.monotonic() - started, bisected=False)
        # A model whose outputs rounding alone moves as far as the compile did (a vocoder's phase) fails the test
        # at the first stage that rounds otherwise: the bisector would name that stage, not the cause
        moved = _sensitivity(model, inputs, reference)
        if moved is not None and moved > FIXED_SHARE * full:
            return CompileBisect(full, compiles=compiles, seconds=time.monotonic() - started, bisected=False,
                                 sensitivity=moved)
        call_inputs = calls[region[1]] if region and region[0] and region[1] < len(calls) else None
        checked, inner = _check_region(model, call_inputs, region, full, lambda: error(region_eager=True), backend,
                                       mode, inductor_config) if call_inputs is not None else (None, None)
        if checked is not None:
            compiles += 1   # the module compiled alone
        if inner is not None:
            return replace(inner, error=full, compiles=compiles + inner.compiles,
                           seconds=time.monotonic() - started, region=checked, region_bisected=True)
        found = _run_bisector(cb, lambda: error() <= share * full)
    seconds = time.monotonic() - started
    if found is None:
        return CompileBisect(full, compiles=compiles, seconds=seconds, region=checked)
    number = found.bisect_number if found.subsystem in _SUBSYSTEMS else None
    detail = found.debug_info if found.subsystem in _SUBSYSTEMS and found.debug_info else None
    return CompileBisect(full, stage=found.backend, part=found.subsystem, number=number, detail=detail,
                         compiles=compiles, seconds=seconds, region=checked)


def _check_region(model: torch.nn.Module, call_inputs: tuple, region: tuple[str, int, float], full: float,
                  error_with_region_eager: Any, backend: str, mode: str | None,
                  inductor_config: dict[str, Any] | None) -> tuple[RegionCheck, CompileBisect | None]:
    """The region check of the first divergence's module (called with `call_inputs` in the eager run), and, when
    its own compiled code makes the difference, the bisection of that module alone (None when it is not bisected
    there)."""
    path, _call, at = region
    sub = model.get_submodule(path)
    with torch.no_grad():
        torch.manual_seed(SEED)
        own = _float_outputs(sub(*call_inputs))
    alone = _compile_error(sub, call_inputs, own, backend, mode)
    checked = RegionCheck(path, full, error_with_region_eager(), alone, at)
    if not checked.inside:
        return checked, None
    inner = bisect_compile(sub, call_inputs, backend=backend, mode=mode, inductor_config=inductor_config)
    return checked, inner if inner.bisected and inner.stage is not None else None


def _run_bisector(cb: Any, fixed: Any) -> Any:
    """PyTorch's bisector with tensorprobe's Inductor settings added before its lowerings; its finding or None."""
    extra = [cb.ConfigChange("inductor", name, value) for name, value in EXTRA_CHANGES
             if not any(getattr(s, "name", None) == f"inductor_{name}" for s in cb.BACKENDS["inductor"])]
    lowerings = next((i for i, s in enumerate(cb.BACKENDS["inductor"]) if s.name == "lowerings"),
                     len(cb.BACKENDS["inductor"]))
    cb.BACKENDS["inductor"][lowerings:lowerings] = extra
    try:
        with contextlib.redirect_stdout(io.StringIO()):   # the bisector narrates with print()
            return cb.CompilerBisector.do_bisect(fixed)
    finally:
        for change in extra:
            cb.BACKENDS["inductor"].remove(change)
        torch._dynamo.reset()


def _compile_error(model: torch.nn.Module, inputs: tuple, reference: list[torch.Tensor], stage: str,
                   mode: str | None) -> float:
    """`model` compiled afresh with `stage`, run from the seed: its outputs' worst relative error to `reference`
    (inf where it cannot run)."""
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=stage, mode=mode if stage == "inductor" else None)
    with torch.no_grad():
        torch.manual_seed(SEED)
        try:
            got = _float_outputs(compiled(*inputs))
        except Exception:  # noqa: BLE001 - a stage that cannot run this model is not the one that is right
            return math.inf
    return _worst_error(got, reference)


@contextlib.contextmanager
def _run_eagerly(model: torch.nn.Module, path: str | None):
    """The module at `path` run eagerly inside the compiled model (`torch.compiler.disable`: dynamo ends the graph
    before it and starts another after it); nothing changed for path=None."""
    if path is None:
        yield
        return
    sub = model.get_submodule(path)
    sub.forward = torch.compiler.disable(sub.forward)
    try:
        yield
    finally:
        del sub.forward   # the class's forward again (the instance attribute set here is all that is removed)


@contextlib.contextmanager
def _calls_of(model: torch.nn.Module, path: str | None):
    """The positional inputs of each call of the module at `path` while the block runs (copied; None for a call
    with keyword inputs), as a list; empty for path=None or a path the model has no module at."""
    seen: list[tuple | None] = []

    def keep(_module: Any, args: tuple, kwargs: dict) -> None:
        seen.append(tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args) if not kwargs
                    else None)

    try:
        sub = model.get_submodule(path) if path else None
    except AttributeError:
        sub = None
    handle = sub.register_forward_pre_hook(keep, with_kwargs=True) if sub is not None else None
    try:
        yield seen
    finally:
        if handle is not None:
            handle.remove()


def _sensitivity(model: torch.nn.Module, inputs: tuple, reference: list[torch.Tensor]) -> float | None:
    """How far eager's outputs move when the float inputs move by float32 rounding (`INPUT_NUDGE`, relative): the
    larger of two moves, every element scaled alike (a drift, as a sum rounded otherwise makes; a phase integrates
    it) and each element on its own (from a fixed generator). None for a model without float inputs."""
    gen = torch.Generator().manual_seed(SEED)
    moves = []
    for shift in ("drift", "noise"):
        nudged, changed = [], False
        for x in inputs:
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                factor = (torch.ones(x.shape, dtype=torch.float64) if shift == "drift"
                          else torch.randn(x.shape, generator=gen, dtype=torch.float64))
                nudged.append((x.double() * (1 + INPUT_NUDGE * factor.to(x.device))).to(x.dtype))
                changed = changed or not torch.equal(nudged[-1], x)
            else:
                nudged.append(x)
        if not changed:
            continue
        with torch.no_grad():
            torch.manual_seed(SEED)
            moves.append(_worst_error(_float_outputs(model(*nudged)), reference))
    return max(moves) if moves else None


@contextlib.contextmanager
def _fresh_compiles():
    """Inductor's FX graph cache and AOT autograd's cache off: each step must compile what it is testing."""
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
        yield


def _float_tensors(out: Any) -> list[torch.Tensor]:
    """The floating-point tensors of a model's output (tensors, tuples, lists, dicts), detached, in order."""
    if isinstance(out, torch.Tensor):
        return [out.detach()] if out.is_floating_point() else []
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _float_tensors(o)]
    return []


def _float_outputs(out: Any) -> list[torch.Tensor]:
    return [t.to(torch.float64) for t in _float_tensors(out)]


def _worst_error(got: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """The largest relative L2 error over the outputs (inf where shapes differ or NaN appears on one side)."""
    if len(got) != len(reference):
        return math.inf
    worst = 0.0
    for a, b in zip(got, reference):
        if a.shape != b.shape or not torch.equal(torch.isnan(a), torch.isnan(b)):
            return math.inf
        finite = torch.isfinite(b) & torch.isfinite(a)
        den = float(b[finite].norm())
        num = float((a[finite] - b[finite]).norm())
        worst = max(worst, num / den if den > 0 else (0.0 if num == 0 else math.inf))
    return worst


def _op_name(detail: str) -> str:
    """"<OpOverload(op='aten.var_mean', overload='correction')>" -> "aten.var_mean.correction"."""
    m = re.search(r"op='([^']+)', overload='([^']+)'", detail)
    return f"{m.group(1)}.{m.group(2)}" if m else detail


__all__ = ["CompileBisect", "RegionCheck", "bisect_compile"]
