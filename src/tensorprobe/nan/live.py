"""`find_first_nonfinite`: run a torch model once and stop at the op where NaN or Inf is born.

The forward runs under a `TorchDispatchMode` that checks every op output (a sum per output: finite sum ⇒
all finite; only a non-finite sum pays for an exact check). The first op whose output holds a non-finite
value while its inputs were finite is the origin. The forward then goes on just long enough to show how the
damage spreads (module outputs, until one is entirely non-finite), and stops.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import replace
from typing import Any, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..errors import InputError
from ..hooks import ModuleStack, module_hooks, op_base_name, op_tensors, user_source_line
from ..ops import ALIAS_OPS, canonical_op
from ..record import module_label, record_name
from ..stats import TensorStats, compute_stats
from .computation import MAX_DEPTH, OpNode
from .diagnose import Evidence, diagnose
from .masks import MaskSources, constant_mask_value, is_elementwise, mask_output_text, new_infinities
from .origin import (CAUSE_MASK_OUTPUT, CAUSE_MODEL_INPUT, CAUSE_OP, CAUSE_PARAMETER, CAUSE_UNTRACKED, NanOrigin,
                     Spread, TensorSummary)

MAX_PROPAGATION = 12
# Ops remembered for the diagnosis (what made the origin's inputs): a variance is a handful of ops before its
# rsqrt, so a window keeps memory flat however long the forward runs.
OPS_REMEMBERED = 512


class _Stop(Exception):
    """Raised inside the forward to end it once the finding is complete."""


def _has_nonfinite(t: torch.Tensor) -> bool:
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return False
    s = t.sum(dtype=torch.float32) if t.dtype in (torch.float16, torch.bfloat16) else t.sum()
    if math.isfinite(abs(s.item())):
        return False
    return not bool(torch.isfinite(t).all())  # a large finite sum can overflow: check exactly


class _OpGraph:
    """Which op made each live tensor, for the last `OPS_REMEMBERED` ops, with the ops they read: enough to
    tell how the origin's inputs were computed (`computation.OpNode`) without keeping the forward's graph.

    Tensors are known by `id()` with a weak reference that proves the id was not reused by a newer tensor
    (~1.5 µs an op, against ~7 µs for torch's WeakTensorKeyDictionary); entries leave with their op."""

    def __init__(self) -> None:
        self.made: dict[int, tuple[int, Any]] = {}   # id(tensor) -> (op id, weakref to the tensor)
        # op id -> (canonical op, ids of the ops that made its inputs, every input is one tensor, output keys)
        self.ops: dict[int, tuple[str, tuple[int | None, ...], bool, list[int]]] = {}

    def ids(self, tensors: list[torch.Tensor]) -> tuple[int | None, ...]:
        made = self.made
        out = []
        for t in tensors:
            e = made.get(id(t))
            out.append(e[0] if e is not None and e[1]() is t else None)
        return tuple(out)

    def add(self, op_id: int, base: str, inputs: list[torch.Tensor], ids: tuple[int | None, ...],
            outputs: list[torch.Tensor]) -> None:
        if base in ALIAS_OPS:   # a view is its source's value
            source = self.ops.get(ids[0]) if ids and ids[0] is not None else None
            if source is not None:
                self._mark(ids[0], source[3], outputs)
            return
        keys: list[int] = []
        self.ops[op_id] = (canonical_op(base), ids, len(inputs) >= 2 and all(t is inputs[0] for t in inputs), keys)
        self._mark(op_id, keys, outputs)
        if len(self.ops) > OPS_REMEMBERED:
            old = next(iter(self.ops))
            for k in self.ops.pop(old)[3]:
                if self.made.get(k, (None,))[0] == old:
                    del self.made[k]

    def _mark(self, op_id: int, keys: list[int], outputs: list[torch.Tensor]) -> None:
        for t in outputs:
            self.made[id(t)] = (op_id, weakref.ref(t))
            keys.append(id(t))

    def node(self, op_id: int | None, depth: int = MAX_DEPTH) -> OpNode | None:
        entry = self.ops.get(op_id) if op_id is not None else None
        if entry is None or depth <= 0:
            return None
        op, ids, same, _ = entry
        return OpNode(op, tuple(self.node(i, depth - 1) for i in ids), same_inputs=same)


class _LiveMasks:
    """The live tensors that hold a deliberate mask's ±Inf (`masks`), each with the masks it holds.

    A non-finite tensor of the forward is either where NaN/Inf is born (the search ends there) or held here, so a
    non-finite tensor the forward reads that is not held was made outside its ops: a constant (a literal, a
    buffer). Tensors are known by `id()` with a weak reference (as in `_OpGraph`); entries leave with them."""

    def __init__(self) -> None:
        self.sources = MaskSources()
        self._held: dict[int, tuple[Any, frozenset[int]]] = {}

    def roots(self, t: torch.Tensor) -> frozenset[int] | None:
        e = self._held.get(id(t))
        return e[1] if e is not None and e[0]() is t else None

    def hold(self, tensors: list[torch.Tensor], roots: frozenset[int]) -> None:
        held = self._held
        for t in tensors:
            key = id(t)

            def gone(ref: Any, key: int = key) -> None:
                if held.get(key, (None,))[0] is ref:
                    del held[key]

            held[key] = (weakref.ref(t, gone), roots)


class _NanMode(TorchDispatchMode):
    def __init__(self, modules: ModuleStack, module_types: dict[str, str], masks: _LiveMasks):
        super().__init__()
        self.modules = modules
        self.module_types = module_types
        self.origin: NanOrigin | None = None
        self.ops = 0
        self.op_counts: dict[tuple[str, int, str], int] = {}
        self.graph = _OpGraph()
        self.masks = masks

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.origin is not None:
            return func(*args, **kwargs)
        flat_in = op_tensors(args, kwargs)
        # A mutating op overwrites its input: keep the values it started from, for the report.
        before = [t.clone() for t in flat_in] if func._schema.is_mutable else flat_in
        in_ids = self.graph.ids(flat_in)
        out = func(*args, **kwargs)
        self.ops += 1
        base = op_base_name(func)
        module, call = self.modules.current
        key = (module, call, base)
        k = self.op_counts.get(key, 0)
        self.op_counts[key] = k + 1
        flat_out = op_tensors(out)
        bad = [i for i, t in enumerate(flat_out) if _has_nonfinite(t)]
        if bad:
            name = record_name(module, call, str(func), k)
            masks_in = self._mask(func, base, name, args, kwargs, flat_in, before, flat_out, bad)
            if masks_in is None:   # a mask made or carried: the forward goes on
                self.graph.add(self.ops, base, flat_in, in_ids, flat_out)
                return out
            computation = tuple(self.graph.node(i) for i in in_ids)
            self.origin = self._finding(func, base, module, call, k, before, flat_out, bad[0], computation,
                                        _running_var(func, args, kwargs), masks_in)
        else:
            self.graph.add(self.ops, base, flat_in, in_ids, flat_out)
        return out

    def _mask(self, func, base, name, args, kwargs, flat_in, before, flat_out, bad) -> str | None:
        """Whether the op's non-finite output is a deliberate mask (`masks`): None when it is (made here from a
        constant, or carried from masks it read), and the output tensors are then held as masks; otherwise the
        masks it read, as a finding names them ("" when it read none)."""
        outputs = [flat_out[i] for i in bad]
        nan = any(bool(torch.isnan(t).any()) for t in outputs)
        bad_in = [i for i, t in enumerate(before) if _has_nonfinite(t)]
        value = _nonfinite_argument(args, kwargs)
        if not bad_in:
            if value is None or nan:
                return ""
            self.masks.hold(outputs, self._source(func, name, outputs, f"value={value}"))
            return None
        carried: frozenset[int] = frozenset()   # masks it read
        made: frozenset[int] = frozenset()      # masks it starts: a constant it reads or writes
        for i in bad_in:
            held = self.masks.roots(flat_in[i])
            if held is not None:
                carried |= held
                continue
            value_in = constant_mask_value(compute_stats(before[i]))   # made outside the forward's ops
            if value_in is None:
                return ""
            if base in ALIAS_OPS:   # a literal's lift_fresh: the op that reads it writes the mask
                return None
            made |= self._source(func, name, outputs, f"a {value_in} constant tensor of shape {list(before[i].shape)}")
        if value is not None:
            made |= self._source(func, name, outputs, f"value={value}")
        if nan or (is_elementwise(base) and new_infinities(_numpy(outputs[0]), [_numpy(t) for t in before]) > 0):
            return self.masks.sources.named(carried | made)
        self.masks.hold(outputs, carried | made)
        if base not in ALIAS_OPS:   # a view holds the same values: not one more place the mask went
            self.masks.sources.carried(carried, name)
        return None

    def _source(self, func, name: str, outputs: list[torch.Tensor], constant: str) -> frozenset[int]:
        return self.masks.sources.new(name, str(func), self.modules.current[0], _sign(outputs), _count(outputs),
                                      constant=constant, source=user_source_line())

    def _finding(self, func, base, module, call, k, inputs, outputs, which, computation, running_var,
                 masks_in: str = "") -> NanOrigin:
        name = record_name(module, call, str(func), k, output=which if len(outputs) > 1 else None)
        out_t = outputs[which]
        tracked_bad = [i for i, t in enumerate(inputs) if _has_nonfinite(t)]
        module_type = self.module_types.get(module, "")
        ev = Evidence(op=base, module_type=module_type, inputs=list(inputs), output=out_t, computation=computation,
                      module=module, running_var=running_var, masks_in=masks_in)
        diagnosis = diagnose(ev)
        cause, note = CAUSE_OP, None
        if tracked_bad and not masks_in:
            cause = CAUSE_UNTRACKED
            note = (f"input {tracked_bad[0]} of this op was already non-finite but no op in the forward produced "
                    "it: a constant or a tensor created outside the model's ops (e.g. torch.from_numpy)")
            diagnosis = [note]
        return NanOrigin(
            found=True, cause=cause, record=name, op=str(func), module=module, module_type=module_type,
            source=user_source_line(), op_index=self.ops - 1,
            inputs=tuple(TensorSummary.of(f"input {i}", t) for i, t in enumerate(inputs)),
            output=TensorSummary.of(name, out_t), diagnosis=tuple(diagnosis), note=note,
        )


def _nonfinite_argument(args: tuple, kwargs: dict) -> str | None:
    """'-inf' / 'inf' for the first Python float argument that is ±Inf (a fill or pad value, a literal)."""
    for a in (*args, *kwargs.values()):
        if type(a) is float and math.isinf(a):
            return str(a)
    return None


def _sign(tensors: list[torch.Tensor]) -> str:
    neg = any(bool(torch.isneginf(t).any()) for t in tensors)
    pos = any(bool(torch.isposinf(t).any()) for t in tensors)
    return "±inf" if neg and pos else "-inf" if neg else "+inf"


def _count(tensors: list[torch.Tensor]) -> int:
    return sum(int(torch.isinf(t).sum()) for t in tensors)


def _numpy(t: torch.Tensor):
    from ..arrays import as_numpy

    return as_numpy(t.detach())


def _running_var(func, args, kwargs) -> TensorStats | None:
    """Statistics of a batch norm op's `running_var` argument (by its schema name), when it has one."""
    names = [a.name for a in func._schema.arguments]
    value = kwargs.get("running_var")
    if value is None and "running_var" in names and names.index("running_var") < len(args):
        value = args[names.index("running_var")]
    return compute_stats(value.detach()) if isinstance(value, torch.Tensor) else None


def find_first_nonfinite(model: torch.nn.Module, *inputs: Any, spread: bool = True, **kwinputs: Any) -> NanOrigin:
    """Run `model(*inputs)` once and return where NaN/Inf is born (or `found=False`).

    Checks, in order: the inputs themselves, the parameters and buffers, then every op of the forward.
    Works in any floating dtype (float32, float16, bfloat16).

    Args:
        model: the PyTorch module.
        *inputs, **kwinputs: forward inputs.
        spread: after the origin, follow module outputs until one is entirely non-finite (shows how the
            damage spreads); False stops at the origin.

    Example:
        >>> origin = find_first_nonfinite(model, x)        # doctest: +SKIP
        >>> print(origin.summary())                        # doctest: +SKIP
    """
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"find_first_nonfinite needs a torch.nn.Module, got {type(model).__name__}")
    masks = _LiveMasks()
    pre = _check_inputs_and_parameters(model, inputs, kwinputs, masks)
    if pre is not None:
        return pre
    modules = ModuleStack()
    types = {path: type(m).__name__ for path, m in model.named_modules()}
    mode = _NanMode(modules, types, masks)
    spread_list: list[Spread] = []
    hooks = module_hooks(model.named_modules(), pre=modules.enter_hook,
                         post=lambda p: _spread_hook(p, modules, mode, spread_list, spread), always_call=True)
    note = None
    output = None
    try:
        with hooks, torch.no_grad(), mode:
            output = model(*inputs, **kwinputs)
    except _Stop:
        pass
    except Exception as e:  # the forward may break after the NaN (e.g. indexing with NaN): keep the finding
        if mode.origin is None:
            raise
        note = f"the forward raised after the origin: {type(e).__name__}: {e}"
    found = masks.sources.masks()
    if mode.origin is None:
        leak = _mask_in_output(output, masks, types.get("", ""))
        return replace(leak or NanOrigin(found=False), ops_checked=mode.ops, masks=found)
    o = mode.origin
    return replace(o, spread=tuple(spread_list), ops_checked=mode.ops, note=o.note or note, masks=found)


