"""One captured tensor: where it came from, what it looks like, where its data lives.

Record names follow one grammar, shared by every capture source (PyTorch, ONNX Runtime, a port's dump)
so that `diff` lines them up by name:

    <module path>[@<call>][/<op>.<k>][:<output>]

    decoder.generator.noise_res.0.adain1.0.norm            module output, first call
    decoder.generator.noise_res.0.adain1.0.norm@3          the same module's fourth call (loops, ODE steps)
    generator.noise_res.0.adain1.0.norm/rsqrt.0            first aten.rsqrt inside that module call
    generator.m_source.l_sin_gen/randn_like.0              a random op (kind "rng")
    encode:1                                               second tensor of a module returning a tuple
    encode:in0                                             first tensor input of a module (kind "input")

The root module's path is "" and prints as `<root>`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any


from .stats import TensorStats

ROOT = "<root>"

KIND_OUTPUT = "output"  # output of a module or an op
KIND_INPUT = "input"    # an input of a module call (kept for replay / isolate)
KIND_RNG = "rng"        # output of a random op (randn, rand, dropout, ...)
KIND_MODEL_INPUT = "model_input"  # the inputs handed to the model
KIND_MODEL_OUTPUT = "model_output"  # every tensor the model returned, named by its path: output, output.0, output.wav
KIND_PARAM = "param"    # a parameter (state-dict name), or a weight derived from parameters (tag "derived")
KIND_BUFFER = "buffer"  # a buffer (state-dict name): running statistics, fixed tables, ...
# Records that are not made by the forward: they have no place in execution order and pair only by name.
WEIGHT_KINDS = (KIND_PARAM, KIND_BUFFER)

# Tag of a runtime's record computed from random ops that the port replaced by zeros (random="zeros"):
# it differs from the reference by construction, so `diff` does not compare it.
TAG_RANDOM_REPLACED = "random_replaced"
# Tag of a runtime's record whose op is hidden (a delegate call's outputs, e.g. XNNPACK): which reference
# op it corresponds to is unknown, so `diff` pairs it only by name or mapping rule, never by order.
TAG_OPAQUE = "opaque"
# Tag of a weight computed from other parameters (weight_norm's `weight` from `weight_g` and `weight_v`, a
# parametrization's value): what a port that folded the parametrization holds under that name.
TAG_DERIVED = "derived"
# Tag of a runtime record made by quantized arithmetic (QuantizeLinear/DequantizeLinear, an int8 kernel and the
# rescale after it): its difference from a float reference is quantization error, expected of an int8 port.
TAG_QUANTIZED = "quantized"
TAG_OWN_CODE = "own_code"   # a module record of a class defined outside torch: code the noise model cannot know
# Tag prefix of a weight dequantised from integers, followed by its largest quantisation step (the scale):
# rounding to that step is what the conversion explains.
TAG_QSTEP = "qstep:"
# Tag of a runtime record holding integer units or quantization parameters (a uint8 tensor, an int32 accumulator
# or its Cast to float, a scale, a zero point): no float reference value holds these, so `diff` never compares them
# with one; the reference value meets the rescaled float value computed from them (tag `rescaled:`).
TAG_INTEGER_DOMAIN = "integer_domain"
# Tag prefix of a runtime record that is the float result of quantized arithmetic (the Mul of an integer result by
# its scales, the bias Add after it), followed by the float op it stands for: "rescaled:Conv".
TAG_RESCALED = "rescaled:"
# Tag prefix of a quantized record, followed by where its quantization parameters are:
# "quant:act=<record>;scale=<record or number>;weight=<record>" (`runtimes.onnxruntime.quant`).
TAG_QUANT = "quant:"
# Tag prefix of a runtime record that stands for another value of its graph, followed by that value's runtime
# name: in a QDQ model the DequantizeLinear after a QuantizeLinear of v is what v's consumers see, so `diff`
# pairs it with the reference's v.
TAG_STANDS_FOR = "stands_for:"
# A random record whose values were fed back from a recording (`tensorprobe.rng`, `--replay-rng`).
TAG_REPLAYED = "replayed"
# Tag prefix of a random record, followed by what it draws (`rng.draws.Draw`): "draw:normal(mean=0,std=1):float".
# Replay feeds a recorded draw only to the same kind of draw, and `diff` compares the two sides' draws.
TAG_DRAW = "draw:"
# Tag of a module record of a runtime whose op records (left out of a module-level comparison) include random
# draws not replayed from the reference: the module's output is computed from draws that differ.
TAG_DRAWS_RANDOM = "draws_random"
# Tag of a module-level record one of whose tensor inputs no record made (it came from code of a parent module
# that module level does not record): NaN in it may have been born there, before the call.
TAG_INPUTS_UNRECORDED = "inputs_unrecorded"
# Tag prefix beside it, followed by the module path whose own code made that input ("" for the root): the parent
# of the outermost module call that received it (it may have been handed down through several calls).
TAG_INPUTS_MADE_IN = "inputs_made_in:"
# Tag of an op-level record whose op read a non-finite scalar argument (`masked_fill(m, -inf)`, `x + float("-inf")`):
# ±Inf it holds from finite inputs is that constant's, a deliberate mask (`nan.masks`), not an overflow.
TAG_NONFINITE_CONSTANT = "nonfinite_constant"
# The op of a record read from a plain tensor file (`.safetensors`, `.npz`): nothing is known of what made it.
OP_UNKNOWN = "tensor"


@dataclass(frozen=True)
class Record:
    """Metadata and statistics of one captured tensor (its data, if kept, lives in a shard)."""

    name: str
    module: str
    op: str
    order: int
    shape: tuple[int, ...]
    dtype: str
    stats: TensorStats
    kind: str = KIND_OUTPUT
    call: int = 0
    device: str = "cpu"
    source: str | None = None
    inputs: tuple[str, ...] = ()
    shard: str | None = None
    runtime_name: str | None = None
    tags: tuple[str, ...] = ()
    digest: str | None = None    # content fingerprint of the data (`stats.tensor_digest`), weights only

    @property
    def has_tensor(self) -> bool:
        return self.shard is not None

    def with_(self, **changes: Any) -> "Record":
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        # From __dict__, not dataclasses.asdict: that deep-copies, and a capture writes thousands of these.
        d = {f: list(v) if type(v) is tuple else v for f, v in self.__dict__.items() if v is not None and v != ()}
        d["stats"] = self.stats.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Record":
        return cls(
            name=str(d["name"]), module=str(d.get("module", "")), op=str(d.get("op", "")),
            order=int(d.get("order", 0)), shape=tuple(int(s) for s in d.get("shape", ())),
            dtype=str(d.get("dtype", "")), stats=TensorStats.from_dict(d.get("stats", {"numel": 0})),
            kind=str(d.get("kind", KIND_OUTPUT)), call=int(d.get("call", 0)),
            device=str(d.get("device", "cpu")), source=d.get("source"),
            inputs=tuple(d.get("inputs", ())), shard=d.get("shard"),
            runtime_name=d.get("runtime_name"), tags=tuple(d.get("tags", ())), digest=d.get("digest"),
        )



def dtype_name(dtype: Any) -> str:
    """'float32' for torch.float32, numpy float32 and the string 'float32' alike."""
    try:
        return _DTYPE_NAMES[dtype]   # NumPy's dtype.name costs ~5 µs, and a capture asks for each record
    except (KeyError, TypeError):   # TypeError: an unhashable dtype-like
        pass
    if type(dtype).__module__ == "torch":   # torch.dtype, without importing torch for NumPy callers
        name = str(dtype).removeprefix("torch.")
    else:
        name = str(getattr(dtype, "name", dtype))
    try:
        if len(_DTYPE_NAMES) < 256:
            _DTYPE_NAMES[dtype] = name
    except TypeError:
        pass
    return name


_DTYPE_NAMES: dict[Any, str] = {}


def module_label(path: str) -> str:
    return path if path else ROOT


def module_place(path: str | None, module_type: str | None = None) -> str:
    """How a finding names a module: its path; the root, whose path says nothing, with the model's class.

    >>> module_place("", "KokoroDecoder"), module_place("gen.norm", "InstanceNorm1d"), module_place("")
    ('<root> (KokoroDecoder)', 'gen.norm', '<root>')
    """
    label = module_label(path or "")
    return f"{label} ({module_type})" if not path and module_type else label


def source_location(source: str | None) -> str | None:
    """`file.py:12` of a record's source line (`file.py:12 (forward)`), or None.

    >>> source_location("model.py:12 (forward)"), source_location(None)
    ('model.py:12', None)
    """
    return source.rsplit(" (", 1)[0] if source else None


def op_place(path: str | None, module_type: str | None = None, source: str | None = None) -> str:
    """How a finding names where an op ran: its module's path, or, for an op of the top-level module's own
    forward (path ""), that forward with the model's class and the op's source line. The root is a module
    like any other, never "the loss" (the loss function's ops have their own scope, see nan.backward).

    >>> op_place("", "Vocoder", "model.py:12 (forward)"), op_place("gen.norm", "InstanceNorm1d"), op_place("")
    ("the model's own forward (Vocoder.forward, model.py:12)", 'gen.norm', "the model's own forward")
    """
    if path:
        return module_place(path, module_type)
    what = ", ".join(w for w in (f"{module_type}.forward" if module_type else None, source_location(source)) if w)
    return f"the model's own forward ({what})" if what else "the model's own forward"


def record_name(module: str, call: int = 0, op: str | None = None, k: int = 0,
                output: int | str | None = None) -> str:
    """Build a record name following the grammar in this module's docstring.

    >>> record_name("gen.norm", call=2, op="aten.rsqrt.default", k=0)
    'gen.norm@2/rsqrt.0'
    """
    name = module_label(module)
    if call:
        name += f"@{call}"
    if op is not None:
        name += f"/{short_op(op)}.{k}"
    if output is not None:
        name += f":{output}"
    return name


NAME_RE = re.compile(r"^(?P<module>[^@/:]*)(?:@(?P<call>\d+))?(?:/(?P<op>[^:]+?)\.(?P<k>\d+))?(?::(?P<output>.+))?$")


def parse_name(name: str) -> tuple[str, int]:
    """Module path and call index of a record name (the inverse of `record_name` for those two parts).

    >>> parse_name("gen.norm@2/rsqrt.0:1")
    ('gen.norm', 2)
    >>> parse_name("<root>/Div.0")
    ('', 0)
    """
    m = NAME_RE.match(name)
    if m is None:
        return name, 0
    module = m.group("module")
    return ("" if module == ROOT else module), int(m.group("call") or 0)


def short_op(op: str) -> str:
    """'aten.native_instance_norm.default' -> 'native_instance_norm'."""
    parts = op.split(".")
    if parts and parts[0] in ("aten", "prims", "quantized"):
        parts = parts[1:]
    if len(parts) > 1 and parts[-1] in ("default", "Tensor", "Scalar", "out", "self", "int", "dim",
                                        "Tensor_Tensor", "Tensor_Scalar", "Scalar_Tensor", "correction"):
        parts = parts[:-1]
    return ".".join(parts) or op
