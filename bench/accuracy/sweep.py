"""Truth-known cases for `tensorprobe sweep`: which items of a corpus does a port get wrong, and where?

A case is an architecture of the `diff` cases, a corpus of six items (its input cut to 1/4 ... all of its length),
and a PyTorch candidate: the same model (faithful), or one whose module M scales its output by 1 - s from frame F
on, F being M's length on the middle item: a bug that bites only the items longer than that (a clamp past a
buffer's length, a cache past its size), as `late_frames` does at frame 20 for `diff`. The candidate runs as is
or in float16 (a wrapper that casts the inputs, as users write one). `tensorprobe.sweep` runs the corpus as a
user runs it (a sweep file with a factory per side, tier 1 first), and the case is scored on its items:

- an item is *planted* when the bug moves M's own output and the model's output on it by more than the port's
  rounding, *clean* when it moves neither at all (items in between are void and not scored);
- the case is a false alarm when any clean item is a finding; it is *detected* when every planted item is one,
  and *localized* when the findings are exactly the planted items and each one's first divergence is M or
  inside it; its cause is right when each of them says `own`.

Cases are named `sweep/ARCH/PORT/TRUTH/sSEED` (TRUTH: `faithful` or `late_frames@SITE`).
"""

from __future__ import annotations

import json
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .archs import ARCHS
from .bugs import late_frames
from .cases import Case, family
from .run import _floats, _site_output, relative_change

SWEEP_PORTS = ("torch", "fp16")
FRACTIONS = (0.25, 0.375, 0.5, 0.625, 0.75, 1.0)   # each item's share of the architecture's input length
MIDDLE = 2                                          # the item whose length at M is where the bug starts to bite
STRENGTH = {"torch": 0.02, "fp16": 0.3}             # 1 - the gain past frame F
# architectures whose input is a time series they take at any length (a dict input, a flow's fixed coupling and
# the noise model's draws are left to `diff`)
SWEEP_ARCHS = tuple(a for a in ARCHS if family(a) in ("convnorm-instance", "convnorm-group", "convnorm-layer",
                                                      "convnorm-batch", "hifi", "rnn", "meldb"))
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class SweepCase:
    arch: str
    port: str
    site: str | None      # where `late_frames` bites; None: faithful
    seed: int

    @property
    def bug(self) -> str | None:
        return None if self.site is None else "late_frames"

    @property
    def id(self) -> str:
        truth = "faithful" if self.site is None else f"late_frames@{self.site}"
        return f"sweep/{self.arch}/{self.port}/{truth}/s{self.seed}"

    @classmethod
    def from_id(cls, case_id: str) -> "SweepCase":
        parts = case_id.split("/")
        if len(parts) != 5 or parts[0] != "sweep" or parts[1] not in SWEEP_ARCHS or parts[2] not in SWEEP_PORTS \
                or not parts[4].startswith("s") or not (parts[3] == "faithful" or parts[3].startswith("late_frames@")):
            raise ValueError(f"not a sweep case id: {case_id!r} (sweep/arch/port/faithful|late_frames@SITE/sSEED)")
        site = None if parts[3] == "faithful" else parts[3].split("@", 1)[1]
        return cls(parts[1], parts[2], site, int(parts[4][1:]))

    @property
    def cell(self) -> tuple[str, str, str]:
        return family(self.arch), f"sweep-{self.port}", "module"

    def items(self) -> dict[str, tuple]:
        """The corpus: the architecture's input cut to each of FRACTIONS of its length."""
        (x,) = ARCHS[self.arch](self.seed).inputs
        n = x.shape[-1]
        return {f"item{k}": (x[..., : max(1, round(n * f))].clone(),) for k, f in enumerate(FRACTIONS)}

    def reference(self) -> nn.Module:
        return ARCHS[self.arch](self.seed).model

    def candidate(self) -> nn.Module:
        model = ARCHS[self.arch](self.seed).model
        if self.site is not None:
            late_frames(model, self.site, STRENGTH[self.port], self.bite_frame())
        return _Half(model) if self.port == "fp16" else model

    def bite_frame(self) -> int:
        """M's output length on the middle item: frames from there on are scaled."""
        return _site_frames(self.reference(), self.site, self.items()[f"item{MIDDLE}"])


