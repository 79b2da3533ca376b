"""Shared `torch.export` plumbing for the runtimes that import an ExportedProgram (ExecuTorch, TVM).

Module taps. A runtime that compiles the whole graph shows only its final output. `TappedModule` wraps a
model so that the output of every submodule call becomes an extra graph output ("mark all", module level):
forward hooks run while `torch.export` traces, so each tapped tensor is a node of the exported graph and the
runtime has to materialise it. Tap names follow the record grammar and the PyTorch module-level capture
(post-order, `path@call` for repeated calls, `path:i` for tuple outputs), so `diff` and `nan` line the two
up with no mapping rules:

    >>> tapped = TappedModule(model)                                     # doctest: +SKIP
    >>> with tapped.hooked():                                            # doctest: +SKIP
    ...     ep = torch.export.export(tapped, inputs)
    >>> tapped.tap_names[:2]                                             # doctest: +SKIP
    ['encode.conv1', 'encode.norm1.norm']

Extra outputs can change what a compiler fuses (a tapped value must be written to memory), never what it
computes: the kernels that produce each value are the same.

Graph rewrites. `rewrite_for_import` applies exact rewrites of an ExportedProgram for importers that lack
an op or an op variant (see `REWRITES`); `check_equivalent` proves them on the actual inputs by running the
rewritten graph in PyTorch.
"""

from __future__ import annotations

import itertools
import math
import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch
from torch.utils._pytree import tree_flatten

from ..modes import eval_mode
from ..errors import InputError
from ..record import ROOT, TAG_RANDOM_REPLACED, record_name


class TappedModule(torch.nn.Module):
    """`model` whose forward returns `(*model outputs, *one output per module call)`.

    Args:
        model: the wrapped module.
        include: a predicate on module paths ("" is the root) deciding which modules are tapped.

    Call it (eagerly, or under `torch.export`) inside `with tapped.hooked():`. After a call, `tap_names`
    holds the record name of each tap, `tap_inputs` the names of the taps each module consumed,
    `tap_slots` the flat output holding each tap's value, and `n_outputs` the number of model outputs.
    """

    def __init__(self, model: torch.nn.Module, include: Callable[[str], bool] | None = None):
        super().__init__()
        self.model = model
        self._include = include or (lambda path: True)
        self._calls: list[_TapCollector] = []  # the forward running now (hooks write to the last one)
        self._key = _new_key(self)

    @property
    def _seen(self) -> dict[str, Any]:
        return _LAST_CALL.get(self._key, {"names": [], "modules": [], "inputs": [], "slots": [], "n_outputs": 0})

    @property
    def tap_names(self) -> list[str]:
        return self._seen["names"]

    @property
    def tap_modules(self) -> list[str]:
        return self._seen["modules"]

    @property
    def tap_inputs(self) -> list[tuple[str, ...]]:
        return self._seen["inputs"]

    @property
    def tap_slots(self) -> list[int]:
        return self._seen["slots"]

    @property
    def n_outputs(self) -> int:
        return self._seen["n_outputs"]

    @contextmanager
    def hooked(self) -> Iterator["TappedModule"]:
        """Hooks on the model's modules for the duration of the block: one per module object, under its
        first path. They are registered here, before any tracing: while torch.export traces, a module
        shared by several parents (Kokoro's AdainResBlk1d blocks share one LeakyReLU) is seen under each
        path, and hooks registered then fired once per path (40 extra outputs on the Kokoro decoder)."""
        handles, hooked = [], set()
        for path, m in self.model.named_modules():
            if id(m) in hooked or not self._include(path):
                continue
            hooked.add(id(m))
            handles.append(m.register_forward_hook(self._hook_for(path)))
        try:
            yield self
        finally:
            for h in handles:
                h.remove()

    def _hook_for(self, path: str):
        def hook(module, hook_args, output):
            if self._calls:
                self._calls[-1].add(path, hook_args, output)
        return hook

    def forward(self, *args: Any) -> tuple[torch.Tensor, ...]:
        tap = _TapCollector()
        self._calls.append(tap)
        try:
            out = self.model(*args)
        finally:
            self._calls.pop()
        flat_out = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        # Each tensor is one program output, however many modules returned it (an Identity, an eval-mode
        # Dropout, a Sequential returning its last child's output): XNNPACK refuses a program returning
        # one value twice. `slots` maps every tap name to the output holding its value.
        slot_of = {id(t): i for i, t in enumerate(flat_out)}
        extra: list[torch.Tensor] = []
        slots = []
        for t in tap.tensors:
            if id(t) not in slot_of:  # every tensor here stays alive, so ids are not reused
                slot_of[id(t)] = len(flat_out) + len(extra)
                extra.append(t)
            slots.append(slot_of[id(t)])
        _LAST_CALL[self._key] = dict(names=tap.names, modules=tap.modules, inputs=tap.inputs, slots=slots,
                                    n_outputs=len(flat_out))
        return (*flat_out, *extra)


