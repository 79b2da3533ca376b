"""Find the op where NaN or Inf is born.

`find_first_nonfinite` runs the forward once under a `TorchDispatchMode` that checks every op output
(a sum per output: finite sum ⇒ all finite; only a non-finite sum pays for an exact check). The first
op whose output holds a non-finite value while its inputs were finite is the origin. The forward then
goes on just long enough to show how the damage spreads (module outputs, until one is entirely
non-finite), and stops.

    >>> from tensorprobe.examples.kokoro import faulty_decoder      # doctest: +SKIP
    >>> origin = find_first_nonfinite(*faulty_decoder())            # doctest: +SKIP
    >>> origin.module, origin.op                                    # doctest: +SKIP
    ('generator.noise_res.0.adain1.0.norm', 'aten.rsqrt.default')
    >>> origin.output.channel_pattern()                             # doctest: +SKIP
    '38 of 256 channels entirely non-finite (channels 5, 10, 23, ...)'
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .bundle import Bundle
from .capture import _ModuleStack, op_base_name, op_tensors, user_source_line
from .diagnose import Evidence, diagnose, diagnose_from_stats, in_normalization, normalization_input_evidence, \
    VARIANCE_ADVICE
from .errors import InputError
from .record import KIND_MODEL_INPUT, WEIGHT_KINDS, Record, module_label, record_name
from .stats import TensorStats, compute_stats
from .hooks import module_hooks

MAX_PROPAGATION = 12

CAUSE_OP = "op"
CAUSE_MODEL_INPUT = "model_input"
CAUSE_PARAMETER = "parameter"
CAUSE_UNTRACKED = "untracked_input"
CAUSE_RECORD = "record"
CAUSE_UNRECORDED = "unrecorded_value"   # born in a value the bundle does not hold (a kernel not tapped)

# Ops that cannot make NaN from finite inputs (a product or sum may overflow to ±Inf, never to NaN): when one
# of them is the first record holding NaN, the NaN came in through an input the bundle did not record.
NAN_FREE_OPS = frozenset({
    "mul", "add", "sub", "rsub", "addcmul", "cat", "stack", "clone", "copy", "_to_copy", "view", "view_copy",
    "reshape", "permute", "permute_copy", "expand", "expand_copy", "repeat", "squeeze", "squeeze_copy",
    "unsqueeze", "unsqueeze_copy", "transpose", "t", "slice", "slice_copy", "select", "select_copy", "index",
    "gather", "index_select", "relu", "leaky_relu", "hardtanh", "sigmoid", "tanh", "gelu", "silu", "elu", "abs",
    "neg", "sin", "cos", "constant_pad_nd", "reflection_pad1d", "replication_pad1d", "upsample_nearest1d",
    "max_pool1d", "max_pool2d", "where", "clamp", "Mul", "Add", "Sub", "Concat", "Relu", "LeakyRelu", "Sigmoid",
    "Tanh", "Identity", "Reshape", "Transpose", "Expand", "Tile", "Slice", "Gather", "Pad", "Sin", "Cos"})


@dataclass(frozen=True)
class TensorSummary:
    """Name, shape, dtype and statistics of one tensor in a finding."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    stats: TensorStats

    @classmethod
    def of(cls, name: str, t: torch.Tensor) -> "TensorSummary":
        return cls(name, tuple(t.shape), str(t.dtype).removeprefix("torch."), compute_stats(t))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "stats": self.stats.to_dict()}


@dataclass(frozen=True)
class Spread:
    """How far the damage reached: one module output after the origin."""

    module: str
    finite_frac: float
    pattern: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"module": self.module, "finite_frac": self.finite_frac, "pattern": self.pattern}


@dataclass(frozen=True)
class NanOrigin:
    """Where non-finite values first appear, with evidence and a diagnosis. `found` is False for a clean run."""

    found: bool
    cause: str | None = None
    record: str | None = None
    op: str | None = None
    module: str | None = None
    module_type: str | None = None
    source: str | None = None
    op_index: int | None = None
    inputs: tuple[TensorSummary, ...] = ()
    output: TensorSummary | None = None
    diagnosis: tuple[str, ...] = ()
    spread: tuple[Spread, ...] = ()
    ops_checked: int = 0
    note: str | None = None

    def headline(self) -> str:
        if not self.found:
            return f"No NaN or Inf: all {self.ops_checked} op outputs are finite."
        if self.cause == CAUSE_MODEL_INPUT:
            return f"The model inputs are already non-finite ({self.record}): nothing inside the model is to blame."
        if self.cause == CAUSE_PARAMETER:
            return f"Parameter {self.record} is non-finite: the weights were broken before the forward ran."
        where = module_label(self.module or "")
        pattern = self.output.stats.channel_pattern() if self.output else None
        tail = f" — {pattern}" if pattern else ""
        if self.cause == CAUSE_UNRECORDED:
            return f"NaN/Inf born inside {where} (its kernel's output is not in the bundle; its module output holds it){tail}"
        return f"NaN/Inf born at {self.op} in {where}{tail}"

    def summary(self) -> str:
        lines = [self.headline()]
        if self.source:
            lines.append(f"  source: {self.source}")
        lines += [f"  - {d}" for d in self.diagnosis]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "found": self.found, "cause": self.cause, "record": self.record, "op": self.op,
            "module": self.module, "module_type": self.module_type, "source": self.source,
            "op_index": self.op_index, "inputs": [i.to_dict() for i in self.inputs],
            "output": self.output.to_dict() if self.output else None, "diagnosis": list(self.diagnosis),
            "spread": [s.to_dict() for s in self.spread], "ops_checked": self.ops_checked,
            "headline": self.headline(), "note": self.note,
        }


