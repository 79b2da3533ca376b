"""Truth-known cases for `tensorprobe nan`: where NaN or Inf is born, and why, or nothing when the model is fine.

A case is an architecture of `archs.py` run in float32 or float16 (`model.half()`), with one of:

- a planted source of NaN/Inf in one module: the module's output passed through `log` (NaN where it is
  negative), `sqrt` (likewise), a division by a zero divisor (0/0 and x/0), `exp` of 200x it, or a gain of
  7e4 (overflows; the gain's in float16 only);
- a deliberate infinity the model handles, which must not be an alarm: a softmax over a causal-style mask of
  -inf (a causal attention's scores, finite after it);
- nothing (faithful: any finding is a false alarm).

The tool runs as a user runs `tensorprobe nan` (`tensorprobe.find_first_nonfinite`). A planted case is *localized*
when the op it names is in the planted module, and its *cause* is right when the diagnosis names the planted
mechanism. A planted source that makes no NaN/Inf on these inputs (an exp whose input stays small) is void. Cases
are named `nan/ARCH/DTYPE/TRUTH/sSEED`, TRUTH being `faithful`, `BUG@SITE` or `handled:KIND@SITE`.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

import torch

from .archs import ARCHS, Built
from .cases import family
from .run import cast_floats

NAN_DTYPES = {"fp32": torch.float32, "fp16": torch.float16}


def _masked_softmax(y: torch.Tensor) -> torch.Tensor:
    """A causal-style mask of -inf over the last dimension's upper half, then softmax: finite after it."""
    cut = torch.arange(y.shape[-1], device=y.device) >= (y.shape[-1] + 1) // 2
    return y + torch.softmax(y.masked_fill(cut, float("-inf")), dim=-1)


# planted sources: (how the module's output is changed, words one of which the diagnosis must name)
NAN_BUGS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], tuple[str, ...]]] = {
    "log_negative": (torch.log, ("log",)),
    "sqrt_negative": (torch.sqrt, ("sqrt",)),
    "zero_division": (lambda y: y / (y - y), ("division by zero", "divide", "divisor")),
    "exp_overflow": (lambda y: torch.exp(200 * y), ("overflow",)),
    # past float16's largest value (65504) where |y| > 1: void in float32
    "gain_overflow": (lambda y: y * 7e4, ("overflow",)),
}
HANDLED: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"masked_softmax": _masked_softmax}
# an architecture's sites whose output is one tensor (a recurrent layer returns a tuple)
_SKIP_ARCHS = ("dictio", "noisy")


@dataclass(frozen=True)
class NanCase:
    arch: str
    dtype: str
    truth: str        # "faithful", "BUG@SITE" or "handled:KIND@SITE"
    seed: int

    @property
    def id(self) -> str:
        return f"nan/{self.arch}/{self.dtype}/{self.truth}/s{self.seed}"

    @classmethod
    def from_id(cls, case_id: str) -> "NanCase":
        tool, arch, dtype, truth, seed = case_id.split("/")
        if tool != "nan" or arch not in ARCHS or dtype not in NAN_DTYPES or not seed.startswith("s"):
            raise ValueError(f"not a nan case id: {case_id!r} (nan/arch/dtype/truth/sSEED)")
        kind = truth.split("@", 1)[0].removeprefix("handled:")
        if truth != "faithful" and kind not in NAN_BUGS and kind not in HANDLED:
            raise ValueError(f"unknown truth {truth!r} in {case_id!r}")
        return cls(arch, dtype, truth, int(seed[1:]))

    @property
    def bug(self) -> str | None:
        """The planted source's name; None for a faithful or handled case (no finding is right)."""
        kind = self.truth.split("@", 1)[0]
        return kind if kind in NAN_BUGS else None

    @property
    def site(self) -> str | None:
        return self.truth.split("@", 1)[1] if "@" in self.truth else None

    @property
    def cell(self) -> tuple[str, str, str]:
        return family(self.arch), f"nan-{self.dtype}", "live"


def _tensor_sites(built: Built) -> list[str]:
    """The planting sites whose module returns one tensor."""
    seen: dict[str, bool] = {}
    hooks = [built.model.get_submodule(s).register_forward_hook(
        lambda m, a, out, s=s: seen.__setitem__(s, isinstance(out, torch.Tensor))) for s in built.sites]
    try:
        with torch.no_grad():
            built.model(*built.inputs)
    finally:
        for h in hooks:
            h.remove()
    return [s for s in built.sites if seen.get(s)]


