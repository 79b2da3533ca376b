"""The two passes behind `tensorprobe.isolate` (see `isolate.py` for the API and the findings).

For a PyTorch candidate (and randomness replayed by generator state, or not at all):
1. `record_candidate`: the candidate's own forward, keeping each selected module call's inputs and outputs.
2. `ReferencePass`: hooks on the reference modules clone each call's inputs (pre-hook); when the call
   returns (post-hook) its output is compared with the candidate's own output of that call (accumulated
   error) and with the candidate module run on the reference's inputs (local error). When the candidate's
   own inputs were identical (every layer before the first divergence) that run is the one from step 1,
   so it is not repeated: cost is ~2x a forward up to the first divergence, ~3x after it.
With recorded-noise replay ("tensors"), or a non-PyTorch runner, the reference pass runs first and keeps
its outputs; `candidate_pass` (or a candidate bundle) then gives the accumulated error.

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
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from ..bundle import Bundle
from ..diff.core import judge
from ..diff.metrics import accumulate, evaluate
from ..diff.result import Criteria
from ..errors import TensorprobeError
from ..hooks import module_hooks, op_base_name
from ..ops import RNG_OPS
from ..record import module_label, record_name
from ..rng.draws import Draw, draw_of_call, draws_differ_words
from .noise import RoundingFloors, dtype_str, rounding_units
from .report import LayerError


@dataclass(frozen=True)
class ModuleCall:
    """What a runner gets for one module call: the reference's inputs, the noise it drew and what each of those
    tensors draws (`rng.draws.Draw`; a replay refuses to feed a tensor to another kind of draw)."""

    args: tuple
    kwargs: dict
    noise: tuple[torch.Tensor, ...] = ()
    draws: tuple[Any, ...] = ()

_EPS32 = 1.1920929e-07
RNG_STATE = "state"
RNG_TENSORS = "tensors"


def compare_tensors(ref: torch.Tensor, cand: torch.Tensor, criteria: Criteria,
                    noise_floor: Callable[[float | None], float | None] | None = None) -> tuple[dict, tuple[str, ...]]:
    """diff's metrics and verdict reasons for one pair of tensors (float64 accumulation).

    Under the noise rule (no threshold in `criteria`) `noise_floor(rel_l2_err)` gives the pair's rounding
    floor (`isolate.noise`); without one, nothing fails but non-finite mismatches."""
    r, c = ref.detach(), cand.detach()
    if r.device.type != "cpu" or c.device.type != "cpu":
        r, c = r.cpu(), c.cpu()
    sums = accumulate(r, c, floor=_floor(r), atol=(criteria.atol or 0.0) if criteria.elementwise else math.inf,
                      rtol=criteria.rtol or 0.0)
    metrics = evaluate(sums)
    floor = noise_floor(metrics.get("rel_l2_err")) if (criteria.noise and noise_floor is not None) else None
    if floor is not None:
        metrics["noise_floor"] = floor
    return metrics, tuple(judge(metrics, sums, criteria, floor))


def _floor(r: torch.Tensor) -> float:
    """float32 eps x the reference's abs-max (NaN/Inf ignored): the denominator floor of max_rel_err."""
    if not (r.is_floating_point() and r.numel()):
        return 1e-30
    lo, hi = torch.aminmax(r)  # one pass, no temporary
    a = max(-float(lo), float(hi))
    if not math.isfinite(a):
        a = float(torch.nan_to_num(r.abs(), nan=0.0, posinf=0.0).amax())
    return max(_EPS32 * a, 1e-30)




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
    """Records (clones of) every random tensor drawn while active and not paused, in order, and what each draws
    (`draws`; with keep=False only that)."""

    def __init__(self, keep: bool = True) -> None:
        super().__init__()
        self._rng_ops, self._base = RNG_OPS, op_base_name
        self.noise: list[torch.Tensor] = []
        self.draws: list[Draw | None] = []
        self.keep = keep
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.paused and self._base(func) in self._rng_ops:
            drawn = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            d = draw_of_call(func, args, kwargs or {})
            self.draws.extend(d.with_kind(t.dtype) if d is not None else None for t in drawn)
            if self.keep:
                self.noise.extend(t.detach().clone() for t in drawn)
        return out


# ---------------------------------------------------------------------------------------------------
# Candidate first: its own run, per module call