def _mask_in_output(output: Any, masks: _LiveMasks, root_type: str) -> NanOrigin | None:
    """A model output holding a deliberate mask's ±Inf: the finding names where the mask is made."""
    from ..capture import output_tensors

    for name, t in output_tensors(output):
        if not (t.is_floating_point() and _has_nonfinite(t)):
            continue
        roots = masks.roots(t)
        if not roots:   # no op of the forward made it non-finite, or it would be held or the origin
            s = TensorSummary.of(name, t)
            return NanOrigin(found=True, cause=CAUSE_UNTRACKED, record=name, output=s, diagnosis=(
                f"The model output {name} holds {s.stats.nan} NaN and {s.stats.posinf + s.stats.neginf} ±Inf values "
                "that no op of the forward made: a tensor made outside the forward's ops, returned as it is.",))
        if roots:
            first = masks.sources.get(min(roots))
            s = TensorSummary.of(name, t)
            text = mask_output_text(name, s.stats.posinf + s.stats.neginf, masks.sources.named(roots))
            module = first.module or ""
            return NanOrigin(found=True, cause=CAUSE_MASK_OUTPUT, record=first.record, op=first.op, module=module,
                             module_type=root_type if not module else None, source=first.source, output=s,
                             diagnosis=(text,))
    return None


