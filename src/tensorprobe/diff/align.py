"""Pair the records of a reference bundle with those of a candidate bundle.

Three passes, each over what the previous one left unmatched:

1. **exact name** — both bundles follow the record-name grammar (`record.py`), so a PyTorch capture of
   the same model lines up by itself;
2. **mapping rules** — regex pairs that rewrite a *candidate* name into the *reference* namespace
   (`dec\\.gen\\.(.*)=decoder.generator.\\1`): for a port whose dump uses other names;
3. **order and shape within a module** — first, an op record that ends its module's call in an op-level
   reference (`conv1/convolution.0`) pairs with the candidate's record of that module's output (`conv1`),
   where the reference has no record of its own for it; then, in each module present on both sides, the
   remaining records are paired in execution order when their shapes agree (ops of a module called in the
   same order) and what they were computed from agrees. A random draw pairs only with a draw, a module output
   only with a module output, and a record whose op is hidden (tagged opaque: a delegate's outputs) not at all.

Values a quantized candidate holds in integer units or as quantization parameters (tag `integer_domain`: a
uint8 tensor, an int32 accumulator or its Cast to float, a scale, a zero point) pair only with such values,
never with a float value; a float reference value meets the rescaled value computed from them (`rescaled:Conv`,
which pairs as the op it stands for).

Rules format (a `--rules FILE` or repeated `--map`): one rule per line, `PATTERN=REPLACEMENT`, split at
the *last* `=`; the pattern must match the whole candidate name (Python `re.fullmatch`) and the
replacement may use `\\1` or `\\g<name>`; blank lines and lines starting with `#` are ignored; the first
rule whose result names an unmatched reference record wins. Rules apply to module paths too (for pass 3).

    >>> rules = [parse_rule(r"dec\\.(.*)=decoder.\\1")]
    >>> rules[0].apply("dec.conv_post")
    'decoder.conv_post'
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from ..errors import InputError
from ..ops import ALIAS_OPS, canonical_op
from ..record import (KIND_INPUT, KIND_MODEL_INPUT, KIND_MODEL_OUTPUT, KIND_OUTPUT, KIND_RNG, NAME_RE, OP_UNKNOWN,
                      TAG_DERIVED, TAG_INTEGER_DOMAIN, TAG_OPAQUE, TAG_RANDOM_REPLACED, TAG_RESCALED, TAG_STANDS_FOR,
                      WEIGHT_KINDS, Record, module_label, short_op)
from .compat import kinds_agree
from .explain import family
from .quantization import quant_fields, rescaled_op

MATCH_NAME, MATCH_RULE, MATCH_ORDER = "name", "rule", "order"
MATCH_RUNTIME, MATCH_DIGEST, MATCH_POSITION = "runtime_name", "digest", "position"
# a weight paired through the one module that reads it; `_T`: the port holds it transposed (ONNX MatMul's B);
# `_REPACKED`: an ONNX LSTM/GRU/RNN's W or R, its gates in another order (compared by statistics)
MATCH_READER, MATCH_READER_T, MATCH_READER_REPACKED = "reader", "reader_transposed", "reader_repacked"
# the port's value that stands for the reference's where an op reads it, held in another shape of the same
# elements in the same order (a norm computed on a (batch, groups, -1) view): compared in the reference's shape
MATCH_VIEW = "value read, as a view"
# ONNX's recurrent ops, and ONNX Runtime's int8 LSTM (quantize_dynamic): its W and R dequantized, in ONNX's layout
_RECURRENT_OPS = {"LSTM": "LSTM", "GRU": "GRU", "RNN": "RNN", "DynamicQuantizeLSTM": "LSTM"}


@dataclass(frozen=True)
class Rule:
    """One mapping rule: candidate names matching `pattern` become `replacement` (regex expand)."""

    pattern: str
    replacement: str

    def apply(self, name: str) -> str | None:
        m = re.fullmatch(self.pattern, name)
        if m is None:
            return None
        try:
            return m.expand(self.replacement)
        except (re.error, IndexError) as e:
            raise InputError(f"mapping rule {self.pattern}={self.replacement}: bad replacement ({e})") from None

    def __str__(self) -> str:
        return f"{self.pattern}={self.replacement}"


@dataclass(frozen=True)
class Pair:
    """A reference record and the candidate record it is compared with; `method` says how they met."""

    ref: Record
    cand: Record
    method: str


@dataclass(frozen=True)
class Alignment:
    pairs: tuple[Pair, ...]          # in reference execution order
    ref_only: tuple[Record, ...]
    cand_only: tuple[Record, ...]


def parse_rule(text: str) -> Rule:
    """`'PATTERN=REPLACEMENT'` -> Rule (split at the last '='; the pattern is checked to compile)."""
    if "=" not in text:
        raise InputError(f"mapping rule {text!r}: expected PATTERN=REPLACEMENT")
    pattern, repl = text.rsplit("=", 1)
    pattern = pattern.strip()
    if not pattern:
        raise InputError(f"mapping rule {text!r}: empty pattern")
    try:
        re.compile(pattern)
    except re.error as e:
        raise InputError(f"mapping rule {text!r}: invalid regular expression ({e})") from None
    return Rule(pattern, repl.strip())


def load_rules(path: str | os.PathLike) -> list[Rule]:
    """Read a rules file (format in this module's docstring)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{p}: can't read rules file ({e})") from None
    return parse_rules(text.splitlines(), where=str(p))


def parse_rules(lines: Iterable[str | Rule], where: str = "rules") -> list[Rule]:
    """Rules from the lines of a rules file (blank lines and `#` comments skipped); a parse error names
    the line (`where:line`).

        >>> [r.apply("dec.conv_post") for r in parse_rules(["# renames", r"dec\\.(.*)=decoder.\\1"])]
        ['decoder.conv_post']
    """
    rules = []
    for i, line in enumerate(lines, 1):
        if isinstance(line, Rule):
            rules.append(line)
            continue
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            rules.append(parse_rule(line))
        except InputError as e:
            raise InputError(f"{where}:{i}: {e}") from None
    return rules


def align(ref: Iterable[Record], cand: Iterable[Record], rules: Sequence[Rule] = (), *,
          runtime_names: bool | None = None,
          outputs: tuple[Sequence[str], Sequence[str]] = ((), ()),
          readers: Iterable[Record] | None = None) -> Alignment:
    """Pair records: each class with its own kind (weights with weights, model inputs with model inputs,
    model outputs with model outputs, the forward's records with the forward's), by exact name, then
    `rules`, then as the class allows: weights by identical content, model inputs and outputs by position,
    forward records by order and shape within a module.

    Module-input records (kind "input") are left out: they repeat the outputs that feed them.

    Args:
        runtime_names: pair forward records by the runtime's own value name first (ONNX value names survive
            quantization and float16 conversion, while op counts shift). None: when both sides come from
            the same runtime and share most value names.
        outputs: each side's model-output record names in the model's own order (`declared_outputs`), where
            it is not the order they were recorded in (an ONNX graph's outputs are recorded as computed).
        readers: the candidate records to find weight readers in (default `cand`): a module view's op
            records, which are not paired, still tell which op reads a renamed weight.

    Example:
        >>> a = align(ref_bundle, cand_bundle, [parse_rule(r"dec\\.(.*)=decoder.\\1")])  # doctest: +SKIP
        >>> [p.ref.name for p in a.pairs][:2], len(a.ref_only)                          # doctest: +SKIP
    """
    refs = [r for r in ref if r.kind != KIND_INPUT]
    cands = [c for c in cand if c.kind != KIND_INPUT]
    matched: dict[str, tuple[Record, str]] = {}     # ref name -> (cand record, method)
    graph = {c.name: c for c in cands}
    used: set[str] = set()
    for cls in (_WEIGHTS, _INPUTS, _OUTPUTS, _FORWARD, _INTEGER):
        r_cls = [r for r in refs if _class(r) == cls]
        c_cls = [c for c in cands if _class(c) == cls]
        if not r_cls or not c_cls:
            continue
        by_ref = {r.name: r for r in r_cls}
        if cls in (_FORWARD, _INTEGER) and (runtime_names if runtime_names is not None
                                            else _share_runtime_names(r_cls, c_cls)):
            _match_runtime_names(r_cls, c_cls, matched, used)
        for c in c_cls:
            if c.name in by_ref and c.name not in matched and c.name not in used:
                matched[c.name] = (c, MATCH_NAME)
                used.add(c.name)
        _match_rules(c_cls, by_ref, rules, matched, used)
        if cls == _WEIGHTS:
            _match_digest(r_cls, c_cls, matched, used)
            _match_readers(r_cls, c_cls, cands if readers is None else list(readers), matched, used)
        elif cls == _INPUTS:
            _match_position(in_model_order(r_cls, ()), in_model_order(c_cls, ()), matched, used)
        elif cls == _OUTPUTS:
            _match_position(in_model_order(r_cls, outputs[0]), in_model_order(c_cls, outputs[1]), matched, used)
        else:
            _match_module_outputs(r_cls, c_cls, rules, matched, used)
            _match_draws(r_cls, c_cls, rules, matched, used)
            _match_order(r_cls, c_cls, rules, matched, used, graph)
    pairs = tuple(Pair(r, matched[r.name][0], matched[r.name][1]) for r in refs if r.name in matched)
    ref_only = tuple(r for r in refs if r.name not in matched)
    cand_only = tuple(c for c in cands if c.name not in used)
    return Alignment(pairs, ref_only, cand_only)


_WEIGHTS, _INPUTS, _OUTPUTS, _FORWARD, _INTEGER = "weights", "inputs", "outputs", "forward", "integer"


def _class(rec: Record) -> str:
    if rec.kind in WEIGHT_KINDS:
        return _WEIGHTS
    if rec.kind == KIND_MODEL_INPUT:
        return _INPUTS
    if rec.kind == KIND_MODEL_OUTPUT:
        return _OUTPUTS
    if TAG_INTEGER_DOMAIN in rec.tags:
        return _INTEGER    # integer units and quantization parameters meet only their own kind
    return _FORWARD


def _share_runtime_names(refs: list[Record], cands: list[Record]) -> bool:
    """Both sides name their values in one runtime's namespace, and most candidate names exist in the
    reference: the candidate graph was derived from the reference graph (quantized, converted, optimized)."""
    r_names = {r.runtime_name for r in refs if r.runtime_name}
    c_names = [c.runtime_name for c in cands if c.runtime_name]
    if not r_names or not c_names:
        return False
    return sum(n in r_names for n in c_names) >= 0.5 * min(len(r_names), len(c_names))


def _match_runtime_names(refs: list[Record], cands: list[Record], matched: dict, used: set[str]) -> None:
    """Pair by the runtime's value name. A candidate value that stands for another one (the
    DequantizeLinear after a QuantizeLinear of v, tagged `stands_for:v`) takes v's place."""
    by_value: dict[str, Record] = {}
    for c in cands:
        if c.runtime_name and c.name not in used:
            by_value.setdefault(c.runtime_name, c)
    for c in cands:
        for t in c.tags:
            if t.startswith(TAG_STANDS_FOR):
                by_value[t[len(TAG_STANDS_FOR):]] = c
    by_name = {c.name: c for c in cands}
    for r in refs:
        if r.name in matched or not r.runtime_name:
            continue
        c = by_value.get(r.runtime_name)
        if c is not None and _same_name_same_op(r, by_name.get(r.name), used) and \
                canonical_op(c.op) != canonical_op(r.op) and not any(t.startswith(TAG_STANDS_FOR) for t in c.tags):
            continue   # a graph that folded an op away (x * 1.0) names the op's input by the output's value name
        if c is not None and c.name not in used and same_shape(r.shape, c.shape):
            matched[r.name] = (c, MATCH_RUNTIME)
            used.add(c.name)


def _same_name_same_op(r: Record, c: Record | None, used: set[str]) -> bool:
    return c is not None and c.name not in used and canonical_op(c.op) == canonical_op(r.op) and \
        same_shape(r.shape, c.shape)


def _match_digest(refs: list[Record], cands: list[Record], matched: dict, used: set[str]) -> None:
    """Weights stored under another name (an exporter's `val_12`, a renamed module) with identical content."""
    by_digest: dict[tuple, list[Record]] = {}   # several weights may hold one content (BatchNorm counters)
    for c in sorted(cands, key=lambda c: c.order):
        if c.name not in used and c.digest:
            by_digest.setdefault((c.digest, tuple(c.shape), c.dtype), []).append(c)
    for r in sorted(refs, key=lambda r: r.order):
        if r.name in matched or not r.digest:
            continue
        same = by_digest.get((r.digest, tuple(r.shape), r.dtype))
        c = same.pop(0) if same else None     # in order: the n-th of equal weights meets the n-th
        if c is not None and c.name not in used:
            matched[r.name] = (c, MATCH_DIGEST)
            used.add(c.name)


def _match_readers(refs: list[Record], cands: list[Record], everything: list[Record], matched: dict,
                   used: set[str]) -> None:
    """Weights an exporter renamed and re-laid out, paired through the module that reads them: torch.onnx's
    dynamo exporter stores a Linear's weight transposed as `val_113`, read by `mix/MatMul.0`. A candidate weight
    read in one module only pairs with the one unpaired reference weight of that module (or of a module inside
    it) that has its shape, or its shape reversed. A square weight read as MatMul's B is held transposed."""
    free = {c.name: c for c in cands if c.name not in used}
    if not free:
        return
    _match_recurrent(refs, free, everything, matched, used)
    read_in: dict[str, set[str]] = {}
    read_as_b: set[str] = set()
    # a QDQ file's kernel reads the DequantizeLinear of its weight (scoped to no module), not the weight
    dequantized = {rec.name: rec.inputs[0] for rec in everything if rec.kind not in WEIGHT_KINDS and rec.inputs
                   and _op_of(rec) == "DequantizeLinear" and rec.inputs[0] in free}
    for rec in everything:
        if rec.kind in WEIGHT_KINDS or rec.name in dequantized:
            continue
        for i, name in enumerate(rec.inputs or ()):
            name = dequantized.get(name, name)
            if name in free:
                read_in.setdefault(name, set()).add(rec.module or "")
                if i == 1 and canonical_op(rec.op) == "matmul":
                    read_as_b.add(name)
        # an int8 kernel reads the integer copy; the dequantized weight is named by its rescaled result's tag
        weight = (quant_fields(rec.tags) or {}).get("weight")
        if weight in free:
            read_in.setdefault(weight, set()).add(rec.module or "")
            if rescaled_op(rec.tags) == "MatMul":
                read_as_b.add(weight)
    waiting = [r for r in sorted(refs, key=lambda r: r.order) if r.name not in matched]
    for name, modules in read_in.items():
        if len(modules) > 1:      # the model's own glue around a module's kernel (a quantizer's rescale) owns nothing
            modules = modules - {""}
        if len(modules) != 1 or not next(iter(modules)):
            continue
        module, c = next(iter(modules)), free[name]
        fits = [r for r in waiting if r.name not in matched and (r.module == module or r.module.startswith(
            module + ".")) and _fits(r.shape, c.shape)]
        if len(fits) > 1:   # weight_norm's v and the weight computed from it: the op reads the computed one
            fits = [r for r in fits if TAG_DERIVED in r.tags] or fits
        if len(fits) != 1:
            continue      # two weights of one shape in one module: nothing tells which is which
        _pair_read(fits[0], c, name in read_as_b, matched, used)
    # read only by the model's own glue (an int8 MatMul the quantizer could not scope: its weight a constant the
    # exporter made): the one reference weight left anywhere with its shape, when no other such weight is left
    at_root = [free[n] for n, modules in read_in.items() if modules == {""} and n not in used]
    for c in at_root:
        fits = [r for r in waiting if r.name not in matched and _fits(r.shape, c.shape)]
        rivals = [o for o in at_root if o is not c and o.name not in used and _fits(o.shape, c.shape)]
        if len(fits) == 1 and not rivals:
            _pair_read(fits[0], c, c.name in read_as_b, matched, used)


def made_from_weights(rec: Record | None, by_name: dict[str, Record], depth: int = 0) -> bool:
    """Is `rec` a weight, or an op's value computed from weights alone (weight_norm's weight from g and v)?"""
    if rec is None or rec.kind in WEIGHT_KINDS:
        return rec is not None
    if not rec.inputs or depth > 8:
        return False
    return all(made_from_weights(by_name.get(i), by_name, depth + 1) for i in rec.inputs)


def _pair_read(r: Record, c: Record, as_b: bool, matched: dict, used: set[str]) -> None:
    transposed = tuple(r.shape) != tuple(c.shape) or (len(c.shape) == 2 and as_b)
    matched[r.name] = (c, MATCH_READER_T if transposed else MATCH_READER)
    used.add(c.name)


def _match_recurrent(refs: list[Record], free: dict[str, Record], everything: list[Record], matched: dict,
                     used: set[str]) -> None:
    """An ONNX LSTM/GRU/RNN node reads its layer's input and recurrent weights as W and R (inputs 1 and 2), of
    shape (1, gates·H, ·): the k-th such node of module M is layer k of M's `weight_ih_lk` and `weight_hh_lk`, its
    gates re-packed in ONNX's order (iofc for PyTorch's ifgo). A bidirectional node (2, ...) is left alone."""
    by_name = {r.name: r for r in refs}
    layer: dict[str, int] = {}
    for rec in sorted(everything, key=lambda r: r.order):
        if rec.kind in WEIGHT_KINDS or rec.op not in _RECURRENT_OPS or len(rec.inputs) < 3:
            continue
        module = rec.module or ""
        k = layer[module] = layer.get(module, -1) + 1
        for name, ref_name in ((rec.inputs[1], f"{module}.weight_ih_l{k}"), (rec.inputs[2], f"{module}.weight_hh_l{k}")):
            c, r = free.get(name), by_name.get(ref_name)
            if c is None or r is None or r.name in matched or c.name in used:
                continue
            if tuple(c.shape) == (1, *r.shape):
                matched[r.name] = (c, f"{MATCH_READER_REPACKED}:{_RECURRENT_OPS[rec.op]}")
                used.add(c.name)


# the rows of each gate of ONNX's W and R in PyTorch's order: LSTM iofc -> ifgo, GRU zrh -> rzn
ONNX_GATES_IN_TORCH_ORDER = {"LSTM": (0, 2, 3, 1), "GRU": (1, 0, 2), "RNN": (0,)}


def torch_gate_order(value: Any, op: str) -> Any:
    """An ONNX recurrent weight (1, gates·H, ·) with its gate blocks in PyTorch's order, as (gates·H, ·)."""
    order = ONNX_GATES_IN_TORCH_ORDER[op]
    blocks = value.reshape(len(order), -1, *value.shape[2:])
    return blocks[list(order)].reshape(-1, *value.shape[2:])


def _fits(ref: Sequence[int], cand: Sequence[int]) -> bool:
    """The same shape, or a matrix's shape reversed (the port holds it transposed)."""
    return tuple(ref) == tuple(cand) or (len(ref) == 2 and tuple(ref) == tuple(cand)[::-1])


def declared_outputs(manifest: dict) -> tuple[str, ...]:
    """The model-output record names in the model's own order, where a bundle's manifest says it (an ONNX
    capture: `runtime.outputs`, the graph's output order); () otherwise (the recorded order is the model's:
    a PyTorch capture records the outputs in the order the forward returns them)."""
    names = ((manifest or {}).get("runtime") or {}).get("outputs") or ()
    return tuple(n for n in names if isinstance(n, str))


def in_model_order(records: Sequence[Record], declared: Sequence[str]) -> list[Record]:
    """Model inputs or outputs in the model's order: the declared names first in their order, then the rest as
    recorded."""
    pos = {n: i for i, n in enumerate(declared)}
    return sorted(records, key=lambda r: (pos.get(r.name, len(pos)), r.order))


def _match_position(refs: list[Record], cands: list[Record], matched: dict, used: set[str]) -> None:
    """Model inputs and outputs left over pair by position among their own kind (PyTorch's `input.0` with
    an ONNX graph's first input `input.asr`); `refs` and `cands` come in the model's order."""
    r_left = [r for r in refs if r.name not in matched]
    c_left = [c for c in cands if c.name not in used]
    r_pos = {r.name: i for i, r in enumerate(refs)}
    c_pos = {c.name: i for i, c in enumerate(cands)}
    by_pos = {c_pos[c.name]: c for c in c_left}
    for r in r_left:
        c = by_pos.get(r_pos[r.name])
        if c is not None:
            matched[r.name] = (c, MATCH_POSITION)
            used.add(c.name)


def _match_rules(cands: list[Record], by_ref: dict[str, Record], rules: Sequence[Rule],
                 matched: dict, used: set[str]) -> None:
    if not rules:
        return
    for c in cands:
        if c.name in used:
            continue
        for rule in rules:
            target = rule.apply(c.name)
            if target is not None and target in by_ref and target not in matched:
                matched[target] = (c, MATCH_RULE)
                used.add(c.name)
                break


def translate_module(module: str, rules: Sequence[Rule]) -> str:
    """A candidate module path in the reference namespace (first rule that matches, else unchanged)."""
    for rule in rules:
        out = rule.apply(module)
        if out is not None:
            return out
    return module


def _match_module_outputs(refs: list[Record], cands: list[Record], rules: Sequence[Rule], matched: dict,
                          used: set[str]) -> None:
    """An op record that ends its module's call in the reference (an op-level capture records `conv1/convolution.0`
    and no `conv1`: the op's value is the module's output) pairs with the candidate's record of that call's output
    (`conv1`: a runtime names module outputs), when shapes agree. The candidate may compute it with other ops
    (a MatMul and a bias Add for aten's addmm; int8 arithmetic rescaled to float): its op is not compared. Where
    the candidate is an op-level capture too, the op that ends the same call stands for it (`proj/addmm.0` against
    torch.ao's `proj/linear_dynamic.0`). A module returning several tensors (`lstm_cell:0`, `lstm_cell:1`) is left
    to pairing by order."""
    ends = {(translate_module(c.module, rules), c.call): c for c in _call_ends(cands)
            if c.name not in used and TAG_OPAQUE not in c.tags}    # a delegate's output: its op is hidden
    outputs = {**ends, **{(translate_module(c.module, rules), c.call): c for c in cands
                          if c.name not in used and c.kind == KIND_OUTPUT and _level(c) == "module" and ":" not in c.name}}
    for r in _call_ends(refs):
        c = outputs.get((r.module, r.call))
        if r.name in matched or c is None or c.name in used:
            continue
        draws = (_pairing_class(r)[0], _pairing_class(c)[0])   # a draw (or one replaced by zeros) only with a draw
        if same_shape(r.shape, c.shape) and kinds_agree(r, c) and _classes_agree(draws[:1], draws[1:]):
            matched[r.name] = (c, MATCH_ORDER)
            used.add(c.name)


def _call_ends(refs: list[Record]) -> list[Record]:
    """The op records (output 0) after which the next record lies outside their module's call: the op that
    made the module's output. A module with records of its own (module level) is left to pairing by name."""
    forward = sorted((r for r in refs if r.kind == KIND_OUTPUT), key=lambda r: r.order)
    modules = {(r.module, r.call) for r in forward if _level(r) == "module"}
    ends = []
    for i, r in enumerate(forward):
        if _level(r) != "op" or (r.module, r.call) in modules or _output_index(r.name) > 0:
            continue
        base, j = r.name.split(":")[0], i + 1
        while j < len(forward) and forward[j].name.split(":")[0] == base:   # its own other outputs
            j += 1
        if j == len(forward) or not _within(forward[j], r):
            ends.append(r)
    return ends


def _within(rec: Record, r: Record) -> bool:
    """Whether `rec` ran inside `r`'s module call: in that call, or in one of its submodules (the root holds all)."""
    return not r.module or (rec.module, rec.call) == (r.module, r.call) or rec.module.startswith(f"{r.module}.")


def _level(rec: Record) -> str | None:
    """'module' for a module call's output (`enc.norm1`, `enc.norm1@2:0`), 'op' for an op's (`enc.norm1/mul.0`),
    None for a name outside the record-name grammar (a port's own names)."""
    m = NAME_RE.match(rec.name)
    if m is None or m.group("module") != module_label(rec.module):
        return None
    return "op" if m.group("op") else "module"


def _output_index(name: str) -> int:
    m = NAME_RE.match(name)
    out = m.group("output") if m else None
    return int(out) if out and out.isdigit() else 0


def _match_draws(refs: list[Record], cands: list[Record], rules: Sequence[Rule], matched: dict,
                 used: set[str]) -> None:
    """Random draws left over pair with the draws of the same module call, in call order, when shapes agree:
    first those of one distribution (`randn` with `randn_like`, PyTorch's draw with ONNX's RandomNormalLike; a
    reference draw the export dropped is then left alone), then any two (`rand_like` where the reference has
    `randn_like`: `diff.draws` reports that the two draw otherwise)."""
    from ..rng.draws import draw_of

    def by_call(records: Iterable[Record], module_of) -> dict[tuple[str, int], list[Record]]:
        out: dict[tuple[str, int], list[Record]] = {}
        for x in sorted(records, key=lambda x: x.order):
            if x.kind == KIND_RNG:
                out.setdefault((module_of(x), x.call), []).append(x)
        return out

    r_calls = by_call((r for r in refs if r.name not in matched), lambda r: r.module)
    c_calls = by_call((c for c in cands if c.name not in used), lambda c: translate_module(c.module, rules))
    for key, rs in r_calls.items():
        cs = c_calls.get(key, [])
        for alike in (True, False):
            start = 0
            for r in rs:
                if r.name in matched:
                    continue
                dr = draw_of(r) if alike else None
                for j in range(start, len(cs)):
                    c = cs[j]
                    if c.name in used or not same_shape(r.shape, c.shape):
                        continue
                    if alike and (dr is None or (dc := draw_of(c)) is None or dc.distribution != dr.distribution):
                        continue
                    matched[r.name] = (c, MATCH_ORDER)
                    used.add(c.name)
                    start = j + 1
                    break


def _match_order(refs: list[Record], cands: list[Record], rules: Sequence[Rule],
                 matched: dict, used: set[str], graph: dict[str, Record] | None = None) -> None:
    """Within each module on both sides, pair leftovers in execution order when shapes agree (records tagged
    opaque, such as a delegate's outputs, are left out: their op is unknown) and, where `graph` (every candidate
    record by name) tells, the candidate was computed from what the reference record was (`_same_sources`). A
    QDQ copy of a value (`stands_for:v`) pairs as v's op would while v is unpaired; once v is paired, the copy
    can only be the ReLU or clip the quantizer folded into it (a uint8 zero point at 0 clamps)."""
    left: dict[tuple[str, int], list[tuple[Record, tuple]]] = {}
    ref_of = {c.name: r for r, (c, _) in matched.items() if c.kind not in WEIGHT_KINDS}
    # weights paired by name say where a value comes from too: an instance norm's weight and bias, each repeated
    # (aten) or passed through an Identity (torch.onnx), paired crosswise by order ("relative error 1")
    sources_of = {**{c.name: r for r, (c, how) in matched.items() if c.kind in WEIGHT_KINDS and how == MATCH_NAME},
                  **ref_of}
    partial = _partial_rescales(cands)
    copies = _copies(graph or {})
    for c in cands:
        if c.name not in used and TAG_OPAQUE not in c.tags and c.name not in partial:
            left.setdefault((translate_module(c.module, rules), c.call), []).append((c, _pairing_class(c)))
    for r in refs:
        if r.name in matched:
            continue
        queue = left.get((r.module, r.call))
        if not queue:
            continue
        r_class = _pairing_class(r)
        for i, (c, c_class) in enumerate(queue):
            if same_shape(r.shape, c.shape) and _classes_agree(r_class, c_class) and kinds_agree(r, c) \
                    and _same_op_or_copy(r, c, copies.get(c.name), used) and _same_sources(r, c, sources_of, graph) \
                    and not _view_of_its_input(r, c, ref_of):
                matched[r.name] = (c, MATCH_ORDER)
                ref_of[c.name] = sources_of[c.name] = r.name
                used.add(c.name)
                del queue[: i + 1]  # keep order: later refs only pair with later cands
                break


def _view_of_its_input(r: Record, c: Record, ref_of: dict[str, str]) -> bool:
    """`c` only reshapes or transposes a value already paired with one of `r`'s inputs, and `r` is no such view:
    `c` holds `r`'s input, not `r` (an exporter reshapes a stacked LSTM's first-layer output before the second
    layer, and that Reshape of the same shape took the second layer's place: "relative error 1.78")."""
    if canonical_op(_op_of(c)) not in ALIAS_OPS or canonical_op(_op_of(r)) in ALIAS_OPS or not c.inputs:
        return False
    return ref_of.get(c.inputs[0]) in set(r.inputs)


_CLAMPS = frozenset({"relu", "relu_", "clamp", "clamp_", "clamp_min", "hardtanh", "relu6", "Relu", "Clip"})


def _same_op_or_copy(r: Record, c: Record, copy_of: Record | None, used: set[str]) -> bool:
    if copy_of is None:
        return _same_op_or_unknown(r, c)
    if copy_of.name not in used:
        return _same_op_or_unknown(r, copy_of)
    return short_op(r.op).split(".")[0] in _CLAMPS


def _copies(graph: dict[str, Record]) -> dict[str, Record]:
    """A QDQ graph's quantized copies (`DequantizeLinear(QuantizeLinear(v))`, tagged `stands_for:v`) -> v's record."""
    by_value = {c.runtime_name: c for c in graph.values()
                if c.runtime_name and not any(t.startswith(TAG_STANDS_FOR) for t in c.tags)}
    out = {}
    for c in graph.values():
        v = next((t[len(TAG_STANDS_FOR):] for t in c.tags if t.startswith(TAG_STANDS_FOR)), None)
        if v is not None and v in by_value:
            out[c.name] = by_value[v]
    return out


def _same_sources(r: Record, c: Record, ref_of: dict[str, str], graph: dict[str, Record] | None,
                  depth: int = 16) -> bool:
    """Whether `c` may be `r`'s counterpart by what it was computed from: the nearest paired records upstream of `c`
    (through records with no counterpart: the QuantizeLinear of a QDQ pair) include one of `r`'s inputs, or nothing
    upstream of either is known. In a QDQ graph a `DequantizeLinear` copy of a max-pool's output has the shape of
    the ReLU after the next conv: its sources tell them apart."""
    if graph is None or not r.inputs:
        return True
    todo, seen = list(c.inputs), set(c.inputs)
    for _ in range(depth):     # the nearest paired records: the first level of the walk back that has any
        found = {ref_of[name] for name in todo if name in ref_of}
        if found:
            return bool(found & set(r.inputs))
        todo = [i for name in todo if (rec := graph.get(name)) is not None for i in rec.inputs if i not in seen]
        seen.update(todo)
    return True


def _partial_rescales(cands: list[Record]) -> set[str]:
    """Rescaled int8 results another rescaled record reads (the Mul by the scales before the bias Add): the
    float op they stand for ends later, so they never meet that op's reference by order."""
    rescaled = {c.name for c in cands if any(t.startswith(TAG_RESCALED) for t in c.tags)}
    return {i for c in cands if c.name in rescaled for i in c.inputs if i in rescaled}


def _pairing_class(rec: Record) -> tuple[bool | None, str | None]:
    """What pairing by order must keep apart, None where unknown:

    - whether the record is a random draw (or one a runtime replaced by zeros): in an XNNPACK capture a
      delegate's output took the place of the `randn_like` that starts Kokoro's source module, and was
      reported as the first divergence;
    - its level, "module" for a module call's output (`enc.norm1`, `enc.norm1@2:0`) or "op" for an op or
      kernel output (`enc.norm1/mul.0`): against an op-level reference, an ExecuTorch module tap was paired
      with the module's first op.
    """
    if rec.kind == KIND_RNG or TAG_RANDOM_REPLACED in rec.tags:
        draw: bool | None = True
    else:
        draw = None if rec.op in ("", OP_UNKNOWN) else False
    return draw, _level(rec)


def _same_op_or_unknown(r: Record, c: Record) -> bool:
    """Two PyTorch op records pair by order only if they are the same op (aten names are comparable). A
    runtime's op types (Conv, MatMul) name ops in other words, so they need only be of one family
    (`explain.family`: matmul and addmm are both linear): an ONNX `Cast` never pairs with aten's `sigmoid`. A
    rescaled int8 result counts as the op it stands for (the `Mul` after a ConvInteger as `Conv`)."""
    r_op, c_op = _op_of(r), _op_of(c)
    if r_op.startswith("aten.") and c_op.startswith("aten."):
        return short_op(r_op) == short_op(c_op)
    r_base, c_base = canonical_op(r_op), canonical_op(c_op)
    if r_op.startswith("module:") or c_op.startswith("module:") or r_base == c_base:
        return True
    if any(r_base in group and c_base in group for group in _OTHER_VALUES_IN_FAMILY):
        return False
    if (r_base in _SPLITS) != (c_base in _SPLITS):   # one output of many, never an arithmetic op's one
        return False
    return family(r_op) == family(c_op)   # two unknown families ("other") may still be one op


# ops of one family whose values differ: torch.onnx's legacy exporter writes log10 as ONNX Log then a Div by ln 10,
# and aten's log10 paired with that Log read "relative error 1.3" (ln 10 - 1) on a faithful log-mel front end
# ops that cut a tensor into parts: a flow's chunk of its input paired by order with ONNX's Mul after it
_SPLITS = frozenset({"split", "split_with_sizes", "chunk", "unbind", "unsafe_split", "unsafe_split_with_sizes",
                     "tensor_split"})
_OTHER_VALUES_IN_FAMILY = (frozenset({"log", "log2", "log10", "log1p"}), frozenset({"exp", "exp2", "expm1"}))


def _op_of(rec: Record) -> str:
    return next((t[len(TAG_RESCALED):] for t in rec.tags if t.startswith(TAG_RESCALED)), rec.op)


def _classes_agree(a: tuple, b: tuple) -> bool:
    return all(x is None or y is None or x == y for x, y in zip(a, b))


def same_shape(a: Sequence[int], b: Sequence[int]) -> bool:
    """Equal shapes, or equal once size-1 dimensions are dropped ((1, 80, 100) vs (80, 100))."""
    return tuple(a) == tuple(b) or tuple(d for d in a if d != 1) == tuple(d for d in b if d != 1)


def _op_sequences(records: Iterable[Record]) -> dict[tuple[str, int], tuple[str, ...]]:
    """(module, call) -> the op-level records' ops in execution order."""
    seqs: dict[tuple[str, int], list[tuple[int, str]]] = {}
    for r in records:
        if "/" in r.name and r.kind not in WEIGHT_KINDS:
            seqs.setdefault((r.module, r.call), []).append((r.order, r.op))
    return {k: tuple(op for _, op in sorted(v)) for k, v in seqs.items()}


def _sources(r: Record, unpaired: dict[str, Record], depth: int = 4) -> set[str]:
    """What `r` read, and what the records it read that have no counterpart read: a weight can reach an op through
    ops the other side does not have (an InstanceNorm's affine weight through `repeat`)."""
    out, todo = set(r.inputs), list(r.inputs)
    for _ in range(depth):
        todo = [i for name in todo if name in unpaired for i in unpaired[name].inputs if i not in out]
        out.update(todo)
    return out


def inconsistent_order_pairs(alignment: Alignment) -> dict[str, str]:
    """Op-level pairs (by order, or by a name like `lstm/stack.0`) whose records were computed from
    different things: the candidate's recorded inputs pair with reference records none of which the reference
    record read. Two runtimes (or two dtypes) that decompose a module differently line up records that mean
    different things (float64's LSTM decomposed into 6,400 ops against float32's fused `mkldnn_rnn_layer`,
    where `lstm/stack.0` stacks time steps on one side and layers on the other); those are not comparable.

    Returns: reference name -> reason.
    """
    # the forward records each side read (a weight is no evidence: exporters merge identical ones, and it reaches
    # an op through other ops on one side, `repeat` of an InstanceNorm's affine weight), and on the reference side
    # what its records with no counterpart read (a dropout the candidate does not have)
    ref_of = {p.cand.name: p.ref.name for p in alignment.pairs if p.ref.kind not in WEIGHT_KINDS}
    unpaired = {r.name: r for r in alignment.ref_only}
    r_ops = _op_sequences([p.ref for p in alignment.pairs] + list(alignment.ref_only))
    c_ops = _op_sequences([p.cand for p in alignment.pairs] + list(alignment.cand_only))
    out = {}
    for p in alignment.pairs:
        by_order = p.method == MATCH_ORDER
        op_level = p.method == MATCH_NAME and "/" in p.ref.name and "/" in p.cand.name
        key = (p.ref.module, p.ref.call)
        if op_level and not same_shape(p.ref.shape, p.cand.shape) and r_ops.get(key) != c_ops.get(key):
            out[p.ref.name] = (f"not comparable: {p.ref.name} names another op on each side: the two sides "
                               f"decompose {module_label(p.ref.module)} differently ({len(r_ops.get(key, ()))} vs "
                               f"{len(c_ops.get(key, ()))} op records)")
            continue
        if not (by_order or op_level) or not p.ref.inputs:
            continue
        mapped = [ref_of[i] for i in p.cand.inputs if i in ref_of and ref_of[i] not in out]   # evidence only
        if mapped and not set(mapped) & _sources(p.ref, unpaired):
            how = "order" if by_order else "name"
            out[p.ref.name] = (f"not comparable: paired by {how}, but computed from different records "
                               f"({', '.join(mapped[:2])} against {', '.join(p.ref.inputs[:2])}): the two sides "
                               f"decompose {module_label(p.ref.module)} differently")
    return out