class OwnCall:
    """One module call of the candidate's own run: its inputs (by reference, with their version counters:
    an input modified in place later no longer counts as seen), generator state and outputs (clones)."""

    __slots__ = ("args", "kwargs", "versions", "state", "outputs")

    def __init__(self, args: tuple, kwargs: dict, state: tuple | None):
        self.args, self.kwargs, self.state = args, kwargs, state
        self.versions = [t._version for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        self.outputs: list[torch.Tensor] | None = None

    def intact(self) -> bool:
        now = [t._version for t in tree_flatten((self.args, self.kwargs))[0] if isinstance(t, torch.Tensor)]
        return now == self.versions


def record_candidate(model: torch.nn.Module, paths: list[str], args: tuple, kwargs: dict,
                     initial_state: tuple | None) -> tuple[dict[tuple[str, int], OwnCall], Any]:
    """Run the candidate model once, keeping each selected module call's inputs and outputs; returns them
    and the model's output.

    With `initial_state` (the generator state now), the generators are put back to it afterwards, so
    the reference pass draws the same noise; without it, the reference draws fresh noise.

    The reference pass then gets the accumulated error from these outputs, and skips re-running a
    candidate module whose own inputs (and generator state) equal the reference's: its local output is
    the one already computed. Before the first divergence that is every layer.
    """
    named = dict(getattr(model, "_orig_mod", model).named_modules())
    calls: dict[str, int] = {}
    own: dict[tuple[str, int], OwnCall] = {}
    stack: list[OwnCall] = []

    def pre(path: str):
        def hook(module, a, kw):
            call = calls.get(path, -1) + 1
            calls[path] = call
            entry = own[(path, call)] = OwnCall(a, kw, rng_state() if initial_state is not None else None)
            stack.append(entry)
        return hook

    def post(path: str):
        def hook(module, a, output):
            if stack:
                stack.pop().outputs = [t.detach().clone() for t in tree_flatten(output)[0]
                                       if isinstance(t, torch.Tensor)]
        return hook

    try:
        with module_hooks(((p, named[p]) for p in paths if p in named), pre=pre, post=post, pre_kwargs=True,
                          always_call=True), torch.no_grad():
            output = model(*args, **kwargs)
    finally:
        if initial_state is not None:
            set_rng_state(initial_state)  # the reference then draws what the candidate drew
    return own, output


def same_inputs(runner: Any, path: str, entry: OwnCall, args: tuple, kwargs: dict, state: tuple | None) -> bool:
    """Did the candidate's own call of `path` get exactly the reference's inputs (cast as the runner casts)?"""
    if entry.outputs is None or not hasattr(runner, "cast_inputs") or not entry.intact():
        return False
    if (state is None) != (entry.state is None) or (state is not None and not same_state(state, entry.state)):
        return False
    mine = tree_flatten(runner.cast_inputs(path, args, kwargs))[0]
    theirs = tree_flatten((entry.args, entry.kwargs))[0]
    if len(mine) != len(theirs):
        return False
    for x, y in zip(mine, theirs):
        if isinstance(x, torch.Tensor) or isinstance(y, torch.Tensor):
            if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.dtype == y.dtype
                    and x.shape == y.shape and torch.equal(x, y)):
                return False
        elif type(x) is not type(y) or not _eq(x, y):
            return False
    return True


def _eq(x: Any, y: Any) -> bool:
    try:
        return bool(x == y)
    except Exception:
        return False


# ---------------------------------------------------------------------------------------------------
# Reference pass


class CallSpan:
    """One module call of the reference run: where it starts and ends in the sequence of call events, and
    the call that encloses it."""

    __slots__ = ("path", "call", "enter", "exit", "parent")

    def __init__(self, path: str, call: int, enter: int, parent: int | None):
        self.path, self.call, self.enter, self.parent = path, call, enter, parent
        self.exit = -1

    @property
    def key(self) -> tuple[str, int]:
        return self.path, self.call

    def __repr__(self) -> str:
        return f"CallSpan({self.path!r}@{self.call}, {self.enter}..{self.exit})"


