"""`find_nonfinite_in_bundle`: where NaN or Inf is born, read from any bundle (no torch needed).

Works on a tensorprobe capture, another runtime's capture, or a port's `.npz`/`.safetensors` dump: the first
record, in execution order, holding non-finite values whose recorded inputs were finite. Diagnosis rules
see every producer's op names through `ops.canonical_op` (an ONNX `Sqrt`, a TVM kernel, an aten op).
"""

from __future__ import annotations

import re
from dataclasses import replace

from ..bundle import Bundle
from ..errors import BundleError
from ..ops import NAN_FREE_OPS, canonical_op
from ..record import (KIND_BUFFER, KIND_INPUT, KIND_MODEL_INPUT, KIND_MODEL_OUTPUT, KIND_PARAM, TAG_INPUTS_MADE_IN,
                      TAG_INPUTS_UNRECORDED, TAG_NONFINITE_CONSTANT, WEIGHT_KINDS, Record, module_label, module_place,
                      op_place)
from ..stats import TensorStats
from .computation import MAX_DEPTH, OpNode
from .diagnose import (VARIANCE_ADVICE, Evidence, diagnose, diagnose_from_stats, in_normalization,
                       normalization_input_evidence, op_label, running_variance_cause)
from .masks import (MaskSources, adds_infinities, adds_infinities_by_count, constant_mask_value, infinity_sign,
                    is_elementwise, is_fill_op, mask_output_text)
from .origin import (CAUSE_MASK_OUTPUT, CAUSE_MODEL_INPUT, CAUSE_PARAMETER, CAUSE_RECORD, CAUSE_UNRECORDED, NanOrigin,
                     TensorSummary)


def find_nonfinite_in_bundle(bundle: Bundle | str) -> NanOrigin:
    """The first record, in execution order, holding non-finite values whose recorded inputs were finite.

    Works on any bundle: a tensorprobe capture, another runtime's capture, or a port's `.npz`/`.safetensors`
    dump. With stored tensors (keep="full") the diagnosis looks at the values; otherwise at statistics. A
    cause is named only where the bundle shows it: the op graph (`Record.inputs`) for how a value was
    computed, the module's class (module level, or the manifest's `module_types`) for a normalization.

    ±Inf that a constant writes on purpose (a mask: `nan.masks`) is not a finding while no model output holds it
    and no op turns it into NaN; the masks met are in `NanOrigin.masks`, found or not.
    """
    b = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle)
    ctx = _Context(b)
    for r in ctx.records:
        if r.stats.all_finite:
            continue
        if r.kind == KIND_MODEL_INPUT:
            return ctx.with_masks(NanOrigin(
                found=True, cause=CAUSE_MODEL_INPUT, record=r.name, output=TensorSummary(r.name, r.shape, r.dtype, r.stats),
                diagnosis=(f"Model input {r.name} is already non-finite ({r.stats.finite_frac:.4%} finite).",),
                ops_checked=len(ctx.records)))
        if r.kind in WEIGHT_KINDS:
            if ctx.constant_mask(r):
                continue
            return ctx.with_masks(NanOrigin(
                found=True, cause=CAUSE_PARAMETER, record=r.name, module=r.module,
                output=TensorSummary(r.name, r.shape, r.dtype, r.stats), diagnosis=(
                    f"{'Parameter' if r.kind == 'param' else 'Buffer'} {r.name} holds {r.stats.nan} NaN "
                    f"and {r.stats.posinf + r.stats.neginf} ±Inf values: the checkpoint or training run "
                    "is broken (exploding gradients?), not the forward.",), ops_checked=len(ctx.records)))
        ins = [ctx.by_name[n] for n in r.inputs if n in ctx.by_name]
        bad = [i for i in ins if not i.stats.all_finite]
        if bad and all(i.name in ctx.held for i in bad):   # it read deliberate masks only
            masks_in = ctx.masks.named(frozenset().union(*(ctx.held[i.name] for i in bad)))
            if r.stats.nan or _adds_infinities(ctx, r, ins):
                return ctx.with_masks(_bundle_origin(ctx, r, ins, masks_in=masks_in))
            ctx.carry(r, bad)
            continue
        if bad:
            continue  # inherited, not born here
        if r.kind == KIND_INPUT:
            return ctx.with_masks(_before_the_call(ctx, r))
        if _makes_mask(r):
            ctx.make_mask(r)
            continue
        if _cannot_make_nan(r, ins):
            return ctx.with_masks(_unrecorded_origin(ctx, r))
        return ctx.with_masks(_bundle_origin(ctx, r, ins))
    leak = next((r for r in ctx.records if r.kind == KIND_MODEL_OUTPUT and r.name in ctx.held), None)
    if leak is not None:
        return ctx.with_masks(_mask_reaches_output(ctx, leak))
    return ctx.with_masks(NanOrigin(found=False, ops_checked=len(ctx.records), incomplete=_incomplete(b)))