# What the latest call of each wrapper saw, by the wrapper's key. Kept outside the module: torch.export
# restores a module's attributes after tracing (and may trace a copy: hence a key, not id()), and the names
# must come from the traced call itself (an eager call can differ in which module outputs are one tensor:
# eval-mode dropout returns its input eagerly, a new value in the traced graph).
_LAST_CALL: dict[int, dict[str, Any]] = {}
_KEYS = itertools.count()


def _new_key(owner: Any) -> int:
    key = next(_KEYS)
    weakref.finalize(owner, _LAST_CALL.pop, key, None)
    return key


class _TapCollector:
    """The taps of one forward call, in the order their modules returned."""

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []
        self.names: list[str] = []
        self.modules: list[str] = []
        self.inputs: list[tuple[str, ...]] = []
        self._calls: dict[str, int] = {}
        self._producer: dict[int, str] = {}

    def add(self, path: str, args: Any, output: Any) -> None:
        call = self._calls.get(path, 0)
        self._calls[path] = call + 1
        flat = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)]
        consumed = tuple(dict.fromkeys(self._producer[id(a)] for a in tree_flatten(args)[0]
                                       if isinstance(a, torch.Tensor) and id(a) in self._producer))
        for i, t in enumerate(flat):
            name = record_name(path, call, output=i if len(flat) > 1 else None)
            self.tensors.append(t)
            self.names.append(name)
            self.modules.append(path)
            self.inputs.append(consumed)
            self._producer[id(t)] = name


@dataclass(frozen=True)
class TapInfo:
    """What the extra outputs of a tapped program are: names, module paths, consumed taps, and which
    flat output holds each name's value (`slots`; several names share one output when modules return
    the same tensor)."""

    names: tuple[str, ...]
    modules: tuple[str, ...]
    inputs: tuple[tuple[str, ...], ...]
    n_outputs: int
    replaced: tuple[int, ...] = ()  # flat outputs that random="zeros" changed
    slots: tuple[int, ...] = ()     # empty: one output per name, after the model's (files of earlier versions)

    @classmethod
    def from_module(cls, tapped: TappedModule) -> "TapInfo":
        return cls(tuple(tapped.tap_names), tuple(tapped.tap_modules), tuple(tapped.tap_inputs), tapped.n_outputs,
                   slots=tuple(tapped.tap_slots))

    @classmethod
    def untapped(cls, n_outputs: int) -> "TapInfo":
        return cls((), (), (), n_outputs)

    @property
    def n_program_outputs(self) -> int:
        """Flat outputs the program returns."""
        return max(self.n_outputs, max(self._slots(), default=-1) + 1)

    def _slots(self) -> tuple[int, ...]:
        return self.slots or tuple(range(self.n_outputs, self.n_outputs + len(self.names)))

    def to_dict(self) -> dict[str, Any]:
        return {"names": list(self.names), "modules": list(self.modules), "inputs": [list(i) for i in self.inputs],
                "n_outputs": self.n_outputs, "replaced": list(self.replaced), "slots": list(self._slots())}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TapInfo":
        return cls(tuple(d["names"]), tuple(d["modules"]), tuple(tuple(i) for i in d["inputs"]), int(d["n_outputs"]),
                   tuple(int(i) for i in d.get("replaced", ())), tuple(int(i) for i in d.get("slots", ())))

    def tags(self, i: int) -> tuple[str, ...]:
        """Record tags of flat output `i`."""
        return (TAG_RANDOM_REPLACED,) if i in self.replaced else ()

    def records(self) -> list[tuple[int, str, str, tuple[str, ...]]]:
        """(flat output index, record name, module path, consumed taps) of every record the program's
        outputs hold, in execution order: the taps as their modules returned, then any model output no
        tap holds (`<root>`, or `<root>:i` for several)."""
        out = [(k, n, m, c) for n, m, c, k in zip(self.names, self.modules, self.inputs, self._slots())]
        held = {k for k, *_ in out}
        for i in range(self.n_outputs):
            if i not in held:
                out.append((i, ROOT if self.n_outputs == 1 else f"{ROOT}:{i}", "", ()))
        held |= set(range(self.n_outputs))
        n = self.n_program_outputs
        return out + [(i, f"program_output.{i}", "", ()) for i in range(n) if i not in held]

    def model_outputs(self) -> list[tuple[int, str]]:
        """(flat output index, model-output record name) of the model's own outputs, named as a PyTorch
        capture names them when the forward returns a tensor (`output`) or a flat tuple (`output.0`, ...)."""
        if self.n_outputs == 1:
            return [(0, "output")]
        return [(i, f"output.{i}") for i in range(self.n_outputs)]