class CallTrace:
    """Every module call of the reference run, nested (for looking above the isolated modules)."""

    def __init__(self) -> None:
        self.spans: list[CallSpan] = []
        self.index: dict[tuple[str, int], int] = {}
        self._calls: dict[str, int] = {}
        self._stack: list[int] = []
        self._seq = 0

    def enter(self, path: str) -> None:
        call = self._calls.get(path, -1) + 1
        self._calls[path] = call
        span = CallSpan(path, call, self._seq, self._stack[-1] if self._stack else None)
        self._seq += 1
        self.index[span.key] = len(self.spans)
        self._stack.append(len(self.spans))
        self.spans.append(span)

    def leave(self, path: str) -> None:
        while self._stack and self.spans[self._stack[-1]].path != path:
            self._stack.pop()   # a call that raised
        if self._stack:
            self.spans[self._stack.pop()].exit = self._seq
            self._seq += 1

    def span(self, path: str, call: int) -> CallSpan | None:
        i = self.index.get((path, call))
        return None if i is None else self.spans[i]

    def within(self, outer: CallSpan) -> list[CallSpan]:
        """The calls made inside `outer` (at any depth)."""
        return [s for s in self.spans if outer.enter < s.enter and s.exit < outer.exit]

    def children(self, outer: CallSpan) -> list[CallSpan]:
        i = self.index[outer.key]
        return [s for s in self.spans if s.parent == i]