def _makes_mask(r: Record) -> bool:
    """r's ±Inf, made from finite recorded inputs, are a constant's: r holds no NaN and its op read a non-finite
    constant argument (capture's `nonfinite_constant` tag) or only copies and fills (`masks.FILL_OPS`)."""
    return not r.stats.nan and (TAG_NONFINITE_CONSTANT in r.tags or is_fill_op(r.op))


def _adds_infinities(ctx: _Context, r: Record, ins: list[Record]) -> bool:
    """An elementwise op that read masks and makes ±Inf of its own beside them: by place where the bundle holds
    the values, by count where it holds statistics."""
    if not is_elementwise(r.op):
        return False
    if r.has_tensor and ins and all(i.has_tensor for i in ins):
        return adds_infinities(r.op, ctx.b.numpy(r.name), [ctx.b.numpy(i.name) for i in ins])
    return adds_infinities_by_count(r.op, r.stats, r.stats.numel, [(i.stats, i.stats.numel) for i in ins])


def _mask_reaches_output(ctx: _Context, out: Record) -> NanOrigin:
    """A model output holds ±Inf carried from a deliberate mask: the finding names where the mask is made."""
    roots = ctx.held[out.name]
    first = ctx.masks.get(min(roots))
    text = mask_output_text(out.name, out.stats.posinf + out.stats.neginf, ctx.masks.named(roots))
    return NanOrigin(found=True, cause=CAUSE_MASK_OUTPUT, record=first.record, op=first.op, module=first.module,
                     module_type=(ctx.types.get(first.module) or None) if first.module is not None else None,
                     source=first.source, output=TensorSummary(out.name, out.shape, out.dtype, out.stats),
                     diagnosis=(text,), ops_checked=len(ctx.records), note=_incomplete(ctx.b))


def diagnose_record(bundle: Bundle | str, name: str) -> NanOrigin:
    """The finding for record `name` taken as where NaN is born, whatever comes before it in the bundle:
    for a caller that already knows the record (`diff`, for a pair finite on one side only). The diagnosis
    reads the same evidence as `find_nonfinite_in_bundle` (op graph, module classes, stored values)."""
    b = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle)
    ctx = _Context(b)
    r = ctx.by_name.get(name)
    if r is None:
        raise BundleError(f"{b.path}: no record named {name!r}")
    return _bundle_origin(ctx, r, [ctx.by_name[n] for n in r.inputs if n in ctx.by_name])


