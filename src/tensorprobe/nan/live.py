"""`find_first_nonfinite`: run a torch model once and stop at the op where NaN or Inf is born.

The forward runs under a `TorchDispatchMode` that checks every op output (a sum per output: finite sum ⇒
all finite; only a non-finite sum pays for an exact check). The first op whose output holds a non-finite
value while its inputs were finite is the origin. The forward then goes on just long enough to show how the
damage spreads (module outputs, until one is entirely non-finite), and stops.
"""

from __future__ import annotations

import math
import weakref
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
from .origin import CAUSE_MODEL_INPUT, CAUSE_OP, CAUSE_PARAMETER, CAUSE_UNTRACKED, NanOrigin, Spread, TensorSummary

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


class _NanMode(TorchDispatchMode):
    def __init__(self, modules: ModuleStack, module_types: dict[str, str]):
        super().__init__()
        self.modules = modules
        self.module_types = module_types
        self.origin: NanOrigin | None = None
        self.ops = 0
        self.op_counts: dict[tuple[str, int, str], int] = {}
        self.graph = _OpGraph()

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
            computation = tuple(self.graph.node(i) for i in in_ids)
            self.origin = self._finding(func, base, module, call, k, before, flat_out, bad[0], computation,
                                        _running_var(func, args, kwargs))
        else:
            self.graph.add(self.ops, base, flat_in, in_ids, flat_out)
        return out

    def _finding(self, func, base, module, call, k, inputs, outputs, which, computation, running_var) -> NanOrigin:
        name = record_name(module, call, str(func), k, output=which if len(outputs) > 1 else None)
        out_t = outputs[which]
        tracked_bad = [i for i, t in enumerate(inputs) if _has_nonfinite(t)]
        module_type = self.module_types.get(module, "")
        ev = Evidence(op=base, module_type=module_type, inputs=list(inputs), output=out_t, computation=computation,
                      module=module, running_var=running_var)
        diagnosis = diagnose(ev)
        cause, note = CAUSE_OP, None
        if tracked_bad:
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
    pre = _check_inputs_and_parameters(model, inputs, kwinputs)
    if pre is not None:
        return pre
    modules = ModuleStack()
    types = {path: type(m).__name__ for path, m in model.named_modules()}
    mode = _NanMode(modules, types)
    spread_list: list[Spread] = []
    hooks = module_hooks(model.named_modules(), pre=modules.enter_hook,
                         post=lambda p: _spread_hook(p, modules, mode, spread_list, spread), always_call=True)
    note = None
    try:
        with hooks, torch.no_grad(), mode:
            model(*inputs, **kwinputs)
    except _Stop:
        pass
    except Exception as e:  # the forward may break after the NaN (e.g. indexing with NaN): keep the finding
        if mode.origin is None:
            raise
        note = f"the forward raised after the origin: {type(e).__name__}: {e}"
    if mode.origin is None:
        return NanOrigin(found=False, ops_checked=mode.ops)
    o = mode.origin
    return NanOrigin(**{**o.__dict__, "spread": tuple(spread_list), "ops_checked": mode.ops,
                        "note": o.note or note})


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


def _check_inputs_and_parameters(model: torch.nn.Module, inputs: Sequence[Any], kwinputs: dict) -> NanOrigin | None:
    named = {f"input.{i}": t for i, t in enumerate(inputs)} | {f"input.{k}": v for k, v in kwinputs.items()}
    for name, t in named.items():
        if isinstance(t, torch.Tensor) and _has_nonfinite(t):
            s = TensorSummary.of(name, t)
            return NanOrigin(found=True, cause=CAUSE_MODEL_INPUT, record=name, output=s, diagnosis=(
                f"Model input {name} holds {s.stats.nan} NaN and {s.stats.posinf + s.stats.neginf} ±Inf values "
                f"({s.stats.finite_frac:.4%} finite). Look upstream: the stage that produced it.",))
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if _has_nonfinite(t.detach()):
            s = TensorSummary.of(name, t.detach())
            return NanOrigin(found=True, cause=CAUSE_PARAMETER, record=name, output=s, diagnosis=(
                f"Parameter {name} holds {s.stats.nan} NaN and {s.stats.posinf + s.stats.neginf} ±Inf values: "
                "the checkpoint or training run is broken (exploding gradients?), not the forward.",))
    return None