class ReferencePass:
    """Reference forward with hooks; fills `layers` (local error) and `outputs` (kept for accumulated).

    `only`: compare only these (path, call) pairs (the other calls of those paths run untouched);
    `stop_at_local`: once a call fails locally, run no more candidates (isolate's ascent: calls complete
    innermost first, so the first failure is the smallest); `trace`: record every module call of the run.
    """

    def __init__(self, model: torch.nn.Module, paths: list[str], runner: Any, criteria: Criteria,
                 *, keep: bool, rng: str | None, own: dict[tuple[str, int], OwnCall] | None = None,
                 floors: RoundingFloors | None = None, only: set[tuple[str, int]] | None = None,
                 stop_at_local: bool = False, trace: bool = False):
        self.call_type = ModuleCall
        self.model, self.paths, self.runner, self.criteria = model, paths, runner, criteria
        self.keep, self.rng = keep, rng
        self.floors = floors or RoundingFloors(criteria)
        self.only, self.stop_at_local = only, stop_at_local
        self.trace = CallTrace() if trace else None
        self.layers: list[Any] = []
        self.outputs: dict[str, torch.Tensor] = {}
        self.calls: dict[str, int] = {}
        self.frames: list[tuple] = []
        self.tap = NoiseTap() if rng == RNG_TENSORS else None
        self.initial_state: tuple | None = None
        self.rng_calls = 0  # module calls that drew random numbers (state mode)
        self.busy = False   # running the candidate: a module shared by both models must not re-enter
        self.own = own      # the candidate's own run per call (record_candidate), when it ran first
        self.reused = 0     # module calls whose local result is the candidate's own (identical inputs)
        self.failed: tuple | None = None  # (module, path, call, args, kwargs) of the first local failure
        self.result: Any = None   # what the reference model returned

    @property
    def noise(self) -> list[torch.Tensor]:
        return self.tap.noise if self.tap is not None else []

    @property
    def draws(self) -> list[Draw | None]:
        return self.tap.draws if self.tap is not None else []

    def run(self, inputs: tuple, kwinputs: dict, initial_state: tuple | None = None) -> None:
        named = dict(self.model.named_modules())
        if initial_state is not None:
            set_rng_state(initial_state)
        self.initial_state = rng_state()
        traced = ((p, m) for p, m in named.items() if not _is_container(m)) if self.trace is not None else ()
        with module_hooks(traced, pre=self._trace_enter, post=self._trace_leave, always_call=True), \
                module_hooks(((p, named[p]) for p in self.paths), pre=self._pre, post=self._post, pre_kwargs=True,
                             post_kwargs=True, always_call=True), torch.no_grad():
            if self.tap is not None:
                with self.tap:
                    self.result = self.model(*inputs, **kwinputs)
            else:
                self.result = self.model(*inputs, **kwinputs)

    def _trace_enter(self, path: str):
        def hook(module, args):
            if not self.busy:
                self.trace.enter(path)
        return hook

    def _trace_leave(self, path: str):
        def hook(module, args, output):
            if not self.busy:
                self.trace.leave(path)
        return hook

    def _pre(self, path: str):
        def hook(module, args, kwargs):
            if self.busy:
                return
            call = self.calls.get(path, -1) + 1
            self.calls[path] = call
            if (self.only is not None and (path, call) not in self.only) or self.failed is not None \
                    and self.stop_at_local:
                self.frames.append((path, call, None, None, 0, None, None, None))   # not compared
                return
            state = rng_state() if self.rng != RNG_TENSORS else None   # also to re-run it for its rounding
            entry = self.own.pop((path, call), None) if self.own is not None else None
            if entry is not None and same_inputs(self.runner, path, entry, args, kwargs,
                                                 state if self.rng == RNG_STATE else None):
                # The candidate's own call saw exactly these inputs: its output is the local result.
                self.frames.append((path, call, None, None, len(self.noise), state, entry, True))
                return
            cargs, ckwargs = tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, (args, kwargs))
            self.frames.append((path, call, cargs, ckwargs, len(self.noise), state, entry, False))
        return hook

    def _post(self, path: str):
        def hook(module, args, kwargs, output):
            if self.busy:
                return
            while self.frames and self.frames[-1][0] != path:
                self.frames.pop()  # a child raised
            if not self.frames:
                return
            _, call, cargs, ckwargs, n0, state, entry, reuse = self.frames.pop()
            if reuse is None or output is None or (self.stop_at_local and self.failed is not None):
                return
            mtype = type(module).__name__
            drew = state is not None and not same_state(state, rng_state())
            replay = _Replay(self, state, drew, n0)
            if reuse:
                self.reused += 1
                inputs = (args, kwargs)   # the reference's own (the candidate's were cast to its dtype)
                self._compare(module, path, call, mtype, output, entry.outputs, None, inputs, replay,
                              own=entry, reused=True)
                return
            noise, draws = tuple(self.noise[n0:]), tuple(self.draws[n0:])
            replayed = state if self.rng == RNG_STATE else None
            cand_out, note = self._run_candidate(path, call, self.call_type(cargs, ckwargs, noise, draws), replayed,
                                                 drew and replayed is not None)
            self._compare(module, path, call, mtype, output, cand_out, note, (cargs, ckwargs), replay, own=entry)
        return hook

    def _run_candidate(self, path: str, call: int, inputs: Any, state: tuple | None,
                       drew: bool, watch: NoiseTap | None = None) -> tuple[Any, str | None]:
        if not self.runner.has(path):
            return None, f"the candidate ({self.runner.name}) has no module {module_label(path)}"
        after = rng_state() if state is not None else None
        if drew:
            self.rng_calls += 1
            set_rng_state(state)  # the candidate's module draws what the reference drew in this call
        try:
            with self.paused(), torch.no_grad(), (watch if watch is not None else nullcontext()):
                return self.runner.run(path, call, inputs), None
        except TensorprobeError as e:
            return None, f"replay failed: {e}"
        except Exception as e:  # the candidate's own code fails on the reference inputs: report, go on
            return None, f"the candidate's module raised {type(e).__name__}: {e}"
        finally:
            if drew:
                set_rng_state(after)

    def paused(self) -> "_Paused":
        """While running something other than the reference's own forward: no hooks, no noise recorded."""
        return _Paused(self)

    def _compare(self, module: torch.nn.Module, path: str, call: int, mtype: str, ref_out: Any, cand_out: Any,
                 note: str | None, inputs: tuple, replay: "_Replay", own: OwnCall | None = None,
                 reused: bool = False) -> None:
        refs = [t for t in tree_flatten(ref_out)[0] if isinstance(t, torch.Tensor)]
        owns = own.outputs if own is not None and own.outputs is not None and len(own.outputs) == len(refs) else None
        cands = [t for t in tree_flatten(cand_out)[0] if isinstance(t, torch.Tensor)] if cand_out is not None else None
        if cands is not None and len(cands) != len(refs):
            note, cands = f"the candidate returned {len(cands)} tensors, the reference {len(refs)}", None
        measured: list = []
        drawn: list = []

        def units(i: int) -> float | None:   # the reference module's rounding on these inputs, measured once
            if not measured:
                measured.extend(self._measure(module, inputs, refs, replay))
            return measured[i]

        def draws_differ() -> tuple[str, ...]:   # a failing call that draws: does it draw what the reference does?
            if not drawn:
                drawn.append(self._draws_differ(module, path, call, inputs, replay))
            return drawn[0]

        for i, r in enumerate(refs):
            name = record_name(path, call, output=i if len(refs) > 1 else None)
            c = cands[i] if cands is not None else None
            local, reasons, lnote = None, (), note
            if c is not None and tuple(c.shape) != tuple(r.shape):
                lnote = f"shape {tuple(r.shape)} vs candidate {tuple(c.shape)}"
                reasons = (lnote,)
            elif c is not None:
                local, reasons = compare_tensors(
                    r, c, self.criteria, lambda rel, r=r, c=c, i=i: self.floors.local(rel, r, c, module,
                                                                                      lambda: units(i)))
            acc: dict = {}
            if owns is not None:
                pair = (local, reasons, dtype_str(c)) if reused else _pair(
                    r, owns[i], self.criteria, dtype_str(owns[i]), self.floors.accumulated(len(self.layers), r, owns[i]))
                acc = dict(accumulated=pair[0], accumulated_reasons=tuple(pair[1]))
            elif self.keep:
                self.outputs[name] = r.detach().clone()
            if reasons:
                reasons = draws_differ() + tuple(reasons)
            if reasons and self.failed is None:
                self.failed = (module, path, call, inputs)
            self.layers.append(LayerError(
                name=name, module=path, call=call, module_type=mtype, order=len(self.layers),
                shape=tuple(r.shape), dtype=dtype_str(r), cand_dtype=dtype_str(c) if c is not None else None,
                local=local, local_reasons=reasons, note=lnote, **acc))

    def _draws_differ(self, module: torch.nn.Module, path: str, call: int, inputs: tuple,
                      replay: "_Replay") -> tuple[str, ...]:
        """For a call that fails and drew random numbers: the words when the candidate's module draws another
        distribution or parameters than the reference's (`rng.draws`), found by running it once more, watched."""
        if not (replay.drew or replay.n1 > replay.n0) or not self.runner.has(path):
            return ()
        with self.paused():
            theirs = replay.draws(module, inputs)
        if not theirs:
            return ()
        watch = NoiseTap(keep=False)
        noise, draws = tuple(self.noise[replay.n0:replay.n1]), tuple(self.draws[replay.n0:replay.n1])
        state = replay.state if self.rng == RNG_STATE else None
        reseed = replay.drew and state is not None
        self._run_candidate(path, call, self.call_type(inputs[0], inputs[1], noise, draws), state, reseed, watch)
        self.rng_calls -= reseed    # counted once, by the run that was compared
        words = draws_differ_words(watch.draws, theirs)
        return (words,) if words else ()

    def _measure(self, module: torch.nn.Module, inputs: tuple, refs: list[torch.Tensor],
                 replay: "_Replay") -> list[float | None]:
        self.floors.probes += 1
        with self.paused():
            noise = replay.noise(module, inputs)
            out = rounding_units(module, inputs[0], inputs[1], refs, noise)
        if all(u is None for u in out):
            self.floors.failed_probes.append(type(module).__name__)
        return out


