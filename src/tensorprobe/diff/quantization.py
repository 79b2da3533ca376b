"""Quantized candidates: what int8 arithmetic is expected to add at each record, and where it adds more.

An int8 port (`onnxruntime.quantization`'s `quantize_dynamic` or QDQ `quantize_static`) differs from its float
reference by quantization error at every quantized op. How much is known where the quantization parameters
are (the ONNX Runtime capture tags each rescaled value `quant:act=...;scale=...;weight=...`, `names`/`quant`):

- a QDQ pair (`DequantizeLinear(QuantizeLinear(v))`) with step s rounds v by at most s/2: a relative error of
  s/sqrt(12)/rms(v), unless v reaches beyond what the scale holds ([qmin - zp, qmax - zp]·s): then it clips;
- an integer kernel (`MatMulInteger`, `ConvInteger`) on an activation x quantized with step s_x and a weight w with
  step s_w sums K products, each off by its rounding: var(δy) = K/12 · (s_x²·ms(w) + s_w²·ms(x)), relative to
  the reference's rms(y) (ms: the mean square, K: the products per output, from the weight's or input's shape).

`QuantNoise` holds those figures per record (JSON: `pairs[].quantization`). A record whose error is far beyond
them (`FAR` times, counting what its inputs bring) is not quantization noise: it is named as its own error, with
what to change (a wrong scale, int16 saturation of u8·s8 products on x86 without VNNI: `reduce_range`, a recurrent
or attention node that should stay float). A record whose steps are coarse for its values (the scale spans
outliers: its rms is a few steps) keeps cause `quantized`, with the fix (per-channel scales, exclude the node).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

from ..record import KIND_OUTPUT, TAG_INTEGER_DOMAIN, TAG_QSTEP, TAG_QUANT, TAG_QUANTIZED, TAG_RESCALED, Record
from .compat import rms
from .explain import gain_inputs, predicted_gain
from .noise import CAUSE_INHERITED, CAUSE_OWN, CAUSE_QUANTIZED
from .result import TAG_READS_QUANTIZED, PairResult, QuantNoise
from .views import every_record

FAR = 8.0            # a record this many times beyond what int8 and its inputs explain is not quantization noise
COARSE_LEVELS = 8.0  # a quantized value whose rms spans fewer steps than this has a scale too coarse for it
COARSE_ERROR = 0.05  # ... said when it costs at least this relative error
_RECURRENT = ("LSTM", "GRU", "RNN", "Attention")


def quant_fields(tags: Sequence[str]) -> dict[str, str] | None:
    """The fields of a record's `quant:` tag ({'act': ..., 'scale': ..., 'weight': ...}), or None without one."""
    tag = next((t for t in tags if t.startswith(TAG_QUANT)), None)
    if tag is None:
        return None
    return dict(part.split("=", 1) for part in tag[len(TAG_QUANT):].split(";") if "=" in part)


def rescaled_op(tags: Sequence[str]) -> str | None:
    """The float op a rescaled int8 result stands for (`rescaled:Conv` -> 'Conv'), or None."""
    return next((t[len(TAG_RESCALED):] for t in tags if t.startswith(TAG_RESCALED)), None)


