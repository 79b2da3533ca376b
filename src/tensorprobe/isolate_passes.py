"""The two passes behind `tensorprobe.isolate` (see `isolate.py` for the API and the findings).

Reference pass: hooks on the selected reference modules clone each call's inputs (pre-hook); when the
call returns (post-hook) the runner runs the candidate's module on them, and the outputs are compared
with diff's metrics: the local error. The reference outputs are kept for the candidate pass, which runs
the candidate model with hooks on the same paths and compares: the accumulated error.

Randomness, two ways:
- "state": the CPU/CUDA generator state is saved before each reference call and restored for the
  candidate's run of the same module (and for the whole candidate pass): free, exact for a PyTorch
  candidate that draws the same way (same dtype, same ops).
- "tensors": a dispatch mode records every random tensor the reference draws; the candidate's module
  gets the ones drawn in the same call (`ModuleCall.noise`, replayed with `rng.RngReplay(cast=True)`).
  Needed for another dtype (torch's float16 randn differs from float32's) and for non-PyTorch runners.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from .bundle import Bundle
from .diff.core import judge
from .diff.metrics import accumulate, evaluate
from .diff.result import Criteria
from .errors import TensorprobeError
from .record import module_label, record_name

_EPS32 = 1.1920929e-07
RNG_STATE = "state"
RNG_TENSORS = "tensors"


def compare_tensors(ref: torch.Tensor, cand: torch.Tensor, criteria: Criteria) -> tuple[dict, tuple[str, ...]]:
    """diff's metrics and verdict reasons for one pair of tensors (float64 accumulation)."""
    r, c = ref.detach(), cand.detach()
    if r.device.type != "cpu" or c.device.type != "cpu":
        r, c = r.cpu(), c.cpu()
    sums = accumulate(r, c, floor=_floor(r), atol=(criteria.atol or 0.0) if criteria.elementwise else math.inf,
                      rtol=criteria.rtol or 0.0)
    metrics = evaluate(sums)
    return metrics, tuple(judge(metrics, sums, criteria))


def _floor(r: torch.Tensor) -> float:
    """float32 eps x the reference's abs-max (NaN/Inf ignored): the denominator floor of max_rel_err."""
    if not (r.is_floating_point() and r.numel()):
        return 1e-30
    a = float(r.abs().amax())
    if not math.isfinite(a):
        a = float(torch.nan_to_num(r.abs(), nan=0.0, posinf=0.0).amax())
    return max(_EPS32 * a, 1e-30)


def dtype_str(t: torch.Tensor) -> str:
    return str(t.dtype).removeprefix("torch.")


# ---------------------------------------------------------------------------------------------------
# Generator state


def rng_state() -> tuple:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.random.get_rng_state(), cuda


def set_rng_state(state: tuple) -> None:
    cpu, cuda = state
    torch.random.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def same_state(a: tuple, b: tuple) -> bool:
    if not torch.equal(a[0], b[0]):
        return False
    return a[1] is None or b[1] is None or all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


class NoiseTap(TorchDispatchMode):
    """Records (clones of) every random tensor drawn while active and not paused, in order."""

    def __init__(self) -> None:
        super().__init__()
        from .capture import RNG_OPS, op_base_name
        self._rng_ops, self._base = RNG_OPS, op_base_name
        self.noise: list[torch.Tensor] = []
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.paused and self._base(func) in self._rng_ops:
            self.noise.extend(t.detach().clone() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor))
        return out


# ---------------------------------------------------------------------------------------------------
# Reference pass