class _Paused:
    def __init__(self, ref_pass: ReferencePass):
        self.p = ref_pass

    def __enter__(self) -> None:
        self.p.busy = True
        if self.p.tap is not None:
            self.p.tap.paused = True

    def __exit__(self, *exc: Any) -> None:
        self.p.busy = False
        if self.p.tap is not None:
            self.p.tap.paused = False


class _Replay:
    """The random numbers one reference call drew, for re-running it (recorded, or regenerated from the
    generator state it started from)."""

    def __init__(self, ref_pass: ReferencePass, state: tuple | None, drew: bool, n0: int):
        self.p, self.state, self.drew, self.n0 = ref_pass, state, drew, n0
        self.n1 = len(ref_pass.noise)

    def noise(self, module: torch.nn.Module, inputs: tuple) -> list[torch.Tensor] | None:
        if self.p.tap is not None:
            return list(self.p.noise[self.n0:self.n1]) or None
        tap = self._rerun(module, inputs, keep=True)
        return tap.noise if tap is not None else None

    def draws(self, module: torch.nn.Module, inputs: tuple) -> list[Draw | None] | None:
        """What the reference's call drew (recorded, or seen again by re-running it from its generator state)."""
        if self.p.tap is not None:
            return list(self.p.draws[self.n0:self.n1]) or None
        tap = self._rerun(module, inputs, keep=False)
        return tap.draws if tap is not None else None

    def _rerun(self, module: torch.nn.Module, inputs: tuple, keep: bool) -> NoiseTap | None:
        if not self.drew:
            return None
        after = rng_state()
        tap = NoiseTap(keep)
        try:
            set_rng_state(self.state)
            with tap, torch.no_grad():
                module(*inputs[0], **inputs[1])
        except Exception:
            return None
        finally:
            set_rng_state(after)
        return tap


CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.ParameterList, torch.nn.ParameterDict)


def _is_container(m: torch.nn.Module) -> bool:
    """Containers hold modules but are never called: not a module call, not a level of the tree."""
    return isinstance(m, CONTAINERS)


# ---------------------------------------------------------------------------------------------------
# Accumulated error