def expected_noise(ref: Record, cand: Record, cand_bundle: Any) -> QuantNoise | None:
    """What int8 is expected to add at `cand` (quantized), from its `quant:` tag and the records it names; None
    where the tag or the records it names are missing."""
    fields = quant_fields(cand.tags)
    if not fields or cand_bundle is None:
        return None
    act = cand_bundle.get(fields.get("act", ""))
    step = _number(fields.get("scale"), cand_bundle)
    if act is None or step is None or step <= 0 or act.stats.kind != "float":
        return None
    x_rms = rms(act.stats) or 0.0
    y_rms = rms(ref.stats) or 0.0
    if not x_rms or not y_rms:
        return None
    if "zp" in fields:      # a QDQ pair: v rounded to its step, clipped to what the scale holds
        return _qdq_noise(act, step, int(fields["zp"]), fields.get("q", "uint8"), x_rms)
    weight = cand_bundle.get(fields.get("weight", ""))
    lo, hi = min(float(act.stats.min or 0.0), 0.0), max(float(act.stats.max or 0.0), 0.0)
    if weight is None:
        return QuantNoise(step=step, low=lo, high=hi, rms=x_rms, expected=step / math.sqrt(12) / x_rms)
    k = _products(rescaled_op(cand.tags), act, weight)
    w_step, w_rms = _qstep(weight) or 0.0, rms(weight.stats) or 0.0
    expected = math.sqrt(k / 12 * (step ** 2 * w_rms ** 2 + w_step ** 2 * x_rms ** 2)) / y_rms
    return QuantNoise(step=step, low=lo, high=hi, rms=x_rms, expected=expected, weight_step=w_step or None,
                      weight_rms=w_rms or None)


def _qdq_noise(act: Record, step: float, zp: int, qtype: str, x_rms: float) -> QuantNoise:
    qmin, qmax = {"uint8": (0, 255), "int8": (-128, 127), "uint16": (0, 65535), "int16": (-32768, 32767)}.get(
        qtype, (0, 255))
    lo, hi = (qmin - zp) * step, (qmax - zp) * step
    a_lo, a_hi = float(act.stats.min or 0.0), float(act.stats.max or 0.0)
    span = max(a_hi - a_lo, 1e-30)
    # below a zero point at qmin lies what a ReLU the quantizer removed would cut: that clipping is the ReLU
    below = 0.0 if zp == qmin else max(0.0, lo - step - a_lo)
    clipped = (max(0.0, a_hi - hi - step) + below) / span
    return QuantNoise(step=step, low=lo, high=hi, rms=x_rms, expected=step / math.sqrt(12) / x_rms, clipped=clipped)


def _number(value: str | None, bundle: Any) -> float | None:
    """A scale given as a number, or as the record of a runtime scale (a 0-d value: its max is the value)."""
    if not value:
        return None
    try:
        return float(value)
    except ValueError:
        rec = bundle.get(value)
        return float(rec.stats.max) if rec is not None and rec.stats.max is not None else None


def _qstep(weight: Record) -> float | None:
    return next((float(t[len(TAG_QSTEP):]) for t in weight.tags if t.startswith(TAG_QSTEP)), None)


