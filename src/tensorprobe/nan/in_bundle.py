"""`find_nonfinite_in_bundle`: where NaN or Inf is born, read from any bundle (no torch needed).

Works on a tensorprobe capture, another runtime's capture, or a port's `.npz`/`.safetensors` dump: the first
record, in execution order, holding non-finite values whose recorded inputs were finite. Diagnosis rules
see every producer's op names through `ops.canonical_op` (an ONNX `Sqrt`, a TVM kernel, an aten op).
"""

from __future__ import annotations

import re
from dataclasses import replace

from ..bundle import Bundle
from ..ops import NAN_FREE_OPS, canonical_op
from ..record import KIND_MODEL_INPUT, WEIGHT_KINDS, Record, module_label
from .diagnose import (VARIANCE_ADVICE, Evidence, diagnose, diagnose_from_stats, in_normalization,
                       normalization_input_evidence)
from .origin import CAUSE_MODEL_INPUT, CAUSE_PARAMETER, CAUSE_RECORD, CAUSE_UNRECORDED, NanOrigin, TensorSummary


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
        return _bundle_origin(b, r, ins, records)
    return NanOrigin(found=False, ops_checked=len(records), incomplete=_incomplete(b))


def _cannot_make_nan(r: Record, ins: list[Record]) -> bool:
    """r holds NaN, its op cannot make NaN from finite values, and an input it read is not in the bundle."""
    if not r.stats.nan or canonical_op(r.op) not in NAN_FREE_OPS:
        return False
    return not r.inputs or len(ins) < len(r.inputs)


def _unrecorded_origin(b: Bundle, r: Record, records: list[Record], n: int) -> NanOrigin:
    """The NaN came from a value the bundle lacks: name the module whose output first holds it."""
    producer = _producer_of_unrecorded(r, records)
    first = f"The first record holding NaN is {r.op} in {module_label(r.module)} ({r.name}), an op that " \
            f"cannot make NaN from finite inputs: the NaN came in through a value it read that the bundle does " \
            f"not hold (a kernel whose output the runtime did not expose)."
    if producer is None:
        return replace(_bundle_origin(b, r, [], records), cause=CAUSE_UNRECORDED, diagnosis=(
            first, "No recorded module output inside it holds NaN either: capture at op level with keep='full' "
                   "(or with the runtime's per-kernel outputs) to see the producer."))
    diagnosis = [first, f"{producer.name} is the module output that holds it: the NaN is born inside "
                        f"{module_label(producer.module)}."]
    evidence, measured = _normalization_evidence(b, producer, records)
    general = diagnose_from_stats(canonical_op(producer.op), producer.module.rsplit(".", 1)[-1], [], producer.stats)
    diagnosis += evidence + [d for d in general if not (measured and d == VARIANCE_ADVICE)]   # said with numbers
    return NanOrigin(
        found=True, cause=CAUSE_UNRECORDED, record=producer.name, op=producer.op, module=producer.module,
        op_index=producer.order, output=TensorSummary(producer.name, producer.shape, producer.dtype, producer.stats),
        diagnosis=tuple(diagnosis), ops_checked=n,
        note=_incomplete(b))


def _normalization_evidence(b: Bundle, norm: Record, records: list[Record]) -> tuple[list[str], bool]:
    """For NaN born in a normalization: what its input's channels say (`normalization_input_evidence`),
    and whether that was measured (the input's tensor is in the bundle) rather than only pointed at.

    The input is the last finite record of the norm's shape made before the norm's first record: a
    normalization keeps its input's shape, and runtimes record module outputs, not module inputs."""
    if not in_normalization(Evidence(op=canonical_op(norm.op), module_type=norm.module.rsplit(".", 1)[-1])):
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
    found = normalization_input_evidence(b.numpy(x.name), norm.stats.nonfinite_channel_idx, x.name)
    return found, bool(found)


def _producer_of_unrecorded(r: Record, records: list[Record]) -> Record | None:
    """The deepest module output inside r's module (r's module itself last) holding NaN: module outputs are
    tapped where kernels are not, and may sit later in the bundle than the op that consumed them."""
    inside = [x for x in records if x is not r and x.stats.nan and x.kind == "output" and "/" not in x.name
              and (x.module == r.module or x.module.startswith(f"{r.module}.") or not r.module)]
    if not inside:
        return None
    return min(inside, key=lambda x: (-x.module.count("."), x.module == r.module, x.order))


def _bundle_origin(b: Bundle, r: Record, ins: list[Record], records: list[Record]) -> NanOrigin:
    base = canonical_op(r.op)
    if r.has_tensor and ins and all(i.has_tensor for i in ins):   # any producer: rules see canonical op names
        diagnosis = diagnose(Evidence(op=base, inputs=[b.numpy(i.name) for i in ins], output=b.numpy(r.name),
                                      input_dtypes=[i.dtype for i in ins], output_dtype=r.dtype))
    else:
        diagnosis = diagnose_from_stats(base, r.op, [i.stats for i in ins], r.stats)
        if not ins:   # a runtime's kernel record (no dataflow): a normalization's input is found by shape
            evidence, measured = _normalization_evidence(b, r, records)
            diagnosis = evidence + [d for d in diagnosis if not (measured and d == VARIANCE_ADVICE)]
    return NanOrigin(
        found=True, cause=CAUSE_RECORD, record=r.name, op=r.op, module=r.module, source=r.source,
        op_index=r.order, inputs=tuple(TensorSummary(i.name, i.shape, i.dtype, i.stats) for i in ins),
        output=TensorSummary(r.name, r.shape, r.dtype, r.stats), diagnosis=tuple(diagnosis),
        ops_checked=len(records), note=_incomplete(b),
    )


def _incomplete(b: Bundle) -> str | None:
    note = b.incomplete_note()
    return f"the bundle is incomplete: {note}" if note else None