class _Context:
    """A bundle as the search reads it: records in execution order, by name, and each module's class."""

    def __init__(self, b: Bundle):
        self.b = b
        self.records = sorted(b.records, key=lambda r: r.order)
        self.by_name = {r.name: r for r in self.records}
        model = b.manifest.get("model") or {}
        types = dict(model.get("module_types") or {})
        types.update((r.module, r.op.removeprefix("module:")) for r in self.records if r.op.startswith("module:"))
        if model.get("class"):
            types.setdefault("", model["class"])
        self.types: dict[str, str] = types
        self._nodes: dict[str, OpNode | None] = {}
        self.masks = MaskSources()
        self.held: dict[str, frozenset[int]] = {}   # record name -> the masks whose ±Inf it holds

    def constant_mask(self, r: Record) -> bool:
        """A weight that is a mask constant (`masks.constant_mask_value`) starts a mask; a PyTorch parameter, which
        training changes, never does (ONNX initializers, buffers and other constants may)."""
        value = constant_mask_value(r.stats) if r.op != KIND_PARAM else None
        if value is not None:
            self.held[r.name] = self.masks.new(r.name, r.op, r.module, value, r.stats.nonfinite, constant=r.name)
        return value is not None

    def make_mask(self, r: Record) -> None:
        """r writes a constant's ±Inf (`_makes_mask`)."""
        constant = "a non-finite argument" if TAG_NONFINITE_CONSTANT in r.tags else None
        self.held[r.name] = self.masks.new(r.name, r.op, r.module, infinity_sign(r.stats), r.stats.nonfinite,
                                           constant=constant, source=r.source)

    def carry(self, r: Record, bad: list[Record]) -> None:
        """r holds ±Inf carried from the masks its inputs hold."""
        roots = frozenset().union(*(self.held[i.name] for i in bad))
        self.held[r.name] = roots
        self.masks.carried(roots, r.name)

    def with_masks(self, origin: NanOrigin) -> NanOrigin:
        return replace(origin, masks=self.masks.masks()) if self.masks else origin

    def place(self, module: str) -> str:
        """The module as a finding names it: the root with the model's class."""
        return module_place(module, self.types.get(module))

    def code(self, module: str) -> str:
        """The own code of a module (what runs between its children's calls): the root's is the model's own
        forward, with the model's class."""
        return op_place(module, self.types.get(module))

    def type_of(self, r: Record) -> str:
        return self.types.get(r.module, "")

    def running_var(self, module: str) -> TensorStats | None:
        """The statistics of the module's stored running variance (`<module>.running_var`), if recorded."""
        r = self.by_name.get(f"{module}.running_var" if module else "running_var")
        return r.stats if r is not None and r.kind in WEIGHT_KINDS else None

    def computation(self, r: Record) -> tuple[OpNode | None, ...]:
        """How each input of r was computed, from the op graph the bundle recorded."""
        return tuple(self.node(n) for n in r.inputs)

    def node(self, name: str, depth: int = MAX_DEPTH) -> OpNode | None:
        r = self.by_name.get(name)
        if r is None or depth <= 0 or r.kind in WEIGHT_KINDS or r.kind == KIND_MODEL_INPUT:
            return None   # a weight, a model input or a value the bundle lacks: not a computed value
        key = f"{depth}:{name}"
        if key not in self._nodes:
            same = len(r.inputs) >= 2 and len(set(r.inputs)) == 1
            nonneg = None if r.stats.min is None else bool(r.stats.min >= 0)
            self._nodes[key] = OpNode(canonical_op(r.op), tuple(self.node(n, depth - 1) for n in r.inputs),
                                      same_inputs=same, nonneg=nonneg, name=r.name, label=op_label(r.op))
        return self._nodes[key]


def _cannot_make_nan(r: Record, ins: list[Record]) -> bool:
    """r holds NaN, its op cannot make NaN from finite values, and an input it read is not in the bundle."""
    if not r.stats.nan or canonical_op(r.op) not in NAN_FREE_OPS:
        return False
    return not r.inputs or len(ins) < len(r.inputs)


def _before_the_call(ctx: _Context, r: Record) -> NanOrigin:
    """A module call's recorded input (`--record-inputs`) is the first record holding NaN: it was made before
    the call, by the code of a module around it, not by the module called."""
    parent = _parent_of(r.module)
    last = _last_finite_before(ctx, r)
    since = f" after {last.name} (the last finite record)" if last is not None else ""
    text = (f"{r.name}, an input of {ctx.place(r.module)}, is the first record holding non-finite values: they were "
            f"made before the call, by the code of {ctx.code(parent)} that ran{since}, which this bundle does not "
            "record op by op; capture at level='op' to see the op.")
    return NanOrigin(found=True, cause=CAUSE_UNRECORDED, record=r.name, op=None, module=parent,
                     module_type=ctx.types.get(parent) or None, op_index=r.order,
                     output=TensorSummary(r.name, r.shape, r.dtype, r.stats), diagnosis=(text,),
                     ops_checked=len(ctx.records), note=_incomplete(ctx.b))


def _parent_of(module: str) -> str:
    return module.rsplit(".", 1)[0] if "." in module else ""


def _last_finite_before(ctx: _Context, r: Record) -> Record | None:
    earlier = [x for x in ctx.records if x.order < r.order and x.kind not in WEIGHT_KINDS]
    return earlier[-1] if earlier else None