def export_tapped(model: torch.nn.Module, inputs: tuple, *, taps: bool = True) -> tuple[Any, TapInfo]:
    """`torch.export` `model` (wrapped in `TappedModule` when `taps`) in eval mode, every module's training flag
    as it was after; raises InputError if export fails."""
    module: torch.nn.Module = TappedModule(model) if taps else _FlatOutputs(model)
    with eval_mode(module), module.hooked() if taps else nullcontext():
        try:
            ep = torch.export.export(module, tuple(inputs))
        except Exception as e:  # torch.export raises many types; the message is what the user needs
            raise InputError(f"torch.export could not trace {type(model).__name__}: {type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''}") from None
    info = TapInfo.from_module(module) if taps else TapInfo.untapped(module.n_outputs)
    traced = len(ep.graph_signature.user_outputs)
    if traced != info.n_program_outputs:  # the names would land on the wrong outputs
        raise InputError(f"torch.export traced {type(model).__name__} into {traced} outputs, but its tap names "
                         f"cover {info.n_program_outputs}: module taps can't be named; retry with taps=False")
    return ep, info


class _FlatOutputs(torch.nn.Module):
    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model
        self._key = _new_key(self)

    @property
    def n_outputs(self) -> int:
        return _LAST_CALL.get(self._key, {}).get("n_outputs", 0)

    def forward(self, *args: Any) -> tuple[torch.Tensor, ...]:
        flat = [t for t in tree_flatten(self.model(*args))[0] if isinstance(t, torch.Tensor)]
        _LAST_CALL[self._key] = {"n_outputs": len(flat)}
        return tuple(flat)


# ---- exact graph rewrites for importers --------------------------------------------------------------

def _rewrite_mask_assign(graph: Any, node: Any) -> bool:
    """`x[mask] = v` (aten.index_put with one bool mask of x's shape) -> `torch.where(mask, v, x)`.

    Exact: both return v where mask is true and x elsewhere. Only applied when the mask has x's shape
    and `accumulate` is false.
    """
    aten = torch.ops.aten
    x, indices, value = node.args[:3]
    accumulate = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
    if accumulate or len(indices) != 1 or indices[0] is None:
        return False
    mask = indices[0].meta.get("val")
    xv = x.meta.get("val")
    if mask is None or xv is None or mask.dtype != torch.bool or tuple(mask.shape) != tuple(xv.shape):
        return False
    with graph.inserting_before(node):
        w = graph.call_function(aten.where.self, (indices[0], value, x))
    w.meta.update(node.meta)
    node.replace_all_uses_with(w)
    graph.erase_node(node)
    return True


def _rewrite_int_clamp(graph: Any, node: Any) -> bool:
    """`clamp(i, None, hi)` on an integer tensor -> `clamp(i, iinfo.min, hi)` (and likewise for `lo`).

    Exact: no integer lies beyond its dtype's range. Importers that turn a missing bound into ±inf and
    cast it to the integer dtype fail ("Cannot convert infinity"); `F.interpolate(mode="linear")` emits
    such clamps on its index tensors.
    """
    val = node.args[0].meta.get("val")
    if val is None or val.dtype.is_floating_point or val.dtype == torch.bool:
        return False
    args = list(node.args) + [None] * (3 - len(node.args))
    args[1] = node.kwargs.get("min", args[1])
    args[2] = node.kwargs.get("max", args[2])
    if args[1] is not None and args[2] is not None:
        return False
    info = torch.iinfo(val.dtype)
    args[1] = info.min if args[1] is None else args[1]
    args[2] = info.max if args[2] is None else args[2]
    node.args, node.kwargs = tuple(args[:3]), {}
    return True