def _products(op: str | None, act: Record, weight: Record) -> int:
    """Products summed per output: a conv's kernel size times its input channels (the weight's elements per
    output channel), a matmul's inner dimension (the activation's last)."""
    if op == "Conv" and weight.shape:
        return max(1, math.prod(weight.shape) // max(1, weight.shape[0]))
    return max(1, act.shape[-1] if act.shape else 1)


def judged(results: list[PairResult], ref_bundle: Any, cand_bundle: Any) -> list[PairResult]:
    """Each failing quantized pair with what int8 is expected to add there (`QuantNoise`), and a finding where its
    error is far beyond that (cause `own`) or its steps are coarse for its values (cause kept, the fix said)."""
    if cand_bundle is None or ref_bundle is None:
        return results
    out = []
    inner = _last_kernels(cand_bundle)
    paired = {r.cand_name for r in results}
    for p in results:
        e = _error_known(p)
        if not p.failed or e is None:
            out.append(p)
            continue
        ref, cand = ref_bundle.get(p.name), cand_bundle.get(p.cand_name)
        if cand is not None and cand.kind == KIND_OUTPUT and "/" not in cand.name and quant_fields(cand.tags) is None:
            # a module's output made after its int8 kernel (a gain, a cat): judged by that kernel's figures
            cand = _after_kernel(cand, inner.get(cand.module), cand_bundle)
        reader = None
        if cand is not None and TAG_READS_QUANTIZED in p.tags and cand.op in _LINEAR_KERNELS and \
                TAG_QUANTIZED not in p.tags and quant_fields(cand.tags) is None:
            # a float kernel on quantized copies (a QDQ conv the exporter folded a norm into, its output not
            # re-quantized): judged by the copies it reads
            reader = cand
            cand = next((r for r in map(cand_bundle.get, cand.inputs) if r is not None and
                         "zp" in (quant_fields(r.tags) or {})), None)
        if TAG_QUANTIZED in p.tags or (cand is not None and quant_fields(cand.tags) is not None):
            q = expected_noise(ref, cand, cand_bundle) if ref is not None and cand is not None else None
            if q is not None:
                ins = gain_inputs(ref, ref_bundle.get)
                op = rescaled_op(cand.tags)
                kernel = reader or (_qdq_kernel(cand, cand_bundle) if op is None else None)
                if kernel is not None:
                    # a QDQ module's float kernel on quantized copies: its own output's rounding, and that of the
                    # copies it reads since the compared records, are what int8 adds there
                    chain = _quantized_source(cand_bundle, kernel.inputs, paired)
                    q = replace(q, expected=math.hypot(q.expected, chain.chain if chain is not None else 0.0))
                    op = kernel.op
                p = _with_finding(p, q, op, predicted_gain(ref, ins), e)
        out.append(p)
    return out


_LINEAR_KERNELS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
_QDQ_OPS = frozenset({"QuantizeLinear", "DequantizeLinear"})


def _qdq_kernel(cand: Record, cand_bundle: Any) -> Record | None:
    """The float linear kernel of `cand`'s module that a QDQ copy of the module's output quantizes, reached
    through ops that only move, select or scale values (a gain past frame N) and the QDQ copies between them;
    None for a copy of anything else (a norm's output: what its kernel's figures say does not hold after it)."""
    fields = quant_fields(cand.tags)
    if not fields or "zp" not in fields:
        return None
    todo, seen = [fields.get("act", "")], set()
    while todo and len(seen) < 64:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        rec = cand_bundle.get(name)
        # (what the copy quantizes may be a kernel of another module: a conv the exporter folded a norm into)
        if rec is None or rec.kind != KIND_OUTPUT or (rec.module != cand.module and name != fields.get("act")):
            continue
        if rec.op in _LINEAR_KERNELS:
            return rec
        if rec.op in _COPY_OPS or rec.op in _QDQ_OPS:
            todo.extend(rec.inputs[:1] if rec.op.endswith("QuantizeLinear") else rec.inputs)
        else:
            return None
    return None


def _last_kernels(cand_bundle: Any) -> dict[str, Record]:
    """Module path -> the last op record of its own (not of a submodule) that carries an int8 kernel's figures
    (a `quant:` tag): what the module's output computed after that kernel (a gain, a concatenation) is judged
    by. A container's output is not: a norm after its conv amplifies what the kernel's figures do not say."""
    return {r.module: r for r in every_record(cand_bundle)
            if "/" in r.name and not r.op.startswith("module:") and quant_fields(r.tags) is not None}


# ops that move, select or scale values: what they do to a kernel's error is its size, not more
_COPY_OPS = frozenset({"Slice", "Concat", "Mul", "Add", "Sub", "Reshape", "Transpose", "Cast", "Identity", "Squeeze",
                       "Unsqueeze", "Pad", "Expand", "Gather", "Split", "Where", "Neg"})


def _after_kernel(cand: Record, kernel: Record | None, cand_bundle: Any) -> Record:
    """`kernel` when module output `cand` is made from it by ops that only move, select or scale values (a gain
    past frame N, a concatenation), else `cand`: after a softmax or a norm the kernel's figures say nothing."""
    if kernel is None or cand.op not in _COPY_OPS:
        return cand
    todo, seen = list(cand.inputs), set()
    reached = False
    while todo and len(seen) < 256:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name == kernel.name:
            reached = True
            continue
        rec = cand_bundle.get(name)
        if rec is None or rec.module != cand.module or "/" not in name or rec.kind != KIND_OUTPUT:
            continue         # a weight, a constant, a value from before the module
        if "zp" in (quant_fields(rec.tags) or {}):
            continue         # another QDQ copy in the module: what it quantizes is judged at its own kernel
        if rec.op not in _COPY_OPS and rec.op != "QuantizeLinear":
            return cand
        todo.extend(rec.inputs)
    return kernel if reached else cand


def _error_known(p: PairResult) -> float | None:
    """A pair's relative error: measured, else the larger of what its statistics prove and its sketches
    estimate (a statistics-only capture), None when neither is known."""
    if p.rel_err is not None:
        return p.rel_err
    seen = [v for v in (p.metrics.get("rel_l2_err_lower"), p.metrics.get("rel_l2_err_estimate"))
            if v is not None and math.isfinite(v)]
    return max(seen) if seen else None


def _with_finding(p: PairResult, q: QuantNoise, op: str | None, gain: float, e: float) -> PairResult:
    """`op`: the float op an int8 kernel's result stands for (None for a QDQ copy, whose error beyond its rounding
    is what its input brings, amplified as its consumer's op allows: not judged here); `e`: its error."""
    e_in = p.input_rel_err or 0.0
    explained = math.hypot(q.expected, gain * e_in)
    if op is not None and p.cause in (CAUSE_QUANTIZED, CAUSE_INHERITED, CAUSE_OWN) and e > FAR * explained:
        why = (f"relative error {e:.3g} is {e / explained:,.0f}x what int8 explains here ({q.words()}; its inputs "
               f"differ by {e_in:.2g}): not quantization noise. {_fix_beyond(op)}")
        return replace(p, cause=CAUSE_OWN, origin=p.name, explanation=why, quantization=replace(q, finding=why))
    if p.cause == CAUSE_QUANTIZED and q.coarse and e >= COARSE_ERROR:
        why = f"{q.words()}. {_fix_coarse(q, op)}"
        return replace(p, explanation=why, quantization=replace(q, finding=why))
    return replace(p, quantization=q)


def _fix_beyond(op: str) -> str:
    if op in _RECURRENT:
        return (f"A quantized {op} compounds its rounding over time steps: keep it in float "
                "(quantize_dynamic(..., nodes_to_exclude=[...]) or op_types_to_quantize without it)")
    return ("Check this node's scale and zero point (a wrong scale moves every value); on x86 without VNNI, u8xs8 "
            "products saturate int16: quantize with reduce_range=True, or exclude this node (nodes_to_exclude)")


def _fix_coarse(q: QuantNoise, op: str | None) -> str:
    if q.clipped > 0:
        return (f"The scale clips: the values reach beyond [{q.low:.3g}, {q.high:.3g}] ({q.clipped:.0%} of their "
                "range): calibrate on representative inputs, or exclude this node (nodes_to_exclude)")
    if q.weight_levels is not None and q.weight_levels < COARSE_LEVELS:
        return (f"The weight's scale spans outlier channels: its rms is {q.weight_levels:.1f} steps. Quantize the "
                "weights per channel (quantize_static's per_channel=True: quantize_dynamic's ConvInteger keeps one "
                "scale per tensor), or leave this node in float (nodes_to_exclude)")
    return (f"The activation's scale spans outliers: its rms is {q.levels:.1f} steps, its largest value "
            f"{max(abs(q.low), abs(q.high)) / q.rms:,.0f}x the rms. Exclude this node (nodes_to_exclude), or scale the "
            "outlier channels down before it" + (f"; a {op} is better left in float" if op in _RECURRENT else ""))


@dataclass(frozen=True)
class QuantizedInput:
    """The quantized value nearest a record's candidate (`source`), and the int8 rounding of every quantized copy
    on its way back to the compared records (`chain`: their `QuantNoise.expected` added in quadrature; 0 when
    none is a QDQ copy whose scale is known): what code no record shows may amplify, in a static int8 port."""
    source: str
    chain: float = 0.0
    copies: int = 0


def quantized_inputs(cand_bundle: Any, results: Sequence[PairResult]) -> dict[str, QuantizedInput]:
    """Reference name -> the nearest candidate record tagged quantized that its candidate record was computed from
    through records with no reference counterpart: QDQ's quantized copy of a model input, the in-projection inside a
    fused attention op the reference computes in one (`_native_multi_head_attention`)."""
    if cand_bundle is None:
        return {}
    paired = {p.cand_name for p in results}
    out = {}
    for p in results:
        c = cand_bundle.get(p.cand_name)
        found = _quantized_source(cand_bundle, c.inputs, paired) if c is not None else None
        if found is not None:
            out[p.name] = found
    return out


def _quantized_source(bundle: Any, start: Sequence[str], paired: set[str], limit: int = 10_000) -> QuantizedInput | None:
    """Breadth first through unpaired records: the first tagged quantized (a float one before integer units),
    with the rounding of every QDQ copy met on the way back to paired records."""
    todo, seen = list(start), set(start)
    source: str | None = None
    rounding: list[float] = []
    while todo and len(seen) < limit:
        level, todo = todo, []
        hits = []
        for name in level:
            rec = bundle.get(name)
            if rec is None or name in paired:
                continue
            if TAG_QUANTIZED in rec.tags:
                hits.append(rec)
                if (q := _copy_rounding(rec, bundle)) is not None:
                    rounding.append(q)
            todo += [i for i in rec.inputs if i not in seen]
            seen.update(rec.inputs)
        if hits and source is None:
            source = min(hits, key=lambda r: TAG_INTEGER_DOMAIN in r.tags).name
    if source is None:
        return None
    return QuantizedInput(source, math.sqrt(sum(q * q for q in rounding)), len(rounding))


def _copy_rounding(rec: Record, bundle: Any) -> float | None:
    """A QDQ copy's relative rounding (step / sqrt(12) / rms of what it quantizes), None for anything else."""
    fields = quant_fields(rec.tags)
    if not fields or "zp" not in fields:
        return None
    act, step = bundle.get(fields.get("act", "")), _number(fields.get("scale"), bundle)
    x_rms = rms(act.stats) if act is not None and act.stats.kind == "float" else None
    return step / math.sqrt(12) / x_rms if step and x_rms else None


def integer_domain_note(cand_only: Sequence[str], cand_bundle: Any) -> str | None:
    """One line for the candidate's values in integer units or quantization parameters left unpaired (by design)."""
    if cand_bundle is None:
        return None
    names = [n for n in cand_only if (r := cand_bundle.get(n)) is not None and TAG_INTEGER_DOMAIN in r.tags]
    if not names:
        return None
    ops = sorted({cand_bundle.get(n).op for n in names})
    return (f"{len(names):,} candidate value{'s' if len(names) != 1 else ''} in integer units or quantization "
            f"parameters ({', '.join(ops[:4])}{', ...' if len(ops) > 4 else ''}) "
            f"{'are' if len(names) != 1 else 'is'} not compared with float values: the reference values are compared "
            "with the rescaled values computed from them")


def scaled_weights(weights: list[PairResult], ref_bundle: Any, cand_bundle: Any) -> list[PairResult]:
    """A failing weight dequantized from int8 whose values are the reference's times a constant (cosine ~1, the
    norms in another ratio) is said to be: its quantization scale is off by that factor (a scale initializer
    edited, or computed for another tensor)."""
    if ref_bundle is None or cand_bundle is None:
        return weights
    out = []
    for p in weights:
        cos = p.metric("cosine")
        if p.failed and cos is not None and cos > 0.999 and any(t.startswith("dequantized") for t in p.tags):
            r, c = ref_bundle.get(p.name), cand_bundle.get(p.cand_name)
            ratio = (rms(c.stats) or 0.0) / (rms(r.stats) or math.inf) if r is not None and c is not None else 0.0
            if ratio and abs(ratio - 1.0) > 0.01:
                p = replace(p, explanation=f"the dequantized weight is the reference's x{ratio:.3g} (cosine {cos:.6f}): "
                                           "its int8 scale is off by that factor; check the scale stored with it")
        out.append(p)
    return out
