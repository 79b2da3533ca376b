"""What each value of a quantized ONNX graph holds: integer units, quantization parameters, or float values.

A graph made by `onnxruntime.quantization` computes some values in integer units (the uint8 tensor a
`DynamicQuantizeLinear` or `QuantizeLinear` makes, the int32 accumulator of `MatMulInteger`/`ConvInteger`, the
`Cast` of that accumulator to float, an int32 bias added before the rescale, a `QLinear*` result) and some
quantization parameters (scales, zero points, the product of the input's and the weight's scales). Neither holds
a value a float reference holds: they are tagged `integer_domain` and `diff` never compares them with float
values. The float value the reference holds is the **rescaled** one: the `Mul` of the integer result by its
scales (and the bias `Add` after it), or a `DequantizeLinear`. A rescaled value is tagged `rescaled:<Op>` with the
float op it stands for (`rescaled:Conv`), and `quant:` with where its quantization parameters are recorded, so
that `diff` can say how much noise int8 is expected to add there (`tensorprobe.diff.quantization`):

    quant:act=conv1/Pad.0;scale=conv1/DynamicQuantizeLinear.0:1;weight=conv1.weight     dynamic quantization
    quant:act=conv1;scale=0.0123;zp=128;q=uint8                                         a QDQ pair of a value

Record names hold no `;` or `=`, so the tag parses back unambiguously (`diff.quantization.quant_fields`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ...record import TAG_INTEGER_DOMAIN, TAG_QUANT, TAG_QUANTIZED, TAG_RESCALED

UNITS, PARAMS = "units", "params"
# ops whose outputs are integer units (so are QLinear ops', and QGemm's when it returns integers)
QUANTIZERS = {"QuantizeLinear", "DynamicQuantizeLinear"}
INTEGER_KERNELS = {"MatMulInteger": "MatMul", "ConvInteger": "Conv"}
# fused kernels that compute with int8 and return float: their output is already rescaled
FLOAT_RESULTS = {"DynamicQuantizeMatMul": "MatMul", "MatMulIntegerToFloat": "MatMul", "DynamicQuantizeLSTM": "LSTM",
                 "QAttention": "Attention", "QGemm": "Gemm"}
_SHAPE_OPS = {"Shape", "Size"}
_SCALING = {"Mul"}
_ADDING = {"Add", "Sub"}
# ONNX element types of the integer types quantization uses: (name, qmin, qmax)
_QRANGE = {2: ("uint8", 0, 255), 3: ("int8", -128, 127), 4: ("uint16", 0, 65535), 5: ("int16", -32768, 32767)}
_INT32 = 6    # a quantized bias's type


@dataclass
class Kernel:
    """Where an integer result's quantization parameters come from (ONNX value names, or numbers)."""

    op: str                       # the float op it stands for: Conv, MatMul
    act: str | None = None        # the float value that was quantized
    scale: str | float | None = None
    weight: str | None = None     # the quantized weight initializer


@dataclass
class Roles:
    """Values of a graph in integer units or quantization parameters, and rescaled float values."""

    domain: dict[str, str] = field(default_factory=dict)      # value -> UNITS | PARAMS
    rescaled: dict[str, Kernel] = field(default_factory=dict)  # value -> the kernel it is the float result of
    qdq: dict[str, tuple[str, float, int, str]] = field(default_factory=dict)  # DQ value -> (v, scale, zp, type)
    kernels: dict[str, Kernel] = field(default_factory=dict)   # integer units value -> the kernel it comes from

    def integer(self, value: str) -> bool:
        return value in self.domain

    def kernel_of(self, value: str) -> Kernel | None:
        """The integer kernel whose result `value` holds (its accumulator, the Cast, the rescaled value)."""
        return self.rescaled.get(value) or self.kernels.get(value)

    def tags(self, value: str, record: Callable[[str], str | None]) -> tuple[str, ...]:
        """The tags of `value`'s record; `record` gives the record name of another value (None if it has none)."""
        if value in self.domain:
            return (TAG_QUANTIZED, TAG_INTEGER_DOMAIN)
        k = self.rescaled.get(value)
        if k is not None:
            parts = [(n, record(v)) for n, v in (("act", k.act), ("weight", k.weight))]
            scale = k.scale if isinstance(k.scale, float) else record(k.scale) if k.scale else None
            parts.append(("scale", f"{scale:.6g}" if isinstance(scale, float) else scale))
            info = ";".join(f"{n}={v}" for n, v in parts if v)
            return (TAG_QUANTIZED, f"{TAG_RESCALED}{k.op}") + ((f"{TAG_QUANT}{info}",) if info else ())
        q = self.qdq.get(value)
        if q is not None:
            v, scale, zp, qtype = q
            act = record(v)
            return (f"{TAG_QUANT}" + ";".join(x for x in (f"act={act}" if act else "", f"scale={scale:.6g}",
                                                        f"zp={zp}", f"q={qtype}") if x),)
        return ()


