"""`isolate`: run each candidate module on the reference's inputs for that call (local error) beside the
two models' own runs (accumulated error). The module docstring of `tensorprobe.isolate` tells how."""

from __future__ import annotations

import os
import re
import time
from dataclasses import replace
from typing import Any, Protocol, Sequence, runtime_checkable

import torch
from torch.utils._pytree import tree_map

from . import passes
from .passes import ModuleCall
from .ascend import ascend, unexplained_start
from .noise import RoundingFloors
from .report import IsolateReport, LayerError
from ..bundle import Bundle
from ..diff.result import Criteria
from ..errors import InputError

CONTAINERS = passes.CONTAINERS

@runtime_checkable
class ModuleRunner(Protocol):
    """Runs the candidate's version of one module on given inputs (PyTorch here; ONNX/ExecuTorch later).

    `has(path)` says whether the candidate has a module at `path` (reference module path); `run` returns
    its outputs (a tensor or a tuple/list/dict of tensors, in the reference module's output structure).
    """

    name: str

    def has(self, module_path: str) -> bool: ...

    def run(self, module_path: str, call: int, inputs: ModuleCall) -> Any: ...


class TorchRunner:
    """`ModuleRunner` over a PyTorch candidate model: module `path` of the candidate, same path names.

    Floating inputs are cast to the candidate module's parameter dtype and device (the model's, for a
    module without parameters); the reference's noise is replayed into the module's random ops.

    Args:
        model: the candidate model (a `torch.compile` wrapper is unwrapped for path lookup).
        transform: optional function applied once to each module before it runs (e.g. `torch.compile`).

    Example:
        >>> runner = TorchRunner(cand_model)                                   # doctest: +SKIP
        >>> runner.run("encode.conv1", 0, ModuleCall((x,), {}))                # doctest: +SKIP
    """

    name = "pytorch"

    def __init__(self, model: torch.nn.Module, transform: Any = None):
        self.model = getattr(model, "_orig_mod", model)
        self.modules = dict(self.model.named_modules())
        self.transform = transform
        self._prepared: dict[str, Any] = {}
        self._targets: dict[str, tuple] = {}
        self.default = _param_dtype_device(self.model)

    def has(self, module_path: str) -> bool:
        return module_path in self.modules

    def cast_inputs(self, module_path: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """Floating tensors cast to the candidate module's parameter dtype and device."""
        target = self._targets.get(module_path)
        if target is None:
            target = self._targets[module_path] = _param_dtype_device(self.modules[module_path], self.default)
        return tree_map(lambda t: _cast(t, *target), (args, kwargs))

    def run(self, module_path: str, call: int, inputs: ModuleCall) -> Any:
        module = self.modules[module_path]
        args, kwargs = self.cast_inputs(module_path, inputs.args, inputs.kwargs)
        fn = self._prepare(module_path, module)
        if not inputs.noise:
            return fn(*args, **kwargs)
        from ..rng import RngReplay
        with RngReplay(list(inputs.noise), cast=True, draws=inputs.draws):
            return fn(*args, **kwargs)

    def _prepare(self, path: str, module: torch.nn.Module) -> Any:
        if self.transform is None:
            return module
        if path not in self._prepared:
            self._prepared[path] = self.transform(module)
        return self._prepared[path]


def _param_dtype_device(module: torch.nn.Module, default: tuple | None = None) -> tuple:
    for t in (*module.parameters(recurse=True), *module.buffers(recurse=True)):
        if t.is_floating_point():
            return t.dtype, t.device
    return default if default is not None else (None, None)


def _cast(t: Any, dtype: torch.dtype | None, device: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    if t.is_floating_point() and dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    if device is not None and t.device != device:
        t = t.to(device)
    return t


# ---------------------------------------------------------------------------------------------------
# Findings


def select_modules(model: torch.nn.Module, modules: str | Sequence[str] | None = None,
                   depth: int | None = None) -> list[str]:
    """Module paths to isolate: leaves by default, a regex, an explicit list, or a cut at `depth`.

    `depth` counts module levels below the root, not counting containers (`ModuleList`, `ModuleDict`):
    depth 1 of the Kokoro decoder is `encode`, `decode.0`..`decode.3`, `F0_conv`, ..., `generator`.
    A regex (searched in the path) then filters that set.

    Example:
        >>> select_modules(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()))
        ['0', '1']
    """
    named = dict(model.named_modules())
    if isinstance(modules, (list, tuple)):
        missing = [m for m in modules if m not in named]
        if missing:
            raise InputError(f"no module {missing[0]!r} in the reference model "
                             f"({len(named)} modules; e.g. {', '.join(list(named)[1:4])})")
        return list(modules)
    levels = {p: _level(p, named) for p in named}
    if depth is not None:
        if depth < 1:
            raise InputError(f"--depth must be >= 1, got {depth}")
        chosen = [p for p, m in named.items() if p and not isinstance(m, CONTAINERS)
                  and (levels[p] == depth or (levels[p] < depth and _is_leaf(m)))]
    else:
        chosen = [p for p, m in named.items() if p and _is_leaf(m) and not isinstance(m, CONTAINERS)]
    if isinstance(modules, str):
        try:
            rx = re.compile(modules)
        except re.error as e:
            raise InputError(f"invalid --modules regex {modules!r}: {e}") from None
        pool = chosen if depth is not None else [p for p, m in named.items() if p and not isinstance(m, CONTAINERS)]
        chosen = [p for p in pool if rx.search(p)]
        if not chosen:
            raise InputError(f"--modules {modules!r} matches no module of the reference model")
    return chosen


def _level(path: str, named: dict[str, torch.nn.Module]) -> int:
    if not path:
        return 0
    parts = path.split(".")
    prefixes = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return sum(1 for p in prefixes if not isinstance(named.get(p), CONTAINERS))


def _is_leaf(m: torch.nn.Module) -> bool:
    return next(m.children(), None) is None


# ---------------------------------------------------------------------------------------------------
# The passes


def isolate(ref_model: torch.nn.Module, cand: torch.nn.Module | ModuleRunner, *inputs: Any,
            modules: str | Sequence[str] | None = None, depth: int | None = None,
            atol: float | None = None, rtol: float | None = None, min_corr: float | None = None,
            min_snr: float | None = None, accumulated: bool | Bundle | str | os.PathLike = True,
            replay_rng: bool | str = True, **kwinputs: Any) -> IsolateReport:
    """Per module call: the candidate's local error (its module on the reference's inputs) and the
    accumulated error (its own run), side by side; names the first layer wrong on its own.

    Args:
        ref_model: the reference PyTorch model.
        cand: the candidate: a PyTorch model with the same module paths (another dtype, patched,
            quantized, rewritten modules), or any `ModuleRunner` (a runtime adapter).
        *inputs, **kwinputs: the forward inputs (given to both models; cast for the candidate).
        modules: None (leaf modules), a regex searched in module paths, or a list of paths.
        depth: isolate the modules at this depth of the tree (see `select_modules`).
        atol, rtol, min_corr, min_snr: criteria, as `tensorprobe.diff` (none given: SNR >= 60 dB).
        accumulated: True runs the candidate model for the accumulated error; a bundle (or path)
            captured from the candidate (keep="full") is compared by record name instead; False skips it.
        replay_rng: give the candidate the reference's randomness: True picks "state" (generator state
            restored per module call; free) for a PyTorch candidate of the reference's dtype, else
            "tensors" (recorded noise replayed); False draws fresh noise.

    Returns:
        An `IsolateReport`: `first_local` names the first layer whose local error alone fails.

    Example:
        >>> r = isolate(ref, cand, asr, f0, n, s, min_snr=80)                    # doctest: +SKIP
        >>> r.first_local, r.layer(r.first_local).verdict                      # doctest: +SKIP
        ('decode.1.conv1', 'local')
    """
    if not isinstance(ref_model, torch.nn.Module):
        raise InputError(f"isolate needs a reference torch.nn.Module, got {type(ref_model).__name__}")
    runner = _runner(cand)
    criteria = Criteria(atol, rtol, min_corr, min_snr)
    floors = RoundingFloors(criteria)
    paths = select_modules(ref_model, modules, depth)
    cand_model = cand if isinstance(cand, torch.nn.Module) else None
    keep = accumulated is not False and (cand_model is not None or accumulated is not True)
    rng = _rng_mode(replay_rng, ref_model, runner)
    t0 = time.perf_counter()
    own, cand_result = None, None
    if cand_model is not None:
        dtype, device = _param_dtype_device(getattr(cand_model, "_orig_mod", cand_model))
        cand_args, cand_kwargs = tree_map(lambda t: _cast(t, dtype, device), (inputs, kwinputs))
    if accumulated is True and cand_model is not None and rng != passes.RNG_TENSORS:
        # Candidate first: its outputs give the accumulated error, and its calls whose inputs equal the
        # reference's need no second run (state replay keeps the generators aligned).
        initial = passes.rng_state()
        own, cand_result = passes.record_candidate(cand_model, paths, cand_args, cand_kwargs,
                                                   initial if rng == passes.RNG_STATE else None)
    ref_pass = passes.ReferencePass(ref_model, paths, runner, criteria, keep=keep and own is None, rng=rng, own=own,
                                    floors=floors, trace=keep)
    ref_pass.run(inputs, kwinputs)
    acc, notes = {}, []
    if accumulated is True and cand_model is None:
        notes.append("no accumulated error: the candidate is not a PyTorch model; pass accumulated=BUNDLE")
    elif accumulated is True and own is None:
        acc, cand_result = passes.candidate_pass(cand_model, ref_pass, cand_args, cand_kwargs, criteria)
    elif accumulated is not True and accumulated is not False:
        bundle = accumulated if isinstance(accumulated, Bundle) else Bundle.open(accumulated)
        acc, notes = passes.accumulated_from_bundle(bundle, ref_pass, criteria)
        cand_result = passes.bundle_model_output(bundle)
    layers = [_merge(x, acc.get(x.name)) for x in ref_pass.layers]
    outputs = _model_outputs(ref_model, paths, ref_pass, cand_result, criteria, floors, len(layers))
    start = unexplained_start([*layers, *outputs]) if ref_pass.trace is not None else None
    found_above = None
    if start is not None:
        def make_pass(chosen: list[str], only: set) -> passes.ReferencePass:
            return passes.ReferencePass(ref_model, chosen, runner, criteria, keep=False, rng=rng, floors=floors,
                                        only=only, stop_at_local=True)
        found_above = ascend(ref_model, runner, inputs, kwinputs, ref_pass, layers, start, make_pass)
    if floors.failed_probes:
        kinds = ", ".join(sorted(set(floors.failed_probes)))
        notes.append(f"the rounding of {len(floors.failed_probes)} module call(s) ({kinds}) could not be measured "
                     f"in float64: judged against one roundoff per element")
    return IsolateReport(
        layers=tuple(layers), criteria=criteria, runner=runner.name,
        first_local=next((x.name for x in layers if x.local_fails), None),
        first_accumulated=next((x.name for x in layers if x.accumulated_fails), None),
        rng=rng, noise_replayed=len(ref_pass.noise) if rng == passes.RNG_TENSORS else ref_pass.rng_calls,
        reused=ref_pass.reused, seconds=time.perf_counter() - t0, notes=tuple(notes), ascent=found_above,
        outputs=outputs)


def _model_outputs(ref_model: torch.nn.Module, paths: list[str], ref_pass: passes.ReferencePass,
                   cand_result: Any, criteria: Criteria, floors: RoundingFloors, order: int) -> tuple[LayerError, ...]:
    """The model's outputs judged (accumulated error), unless the root is itself an isolated module or there
    is no candidate run to compare with. `cand_result`: what the candidate returned, or a candidate bundle's
    model outputs by record name."""
    if cand_result is None or "" in paths:
        return ()
    from ..capture import output_tensors

    cands = cand_result if isinstance(cand_result, passes.NamedOutputs) else dict(output_tensors(cand_result))
    return passes.judge_model_output(output_tensors(ref_pass.result), cands, criteria, floors, order,
                                     type(ref_model).__name__)


def _runner(cand: Any) -> ModuleRunner:
    if isinstance(cand, torch.nn.Module):
        return TorchRunner(cand)
    if isinstance(cand, ModuleRunner):
        return cand
    raise InputError(f"the candidate must be a torch.nn.Module or a ModuleRunner, got {type(cand).__name__}")


def _rng_mode(replay_rng: bool | str, ref_model: torch.nn.Module, runner: ModuleRunner) -> str | None:
    if replay_rng is False or replay_rng is None:
        return None
    if replay_rng in (passes.RNG_STATE, passes.RNG_TENSORS):
        return str(replay_rng)
    if replay_rng is not True:
        raise InputError(f"replay_rng must be True, False, 'state' or 'tensors', got {replay_rng!r}")
    same_dtype = isinstance(runner, TorchRunner) and runner.default[0] == _param_dtype_device(ref_model)[0]
    return passes.RNG_STATE if same_dtype else passes.RNG_TENSORS


def _merge(layer: LayerError, acc: tuple | None) -> LayerError:
    if acc is None:
        return layer
    metrics, reasons, cdtype = acc
    return replace(layer, accumulated=metrics, accumulated_reasons=tuple(reasons),
                   cand_dtype=layer.cand_dtype or cdtype)


compare_tensors = passes.compare_tensors
