"""Looking above the isolated modules: when no isolated module explains where the accumulated error starts.

Isolating leaf modules cannot see error that enters in a parent's own code: `nn.MultiheadAttention` reads
`out_proj.weight` inside `F.multi_head_attention_forward` and never calls `out_proj`; a vocoder block
computes its conv's weight norm and calls `F.conv1d`; a hand-written RNN cell multiplies by its children's
weights. So when the first accumulated failure X has no local failure at or before it, `ascend`:

1. takes the window of the reference run between the last isolated call that still agreed and X, and
   every module call not isolated yet that overlaps it: the calls inside the window and the calls that
   enclose X, up to the whole model;
2. runs them alone on the reference's inputs, in one more reference pass. Calls complete innermost first,
   so the first one that fails locally is the smallest: the pass stops running candidates there;
3. if that call has descendants nobody ran alone (they ran before the window), runs those too, and
   descends into the first that fails, until every call inside the answer passes alone;
4. names what the answer's own code reads: the parameters its ops use outside any child call (a dispatch
   mode watching which parameter storages reach which op), its children that were never called, and,
   for a PyTorch candidate, which of its parameters differ from the reference's.

    >>> report = isolate(ref, port, x)                                          # doctest: +SKIP
    >>> report.ascent.module, report.ascent.direct_params                       # doctest: +SKIP
    ('encoder.layers.2.self_attn', ('in_proj_weight', 'in_proj_bias', 'out_proj.weight', 'out_proj.bias'))
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..diff.noise import WEIGHT_UNITS, dtype_roundoff
from ..hooks import module_hooks
from ..record import record_name
from . import passes
from .noise import dtype_str
from ..rng.draws import is_draw_mismatch

MAX_DESCENTS = 8


@dataclass(frozen=True)
class Ascent:
    """What isolate found above the isolated modules (`IsolateReport.ascent`)."""

    start: str                          # the first accumulated failure no isolated module explained
    tested: tuple = ()                  # LayerError per module call run alone, in completion order
    found: str | None = None            # record name of the smallest call that fails alone
    module: str | None = None           # its module path
    call: int = 0
    module_type: str | None = None
    children: tuple[tuple[str, str], ...] = ()   # (record name, verdict) of its direct child calls
    uncalled: tuple[str, ...] = ()      # its child modules never called in that call (names relative to it)
    direct_params: tuple[str, ...] = ()  # parameters its own code reads (relative names)
    differing_params: tuple[tuple[str, float | None], ...] = ()   # (relative name, relative error or None)
    passes: int = 0
    notes: tuple[str, ...] = field(default=())

    @property
    def layer(self) -> Any:
        return next((x for x in self.tested if x.name == self.found), None)

    def summary(self) -> str:
        if self.found is None:
            around = [x.name for x in self.tested]
            named = ", ".join(around[:3]) + (", …" if len(around) > 3 else "")
            return (f"The accumulated error fails from {self.start} on, yet no module fails alone: not the isolated "
                    f"modules, nor the {len(around)} module call(s) around it ({named}). The difference is "
                    f"rounding amplified along the model, or builds up from local errors each within the noise: "
                    f"diff op-level captures to see where.")
        call = f", call {self.call}" if self.call else ""
        if self.module:
            parts = [f"Error enters inside {self.module} ({self.module_type}{call}), in its own code, not in a child"]
        else:    # the top-level module's own code: the model's forward around its children, never "the loss"
            parts = [f"Error enters in the model's own forward ({self.module_type}.forward{call}), not in a child"]
        failing_children = [n for n, v in self.children if v == "local"]
        if not failing_children:
            words = f"its {len(self.children)} child call(s) pass alone" if self.children else "it calls no child"
            if self.uncalled:
                words += f"; {_list(self.uncalled)} {'is' if len(self.uncalled) == 1 else 'are'} never called"
            parts[0] += f": {words}"
        text = parts[0] + "."
        drawn = next((r for r in (self.layer.local_reasons if self.layer else ()) if is_draw_mismatch(r)), None)
        if drawn:
            text += f" Its random op differs: {drawn}."
        if self.direct_params:
            text += f" Its own code reads {_list(self.direct_params)}."
        differ = [f"{n} (relative error {e:.3g})" if e is not None else f"{n} (shape)" for n, e in self.differing_params]
        if differ:
            text += f" The candidate's {_list(differ)} {'differs' if len(differ) == 1 else 'differ'} from the reference."
        return text

    def to_dict(self) -> dict[str, Any]:
        return {"start": self.start, "found": self.found, "module": self.module, "call": self.call,
                "module_type": self.module_type, "children": [{"name": n, "verdict": v} for n, v in self.children],
                "uncalled": list(self.uncalled), "direct_params": list(self.direct_params),
                "differing_params": [{"name": n, "rel_err": e} for n, e in self.differing_params],
                "passes": self.passes, "notes": list(self.notes), "summary": self.summary(),
                "tested": [x.to_dict() for x in self.tested]}


def _list(items: Any) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def unexplained_start(layers: list) -> Any | None:
    """The first accumulated failure with no local failure at or before it (None: nothing to explain)."""
    for x in layers:
        if x.local_fails:
            return None
        if x.accumulated_fails:
            return x
    return None


def ascend(ref_model: torch.nn.Module, runner: Any, inputs: tuple, kwinputs: dict, leaf_pass: passes.ReferencePass,
           layers: list, start: Any, make_pass: Any) -> Ascent:
    """Find the smallest module call around `start` that fails alone (see the module docstring).

    `layers`: the isolated calls' findings (local and accumulated), in execution order; `leaf_pass` the pass
    that made them (its call trace and generator state).

    `make_pass(paths, only)` returns a fresh `ReferencePass` (same criteria, randomness, floors) that
    compares only the (path, call) pairs in `only` and stops at the first local failure.
    """
    trace = leaf_pass.trace
    x = trace.span(start.module, start.call)
    if x is None:
        return Ascent(start=start.name, notes=("the reference run's module calls were not traced",))
    tested_keys = {(layer.module, layer.call): layer for layer in layers}
    prev = next((x for x in reversed(layers) if x.order < start.order), None)   # the start may be a model output
    prev_span = trace.span(prev.module, prev.call) if prev is not None else None
    begin = prev_span.exit if prev_span is not None else -1
    around = [s for s in trace.spans if s.enter < x.exit and s.exit > begin and s.key not in tested_keys]
    tested: list = []
    n_passes = 0
    found_pass = None
    while around and n_passes <= MAX_DESCENTS:
        p = make_pass(sorted({s.path for s in around}), {s.key for s in around})
        p.run(inputs, kwinputs, leaf_pass.initial_state)
        n_passes += 1
        tested.extend(p.layers)
        for layer in p.layers:
            tested_keys.setdefault((layer.module, layer.call), layer)
        if p.failed is None:
            break
        found_pass = p
        span = trace.span(p.failed[1], p.failed[2])
        # Calls inside it that nobody ran alone (they ran before the window): run them, descend if one fails.
        around = [s for s in trace.within(span) if s.key not in tested_keys] if span is not None else []
    if found_pass is None:
        return Ascent(start=start.name, tested=tuple(tested), passes=n_passes)
    module, path, call, call_inputs = found_pass.failed
    span = trace.span(path, call)
    children = []
    for s in trace.children(span) if span is not None else []:
        layer = tested_keys.get(s.key)
        children.append((record_name(s.path, s.call), _alone(layer)))
    called = {s.path for s in trace.within(span)} if span is not None else set()
    return Ascent(
        start=start.name, tested=tuple(tested), found=record_name(path, call), module=path, call=call,
        module_type=type(module).__name__, children=tuple(children), uncalled=_uncalled(module, path, called),
        direct_params=direct_params(module, *call_inputs), differing_params=_differing(runner, module, path),
        passes=n_passes)


def _alone(layer: Any) -> str:
    """A call's verdict on its own: "local" (fails alone), "ok" (passes alone) or "unknown" (not run alone)."""
    if layer is None or (layer.local is None and not layer.local_fails):
        return "unknown"
    return "local" if layer.local_fails else "ok"