def quantization_roles(nodes: list[Any], producer: dict[str, int], initializers: dict[str, Any],
                       types: dict[str, int], constant: Callable[[str], bool]) -> Roles:
    """Walk the nodes (in topological order) and tell, for each value, whether it holds integer units, quantization
    parameters, a rescaled float value, or (not listed) a float value. `constant(v)`: v depends on no graph input."""
    roles = Roles()
    kernels = roles.kernels    # integer-units value -> its kernel (through casts and int32 bias adds)
    params = _parameter_initializers(nodes)
    for node in nodes:
        outs = [o for o in node.output if o]
        ins = [v for v in node.input if v]
        kinds = [_kind(v, roles, initializers, params, constant) for v in ins]
        op = node.op_type
        if op in _SHAPE_OPS or not outs:
            continue
        if op == "DynamicQuantizeLinear":
            roles.domain.update({outs[0]: UNITS, **{o: PARAMS for o in outs[1:]}})
        elif op in QUANTIZERS or op.startswith("QLinear") or (op == "QGemm" and types.get(outs[0]) in _QRANGE):
            roles.domain.update((o, UNITS) for o in outs)
        elif op in INTEGER_KERNELS:
            roles.domain[outs[0]] = UNITS
            kernels[outs[0]] = _kernel(INTEGER_KERNELS[op], ins, nodes, producer)
        elif op in FLOAT_RESULTS:
            roles.rescaled[outs[0]] = Kernel(FLOAT_RESULTS[op], act=ins[0] if ins else None)
        elif op == "DequantizeLinear":
            _dequantized(node, ins, nodes, producer, initializers, roles)
        elif op in _SCALING and UNITS in kinds and all(k in (UNITS, PARAMS, "const") for k in kinds):
            # the rescale: integer units times their scales make the float value the reference holds
            src = next((kernels[v] for v in ins if v in kernels), None)
            roles.rescaled[outs[0]] = src or Kernel(op="MatMul")
        elif op in _ADDING and sum(v in roles.rescaled for v in ins) == 1 and all(
                v in roles.rescaled or k == "const" for v, k in zip(ins, kinds)):
            roles.rescaled[outs[0]] = next(roles.rescaled[v] for v in ins if v in roles.rescaled)   # bias after it
        elif kinds and all(k in (UNITS, PARAMS, "const") for k in kinds) and any(k != "const" for k in kinds):
            # casts, int32 bias adds, products of scales, reshapes of quantized tensors: what they read
            role = UNITS if UNITS in kinds else PARAMS
            roles.domain.update((o, role) for o in outs)
            src = next((kernels[v] for v in ins if v in kernels), None)
            if src is not None and role == UNITS:
                kernels.update((o, src) for o in outs)
    return roles


def _kind(v: str, roles: Roles, initializers: dict[str, Any], params: set[str], constant: Callable[[str], bool]) -> str:
    if v in roles.domain:
        return roles.domain[v]
    if v in params:
        return PARAMS
    if v in initializers:
        return UNITS if initializers[v].data_type in _QRANGE or initializers[v].data_type == _INT32 else "const"
    return "const" if constant(v) else "float"


def _parameter_initializers(nodes: list[Any]) -> set[str]:
    """Initializers read as scales or zero points: inputs 1 and 2 of (De)QuantizeLinear, 2 and 3 of the integer
    kernels (zero points), and the scale/zero-point inputs of QLinear ops (every input but the data ones)."""
    out: set[str] = set()
    for n in nodes:
        ins = list(n.input)
        if n.op_type in ("QuantizeLinear", "DequantizeLinear"):
            out.update(ins[1:3])
        elif n.op_type in INTEGER_KERNELS:
            out.update(ins[2:4])
        elif n.op_type.startswith("QLinear") or n.op_type == "QGemm":
            out.update(v for i, v in enumerate(ins) if i % 3 != 0)   # (x, x_scale, x_zp, w, w_scale, w_zp, ...)
    out.discard("")
    return out


def _kernel(op: str, ins: list[str], nodes: list[Any], producer: dict[str, int]) -> Kernel:
    """The float value an integer kernel's activation input quantizes, its scale, and its weight."""
    k = Kernel(op=op)
    if ins:
        i = producer.get(ins[0])
        q = nodes[i] if i is not None else None
        if q is not None and q.op_type == "DynamicQuantizeLinear" and q.input:
            k.act, k.scale = q.input[0], q.output[1] if len(q.output) > 1 else None
    if len(ins) > 1 and ins[1] not in producer:
        k.weight = ins[1]
    return k


def _dequantized(node: Any, ins: list[str], nodes: list[Any], producer: dict[str, int],
                 initializers: dict[str, Any], roles: Roles) -> None:
    """A DequantizeLinear of a QuantizeLinear of v (QDQ): the quantized copy of v, with a scale known from the
    file."""
    from onnx import numpy_helper

    i = producer.get(ins[0]) if ins else None
    q = nodes[i] if i is not None else None
    if q is None or q.op_type != "QuantizeLinear" or not q.input or len(ins) < 2 or ins[1] not in initializers:
        return
    scale = numpy_helper.to_array(initializers[ins[1]])
    zp_init = initializers.get(ins[2]) if len(ins) > 2 else None
    zp = numpy_helper.to_array(zp_init) if zp_init is not None else None
    if scale.size != 1 or (zp is not None and zp.size != 1):
        return      # per-channel activations: no single step to report
    qtype = _QRANGE.get(zp_init.data_type if zp_init is not None else 2, ("uint8", 0, 255))[0]
    roles.qdq[node.output[0]] = (q.input[0], float(scale.reshape(())), int(zp.reshape(())) if zp is not None else 0,
                                 qtype)