class _Stop(Exception):
    """Raised inside the forward to end it once the finding is complete."""


def _has_nonfinite(t: torch.Tensor) -> bool:
    if not (t.is_floating_point() or t.is_complex()) or t.numel() == 0:
        return False
    s = t.sum(dtype=torch.float32) if t.dtype in (torch.float16, torch.bfloat16) else t.sum()
    if math.isfinite(abs(s.item())):
        return False
    return not bool(torch.isfinite(t).all())  # a large finite sum can overflow: check exactly


class _NanMode(TorchDispatchMode):
    def __init__(self, modules: _ModuleStack, module_types: dict[str, str]):
        super().__init__()
        self.modules = modules
        self.module_types = module_types
        self.origin: NanOrigin | None = None
        self.ops = 0
        self.op_counts: dict[tuple[str, int, str], int] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.origin is not None:
            return func(*args, **kwargs)
        flat_in = op_tensors(args, kwargs)
        # A mutating op overwrites its input: keep the values it started from, for the report.
        before = [t.clone() for t in flat_in] if func._schema.is_mutable else flat_in
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
            self.origin = self._finding(func, base, module, call, k, before, flat_out, bad[0])
        return out

    def _finding(self, func, base, module, call, k, inputs, outputs, which) -> NanOrigin:
        name = record_name(module, call, str(func), k, output=which if len(outputs) > 1 else None)
        out_t = outputs[which]
        tracked_bad = [i for i, t in enumerate(inputs) if _has_nonfinite(t)]
        module_type = self.module_types.get(module, "")
        ev = Evidence(op=base, module_type=module_type, inputs=list(inputs), output=out_t)
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
    modules = _ModuleStack()
    types = {path: type(m).__name__ for path, m in model.named_modules()}
    mode = _NanMode(modules, types)
    spread_list: list[Spread] = []
    hooks = module_hooks(model.named_modules(), pre=lambda p: _enter_hook(p, modules),
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


def _enter_hook(path: str, modules: _ModuleStack):
    def hook(module, args):
        modules.enter(path)  # returns None: a pre-hook's return value would replace the inputs
    return hook


def _spread_hook(path: str, modules: _ModuleStack, mode: _NanMode, out: list[Spread], enabled: bool):
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


def find_nonfinite_in_bundle(bundle: Bundle | str) -> NanOrigin:
    """The first record, in execution order, holding non-finite values whose recorded inputs were finite.

    Works on any bundle: a tensorprobe capture, another runtime's capture, or a port's `.npz`/`.safetensors`
    dump. With stored tensors (keep="full") the diagnosis looks at the values; otherwise at statistics.
    """
    b = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle)
    records = sorted(b.records, key=lambda r: r.order)
    by_name = {r.name: r for r in records}
    for r in records:
        if r.stats.all_finite:
            continue
        if r.kind == KIND_MODEL_INPUT:
            return NanOrigin(found=True, cause=CAUSE_MODEL_INPUT, record=r.name,
                             output=TensorSummary(r.name, r.shape, r.dtype, r.stats),
                             diagnosis=(f"Model input {r.name} is already non-finite "
                                        f"({r.stats.finite_frac:.4%} finite).",), ops_checked=len(records))
        if r.kind in WEIGHT_KINDS:
            return NanOrigin(found=True, cause=CAUSE_PARAMETER, record=r.name, module=r.module,
                             output=TensorSummary(r.name, r.shape, r.dtype, r.stats), diagnosis=(
                                 f"{'Parameter' if r.kind == 'param' else 'Buffer'} {r.name} holds {r.stats.nan} NaN "
                                 f"and {r.stats.posinf + r.stats.neginf} ±Inf values: the checkpoint or training run "
                                 "is broken (exploding gradients?), not the forward.",), ops_checked=len(records))
        ins = [by_name[n] for n in r.inputs if n in by_name]
        if any(not i.stats.all_finite for i in ins):
            continue  # inherited, not born here
        if _cannot_make_nan(r, ins):
            return _unrecorded_origin(b, r, records, len(records))
        return _bundle_origin(b, r, ins, len(records))
    return NanOrigin(found=False, ops_checked=len(records))


def _op_base(op: str) -> str:
    return op.split(".")[1] if op.startswith("aten.") else op.removeprefix("module:")


