"""What a claim about a record's inputs rests on: which of them were paired and compared.

"The error enters here: its inputs are identical" is a claim about every input of a record. It holds only
when each one (its op-graph inputs, the weights a module-level record reads) was paired with a candidate
record and compared. A renamed block (`layers.3` against `blocks.3`), a weight with no counterpart, or an
input made by a parent's code that no record shows (tag `inputs_made_in:`) leaves the claim unproven: the
error may enter in what feeds the record. `uncompared_inputs` names those inputs; `summary` says so.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Iterable, Mapping, Sequence

from ..record import KIND_INPUT, TAG_INPUTS_MADE_IN, TAG_INPUTS_UNRECORDED, WEIGHT_KINDS, Record
from .noise import CAUSE_OWN
from .result import STATUS_NO_DATA, PairResult
from .views import every_record

UNPAIRED, NOT_COMPARED, CAND_ONLY = "unpaired", "not compared", "candidate only"
# the reference's record reads these, the candidate's reads nothing recorded: code no record shows made its input
FED_OTHERWISE = "fed otherwise"


def module_weights(ref_records: Iterable[Record]) -> dict[str, list[str]]:
    """module path -> the reference's weights that belong to it directly (`body.scale` -> `body`)."""
    out: dict[str, list[str]] = {}
    for r in ref_records:
        if r.kind in WEIGHT_KINDS:
            out.setdefault(r.module, []).append(r.name)
    return out


def direct_inputs(rec: Record, own_weights: Mapping[str, Sequence[str]]) -> list[str]:
    """What `rec` is computed from, as the reference recorded it: its op-graph inputs, and for a module-level
    record its own module's weights (a module output's graph names only the data it received)."""
    inputs = list(rec.inputs)
    if rec.op.startswith("module:"):
        inputs += [w for w in own_weights.get(rec.module, ()) if w not in inputs]
    return inputs


def uncompared_inputs(p: PairResult, rec: Record | None, pairs: Mapping[str, PairResult],
                      own_weights: Mapping[str, Sequence[str]], cand: Record | None = None,
                      cand_paired: frozenset[str] = frozenset(), *, ref_kinds: Mapping[str, str] | None = None,
                      cand_kinds: Mapping[str, str] | None = None,
                      cand_graph: bool = False) -> tuple[tuple[str, str], ...]:
    """The inputs of pair `p` that were not paired and compared, each as (name, why): why is `unpaired` (the
    candidate has no counterpart), `not compared` (paired, but values of other kinds, or no data), or
    `candidate only` (the candidate's record reads a record the reference has no counterpart of: an op the
    port adds, such as a channel reorder). `ref_kinds`/`cand_kinds`: each side's record kinds by name, when
    known: names no record holds (an integer weight's zero point) and module inputs (never paired) are skipped.
    `cand_graph`: the candidate records its records' inputs (a PyTorch capture, compiled or not): a candidate
    record reading no record then read a value made by code between records (`FED_OTHERWISE`)."""
    if rec is None:
        return ()
    out = []
    for name in direct_inputs(rec, own_weights):
        if not _recorded(name, ref_kinds):
            continue
        q = pairs.get(name)
        if q is None:
            out.append((name, UNPAIRED))
        elif not q.compared or q.status == STATUS_NO_DATA:
            out.append((name, NOT_COMPARED))
    if cand is not None and cand_paired:
        out += [(name, CAND_ONLY) for name in cand.inputs if name not in cand_paired and _recorded(name, cand_kinds)]
    if cand is not None and cand_graph and not cand.inputs:
        # the candidate records what its records read, and this one read no record: the value it was given was
        # made between records (a port's own forward scaling what the reference passes as it is)
        out += [(name, FED_OTHERWISE) for name in rec.inputs
                if (q := pairs.get(name)) is not None and q.compared and _recorded(name, ref_kinds)]
    return tuple(out)


def _recorded(name: str, kinds: Mapping[str, str] | None) -> bool:
    return kinds is None or kinds.get(name, KIND_INPUT) != KIND_INPUT


def with_uncompared_inputs(forward: Sequence[PairResult], weights: Sequence[PairResult],
                           ref_records: Sequence[Record], cand_bundle: Any = None) -> list[PairResult]:
    """`forward` with `uncompared_inputs` filled in for each failing pair whose error is called its own (the
    only pairs whose words claim anything about their inputs)."""
    if not any(p.failed and p.cause == CAUSE_OWN for p in forward):
        return list(forward)
    by_name = {r.name: r for r in ref_records}
    own = module_weights(ref_records)
    pairs = {p.name: p for p in (*weights, *forward)}
    cand_paired = frozenset(p.cand_name for p in pairs.values())
    ref_kinds = {r.name: r.kind for r in ref_records}
    cand_records = every_record(cand_bundle) if cand_bundle is not None else []    # a module view's op records too
    cand_kinds = {r.name: r.kind for r in cand_records} if cand_bundle is not None else None
    cand_graph = cand_bundle is not None and _records_inputs(cand_records)
    out = []
    for p in forward:
        if p.failed and p.cause == CAUSE_OWN:
            cand = cand_bundle.get(p.cand_name) if cand_bundle is not None else None
            p = replace(p, uncompared_inputs=uncompared_inputs(p, by_name.get(p.name), pairs, own, cand, cand_paired,
                                                               ref_kinds=ref_kinds, cand_kinds=cand_kinds,
                                                               cand_graph=cand_graph))
        out.append(p)
    return out


def _records_inputs(records: Iterable[Record]) -> bool:
    """Do a bundle's forward records name their inputs (a PyTorch capture), beyond the model's inputs?"""
    return any(r.inputs and any(not i.startswith("input.") for i in r.inputs)
               for r in records if r.kind not in WEIGHT_KINDS)


def made_in(tags: Iterable[str], module: str) -> str | None:
    """The module whose own code made the input of module `module`'s record (capture's tag `inputs_made_in:`;
    a bundle from before that tag: the parent), or None when the record's inputs were recorded."""
    tags = tuple(tags)
    if TAG_INPUTS_UNRECORDED not in tags:
        return None
    parent = module.rsplit(".", 1)[0] if "." in module else ""
    return next((t[len(TAG_INPUTS_MADE_IN):] for t in tags if t.startswith(TAG_INPUTS_MADE_IN)), parent)


__all__ = ["CAND_ONLY", "FED_OTHERWISE", "NOT_COMPARED", "UNPAIRED", "direct_inputs", "made_in", "module_weights", "uncompared_inputs", "with_uncompared_inputs"]
