"""A diff's records as a tree of modules: what the HTML report leads with on a model of thousands of tensors.

Each node is one module path (`decode.0.conv1`; the root is `<root>`), carrying over its whole subtree: the
worst SNR and relative error of the pairs compared value by value, the number of failing and compared pairs,
the candidate's non-finite values, whether it holds the first divergence or the strongest amplifier, and a
verdict (`fail`, `pass`, `not compared`). Pairs that could not be compared (integer units beside floats, a
record compared by statistics alone) are counted, never averaged in. Weights are not in the tree (the report
lists them on their own). Module paths split at their dots; a step that is only a number (`blocks.0`) stays
with its parent's name, so `blocks.0` is one level, not two.

    >>> tree = module_tree(report)                              # doctest: +SKIP
    >>> [c.path for c in tree.children], tree.open_path        # doctest: +SKIP
    (['encode', 'decode', 'generator'], ['<root>', 'generator', 'generator.noise_res.0', ...])
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterator

ROOT = "<root>"
_SKIP_KINDS = ("param", "buffer")


@dataclass
class ModuleNode:
    """One module of the tree, with figures over its subtree (its own records and every descendant's)."""

    path: str                                   # the module path ("" for the root, printed <root>)
    name: str                                   # the last step of the path (`conv1`, `blocks.0`)
    children: list["ModuleNode"] = field(default_factory=list)
    pairs: list[Any] = field(default_factory=list)     # this module's own records (PairResult), in order
    worst_snr: float | None = None
    worst_rel_err: float | None = None
    worst_record: str | None = None
    failed: int = 0
    compared: int = 0                           # records compared value by value (what has an SNR to show)
    by_stats: int = 0                           # records judged by statistics alone (a side kept no tensor)
    snr_bound: float | None = None              # the lowest SNR upper bound the statistics prove (dB)
    incomparable: int = 0                       # records with no verdict at all (not comparable, no data)
    nonfinite: int = 0
    first_divergence: bool = False
    amplifier: bool = False
    order: int | None = None                    # first execution order in the subtree

    @property
    def verdict(self) -> str:
        if self.failed:
            return "fail"
        if self.compared:
            return "pass"
        # statistics that show no difference prove no match: a module judged only by them is not a pass
        return "not proven" if self.by_stats else "not compared"

    @property
    def judged(self) -> int:
        """Records with a verdict: compared value by value or by statistics (a divergence they prove counts)."""
        return self.compared + self.by_stats

    @property
    def label(self) -> str:
        return self.path or ROOT

    def walk(self) -> Iterator["ModuleNode"]:
        yield self
        for c in self.children:
            yield from c.walk()


def _steps(path: str) -> list[str]:
    """`generator.noise_res.0.adain1.0.norm` -> ['generator', 'noise_res.0', 'adain1.0', 'norm']."""
    steps: list[str] = []
    for part in path.split(".") if path else []:
        if part.isdigit() and steps:
            steps[-1] += "." + part
        else:
            steps.append(part)
    return steps


def _nonfinite(p: Any) -> int:
    frac = p.metric("cand_finite_frac")
    if frac is None or (isinstance(frac, float) and math.isnan(frac)):
        return 0
    n = math.prod(p.cand_shape) if p.cand_shape else 1
    return int(round((1.0 - frac) * n))


def comparable(p: Any) -> bool:
    """A pair compared value by value (or exactly) with an SNR to show: what the per-record plot draws."""
    v = p.metric("snr_db")
    return p.compared and v is not None and not (isinstance(v, float) and math.isnan(v))


@dataclass
class ModuleTree:
    root: ModuleNode
    open_path: list[str]          # module paths, root first, down to the first divergence's module (open)
    by_path: dict[str, ModuleNode]

    @property
    def depth_to_first(self) -> int:
        """Clicks from the top to the first divergence's records if nothing were open by default."""
        return max(len(self.open_path) - 1, 0)


def module_tree(report: Any) -> ModuleTree:
    """Build the tree of a `DiffReport` (records of kind param/buffer left out)."""
    root = ModuleNode(path="", name=ROOT)
    by_path: dict[str, ModuleNode] = {"": root}
    amp = report.strongest_amplifier

    def node(path: str) -> ModuleNode:
        if path in by_path:
            return by_path[path]
        steps = _steps(path)
        parent = node(_join(steps[:-1]))
        n = ModuleNode(path=path, name=steps[-1] if steps else ROOT)
        parent.children.append(n)
        by_path[path] = n
        return n

    for p in report.pairs:
        if p.kind in _SKIP_KINDS:
            continue
        n = node(p.module or "")
        n.pairs.append(p)
        snr = p.metric("snr_db") if comparable(p) else None
        rel = p.rel_err if comparable(p) else None
        bad = _nonfinite(p)
        # every ancestor carries the figures of its subtree
        steps = _steps(p.module or "")
        chain = [by_path[""]] + [by_path[_join(steps[:i + 1])] for i in range(len(steps))]
        for a in chain:
            a.order = p.order if a.order is None else min(a.order, p.order)
            if comparable(p):
                a.compared += 1
                if a.worst_snr is None or snr < a.worst_snr:
                    a.worst_snr, a.worst_record = snr, p.name
                if rel is not None and (a.worst_rel_err is None or rel > a.worst_rel_err):
                    a.worst_rel_err = rel
            elif p.compared:      # by statistics (or a content fingerprint): a verdict without an SNR to draw
                a.by_stats += 1
                lo = p.metric("rel_l2_err_lower")
                if lo is not None and 0 < lo < math.inf:     # proven: the SNR is at most -20 log10(lower bound)
                    bound = -20.0 * math.log10(lo)
                    a.snr_bound = bound if a.snr_bound is None else min(a.snr_bound, bound)
            else:
                a.incomparable += 1
            if p.failed:
                a.failed += 1
            a.nonfinite += bad
            if p.name == report.first_divergence:
                a.first_divergence = True
            if amp is not None and p.name == amp.name:
                a.amplifier = True
    for a in root.walk():
        a.children.sort(key=lambda c: c.order if c.order is not None else math.inf)
    open_path = [a.path for a in root.walk() if a.first_divergence]
    return ModuleTree(root=root, open_path=open_path, by_path=by_path)


def _join(steps: list[str]) -> str:
    return ".".join(steps)


def module_groups(pairs: list[Any], max_groups: int = 40) -> list[tuple[str, list[Any]]]:
    """Comparable pairs grouped by module for the per-record plot: the shallowest level of the module paths
    that splits them into more than one group (at most 3 steps deep, at most `max_groups` groups), groups in
    order of first execution, records in execution order inside each. Records of the root itself (the model's
    inputs, the ops between its submodules, its output) stay where they ran: one group per consecutive run."""
    pairs = sorted(pairs, key=lambda p: p.order)
    best: list[tuple[str, list[Any]]] = [("", pairs)]
    for depth in (1, 2, 3):
        groups: dict[tuple[str, int], list[Any]] = {}
        run, last = 0, None
        for p in pairs:
            key = _join(_steps(p.module or "")[:depth])
            if key == "" and last != "":
                run += 1
            last = key
            groups.setdefault((key, run if key == "" else 0), []).append(p)
        if len(groups) > max_groups:
            break
        best = [(k, g) for (k, _), g in groups.items()]
        if len(groups) > 1:
            break
    return best