class _Half(nn.Module):
    """The model in float16, taking and returning float32 (the wrapper a user writes around `model.half()`)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.m = model.half()

    def forward(self, x):
        out = self.m(x.half())
        return out.float() if isinstance(out, torch.Tensor) else type(out)(o.float() for o in out)


def _site_frames(model: nn.Module, site: str, inputs: tuple) -> int:
    return _site_output(model, site, inputs)[0].shape[-1]


def item_effects(case: SweepCase) -> dict[str, float]:
    """How far the bug moves each item (relative L2, float32): M's own output, or the model's output when that
    moves less (a LayerNorm after M removes a gain on some frames: the item's output is then right)."""
    ref = case.reference()
    bad = ARCHS[case.arch](case.seed).model
    late_frames(bad, case.site, STRENGTH[case.port], case.bite_frame())
    out = {}
    for name, inputs in case.items().items():
        at_site = relative_change(_site_output(ref, case.site, inputs), _site_output(bad, case.site, inputs))
        with torch.no_grad():
            at_output = relative_change(_floats(ref(*inputs)), _floats(bad(*inputs)))
        out[name] = min(at_site, at_output)
    return out


_SWEEP_FILE = '''"""A sweep file written by bench/accuracy/sweep.py for one case."""
import sys
sys.path.insert(0, {root!r})
from bench.accuracy.sweep import SweepCase
from tensorprobe.sweep import Sweep

CASE = SweepCase.from_id({case_id!r})


def build():
    return Sweep(CASE.reference(), CASE.items())


def candidate():
    return CASE.candidate()
'''


def judge_sweep(case: SweepCase, workdir: str | Path | None = None) -> dict[str, Any]:
    """Run `tensorprobe.sweep` on the case's corpus and score its items (outcome fields as `run.judge`'s, and
    `items_planted`, `items_flagged`, `items_wrong`)."""
    import tensorprobe as tp

    effects = item_effects(case) if case.site is not None else {n: 0.0 for n in case.items()}
    least = Case(case.arch, case.port, "module-full", case.bug, case.site, case.seed).min_effect   # as for `diff`
    planted = {n for n, e in effects.items() if e >= least}
    clean = {n for n, e in effects.items() if e == 0.0}
    with tempfile.TemporaryDirectory(dir=workdir, prefix="tp-acc-sweep-") as tmp:
        target = Path(tmp) / "sweep_case.py"
        target.write_text(_SWEEP_FILE.format(root=str(ROOT), case_id=case.id))
        torch.manual_seed(0)
        summary = tp.sweep(f"{target}:build", Path(tmp) / "results", cand=f"{target}:candidate", workers=1)
        records = [json.loads(line) for line in (Path(tmp) / "results" / "items.jsonl").read_text().splitlines()]
    by_item = {r["item"]: r for r in records}
    flagged = {n for n, r in by_item.items() if r.get("finding")}
    wrong_place = sorted(n for n in planted & flagged if not _within(by_item[n].get("first_divergence"), case.site))
    out: dict[str, Any] = {
        "verdict": f"{len(flagged)} of {len(by_item)} items with a finding", "cause": None,
        "first_divergence": sorted({str(by_item[n].get("first_divergence")) for n in flagged}) or None,
        "items_planted": sorted(planted), "items_flagged": sorted(flagged),
        "summary": f"findings on {sorted(flagged)}; planted {sorted(planted)}; clean {sorted(clean)}; "
                   f"{summary.findings} finding(s)",
    }
    false_items = sorted(flagged & clean)
    if case.site is None:
        return {**out, "false_alarm": bool(false_items), "lossy": False, "items_wrong": false_items}
    if not planted:
        return {**out, "effect": max(effects.values()), "void": True}
    exact = flagged & (planted | clean) == planted
    localized = exact and not wrong_place
    causes = {by_item[n].get("cause") for n in planted & flagged}
    out["cause"] = ",".join(sorted(str(c) for c in causes))
    return {**out, "effect": min(effects[n] for n in planted), "detected": planted <= flagged,
            "localized": localized, "enclosing": False, "cause_right": localized and causes == {"own"},
            "items_wrong": sorted((planted - flagged) | set(false_items) | set(wrong_place))}


def _within(record: str | None, site: str | None) -> bool:
    if not record or site is None:
        return False
    module = record.split("/", 1)[0].split(":", 1)[0].split("@", 1)[0]
    return module == site or module.startswith(site + ".")


def generate_sweep(count: int, seed: int = 0, ports: tuple[str, ...] = SWEEP_PORTS,
                   faithful_share: float = 0.3) -> list[SweepCase]:
    """`count` sweep cases over architecture families × ports, faithful twins and a bug at a site drawn from
    those of the `diff` cases; the same arguments give the same cases."""
    rng = random.Random(seed)
    by_family: dict[str, list[str]] = {}
    for arch in SWEEP_ARCHS:
        by_family.setdefault(family(arch), []).append(arch)
    cells = [(f, p) for f in by_family for p in ports]
    per_cell = -(-count // len(cells))
    cases: dict[str, SweepCase] = {}
    for index, (fam, port) in enumerate(cells):
        # (one case per cell: every third cell's is a faithful twin)
        n_faithful = max(1 if per_cell >= 2 or index % 3 == 0 else 0, round(per_cell * faithful_share))
        for k in range(per_cell):
            arch = rng.choice(by_family[fam])
            sites = sorted(s for s, bugs in ARCHS[arch](0).sites.items() if "late_frames" in bugs)
            case_seed = rng.randrange(10_000)
            site = None if k < n_faithful or not sites else rng.choice(sites)
            case = SweepCase(arch, port, site, case_seed)
            cases[case.id] = case
    out = list(cases.values())
    rng.shuffle(out)
    return out
