"""Suggest mapping rules for modules the candidate renamed, from the structure both sides still share.

A port that calls `layers.N` `blocks.N` leaves every record of those blocks unpaired by name. Their structure
still lines up: the same records in the same execution order with the same shapes, and the same weights (a
weight with identical content already pairs by its fingerprint under any name). Each such correspondence
says how a candidate module path becomes a reference path (`blocks.1.conv` -> `layers.1.conv`: `blocks` ->
`layers` under the same prefix, the rest kept); the rewrite most correspondences agree on becomes a rule in
`--map` syntax (`blocks\\.(.*)=layers.\\1`, candidate name -> reference name, `align.Rule`), kept only when
applying it lands most of the names it matches on reference records. The evidence is counted per renamed
instance (`blocks.0` ... `blocks.3`): how many keep the reference's order and shapes, and how many its
weights, so a renamed block whose weights differ is visible before any rule is applied.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any, Iterable, Sequence

from ..record import KIND_INPUT, KIND_MODEL_INPUT, KIND_MODEL_OUTPUT, NAME_RE, ROOT, WEIGHT_KINDS, Record, short_op
from .align import MATCH_DIGEST, Rule
from .result import PairResult

MAX_RULES = 3
MAX_RECORDS = 4000      # unpaired records per side considered (pairing by order is quadratic in the worst case)
MIN_VOTES = 2           # a rewrite seen once is a coincidence of names
_NUMBER = "#"


@dataclass(frozen=True)
class Rewrite:
    """`prefix.cand` -> `prefix.ref` at the start of a name, the rest kept; `#` stands for a number both keep."""

    prefix: str
    cand: str
    ref: str

    def rule(self, dotted: bool) -> str:
        """The rule in `--map` syntax; `dotted`: every name it renames continues with '.' (the usual case)."""
        head = ".".join(x for x in (self.prefix, self.cand) if x)
        pattern = "(\\d+)".join(re.escape(part) for part in head.split(_NUMBER))
        n = head.count(_NUMBER)
        target = ".".join(x for x in (self.prefix, self.ref) if x)
        for i in range(1, n + 1):
            target = target.replace(_NUMBER, f"\\{i}", 1)
        rest = n + 1
        if dotted:
            return f"{pattern}\\.(.*)={target}{'.' if target else ''}\\{rest}"
        return f"{pattern}(.*)={target}\\{rest}"

    def label(self, side: str, numbered: bool) -> str:
        """'blocks.N' (the candidate's renamed instances) or 'layers.N'; 'net.X' against 'X' for a rename
        that is not a list of instances."""
        text = ".".join(x for x in (self.prefix, self.cand if side == "cand" else self.ref) if x)
        text = text.replace(_NUMBER, "N")
        return f"{text}.N" if numbered else f"{text}.X" if text else "X"


@dataclass(frozen=True)
class Suggestion:
    """Mapping rules that would pair renamed records, and the sentence that offers them."""

    rules: tuple[str, ...]
    sentence: str


def suggest(ref_bundle: Any, cand_bundle: Any, results: Sequence[PairResult], ref_only: Sequence[str],
            cand_only: Sequence[str]) -> Suggestion | None:
    """Rules for the modules the candidate renamed, or None when the unpaired records show no rename."""
    if ref_bundle is None or cand_bundle is None or not ref_only or not cand_only:
        return None
    refs = _records(ref_bundle, ref_only)
    cands = _records(cand_bundle, cand_only)
    digest_pairs = [(p.cand_name, p.name) for p in results if p.match == MATCH_DIGEST and p.cand_name != p.name]
    corr = digest_pairs + _by_structure(refs, cands)
    if not corr:
        return None
    ref_names = set(ref_only) | {r for _, r in digest_pairs}
    cand_names = list(cand_only) + [c for c, _ in digest_pairs]
    chosen: list[tuple[Rewrite, Rule, list[tuple[str, str]]]] = []
    for _ in range(MAX_RULES):
        found = _best(corr, cand_names, ref_names, chosen)
        if found is None:
            break
        chosen.append(found)
        corr = [(c, r) for c, r in corr if found[1].apply(c) is None]
    if not chosen:
        return None
    rules = tuple(str(rule) for _, rule, _ in chosen)
    looks = "; ".join(_evidence(rw, landed, ref_bundle, cand_bundle) for rw, _, landed in chosen)
    maps = " ".join(f"--map '{r}'" for r in rules)
    unmatched = f"{len(ref_only):,} reference and {len(cand_only):,} candidate records have no counterpart"
    return Suggestion(rules, f"{unmatched}; {looks}: try {maps}.")


def _records(bundle: Any, names: Iterable[str]) -> list[Record]:
    out = [r for n in names if (r := bundle.get(n)) is not None
           and r.kind not in (KIND_INPUT, KIND_MODEL_INPUT, KIND_MODEL_OUTPUT)]
    return sorted(out, key=lambda r: r.order)


def _by_structure(refs: Sequence[Record], cands: Sequence[Record]) -> list[tuple[str, str]]:
    """(candidate, reference) names of unpaired records that line up in execution order, each class apart:
    the forward's records by op and shape, weights by shape and dtype."""
    out = []
    for weights in (False, True):
        r = [x for x in refs if (x.kind in WEIGHT_KINDS) == weights][:MAX_RECORDS]
        c = [x for x in cands if (x.kind in WEIGHT_KINDS) == weights][:MAX_RECORDS]
        if not r or not c:
            continue
        sm = SequenceMatcher(None, [_token(x) for x in r], [_token(x) for x in c], autojunk=False)
        for a, b, n in sm.get_matching_blocks():
            out += [(c[b + k].name, r[a + k].name) for k in range(n)]
    return out


def _token(r: Record) -> tuple:
    shape = tuple(d for d in r.shape if d != 1)
    if r.kind in WEIGHT_KINDS:
        return ("weight", shape, r.dtype)
    return (short_op(r.op), shape)


def _split(name: str, weight: bool) -> tuple[list[str], str] | None:
    """A name's module path components and the rest (`blocks.1.conv/convolution.0` -> [blocks, 1, conv],
    '/convolution.0'); a weight is all path. None for the root's records and names outside the grammar."""
    if weight:
        return name.split("."), ""
    m = NAME_RE.match(name)
    if m is None or m.group("module") in ("", ROOT):
        return None
    return m.group("module").split("."), name[len(m.group("module")):]


def rewrite_of(cand: str, ref: str) -> Rewrite | None:
    """How candidate name `cand` becomes reference name `ref`: the module path components that differ between
    a common prefix and a common suffix (the op part must be equal), numbers kept on both sides as `#`."""
    weight = "/" not in cand and "/" not in ref and "@" not in cand + ref and ":" not in cand + ref
    a, b = _split(cand, weight), _split(ref, weight)
    if a is None or b is None or a[1] != b[1]:
        return None
    c, r = a[0], b[0]
    while c and r and c[-1] == r[-1]:
        c, r = c[:-1], r[:-1]
    k = 0
    while k < min(len(c), len(r)) and c[k] == r[k]:
        k += 1
    prefix, cm, rm = ".".join(c[:k]), ".".join(c[k:]), ".".join(r[k:])
    if not cm or cm == rm:
        return None     # the candidate lacks a level the reference has: a rule would match every name
    nc, nr = re.findall(r"\d+", cm), re.findall(r"\d+", rm)
    if nc and nc == nr:
        cm, rm = re.sub(r"\d+", _NUMBER, cm), re.sub(r"\d+", _NUMBER, rm)
    return Rewrite(prefix, cm, rm)


def _best(corr: Sequence[tuple[str, str]], cands: Sequence[str], ref_names: set[str],
          chosen: Sequence[tuple[Rewrite, Rule, list]]) -> tuple[Rewrite, Rule, list[tuple[str, str]]] | None:
    """The rewrite most correspondences agree on, as a rule, with the unpaired candidate names it lands on
    unpaired reference records; None when no rewrite is seen twice or its rule lands fewer than half of the
    candidate names it matches."""
    votes = Counter(rw for c, r in corr if (rw := rewrite_of(c, r)) is not None)
    for rw, n in votes.most_common(5):
        if n < MIN_VOTES or any(rw == done for done, _, _ in chosen):
            continue
        head = ".".join(x for x in (rw.prefix, rw.cand) if x)
        matcher = re.compile("\\d+".join(re.escape(p) for p in head.split(_NUMBER)) + "(.*)")
        hit = [c for c in cands if matcher.fullmatch(c)]
        dotted = [c for c in hit if matcher.fullmatch(c).group(matcher.groups).startswith(".")]  # type: ignore[union-attr]
        if not rw.prefix and not rw.ref:   # `net.conv1` -> `conv1`: only names that go on after a dot can lose it
            hit = dotted
        rule = Rule(*rw.rule(len(dotted) == len(hit)).rsplit("=", 1))
        landed = [(c, t) for c in hit if (t := rule.apply(c)) in ref_names]
        if len(landed) >= MIN_VOTES and 2 * len(landed) >= len(hit):
            return rw, rule, landed
    return None


def _evidence(rw: Rewrite, landed: Sequence[tuple[str, str]], ref_bundle: Any, cand_bundle: Any) -> str:
    """"the candidate's blocks.N look like the reference's layers.N (same order and shapes for 4 of 4, same
    weights for 3 of 4: blocks.1's differ)"."""
    depth = len(".".join(x for x in (rw.prefix, rw.cand) if x).split("."))
    groups: dict[str, list[tuple[Record, Record]]] = {}
    numbered = True
    for c, r in landed:
        rc, rr = cand_bundle.get(c), ref_bundle.get(r)
        if rc is None or rr is None:
            continue
        parts = (c if rc.kind in WEIGHT_KINDS else NAME_RE.match(c).group("module")).split(".")  # type: ignore[union-attr]
        numbered = numbered and len(parts) > depth and parts[depth].isdigit()
        groups.setdefault(".".join(parts[: depth + 1] if numbered else parts[:depth]), []).append((rc, rr))
    if not numbered:   # one renamed module, not a list of them
        groups = {"": [x for g in groups.values() for x in g]}
    forward = sorted((x for g in groups.values() for x in g if x[0].kind not in WEIGHT_KINDS), key=lambda x: x[0].order)
    in_order = [rr.order for _, rr in forward] == sorted(rr.order for _, rr in forward)
    order = "order and " if len(forward) > 1 else ""     # weights alone say nothing of execution order
    shapes = [k for k, g in groups.items() if all(tuple(a.shape) == tuple(b.shape) for a, b in g)]
    weights = {k: [a.digest == b.digest for a, b in g if a.kind in WEIGHT_KINDS and a.digest and b.digest]
               for k, g in groups.items()}
    same_w = [k for k, w in weights.items() if w and all(w)]
    differ = [k for k, w in weights.items() if w and not all(w)]
    if numbered:
        n = len(groups)
        what = [f"same {order}shapes for {len(shapes)} of {n}" if in_order else
                f"same shapes for {len(shapes)} of {n}, in another order"]
        if same_w or differ:
            what.append(f"same weights for {len(same_w)} of {n}" + (f" (not {_names(differ)})" if differ else ""))
    else:   # one renamed module: count its weights one by one
        pairs = [x for g in groups.values() for x in g]
        what = [f"same {order}shapes" if in_order and shapes else "same shapes, in another order" if shapes
                else "other shapes"]
        w = [(a.name, a.digest == b.digest) for a, b in pairs if a.kind in WEIGHT_KINDS and a.digest and b.digest]
        if w:
            bad = [name for name, same in w if not same]
            what.append(f"same weights for {len(w) - len(bad)} of {len(w)}" + (f" (not {_names(bad)})" if bad else ""))
    return f"the candidate's {rw.label('cand', numbered)} look like the reference's {rw.label('ref', numbered)} " \
           f"({', '.join(what)})"


def _names(names: Sequence[str]) -> str:
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


__all__ = ["Rewrite", "Suggestion", "rewrite_of", "suggest"]