def _plant(model: torch.nn.Module, site: str, change: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """`site`'s forward replaced by one that applies `change` to its output, inside the module's call."""
    m = model.get_submodule(site)
    forward = m.forward
    m.forward = lambda *a, **k: change(forward(*a, **k))


def build(case: NanCase) -> Built:
    """The case's model (planted where it says) and inputs, in its dtype."""
    built = ARCHS[case.arch](case.seed)
    if case.site is not None:
        kind = case.truth.split("@", 1)[0].removeprefix("handled:")
        _plant(built.model, case.site, NAN_BUGS[kind][0] if kind in NAN_BUGS else HANDLED[kind])
    dtype = NAN_DTYPES[case.dtype]
    return Built(built.model.to(dtype), cast_floats(built.inputs, dtype), built.sites)


def _site_nonfinite(built: Built, site: str) -> bool:
    """Does the planted module's output hold NaN/Inf on these inputs (else the case has no truth to find)?"""
    found: list[bool] = []
    h = built.model.get_submodule(site).register_forward_hook(
        lambda m, a, out: found.append(bool((~torch.isfinite(out)).any())))
    try:
        with torch.no_grad():
            built.model(*built.inputs)
    finally:
        h.remove()
    return any(found)


def _output_nonfinite(built: Built) -> bool:
    with torch.no_grad():
        out = built.model(*built.inputs)
    values = out.values() if isinstance(out, dict) else out if isinstance(out, (tuple, list)) else (out,)
    return any(isinstance(v, torch.Tensor) and bool((~torch.isfinite(v)).any()) for v in values)


def judge_nan(case: NanCase) -> dict[str, Any]:
    """Run `find_first_nonfinite` on the case's model and score it (outcome fields as `run.judge`'s)."""
    import tensorprobe as tp

    built = build(case)
    if case.bug is not None and not _site_nonfinite(built, case.site):
        return {"void": True}
    if case.bug is None and _output_nonfinite(built):
        return {"void": True}     # the model itself overflows in this dtype: a finding would be right
    with torch.no_grad():
        origin = tp.find_first_nonfinite(built.model, *built.inputs)
    words = " ".join(origin.diagnosis or ()).lower()
    out: dict[str, Any] = {"verdict": "found" if origin.found else "none", "first_divergence": origin.op,
                           "cause": origin.module, "summary": (origin.diagnosis or ("",))[0]}
    if case.bug is None:
        out["false_alarm"] = bool(origin.found)
        out["lossy"] = False
        return out
    module = origin.module or ""
    out["detected"] = bool(origin.found)
    out["localized"] = out["detected"] and (module == case.site or module.startswith(case.site + "."))
    out["enclosing"] = False
    out["cause_right"] = out["localized"] and any(w in words for w in NAN_BUGS[case.bug][1])
    return out


def generate_nan(count: int, seed: int = 0, dtypes: tuple[str, ...] = tuple(NAN_DTYPES)) -> list[NanCase]:
    """`count` nan cases spread over architecture families × dtypes: a quarter faithful, a quarter handled
    infinities, the rest planted sources; the same arguments give the same cases."""
    rng = random.Random(seed)
    by_family: dict[str, list[str]] = {}
    for arch in ARCHS:
        if arch not in _SKIP_ARCHS:
            by_family.setdefault(family(arch), []).append(arch)
    sites = {a: _tensor_sites(ARCHS[a](0)) for fam in by_family.values() for a in fam}
    cells = [(f, d) for f in by_family for d in dtypes]
    per_cell = -(-count // len(cells))
    cases: dict[str, NanCase] = {}
    for fam, dtype in cells:
        for k in range(per_cell):
            arch = rng.choice(by_family[fam])
            site = rng.choice(sites[arch])
            if k % 4 == 0:
                truth = "faithful"
            elif k % 4 == 1:
                truth = f"handled:{rng.choice(sorted(HANDLED))}@{site}"
            else:
                truth = f"{rng.choice(sorted(NAN_BUGS))}@{site}"
            case = NanCase(arch, dtype, truth, rng.randrange(10_000))
            cases[case.id] = case
    out = list(cases.values())
    rng.shuffle(out)
    return out