def _unrecorded_origin(ctx: _Context, r: Record) -> NanOrigin:
    """The NaN came from a value the bundle lacks: name the module whose output first holds it."""
    b, records = ctx.b, ctx.records
    producer = _producer_of_unrecorded(r, records)
    first = f"The first record holding NaN is {r.op} in {op_place(r.module, ctx.types.get(r.module), r.source)} ({r.name}), an op that " \
            f"cannot make NaN from finite inputs: the NaN came in through a value it read that the bundle does " \
            f"not hold (a kernel whose output the runtime did not expose)."
    if producer is None:
        return replace(_bundle_origin(ctx, r, []), cause=CAUSE_UNRECORDED, diagnosis=(
            first, "No recorded module output inside it holds NaN either: capture at op level with keep='full' "
                   "(or with the runtime's per-kernel outputs) to see the producer."))
    diagnosis = [first, f"{producer.name} is the module output that holds it: the NaN is born inside "
                        f"{ctx.place(producer.module)}."]
    evidence, measured = _normalization_evidence(ctx, producer)
    general = diagnose_from_stats(producer.op, ctx.type_of(producer), [], producer.stats, module=producer.module,
                                  subject=_subject(ctx, producer), output_dtype=producer.dtype)
    diagnosis += evidence + [d for d in general if not (measured and d.startswith(VARIANCE_ADVICE))]
    return NanOrigin(
        found=True, cause=CAUSE_UNRECORDED, record=producer.name, op=producer.op, module=producer.module,
        module_type=ctx.type_of(producer) or None, op_index=producer.order,
        output=TensorSummary(producer.name, producer.shape, producer.dtype, producer.stats),
        diagnosis=tuple(diagnosis), ops_checked=len(records), note=_incomplete(b))


def _normalization_evidence(ctx: _Context, norm: Record, ins: list[Record] = ()) -> tuple[list[str], bool]:
    """For NaN born in a normalization: what its input's channels say (`normalization_input_evidence`),
    and whether that was measured (the input's tensor is in the bundle) rather than only pointed at.

    The input is the recorded input of the norm's shape, or else the last finite record of that shape made
    before the norm's first record: a normalization keeps its input's shape, and runtimes record module
    outputs, not module inputs."""
    records = ctx.records
    if not in_normalization(Evidence(op=canonical_op(norm.op), module_type=ctx.type_of(norm), module=norm.module)):
        return [], False
    x = next((i for i in ins if i.shape == norm.shape and i.stats.kind == "float"), None) or _input_by_shape(ctx, norm)
    if x is None:
        return [], False
    if not x.has_tensor:   # statistics only: say how to get the evidence, for this one record
        return [f"Its input is most likely {x.name}; to see whether its channels are nearly constant (mean² ≫ "
                f"variance: cancellation in a one-pass variance), capture again with --keep full --include "
                f"'{re.escape(x.name)}|{re.escape(norm.name)}'."], False
    found = normalization_input_evidence(ctx.b.numpy(x.name), norm.stats.nonfinite_channel_idx, x.name)
    return found, bool(found)


def _input_by_shape(ctx: _Context, norm: Record) -> Record | None:
    records = ctx.records
    # the module's computation, not its weights: parameters and buffers are recorded before the forward
    inside = [x.order for x in records if x.kind not in (KIND_PARAM, KIND_BUFFER)
              and (x.module == norm.module or x.module.startswith(f"{norm.module}."))]
    start = min(inside, default=norm.order)
    before = [x for x in records if x.order < start and x.shape == norm.shape
              and x.kind in ("output", "model_input") and x.stats.kind == "float" and x.stats.all_finite]
    return max(before, key=lambda r: r.order) if before else None


def _producer_of_unrecorded(r: Record, records: list[Record]) -> Record | None:
    """The deepest module output inside r's module (r's module itself last) holding NaN: module outputs are
    tapped where kernels are not, and may sit later in the bundle than the op that consumed them."""
    inside = [x for x in records if x is not r and x.stats.nan and x.kind == "output" and "/" not in x.name
              and (x.module == r.module or x.module.startswith(f"{r.module}.") or not r.module)]
    if not inside:
        return None
    return min(inside, key=lambda x: (-x.module.count("."), x.module == r.module, x.order))


def _subject(ctx: _Context, r: Record) -> str:
    """How a diagnosis names record r: a module-level record by its module (the root with its class)."""
    return ctx.place(r.module) if r.op.startswith("module:") or "/" not in r.name else r.name