def _spread_hook(path: str, modules: ModuleStack, mode: _NanMode, out: list[Spread], enabled: bool):
    def hook(module, args, output):
        modules.exit(path)
        if mode.origin is None:
            return
        if not enabled:
            raise _Stop
        flat = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if not flat:
            return
        st = compute_stats(flat[0])
        if st.all_finite:
            return
        out.append(Spread(module_label(path), st.finite_frac, st.channel_pattern()))
        if st.finite_frac == 0.0 or len(out) >= MAX_PROPAGATION:
            raise _Stop
    return hook


def _check_inputs_and_parameters(model: torch.nn.Module, inputs: Sequence[Any], kwinputs: dict,
                                  masks: _LiveMasks | None = None) -> NanOrigin | None:
    """A finding when an input or a weight is already non-finite. A buffer (or a frozen parameter) that is a mask
    constant (`masks.constant_mask_value`: a causal mask of 0 and -inf) is held as a mask instead."""
    named = {f"input.{i}": t for i, t in enumerate(inputs)} | {f"input.{k}": v for k, v in kwinputs.items()}
    for name, t in named.items():
        if isinstance(t, torch.Tensor) and _has_nonfinite(t):
            s = TensorSummary.of(name, t)
            return NanOrigin(found=True, cause=CAUSE_MODEL_INPUT, record=name, output=s, diagnosis=(
                f"Model input {name} holds {s.stats.nan} NaN and {s.stats.posinf + s.stats.neginf} ±Inf values "
                f"({s.stats.finite_frac:.4%} finite). Look upstream: the stage that produced it.",))
    masks = masks if masks is not None else _LiveMasks()
    weights = [(n, t, "param") for n, t in model.named_parameters()] + [(n, t, "buffer") for n, t in model.named_buffers()]
    for name, t, kind in weights:
        if not _has_nonfinite(t.detach()):
            continue
        s = TensorSummary.of(name, t.detach())
        value = constant_mask_value(s.stats) if kind == "buffer" or not t.requires_grad else None
        if value is not None:
            module = name.rsplit(".", 1)[0] if "." in name else ""
            masks.hold([t], masks.sources.new(name, kind, module, value, s.stats.nonfinite, constant=name))
            continue
        return NanOrigin(found=True, cause=CAUSE_PARAMETER, record=name, output=s, diagnosis=(
            f"Parameter {name} holds {s.stats.nan} NaN and {s.stats.posinf + s.stats.neginf} ±Inf values: "
            "the checkpoint or training run is broken (exploding gradients?), not the forward.",))
    return None