def accumulated_from_bundle(bundle: Bundle, ref_pass: ReferencePass, criteria: Criteria) -> tuple[dict, list[str]]:
    """Compare the kept reference outputs with a candidate bundle's tensors of the same names."""
    out, missing = {}, 0
    order = {x.name: x.order for x in ref_pass.layers}
    for name, r in ref_pass.outputs.items():
        rec = bundle.get(name)
        if rec is None or not rec.has_tensor:
            missing += 1
            continue
        c = bundle.tensor(name)
        out[name] = _pair(r, c, criteria, rec.dtype, ref_pass.floors.accumulated(order.get(name, 0), r, c))
    notes = [f"{missing} layer(s) have no tensor in the candidate bundle {bundle.path}"] if missing else []
    return out, notes


def _pair(r: torch.Tensor, c: torch.Tensor, criteria: Criteria, cdtype: str, floor: float | None = None) -> tuple:
    if tuple(c.shape) != tuple(r.shape):
        return None, (f"shape {tuple(r.shape)} vs candidate {tuple(c.shape)}",), cdtype
    m, reasons = compare_tensors(r, c, criteria, lambda rel: floor)
    return m, reasons, cdtype


def candidate_pass(model: torch.nn.Module, ref_pass: ReferencePass, args: tuple, kwargs: dict,
                   criteria: Criteria) -> tuple[dict[str, tuple], Any]:
    """Run the candidate model with hooks on the same paths; compare each output with the kept reference.
    Returns those comparisons and the model's output."""
    named = dict(getattr(model, "_orig_mod", model).named_modules())
    out: dict[str, tuple] = {}
    calls: dict[str, int] = {}
    order = {x.name: x.order for x in ref_pass.layers}

    def post(path: str):
        def hook(module, a, output):
            call = calls.get(path, -1) + 1
            calls[path] = call
            flat = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)]
            for i, c in enumerate(flat):
                name = record_name(path, call, output=i if len(flat) > 1 else None)
                r = ref_pass.outputs.pop(name, None)
                if r is not None:
                    out[name] = _pair(r, c, criteria, dtype_str(c),
                                      ref_pass.floors.accumulated(order.get(name, 0), r, c))
        return hook

    after = rng_state()
    try:
        with module_hooks(((p, named[p]) for p in ref_pass.paths if p in named), post=post), torch.no_grad():
            if ref_pass.rng == RNG_TENSORS and ref_pass.noise:
                from ..rng import RngReplay
                with RngReplay(list(ref_pass.noise), cast=True, draws=ref_pass.draws):
                    output = model(*args, **kwargs)
            else:
                if ref_pass.rng == RNG_STATE and ref_pass.initial_state is not None:
                    set_rng_state(ref_pass.initial_state)
                output = model(*args, **kwargs)
    finally:
        set_rng_state(after)
    return out, output


# ---------------------------------------------------------------------------------------------------
# The model's output


class NamedOutputs(dict):
    """A candidate's model outputs by record name (`output`, `output.0`, ...), as a bundle holds them."""


def judge_model_output(refs: list[tuple[str, torch.Tensor]], cands: dict[str, torch.Tensor], criteria: Criteria,
                       floors: RoundingFloors, order: int, module_type: str) -> tuple[LayerError, ...]:
    """The model's own outputs (`refs`, by model-output record name), reference against the candidate's own
    run (accumulated error only): error made in the root's forward after its last child call shows nowhere
    else. A name the candidate lacks fails with a note."""
    out = []
    for i, (name, r) in enumerate(refs):
        c = cands.get(name)
        acc, reasons, note = None, (), None
        if c is None:
            note = "the candidate returned no tensor of this name"
            reasons = (note,)
        else:
            acc, reasons, _ = _pair(r, c, criteria, dtype_str(c), floors.accumulated(order, r, c))
        out.append(LayerError(name=name, module="", call=0, module_type=module_type, order=order + i,
                              shape=tuple(r.shape), dtype=dtype_str(r),
                              cand_dtype=dtype_str(c) if c is not None else None, accumulated=acc,
                              accumulated_reasons=tuple(reasons), note=note))
    return tuple(out)


def bundle_model_output(bundle: Bundle) -> NamedOutputs | None:
    """A captured candidate's model outputs by record name (None when the bundle kept none)."""
    from ..record import KIND_MODEL_OUTPUT

    out = NamedOutputs((rec.name, bundle.tensor(rec.name)) for rec in bundle.records
                       if rec.kind == KIND_MODEL_OUTPUT and rec.has_tensor)
    return out or None