def _bundle_origin(ctx: _Context, r: Record, ins: list[Record], masks_in: str = "") -> NanOrigin:
    b = ctx.b
    base = canonical_op(r.op)
    computation = ctx.computation(r)
    running_var = ctx.running_var(r.module)
    if r.has_tensor and ins and all(i.has_tensor for i in ins):   # any producer: rules see canonical op names
        diagnosis = diagnose(Evidence(op=base, module_type=ctx.type_of(r), inputs=[b.numpy(i.name) for i in ins],
                                      output=b.numpy(r.name), input_dtypes=[i.dtype for i in ins],
                                      output_dtype=r.dtype, computation=computation, module=r.module,
                                      running_var=running_var, op_name=op_label(r.op), masks_in=masks_in))
    else:
        diagnosis = diagnose_from_stats(r.op, ctx.type_of(r), [i.stats for i in ins], r.stats,
                                        computation=computation, module=r.module, subject=_subject(ctx, r),
                                        running_var=running_var, masks_in=masks_in, output_dtype=r.dtype)
    stored = running_variance_cause(Evidence(op=base, module=r.module, running_var=running_var))
    if stored:   # a wrong buffer, not a computed variance: the input's channels are beside the point
        diagnosis = [d for d in diagnosis if not d.startswith(VARIANCE_ADVICE)]
    elif r.stats.nonfinite_channels and not any("one-pass variance E[x²] − E[x]² (the mean" in d for d in diagnosis):
        evidence, measured = _normalization_evidence(ctx, r, ins)   # what the norm's input channels say
        diagnosis = evidence + [d for d in diagnosis if not (measured and d.startswith(VARIANCE_ADVICE))]
    or_born_in = None
    if r.op.startswith("module:"):
        or_born_in = _parent_code(ctx, r)
        diagnosis = [d for d in diagnosis if "level='op'" not in d] + [_module_level_advice(ctx, r, or_born_in)]
    return NanOrigin(
        found=True, cause=CAUSE_RECORD, record=r.name, op=r.op, module=r.module,
        module_type=ctx.type_of(r) or None, source=r.source, op_index=r.order,
        inputs=tuple(TensorSummary(i.name, i.shape, i.dtype, i.stats) for i in ins),
        output=TensorSummary(r.name, r.shape, r.dtype, r.stats), diagnosis=tuple(diagnosis),
        ops_checked=len(ctx.records), note=_incomplete(b), or_born_in=or_born_in,
    )


def _parent_code(ctx: _Context, r: Record) -> str | None:
    """For a module-level record one of whose inputs no record made (capture's `inputs_unrecorded` tag): the
    module whose own code made that input, and may have made the NaN with it. Capture names it (`inputs_made_in:`,
    the parent of the outermost call the input reached: the root's `sqrt` handed down through `post` to
    `post.lin` is the root's); a bundle from before that tag names the parent."""
    if TAG_INPUTS_UNRECORDED not in r.tags or not r.module:
        return None
    made_in = next((t[len(TAG_INPUTS_MADE_IN):] for t in r.tags if t.startswith(TAG_INPUTS_MADE_IN)), None)
    if made_in is not None:
        return ctx.code(made_in)
    # without the tag: the parent, or an ancestor further up while each one's own input was unrecorded too
    # (the value may have been handed down through their calls)
    places = [_parent_of(r.module)]
    while places[-1] and any(TAG_INPUTS_UNRECORDED in x.tags for x in ctx.records
                             if x.module == places[-1] and x.op.startswith("module:")):
        places.append(_parent_of(places[-1]))
    return " or ".join(ctx.code(m) for m in places)


def _module_level_advice(ctx: _Context, r: Record, or_born_in: str | None) -> str:
    """What a module-level record can and cannot say, and the capture that says more."""
    place = ctx.place(r.module)
    if or_born_in:
        return (f"{place} read an input that no record holds (made by the code of {or_born_in} itself, which "
                f"module level does not record): the NaN was born inside {place}, or in that code before the "
                f"call. Capture with --level op to see the op (or --record-inputs to tell the two apart).")
    return (f"A module-level record: its inputs were finite, so the NaN was born inside {place}, but the op "
            f"is not recorded. Capture with --level op (and --keep full) to see the op and how its input was "
            f"computed.")


def _incomplete(b: Bundle) -> str | None:
    note = b.incomplete_note()
    return f"the bundle is incomplete: {note}" if note else None