def _cannot_make_nan(r: Record, ins: list[Record]) -> bool:
    """r holds NaN, its op cannot make NaN from finite values, and an input it read is not in the bundle."""
    if not r.stats.nan or _op_base(r.op) not in NAN_FREE_OPS:
        return False
    return not r.inputs or len(ins) < len(r.inputs)


def _unrecorded_origin(b: Bundle, r: Record, records: list[Record], n: int) -> NanOrigin:
    """The NaN came from a value the bundle lacks: name the module whose output first holds it."""
    producer = _producer_of_unrecorded(r, records)
    first = f"The first record holding NaN is {r.op} in {module_label(r.module)} ({r.name}), an op that " \
            f"cannot make NaN from finite inputs: the NaN came in through a value it read that the bundle does " \
            f"not hold (a kernel whose output the runtime did not expose)."
    if producer is None:
        return replace(_bundle_origin(b, r, [], n), cause=CAUSE_UNRECORDED, diagnosis=(
            first, "No recorded module output inside it holds NaN either: capture at op level with keep='full' "
                   "(or with the runtime's per-kernel outputs) to see the producer."))
    diagnosis = [first, f"{producer.name} is the module output that holds it: the NaN is born inside "
                        f"{module_label(producer.module)}."]
    evidence, measured = _normalization_evidence(b, producer, records)
    general = diagnose_from_stats(_op_base(producer.op), producer.module.rsplit(".", 1)[-1], [], producer.stats)
    diagnosis += evidence + [d for d in general if not (measured and d == VARIANCE_ADVICE)]   # said with numbers
    return NanOrigin(
        found=True, cause=CAUSE_UNRECORDED, record=producer.name, op=producer.op, module=producer.module,
        op_index=producer.order, output=TensorSummary(producer.name, producer.shape, producer.dtype, producer.stats),
        diagnosis=tuple(diagnosis), ops_checked=n,
        note=None if b.complete else "the bundle is incomplete (its capture did not finish)")


def _normalization_evidence(b: Bundle, norm: Record, records: list[Record]) -> tuple[list[str], bool]:
    """For NaN born in a normalization: what its input's channels say (`normalization_input_evidence`),
    and whether that was measured (the input's tensor is in the bundle) rather than only pointed at.

    The input is the last finite record of the norm's shape made before the norm's first record: a
    normalization keeps its input's shape, and runtimes record module outputs, not module inputs."""
    if not in_normalization(Evidence(op=_op_base(norm.op), module_type=norm.module.rsplit(".", 1)[-1])):
        return [], False
    inside = [x.order for x in records if x.module == norm.module or x.module.startswith(f"{norm.module}.")]
    start = min(inside, default=norm.order)
    before = [x for x in records if x.order < start and x.shape == norm.shape
              and x.kind in ("output", "model_input") and x.stats.kind == "float" and x.stats.all_finite]
    if not before:
        return [], False
    x = max(before, key=lambda r: r.order)
    if not x.has_tensor:   # statistics only: say how to get the evidence, for this one record
        return [f"Its input is most likely {x.name}; to see whether its channels are nearly constant (mean² ≫ "
                f"variance: cancellation in a one-pass variance), capture again with --keep full --include "
                f"'{re.escape(x.name)}|{re.escape(norm.name)}'."], False
    found = normalization_input_evidence(b.tensor(x.name), norm.stats.nonfinite_channel_idx, x.name)
    return found, bool(found)


def _producer_of_unrecorded(r: Record, records: list[Record]) -> Record | None:
    """The deepest module output inside r's module (r's module itself last) holding NaN: module outputs are
    tapped where kernels are not, and may sit later in the bundle than the op that consumed them."""
    inside = [x for x in records if x is not r and x.stats.nan and x.kind == "output" and "/" not in x.name
              and (x.module == r.module or x.module.startswith(f"{r.module}.") or not r.module)]
    if not inside:
        return None
    return min(inside, key=lambda x: (-x.module.count("."), x.module == r.module, x.order))


def _bundle_origin(b: Bundle, r: Record, ins: list[Record], n: int) -> NanOrigin:
    base = _op_base(r.op)
    if r.has_tensor and all(i.has_tensor for i in ins) and r.op.startswith("aten."):
        diagnosis = diagnose(Evidence(op=base, inputs=[b.tensor(i.name) for i in ins], output=b.tensor(r.name)))
    else:
        diagnosis = diagnose_from_stats(base, r.op, [i.stats for i in ins], r.stats)
    return NanOrigin(
        found=True, cause=CAUSE_RECORD, record=r.name, op=r.op, module=r.module, source=r.source,
        op_index=r.order, inputs=tuple(TensorSummary(i.name, i.shape, i.dtype, i.stats) for i in ins),
        output=TensorSummary(r.name, r.shape, r.dtype, r.stats), diagnosis=tuple(diagnosis), ops_checked=n,
        note=None if b.complete else "the bundle is incomplete (its capture did not finish)",
    )