def _uncalled(module: torch.nn.Module, path: str, called: set[str]) -> tuple[str, ...]:
    """Child modules (through containers) not called during the call: their parameters, if used, are read
    by the module's own code."""
    out = []
    prefix = f"{path}." if path else ""
    for name, child in _children_through_containers(module):
        if "parametrizations" in name.split("."):
            continue
        full = prefix + name
        if not any(c == full or c.startswith(full + ".") for c in called):
            out.append(name)
    return tuple(out)


def _children_through_containers(module: torch.nn.Module, prefix: str = "") -> list[tuple[str, torch.nn.Module]]:
    out = []
    for name, child in module.named_children():
        if passes._is_container(child):
            out.extend(_children_through_containers(child, f"{prefix}{name}."))
        else:
            out.append((f"{prefix}{name}", child))
    return out


# ---------------------------------------------------------------------------------------------------
# Which parameters a module's own code reads


class _ParamReads(TorchDispatchMode):
    """Records which parameter storages reach an op while no child module is running."""

    def __init__(self, storages: dict[int, str]):
        super().__init__()
        self.storages = storages
        self.depth = 0
        self.read: dict[str, None] = {}   # ordered set

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.depth == 0:
            for t in tree_flatten((args, kwargs or {}))[0]:
                if isinstance(t, torch.Tensor):
                    name = self.storages.get(_storage(t))
                    if name is not None:
                        self.read.setdefault(name, None)
        return func(*args, **(kwargs or {}))


