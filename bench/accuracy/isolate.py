"""Truth-known cases for `tensorprobe isolate`: is a layer wrong, or inheriting error?

A case is a diff case's architecture and planted bug (`bugs.py`), with the candidate run in PyTorch as is, in
float16 or in bfloat16, and `isolate` run on the reference and the candidate as a user runs it
(`tensorprobe.isolate`). A planted case is *localized* when the layer whose local error first fails (or, where
none does alone, the smallest module call that fails alone, `IsolateReport.ascent`) is the planted module or
inside it; isolate's answer is a place, not a cause, so its cause is right when its place is. Any layer failing
locally on a faithful candidate is a false alarm. A bug that moves its module's output by less than the port's
rounding is void, as for `diff`. Cases are named `isolate/ARCH/PORT/TRUTH/sSEED`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from .archs import ARCHS
from .cases import Case, applicable, family

ISOLATE_PORTS = {"torch": None, "fp16": torch.float16, "bf16": torch.bfloat16}
# (dict inputs and returned dicts are left to `diff`; noise draws are replayed by isolate, and kept)
_SKIP_ARCHS = ("dictio",)


@dataclass(frozen=True)
class IsolateCase:
    """A `diff` case's truth (architecture, port, bug, site, seed) run through `isolate` instead."""

    case: Case

    @property
    def id(self) -> str:
        arch, port, _level, truth, seed = self.case.id.split("/")
        return f"isolate/{arch}/{port}/{truth}/{seed}"

    @classmethod
    def from_id(cls, case_id: str) -> "IsolateCase":
        parts = case_id.split("/")
        if len(parts) != 5 or parts[0] != "isolate" or parts[2] not in ISOLATE_PORTS:
            raise ValueError(f"not an isolate case id: {case_id!r} (isolate/arch/port/truth/sSEED)")
        _, arch, port, truth, seed = parts
        return cls(Case.from_id(f"{arch}/{port}/module-full/{truth}/{seed}"))

    @property
    def bug(self) -> str | None:
        return self.case.bug

    @property
    def site(self) -> str | None:
        return self.case.site

    @property
    def port(self) -> str:
        return self.case.port

    @property
    def cell(self) -> tuple[str, str, str]:
        return family(self.case.arch), f"isolate-{self.port}", "module"


def judge_isolate(case: IsolateCase) -> dict[str, Any]:
    """Run `isolate` on the case's reference and candidate and score it (outcome fields as `run.judge`'s)."""
    import tensorprobe as tp

    from .run import _build, effect

    diff_case = case.case
    out: dict[str, Any] = {}
    if case.bug is not None:
        out["effect"] = effect(diff_case)
        if out["effect"] < diff_case.min_effect:
            return {**out, "void": True}
    ref, cand = _build(diff_case, planted=False), _build(diff_case, planted=True)
    dtype = ISOLATE_PORTS[case.port]
    model = cand.model.to(dtype) if dtype is not None else cand.model
    torch.manual_seed(0)
    report = tp.isolate(ref.model, model, *ref.inputs)
    place = report.first_local
    layer = next((x for x in report.layers if x.name == place), None)
    module = layer.module if layer is not None else None
    if module is None and report.ascent is not None and report.ascent.found is not None:
        module = report.ascent.module
    out.update(verdict="local" if module is not None else "none", first_divergence=place or module, cause=None,
               summary=report.summary().splitlines()[0])
    if case.bug is None:
        return {**out, "false_alarm": module is not None, "lossy": False}
    localized = module is not None and (module == case.site or module.startswith(case.site + "."))
    return {**out, "detected": module is not None, "localized": localized, "enclosing": False,
            "cause_right": localized}


def generate_isolate(count: int, seed: int = 0, ports: tuple[str, ...] = tuple(ISOLATE_PORTS),
                     faithful_share: float = 0.3) -> list[IsolateCase]:
    """`count` isolate cases over architecture families × ports, faithful twins and planted bugs drawn as
    `cases.generate` draws them; the same arguments give the same cases."""
    rng = random.Random(seed)
    by_family: dict[str, list[str]] = {}
    for arch in ARCHS:
        if arch not in _SKIP_ARCHS:
            by_family.setdefault(family(arch), []).append(arch)
    sites = {a: ARCHS[a](0).sites for fam in by_family.values() for a in fam}
    cells = [(f, p) for f in by_family for p in ports]
    per_cell = -(-count // len(cells))
    cases: dict[str, IsolateCase] = {}
    for fam, port in cells:
        n_faithful = max(1, round(per_cell * faithful_share))
        for k in range(per_cell):
            arch = rng.choice(by_family[fam])
            planted = [(b, s) for s, bugs in sites[arch].items() for b in bugs if applicable(arch, port, b, s)]
            if k < n_faithful or not planted:
                case = IsolateCase(Case(arch, port, "module-full", None, None, rng.randrange(10_000)))
            else:
                bug, site = rng.choice(planted)
                case = IsolateCase(Case(arch, port, "module-full", bug, site, rng.randrange(10_000)))
            cases[case.id] = case
    out = list(cases.values())
    rng.shuffle(out)
    return out
