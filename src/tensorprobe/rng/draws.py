"""What a random op draws: its distribution and parameters, so that a recorded draw is fed (and compared) only
to the same kind of draw. NumPy/torch-free at import: capture, replay, the ONNX Runtime adapter and `diff` share it.

A `Draw` is the distribution (`normal`, `uniform`, `integers`, `bernoulli`, `dropout`, ...), its parameters
with the op's defaults filled in (`randn_like` is normal with mean 0 and std 1, like `normal_()` and ONNX's
`RandomNormalLike`), and the kind of numbers drawn (float, int, bool). A parameter given as a tensor (the
probabilities of `bernoulli(p)`) is "tensor": its values are the op's input, compared elsewhere.

    >>> d = Draw.parse("normal(mean=0,std=1):float")
    >>> d.text(), d.conflict(Draw.parse("uniform(low=0,high=1):float"))
    ('normal(mean=0,std=1):float', 'distribution')
    >>> draw_of_record_op("aten.randn_like.default", "float32").text()
    'normal(mean=0,std=1):float'

Records of kind "rng" carry their draw as a tag, `draw:normal(mean=0,std=1):float` (`TAG_DRAW`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from ..ops import canonical_op
from ..record import TAG_DRAW

# aten op -> (distribution, parameter renames, defaults of parameters the op does not take)
_ATEN: dict[str, tuple[str, dict[str, str], dict[str, float]]] = {
    "randn": ("normal", {}, {"mean": 0.0, "std": 1.0}),
    "randn_like": ("normal", {}, {"mean": 0.0, "std": 1.0}),
    "normal": ("normal", {}, {}),
    "normal_": ("normal", {}, {}),
    "rand": ("uniform", {}, {"low": 0.0, "high": 1.0}),
    "rand_like": ("uniform", {}, {"low": 0.0, "high": 1.0}),
    "uniform_": ("uniform", {"from": "low", "to": "high"}, {}),
    "randint": ("integers", {}, {"low": 0.0}),
    "randint_like": ("integers", {}, {"low": 0.0}),
    "random_": ("integers", {"from": "low", "to": "high"}, {}),
    "randperm": ("permutation", {}, {}),
    "bernoulli": ("bernoulli", {}, {}),
    "bernoulli_": ("bernoulli", {}, {}),
    "native_dropout": ("bernoulli", {}, {}),    # its mask: p below becomes the probability to keep
    "multinomial": ("multinomial", {"self": "probs"}, {}),
    "exponential_": ("exponential", {"lambd": "rate"}, {}),
    "geometric_": ("geometric", {}, {}),
    "cauchy_": ("cauchy", {}, {}),
    "log_normal_": ("log_normal", {}, {}),
    "poisson": ("poisson", {"self": "rate"}, {}),
    "_standard_gamma": ("gamma", {"self": "alpha"}, {}),
    "binomial": ("binomial", {}, {}),
    "rrelu_with_noise": ("rrelu", {}, {}),
}
# ONNX random operators -> (distribution, attribute renames, defaults from the ONNX spec)
_ONNX: dict[str, tuple[str, dict[str, str], dict[str, float]]] = {
    "RandomNormal": ("normal", {"scale": "std"}, {"mean": 0.0, "std": 1.0}),
    "RandomNormalLike": ("normal", {"scale": "std"}, {"mean": 0.0, "std": 1.0}),
    "RandomUniform": ("uniform", {}, {"low": 0.0, "high": 1.0}),
    "RandomUniformLike": ("uniform", {}, {"low": 0.0, "high": 1.0}),
    "Bernoulli": ("bernoulli", {}, {"p": math.nan}),       # p is the input tensor
    "Multinomial": ("multinomial", {"sample_size": "num_samples"}, {"probs": math.nan}),
}
_ONNX_ATTRS = {"mean", "scale", "low", "high", "sample_size"}
# Schema arguments that say where or how a draw is stored, not what is drawn.
_NOT_PARAMS = {"size", "dtype", "layout", "device", "pin_memory", "generator", "memory_format", "out", "names",
               "requires_grad", "train", "training", "noise"}
TENSOR = math.nan    # a parameter given as a tensor: its values are an input of the op, not a constant
_TEXT = re.compile(r"^(?P<dist>[\w.]+)(?:\((?P<params>[^)]*)\))?(?::(?P<kind>\w+))?$")


@dataclass(frozen=True)
class Draw:
    """One random op's draw: distribution, parameters (name -> value; NaN: given as a tensor; None: not
    known, e.g. a bundle captured before draws were described) and the kind of number (float, int, bool)."""

    distribution: str
    params: tuple[tuple[str, float], ...] | None = ()
    kind: str | None = None
    op: str | None = field(default=None, compare=False)   # the op that drew it, for words only

    def text(self) -> str:
        """'normal(mean=0,std=1):float' (what the record tag holds after `draw:`)."""
        out = self.distribution
        if self.params is not None:
            out += "(" + ",".join(f"{k}={_num(v)}" for k, v in self.params) + ")"
        return out + (f":{self.kind}" if self.kind else "")

    def tag(self) -> str:
        return TAG_DRAW + self.text()

    def with_kind(self, dtype: Any) -> "Draw":
        """The same draw, of the kind of number `dtype` holds."""
        return Draw(self.distribution, self.params, _kind_of(dtype), self.op)

    @classmethod
    def parse(cls, text: str) -> "Draw | None":
        m = _TEXT.match(text.removeprefix(TAG_DRAW))
        if m is None:
            return None
        params = None
        if m.group("params") is not None:
            items = [p.split("=", 1) for p in m.group("params").split(",") if "=" in p]
            try:
                params = tuple((k, TENSOR if v == "tensor" else float(v)) for k, v in items)
            except ValueError:   # a tag written by hand or damaged: what it draws is not known
                return None
        return cls(m.group("dist"), params, m.group("kind"))

    def conflict(self, other: "Draw") -> str | None:
        """What differs from `other`: 'distribution', 'parameters', 'kind', or None when they may be the same
        draw. A parameter only one side states, or a tensor parameter, is not held against them."""
        if self.distribution != other.distribution:
            return "distribution"
        if self.kind and other.kind and self.kind != other.kind:
            return "kind"
        if self.params is not None and other.params is not None:
            mine, theirs = dict(self.params), dict(other.params)
            for k in mine.keys() & theirs.keys():
                a, b = mine[k], theirs[k]
                if not (math.isnan(a) or math.isnan(b)) and not math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-12):
                    return "parameters"
        return None

    def words(self, op: str | None = None, with_params: bool = True) -> str:
        """'normal `randn_like`', with its parameters: 'normal (mean 0, std 0.5) `normal_`'."""
        shown = [(k, v) for k, v in (self.params or ()) if not math.isnan(v)] if with_params else []
        params = f" ({', '.join(f'{k} {_num(v)}' for k, v in shown)})" if shown else ""
        op = op or self.op
        return f"{self.distribution}{params}" + (f" `{_op_words(op)}`" if op else "")


@dataclass(frozen=True)
class DrawMismatch:
    """A random op whose draw differs from the recorded draw replay would have fed it: replay refused, so the op
    kept its own draw, and the difference is a finding at that op (a port difference, not noise)."""

    name: str                # the op's record name in this run (or its op, unnamed)
    recorded: str            # the recorded draw it was matched with
    words: str               # 'draws uniform `rand_like` where the reference draws normal `randn_like`'
    source: str | None = None

    def sentence(self) -> str:
        where = f" ({self.source})" if self.source else ""
        return (f"random op {self.name}{where} {self.words.removeprefix('the candidate ')} ({self.recorded}): "
                "not replayed, it keeps its own draw")

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "recorded": self.recorded, "words": self.words, "source": self.source,
                "message": self.sentence()}


def is_draw_mismatch(text: str) -> bool:
    """Is `text` what `mismatch_words` or `draws_differ_words` says (a reason that names a draw that differs)?"""
    return text.startswith("the candidate draws ")


def mismatch_words(cand: Draw, cand_op: str | None, ref: Draw, ref_op: str | None,
                   subject: str = "the candidate") -> str:
    """'the candidate draws uniform `rand_like` where the reference draws normal `randn_like`'."""
    what = cand.conflict(ref)
    params = what != "distribution"
    text = f"{subject} draws {cand.words(cand_op, params)} where the reference draws {ref.words(ref_op, params)}"
    if what == "kind":
        text += f" ({cand.kind} numbers against {ref.kind})"
    return text


def draws_differ_words(cand: Sequence["Draw | None"], ref: Sequence["Draw | None"]) -> str | None:
    """Words for the first draw of a call that differs between the two sides' draws (in call order), or for
    a different number of draws; None when they may be the same draws. An unknown draw (None) matches anything."""
    for c, r in zip(cand, ref):
        if c is not None and r is not None and c.conflict(r) is not None:
            return mismatch_words(c, None, r, None)
    if cand and len(cand) != len(ref):
        return f"the candidate draws {len(cand)} random tensors where the reference draws {len(ref)}"
    return None


def draw_of_call(func: Any, args: tuple, kwargs: dict, dtype: Any = None) -> Draw | None:
    """The draw of an aten random op call (`func` an OpOverload), from its schema; None for an unknown op."""
    schema = func._schema
    base = schema.name.split("::")[-1]
    spec = _ATEN.get(base)
    if spec is None:
        return None
    distribution, renames, defaults = spec
    shape_source = _shape_source(base, schema)
    params: dict[str, float] = dict(defaults)
    for i, a in enumerate(schema.arguments):
        if a.name in _NOT_PARAMS or a.name == shape_source:
            continue
        if i < len(args) and not a.kwarg_only:
            v = args[i]
        elif a.name in kwargs:
            v = kwargs[a.name]
        elif a.has_default_value():
            v = a.default_value
        else:
            continue
        value = _value(v)
        if value is not None:
            params[renames.get(a.name, "p" if base == "bernoulli" and a.name == "self" else a.name)] = value
    if base == "native_dropout" and "p" in params:   # CUDA's dropout: keep with 1 - p, as CPU's bernoulli_(1 - p)
        params["p"] = 1.0 - params["p"]
    return Draw(distribution, _ordered(params), _kind_of(dtype), base)


def draw_tags(func: Any, args: tuple, kwargs: dict, outputs: Iterable[Any]) -> list[tuple[str, ...]]:
    """The `draw:` tag of each output of a random op call (dropout's output and its boolean mask differ in kind)."""
    d = draw_of_call(func, args, kwargs)
    if d is None:
        return [() for _ in outputs]
    return [(d.with_kind(getattr(t, "dtype", None)).tag(),) for t in outputs]


def draw_of_onnx(op_type: str, attributes: Iterable[tuple[str, Any]], dtype: Any = None) -> Draw | None:
    """The draw of an ONNX random operator from its attributes (name, value); None for an unknown op."""
    spec = _ONNX.get(op_type)
    if spec is None:
        return None
    distribution, renames, defaults = spec
    params = dict(defaults)
    for name, value in attributes:
        if name in _ONNX_ATTRS and isinstance(value, (int, float)):
            params[renames.get(name, name)] = float(value)
    return Draw(distribution, _ordered(params), _kind_of(dtype))


def draw_of_record_op(op: str, dtype: Any = None, tags: Iterable[str] = ()) -> Draw | None:
    """A random record's draw: its `draw:` tag, else what its op alone tells (`randn_like`: normal(0, 1);
    `normal_`: normal, parameters unknown); None when the op is not a known random op."""
    for t in tags:
        if t.startswith(TAG_DRAW):
            d = Draw.parse(t)
            if d is not None:
                return d if d.kind or dtype is None else Draw(d.distribution, d.params, _kind_of(dtype))
    base = canonical_op(op)
    spec = _ATEN.get(base) or _ONNX.get(op)
    if spec is None:
        return None
    distribution, _, defaults = spec
    exact = base in ("randn", "randn_like", "rand", "rand_like") or op in _ONNX   # no parameters of their own
    return Draw(distribution, _ordered(defaults) if exact else None, _kind_of(dtype))


def draw_of(record: Any) -> Draw | None:
    """`draw_of_record_op` for a `Record` (or anything with op, dtype and tags)."""
    return draw_of_record_op(record.op, record.dtype, record.tags)


def _shape_source(base: str, schema: Any) -> str | None:
    """The tensor argument that only gives the draw its shape (or receives it): `self` of `randn_like` and of
    an in-place op, `input` of dropout. `bernoulli(self)` draws with probabilities `self`: a parameter."""
    names = [a.name for a in schema.arguments]
    if base == "native_dropout":
        return "input"
    if base.endswith("_like") or base.endswith("_") or base == "rrelu_with_noise":
        return "self"
    if base == "bernoulli" and "p" in names:
        return "self"
    return None


_PARAM_ORDER = ("mean", "std", "low", "high", "p", "rate", "probs", "num_samples", "replacement")


def _ordered(params: dict[str, float]) -> tuple[tuple[str, float], ...]:
    """Parameters in the order people write them (mean before std, low before high)."""
    return tuple(sorted(params.items(), key=lambda kv: (_PARAM_ORDER.index(kv[0]) if kv[0] in _PARAM_ORDER
                                                         else len(_PARAM_ORDER), kv[0])))


def _value(v: Any) -> float | None:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    if v is None:
        return None
    if type(v).__name__ in ("Tensor", "Parameter", "FakeTensor") or hasattr(v, "shape"):
        return TENSOR
    return None


def _kind_of(dtype: Any) -> str | None:
    if dtype is None:
        return None
    name = str(getattr(dtype, "name", dtype)).removeprefix("torch.").lower()
    if name in ("bool", "tensor(bool)"):
        return "bool"
    if "complex" in name:
        return "complex"
    if "float" in name or name in ("half", "double", "bfloat16"):
        return "float"
    if "int" in name:
        return "int"
    return None


def _num(v: float) -> str:
    if math.isnan(v):
        return "tensor"
    return str(int(v)) if v == int(v) and abs(v) < 1e15 else format(v, ".9g")


def _op_words(op: str) -> str:
    base = canonical_op(op)
    return op if op[:1].isupper() else base


__all__ = ["Draw", "DrawMismatch", "draw_of", "draw_of_call", "draw_tags", "draw_of_onnx", "draw_of_record_op", "draws_differ_words", "is_draw_mismatch", "mismatch_words"]