def _storage(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:   # tensors without storage (subclasses, meta)
        return None


def direct_params(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[str, ...]:
    """The parameters (names relative to `module`) that ops of `module`'s own code read, on these inputs:
    not inside a child module's call (a parametrization of a child's weight counts as the module's code:
    it runs when the module reads the weight).

    Example:
        >>> mha = torch.nn.MultiheadAttention(8, 2)
        >>> x = torch.randn(3, 1, 8)
        >>> direct_params(mha, (x, x, x), {})
        ('in_proj_weight', 'in_proj_bias', 'out_proj.weight', 'out_proj.bias')
    """
    storages = {}
    for name, p in module.named_parameters():
        s = _storage(p)
        if s is not None:
            storages.setdefault(s, name)
    mode = _ParamReads(storages)
    children = [(n, m) for n, m in module.named_modules() if n and "parametrizations" not in n.split(".")
                and not passes._is_container(m)]

    def enter(path: str):
        def hook(*_: Any) -> None:
            mode.depth += 1
        return hook

    def leave(path: str):
        def hook(*_: Any) -> None:
            mode.depth -= 1
        return hook

    state = passes.rng_state()
    handles = []
    try:
        for _, m in children:   # first of the pre-hooks: a weight_norm hook then runs inside the child
            handles.append(m.register_forward_pre_hook(enter(""), prepend=True))
        with module_hooks(children, post=leave, always_call=True), mode, torch.no_grad():
            module(*args, **kwargs)
    except Exception:
        return ()
    finally:
        for h in handles:
            h.remove()
        passes.set_rng_state(state)
    return tuple(mode.read)


def _differing(runner: Any, module: torch.nn.Module, path: str) -> tuple[tuple[str, float | None], ...]:
    """Parameters of the candidate's module that differ from the reference's beyond a dtype conversion."""
    modules = getattr(runner, "modules", None)
    cand = modules.get(path) if isinstance(modules, dict) else None
    if not isinstance(cand, torch.nn.Module):
        return ()
    theirs = dict(cand.named_parameters())
    out = []
    for name, p in module.named_parameters():
        c = theirs.get(name)
        if c is None:
            continue
        if c.shape != p.shape:
            out.append((name, None))
            continue
        r64, c64 = p.detach().cpu().double(), c.detach().cpu().double()
        norm = float(r64.norm())
        rel = float((r64 - c64).norm()) / norm if norm else (0.0 if float(c64.norm()) == 0 else math.inf)
        allowed = WEIGHT_UNITS * max(dtype_roundoff(dtype_str(p)), dtype_roundoff(dtype_str(c))) \
            if p.dtype != c.dtype else 0.0
        if rel > allowed:
            out.append((name, rel))
    return tuple(out)


__all__ = ["Ascent", "ascend", "direct_params", "unexplained_start"]
