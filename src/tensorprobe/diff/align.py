"""Pair the records of a reference bundle with those of a candidate bundle.

Three passes, each over what the previous one left unmatched:

1. **exact name** — both bundles follow the record-name grammar (`record.py`), so a PyTorch capture of
   the same model lines up by itself;
2. **mapping rules** — regex pairs that rewrite a *candidate* name into the *reference* namespace
   (`dec\\.gen\\.(.*)=decoder.generator.\\1`): for a port whose dump uses other names;
3. **order and shape within a module** — in each module present on both sides, the remaining records
   are paired in execution order when their shapes agree (ops of a module called in the same order).
   A random draw pairs only with a draw, a module output only with a module output, and a record whose
   op is hidden (tagged opaque: a delegate's outputs) not at all.

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
from typing import Iterable, Sequence

from ..errors import InputError
from ..record import (KIND_INPUT, KIND_RNG, NAME_RE, OP_UNKNOWN, TAG_OPAQUE, TAG_RANDOM_REPLACED, Record,
                      module_label)

MATCH_NAME, MATCH_RULE, MATCH_ORDER = "name", "rule", "order"


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
    rules = []
    for i, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        try:
            rules.append(parse_rule(line))
        except InputError as e:
            raise InputError(f"{p}:{i}: {e}") from None
    return rules


def align(ref: Iterable[Record], cand: Iterable[Record], rules: Sequence[Rule] = ()) -> Alignment:
    """Pair records by exact name, then `rules`, then order and shape within a module.

    Module-input records (kind "input") are left out: they repeat the outputs that feed them.

    Example:
        >>> a = align(ref_bundle, cand_bundle, [parse_rule(r"dec\\.(.*)=decoder.\\1")])  # doctest: +SKIP
        >>> [p.ref.name for p in a.pairs][:2], len(a.ref_only)                          # doctest: +SKIP
    """
    refs = [r for r in ref if r.kind != KIND_INPUT]
    cands = [c for c in cand if c.kind != KIND_INPUT]
    by_ref = {r.name: r for r in refs}
    matched: dict[str, tuple[Record, str]] = {}     # ref name -> (cand record, method)
    used: set[str] = set()
    for c in cands:
        if c.name in by_ref and c.name not in matched:
            matched[c.name] = (c, MATCH_NAME)
            used.add(c.name)
    _match_rules(cands, by_ref, rules, matched, used)
    _match_order(refs, cands, rules, matched, used)
    pairs = tuple(Pair(r, matched[r.name][0], matched[r.name][1]) for r in refs if r.name in matched)
    ref_only = tuple(r for r in refs if r.name not in matched)
    cand_only = tuple(c for c in cands if c.name not in used)
    return Alignment(pairs, ref_only, cand_only)


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


def _match_order(refs: list[Record], cands: list[Record], rules: Sequence[Rule],
                 matched: dict, used: set[str]) -> None:
    """Within each module on both sides, pair leftovers in execution order when shapes agree (records tagged
    opaque, such as a delegate's outputs, are left out: their op is unknown)."""
    left: dict[tuple[str, int], list[tuple[Record, tuple]]] = {}
    for c in cands:
        if c.name not in used and TAG_OPAQUE not in c.tags:
            left.setdefault((translate_module(c.module, rules), c.call), []).append((c, _pairing_class(c)))
    for r in refs:
        if r.name in matched:
            continue
        queue = left.get((r.module, r.call))
        if not queue:
            continue
        r_class = _pairing_class(r)
        for i, (c, c_class) in enumerate(queue):
            if same_shape(r.shape, c.shape) and _classes_agree(r_class, c_class):
                matched[r.name] = (c, MATCH_ORDER)
                used.add(c.name)
                del queue[: i + 1]  # keep order: later refs only pair with later cands
                break


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
    m = NAME_RE.match(rec.name)
    if m is None or m.group("module") != module_label(rec.module):
        return draw, None  # a name outside the record-name grammar (a port's own names)
    return draw, "op" if m.group("op") else "module"


def _classes_agree(a: tuple, b: tuple) -> bool:
    return all(x is None or y is None or x == y for x, y in zip(a, b))


def same_shape(a: Sequence[int], b: Sequence[int]) -> bool:
    """Equal shapes, or equal once size-1 dimensions are dropped ((1, 80, 100) vs (80, 100))."""
    return tuple(a) == tuple(b) or tuple(d for d in a if d != 1) == tuple(d for d in b if d != 1)