def _rewrite_random_to_zeros(graph: Any, node: Any) -> bool:
    """`rand`/`randn(_like)` -> `zeros(_like)`. NOT exact in general: applied only on request
    (`random="zeros"`), and `check_equivalent` then proves that the model's output does not depend on it
    (e.g. Kokoro's source module with sine_amp = 0 on unvoiced input multiplies its noise by zero)."""
    target = _RANDOM_TO_ZEROS.get(node.target)
    if target is None:
        return False
    node.target = target
    node.kwargs = {k: v for k, v in node.kwargs.items() if k != "generator"}
    return True


_aten = torch.ops.aten
_RANDOM_TO_ZEROS = {_aten.rand.default: _aten.zeros.default, _aten.randn.default: _aten.zeros.default,
                    _aten.rand_like.default: _aten.zeros_like.default, _aten.randn_like.default: _aten.zeros_like.default}
RANDOM_TO_ZEROS_OPS = frozenset(op.__name__.split(".")[0] for op in _RANDOM_TO_ZEROS)  # "randn_like", ...
REWRITES: dict[str, tuple[Any, Callable[[Any, Any], bool]]] = {
    "mask_assign_to_where": ("index_put", _rewrite_mask_assign),
    "int_clamp_bounds": ("clamp", _rewrite_int_clamp),
}
RANDOM_REWRITE = ("random_to_zeros", ("rand", _rewrite_random_to_zeros))


def rewrite_for_import(ep: Any, *, random: str = "keep") -> tuple[Any, dict[str, int]]:
    """Decompose `ep` to core ATen and apply the rewrites in `REWRITES` (plus random->zeros if asked).

    Returns the rewritten program and how many nodes each rewrite changed.
    """
    ep = ep.run_decompositions()
    rewrites = dict(REWRITES)
    if random == "zeros":
        rewrites[RANDOM_REWRITE[0]] = RANDOM_REWRITE[1]
    counts: dict[str, int] = {}
    graph = ep.graph_module.graph
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        for name, (needle, fn) in rewrites.items():
            if needle in str(node.target) and fn(graph, node):
                counts[name] = counts.get(name, 0) + 1
                break
    graph.lint()
    ep.graph_module.recompile()
    return ep, counts


def check_equivalent(original: Any, rewritten: Any, inputs: tuple, *, n_outputs: int | None = None,
                     rtol: float = 1e-5) -> tuple[int, ...]:
    """Run both programs in PyTorch on `inputs`; raise InputError if a rewrite changed a model output.

    `n_outputs`: how many leading outputs are the model's own. The rest are taps, which may legitimately
    change (Kokoro's source module returns its noise, which the model then drops): their indices are
    returned, so that the records made from them are tagged `random_replaced` and `diff` leaves them out.
    Graph reachability would not do: the noise also flows into the harmonic source, multiplied by zero."""
    with torch.no_grad():
        a = [t for t in tree_flatten(original.module()(*inputs))[0] if isinstance(t, torch.Tensor)]
        b = [t for t in tree_flatten(rewritten.module()(*inputs))[0] if isinstance(t, torch.Tensor)]
    n = len(a) if n_outputs is None else n_outputs
    changed = []
    for i, (x, y) in enumerate(zip(a, b)):
        err, scale = _change(x, y)
        if err > rtol * max(scale, 1e-12):
            if i < n:
                raise InputError(f"the import rewrites changed output {i} of the model in PyTorch (max error "
                                 f"{err:.3g} against scale {scale:.3g}); with random='zeros' the model's output "
                                 "depends on its random ops: give them a fixed source before porting")
            changed.append(i)
    return tuple(changed)


def _change(x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(max abs difference over elements finite on both sides, or inf if the NaN patterns differ; scale)."""
    if x.shape != y.shape or not torch.equal(x.isnan(), y.isnan()):
        return math.inf, 1.0
    if not x.is_floating_point():
        return (0.0 if torch.equal(x, y) else math.inf), 1.0
    finite = x.isfinite() & y.isfinite()
    scale = x[x.isfinite()].abs().max().item() if x.isfinite().any() else 1.0
    err = (x - y)[finite].abs().max().item() if finite.any() else 0.0
    return err, scale


def unsupported_ops_message(runtime: str, ops: list[str], rewrites: dict[str, int]) -> str:
    applied = ", ".join(f"{k} x{v}" for k, v in rewrites.items()) or "none"
    hint = ""
    if any(op.startswith(("rand", "randn")) for op in ops):
        hint = ("; random ops can be replaced by zeros with random='zeros' when the output does not "
                "depend on them (checked)")
    return f"{runtime} cannot import ops {', '.join(sorted(ops))} (rewrites applied: {applied}){hint}"
