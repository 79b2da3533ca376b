"""Random ops that differ between the two sides by what they draw, or by the order their draws are consumed in.

Two runs that draw different numbers from the same distribution differ by noise (cause `random`: replay them).
Two runs that draw from different distributions or parameters (`rand_like` where the reference has
`randn_like`, `normal_(0, 0.5)` where it has `normal_(0, 1)`) differ by the port, with or without replay: the
random pair fails with cause `own`, tagged `draw_differs`, and what follows inherits from it. Replay refuses such
a draw (`rng.RngReplay`), and a bundle replayed before it did is caught here all the same.

Draws consumed in another order (two draws of one module swapped, both replayed and identical) show in the op
graph: a record computed from draw A on one side and from draw B on the other. That alone also describes two
independent ops computed in another order (the math kept), so it counts only when the candidate's record equals
no reference record of the same op computed from its draw. The reference's draw then fails with cause `own`,
tagged `draw_order`, and a failing record computed from the swapped consumer inherits from it.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from ..record import KIND_RNG, Record, module_label, short_op
from ..rng.draws import draw_of, mismatch_words
from .noise import CAUSE_AMPLIFIED, CAUSE_INHERITED, CAUSE_OWN
from .result import STATUS_FAIL, STATUS_NOT_COMPARABLE, PairResult

TAG_DRAW_DIFFERS = "draw_differs"   # a random pair whose two sides draw another distribution or parameters
TAG_DRAW_ORDER = "draw_order"       # a random pair whose draw the candidate consumes where another one belongs
DRAW_FINDINGS = (TAG_DRAW_DIFFERS, TAG_DRAW_ORDER)
_SAME_VALUES = 1e-6    # relative L2 error under which a reordered op is the reference's op (same op, same inputs)


def is_draw_finding(p: PairResult) -> bool:
    """A random pair that differs by the port (what or in which order it draws), not by noise."""
    return p.kind == KIND_RNG and any(t in p.tags for t in DRAW_FINDINGS)


class DrawFindings:
    """Judge the random pairs of a diff (`judge`), then blame what a swapped draw reaches (`blame`)."""

    def __init__(self, ref_bundle: Any, cand_bundle: Any, limit: int = 10_000):
        self.ref_bundle, self.cand_bundle, self.limit = ref_bundle, cand_bundle, limit
        self.ref = {r.name: r for r in (ref_bundle.records if ref_bundle is not None else ())}
        self.cand = {r.name: r for r in (cand_bundle.records if cand_bundle is not None else ())}
        self.swapped: dict[str, str] = {}     # reference consumer -> the reference draw it should have read
        self.compared: set[str] = set()       # reference records whose pair was compared

    def judge(self, results: Sequence[PairResult]) -> list[PairResult]:
        """`results` with the random pairs that differ by the port failed, tagged and explained."""
        if not self.ref or not self.cand:
            return list(results)
        order = self._draw_order(results)
        out = []
        for p in results:
            if p.kind == KIND_RNG:
                p = self._different_draw(p) or order.get(p.name, p)
            out.append(p)
        return out

    def blame(self, p: PairResult) -> PairResult:
        """A failing pair computed (through records not compared) from a consumer of a swapped draw inherits
        from that draw."""
        if not self.swapped or p.cause not in (CAUSE_OWN, CAUSE_AMPLIFIED):
            return p
        todo, seen = [p.name], {p.name}
        while todo and len(seen) < self.limit:
            rec = self.ref.get(todo.pop())
            for i in rec.inputs if rec is not None else ():
                if i in self.swapped:
                    return replace(p, cause=CAUSE_INHERITED, origin=self.swapped[i])
                if i not in seen and i not in self.compared:
                    seen.add(i)
                    todo.append(i)
        return p

    # ---- a draw of another distribution or parameters ---------------------------------------------------
    def _different_draw(self, p: PairResult) -> PairResult | None:
        r, c = self.ref.get(p.name), self.cand.get(p.cand_name)
        dr, dc = (draw_of(r) if r is not None else None), (draw_of(c) if c is not None else None)
        if dr is None or dc is None or dc.conflict(dr) is None:
            return None
        words = mismatch_words(dc, c.op, dr, r.op)
        return replace(p, status=STATUS_FAIL, tags=p.tags + (TAG_DRAW_DIFFERS,), reasons=(words,) + p.reasons,
                       explanation=("a difference of the port at this random op, not noise: no replay can make "
                                    "the two agree (replay feeds a recorded draw only to the same draw)"))

    # ---- draws consumed in another order ---------------------------------------------------------------
    def _draw_order(self, results: Sequence[PairResult]) -> dict[str, PairResult]:
        """Reference draw name -> its pair, failed with the words, for each draw the candidate consumes where
        another one belongs."""
        by_name = {p.name: p for p in results}
        ref_of = {p.cand_name: p.name for p in results}
        self.compared = {p.name for p in results if p.status != STATUS_NOT_COMPARABLE}
        suspects = [p for p in results if p.status == STATUS_NOT_COMPARABLE and p.kind != KIND_RNG]
        if not suspects or not any(p.kind == KIND_RNG and _identical(p) for p in results):
            return {}     # no replayed draw: nothing to swap
        ref_draws, cand_draws = _DrawAncestry(self.ref), _DrawAncestry(self.cand)
        found: dict[str, PairResult] = {}
        for p in suspects:
            r, c = self.ref.get(p.name), self.cand.get(p.cand_name)
            if r is None or c is None:
                continue
            theirs = ref_draws.of(r.name)
            mine = {ref_of.get(d) for d in cand_draws.of(c.name)}
            should, took = sorted(theirs - mine, key=self._order), sorted(mine - theirs, key=self._order)
            if not should or not took or None in took \
                    or not all(_identical(by_name.get(d)) for d in should + took):
                continue     # draws that are not replayed differ anyway: that is noise, told elsewhere
            if self._reordered(c, r):
                continue
            self.swapped[p.name] = should[0]
            if should[0] not in found and should[0] in by_name:
                d = by_name[should[0]]
                words = (f"the candidate consumes the random draws of {module_label(r.module)} in another order: its "
                         f"{p.cand_name} ({short_op(c.op)}) is computed from {took[0]} where the reference's is "
                         f"computed from {should[0]}")
                found[should[0]] = replace(d, status=STATUS_FAIL, tags=d.tags + (TAG_DRAW_ORDER,),
                                           reasons=(words,) + d.reasons, explanation=(
                                               "both draws are replayed and identical, so the difference is the "
                                               "port's, at this random op: not noise, nor the op that reads them"))
        return found

    def _order(self, name: str | None) -> int:
        r = self.ref.get(name or "")
        return r.order if r is not None else -1

    def _reordered(self, c: Record, r: Record) -> bool:
        """The candidate's record equals a reference record of the same op in the same module call: the two
        sides compute the same ops in another order, which keeps the math."""
        if not c.has_tensor:
            return True    # nothing proves a swap: say nothing
        values = None
        for other in self.ref.values():
            if other.module != r.module or other.call != r.call or short_op(other.op) != short_op(c.op) \
                    or not other.has_tensor or tuple(other.shape) != tuple(c.shape):
                continue
            if values is None:
                values = np.asarray(self.cand_bundle.numpy(c.name), dtype=np.float64)
            ref = np.asarray(self.ref_bundle.numpy(other.name), dtype=np.float64)
            err = float(np.sum((values - ref) ** 2))
            if err <= _SAME_VALUES ** 2 * max(float(np.sum(ref * ref)), 1e-300):
                return True
        return False


class _DrawAncestry:
    """The random draws each record of a bundle is computed from (through the op graph), memoised."""

    def __init__(self, records: dict[str, Record]):
        self.records = records
        self.memo: dict[str, frozenset[str]] = {}

    def of(self, name: str) -> frozenset[str]:
        todo, entered = [name], set()
        while todo:
            n = todo[-1]
            if n in self.memo:
                todo.pop()
                continue
            r = self.records.get(n)
            ins = [i for i in (r.inputs if r is not None else ()) if i in self.records and i != n]
            missing = [i for i in ins if i not in self.memo and i not in entered]
            if missing and n not in entered:
                entered.add(n)      # an input met again before it is done (a cycle in a damaged graph) is skipped
                todo.extend(missing)
                continue
            todo.pop()
            own = frozenset([n]) if r is not None and r.kind == KIND_RNG else frozenset()
            self.memo[n] = own.union(*(self.memo.get(i, frozenset()) for i in ins))
        return self.memo[name]


def _identical(p: PairResult | None) -> bool:
    """Both sides drew the same numbers (replayed): compared value by value, and passing."""
    return p is not None and not p.failed and p.rel_err is not None


__all__ = ["DRAW_FINDINGS", "TAG_DRAW_DIFFERS", "TAG_DRAW_ORDER", "DrawFindings", "is_draw_finding"]