class ReferencePass:
    """Reference forward with hooks; fills `layers` (local error) and `outputs` (kept for accumulated)."""

    def __init__(self, model: torch.nn.Module, paths: list[str], runner: Any, criteria: Criteria,
                 *, keep: bool, rng: str | None):
        from .isolate import ModuleCall
        self.call_type = ModuleCall
        self.model, self.paths, self.runner, self.criteria = model, paths, runner, criteria
        self.keep, self.rng = keep, rng
        self.layers: list[Any] = []
        self.outputs: dict[str, torch.Tensor] = {}
        self.calls: dict[str, int] = {}
        self.frames: list[tuple] = []
        self.tap = NoiseTap() if rng == RNG_TENSORS else None
        self.initial_state: tuple | None = None
        self.rng_calls = 0  # module calls that drew random numbers (state mode)
        self.busy = False   # running the candidate: a module shared by both models must not re-enter

    @property
    def noise(self) -> list[torch.Tensor]:
        return self.tap.noise if self.tap is not None else []

    def run(self, inputs: tuple, kwinputs: dict) -> None:
        named = dict(self.model.named_modules())
        handles = []
        self.initial_state = rng_state()
        try:
            for p in self.paths:
                handles.append(named[p].register_forward_pre_hook(self._pre(p), with_kwargs=True))
                handles.append(named[p].register_forward_hook(self._post(p), always_call=True))
            with torch.no_grad():
                if self.tap is not None:
                    with self.tap:
                        self.model(*inputs, **kwinputs)
                else:
                    self.model(*inputs, **kwinputs)
        finally:
            for h in handles:
                h.remove()

    def _pre(self, path: str):
        def hook(module, args, kwargs):
            if self.busy:
                return
            call = self.calls.get(path, -1) + 1
            self.calls[path] = call
            cargs, ckwargs = tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, (args, kwargs))
            state = rng_state() if self.rng == RNG_STATE else None
            self.frames.append((path, call, cargs, ckwargs, len(self.noise), state))
        return hook

    def _post(self, path: str):
        def hook(module, args, output):
            if self.busy:
                return
            while self.frames and self.frames[-1][0] != path:
                self.frames.pop()  # a child raised
            if not self.frames:
                return
            _, call, cargs, ckwargs, n0, state = self.frames.pop()
            noise = tuple(self.noise[n0:])
            cand_out, note = self._run_candidate(path, call, self.call_type(cargs, ckwargs, noise), state)
            self._compare(path, call, type(module).__name__, output, cand_out, note)
        return hook

    def _run_candidate(self, path: str, call: int, inputs: Any, state: tuple | None) -> tuple[Any, str | None]:
        if not self.runner.has(path):
            return None, f"the candidate ({self.runner.name}) has no module {module_label(path)}"
        after = rng_state() if state is not None else None
        drew = state is not None and not same_state(state, after)
        if drew:
            self.rng_calls += 1
            set_rng_state(state)  # the candidate's module draws what the reference drew in this call
        self.busy = True
        if self.tap is not None:
            self.tap.paused = True
        try:
            with torch.no_grad():
                return self.runner.run(path, call, inputs), None
        except TensorprobeError as e:
            return None, f"replay failed: {e}"
        except Exception as e:  # the candidate's own code fails on the reference inputs: report, go on
            return None, f"the candidate's module raised {type(e).__name__}: {e}"
        finally:
            self.busy = False
            if self.tap is not None:
                self.tap.paused = False
            if drew:
                set_rng_state(after)

    def _compare(self, path: str, call: int, mtype: str, ref_out: Any, cand_out: Any, note: str | None) -> None:
        from .isolate import LayerError
        refs = [t for t in tree_flatten(ref_out)[0] if isinstance(t, torch.Tensor)]
        cands = [t for t in tree_flatten(cand_out)[0] if isinstance(t, torch.Tensor)] if cand_out is not None else None
        if cands is not None and len(cands) != len(refs):
            note, cands = f"the candidate returned {len(cands)} tensors, the reference {len(refs)}", None
        for i, r in enumerate(refs):
            name = record_name(path, call, output=i if len(refs) > 1 else None)
            c = cands[i] if cands is not None else None
            local, reasons, lnote = None, (), note
            if c is not None and tuple(c.shape) != tuple(r.shape):
                lnote = f"shape {tuple(r.shape)} vs candidate {tuple(c.shape)}"
                reasons = (lnote,)
            elif c is not None:
                local, reasons = compare_tensors(r, c, self.criteria)
            if self.keep:
                self.outputs[name] = r.detach().clone()
            self.layers.append(LayerError(
                name=name, module=path, call=call, module_type=mtype, order=len(self.layers),
                shape=tuple(r.shape), dtype=dtype_str(r), cand_dtype=dtype_str(c) if c is not None else None,
                local=local, local_reasons=reasons, note=lnote))


# ---------------------------------------------------------------------------------------------------
# Accumulated error


def accumulated_from_bundle(bundle: Bundle, ref_pass: ReferencePass, criteria: Criteria) -> tuple[dict, list[str]]:
    """Compare the kept reference outputs with a candidate bundle's tensors of the same names."""
    out, missing = {}, 0
    for name, r in ref_pass.outputs.items():
        rec = bundle.get(name)
        if rec is None or not rec.has_tensor:
            missing += 1
            continue
        c = bundle.tensor(name)
        out[name] = _pair(r, c, criteria, rec.dtype)
    notes = [f"{missing} layer(s) have no tensor in the candidate bundle {bundle.path}"] if missing else []
    return out, notes


def _pair(r: torch.Tensor, c: torch.Tensor, criteria: Criteria, cdtype: str) -> tuple:
    if tuple(c.shape) != tuple(r.shape):
        return None, (f"shape {tuple(r.shape)} vs candidate {tuple(c.shape)}",), cdtype
    m, reasons = compare_tensors(r, c, criteria)
    return m, reasons, cdtype


def candidate_pass(model: torch.nn.Module, ref_pass: ReferencePass, args: tuple, kwargs: dict,
                   criteria: Criteria) -> dict[str, tuple]:
    """Run the candidate model with hooks on the same paths; compare each output with the kept reference."""
    named = dict(getattr(model, "_orig_mod", model).named_modules())
    out: dict[str, tuple] = {}
    calls: dict[str, int] = {}

    def post(path: str):
        def hook(module, a, output):
            call = calls.get(path, -1) + 1
            calls[path] = call
            flat = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)]
            for i, c in enumerate(flat):
                name = record_name(path, call, output=i if len(flat) > 1 else None)
                r = ref_pass.outputs.pop(name, None)
                if r is not None:
                    out[name] = _pair(r, c, criteria, dtype_str(c))
        return hook

    handles = [named[p].register_forward_hook(post(p)) for p in ref_pass.paths if p in named]
    after = rng_state()
    try:
        with torch.no_grad():
            if ref_pass.rng == RNG_TENSORS and ref_pass.noise:
                from .rng import RngReplay
                with RngReplay(list(ref_pass.noise), cast=True):
                    model(*args, **kwargs)
            else:
                if ref_pass.rng == RNG_STATE and ref_pass.initial_state is not None:
                    set_rng_state(ref_pass.initial_state)
                model(*args, **kwargs)
    finally:
        set_rng_state(after)
        for h in handles:
            h.remove()
    return out
