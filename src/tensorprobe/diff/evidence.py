"""What a claim about a record's inputs rests on: which of them were paired and compared.

"The error enters here: its inputs are identical" is a claim about every input of a record. It holds only
when each one (its op-graph inputs, the weights a module-level record reads) was paired with a candidate
record and compared. A renamed block (`layers.3` against `blocks.3`), a weight with no counterpart, or an
input made by a parent's code that no record shows (tag `inputs_made_in:`) leaves the claim unproven: the
error may enter in what feeds the record. `uncompared_inputs` names those inputs; `summary` says so.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Mapping, Sequence

from ..record import TAG_INPUTS_MADE_IN, TAG_INPUTS_UNRECORDED, WEIGHT_KINDS, Record
from .noise import CAUSE_OWN
from .result import STATUS_NO_DATA, PairResult

UNPAIRED, NOT_COMPARED = "unpaired", "not compared"


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
                      own_weights: Mapping[str, Sequence[str]]) -> tuple[tuple[str, str], ...]:
    """The inputs of pair `p` that were not paired and compared, each as (name, why): why is `unpaired` (the
    candidate has no counterpart) or `not compared` (paired, but values of other kinds, or no data)."""
    if rec is None:
        return ()
    out = []
    for name in direct_inputs(rec, own_weights):
        q = pairs.get(name)
        if q is None:
            out.append((name, UNPAIRED))
        elif not q.compared or q.status == STATUS_NO_DATA:
            out.append((name, NOT_COMPARED))
    return tuple(out)


def with_uncompared_inputs(forward: Sequence[PairResult], weights: Sequence[PairResult],
                           ref_records: Sequence[Record]) -> list[PairResult]:
    """`forward` with `uncompared_inputs` filled in for each failing pair whose error is called its own (the
    only pairs whose words claim anything about their inputs)."""
    by_name = {r.name: r for r in ref_records}
    own = module_weights(ref_records)
    pairs = {p.name: p for p in (*weights, *forward)}
    return [replace(p, uncompared_inputs=uncompared_inputs(p, by_name.get(p.name), pairs, own))
            if p.failed and p.cause == CAUSE_OWN else p for p in forward]


def made_in(tags: Iterable[str], module: str) -> str | None:
    """The module whose own code made the input of module `module`'s record (capture's tag `inputs_made_in:`;
    a bundle from before that tag: the parent), or None when the record's inputs were recorded."""
    tags = tuple(tags)
    if TAG_INPUTS_UNRECORDED not in tags:
        return None
    parent = module.rsplit(".", 1)[0] if "." in module else ""
    return next((t[len(TAG_INPUTS_MADE_IN):] for t in tags if t.startswith(TAG_INPUTS_MADE_IN)), parent)


__all__ = ["NOT_COMPARED", "UNPAIRED", "direct_inputs", "made_in", "module_weights", "uncompared_inputs", "with_uncompared_inputs"]
