"""What a run directory says: its findings grouped into incidents, and per-layer series decimated to a bounded
number of points (for a report of a million-step run without reading it all into memory).

An incident is a finding and what follows from it: an lr blow-up at step 150 is one exploding update, then
exploding and vanishing gradients on every layer and their re-reports at steps 158, 165 and 190. The first
finding of a run comes first; a finding joins the latest open incident when it comes within the monitor's
window of that incident's last finding and the incident's first finding disrupts the whole model (an
exploding update or gradient, a non-finite gradient, skipped steps), or when it re-reports the incident's
own kind on its own layer. Each finding carries its likely cause and the fix to try (`ADVICE`)."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .detect import module_of
from .run import STEPS, as_float, count_lines, read_findings, read_meta, read_rows

MAX_POINTS = 400     # columns of the heatmaps and points of the curves
DEFAULT_GAP = 50     # steps between two findings of one incident (the monitor's window, when the run names none)

# kinds after which anything may follow: the whole model's weights or gradients are disturbed
DISRUPTIVE = frozenset({"exploding_update", "exploding_gradient", "nonfinite_gradient", "skipped_steps"})
# kinds that never follow from another finding: there from the first step, or the scaler's normal life
NEVER_FOLLOWS = frozenset({"dead_gradient", "scaler_calibration", "scaler_backoff"})

# kind -> (likely cause, fix to try)
ADVICE: dict[str, tuple[str, str]] = {
    "exploding_update": (
        "a learning rate too high for this layer: a mistyped parameter-group lr, a warmup that ends too high, "
        "a schedule that jumps",
        "lower that group's lr (compare it with the other groups'), add warmup, clip gradients "
        "(torch.nn.utils.clip_grad_norm_)"),
    "exploding_gradient": (
        "the gradient of this layer is far above its own history or the other layers': too high a learning "
        "rate, an outlier batch, an unnormalised target or loss term",
        "clip gradients (torch.nn.utils.clip_grad_norm_, after scaler.unscale_ with a GradScaler), lower the "
        "lr, check the batch and the target normalisation"),
    "nonfinite_gradient": (
        "an op whose backward overflows or divides by zero (sqrt, log or division at 0, exp of a large value), "
        "or weights already blown up by an earlier update",
        "name the op with Monitor(diagnose=...) or `tensorprobe nan --backward`; add an epsilon or a clamp "
        "there, clip gradients; in fp16 use a GradScaler"),
    "vanishing_gradient": (
        "saturated activations or dead ReLUs (often after weights blew up), or a learning rate decayed to ~0",
        "fix what came before it first; else lower the lr, check the normalisation and the init"),
    "skipped_steps": (
        "optimizer steps skipped because gradients keep overflowing: more than a GradScaler's normal back-offs",
        "lower the lr, clip gradients after scaler.unscale_, run the overflowing op in fp32 or bf16"),
    "loss_plateau": (
        "the loss stopped moving: an lr at or near 0, a frozen model, a data loader that repeats one batch",
        "check the lr schedule, which parameters the optimizer holds, the data pipeline"),
    "loss_not_decreasing": (
        "the loss's trend stopped improving far from its best: too high or too low an lr, inputs not matched "
        "with their targets (shuffled labels), a schedule that decayed too early",
        "check the input-target pairing and the lr schedule; try a lower lr from the last good checkpoint"),
    "output_collapse": (
        "the model outputs a near-constant: targets normalised so that their mean is the cheapest answer, a "
        "loss that rewards the mean, a dead decoder layer",
        "check the target normalisation (per-channel mean and std) and the loss; look at the decoder's "
        "activations"),
    "loss_at_mean": (
        "the loss sits at the cost of predicting the targets' mean: the model has learnt nothing input-specific",
        "check that inputs reach the output (a detached branch, masked inputs) and the target normalisation"),
    "frozen_weights": (
        "optimizer steps leave these weights unchanged although their gradient is not zero: a parameter "
        "missing from the optimizer's groups, a group lr of 0",
        "add the parameter to the optimizer, or set its group's lr"),
    "dead_gradient": (
        "this layer's gradient is exactly zero: dead ReLUs, a detached branch (.detach(), no_grad, .data), an "
        "output the loss does not use",
        "trace the graph from the loss to this layer; a leaky activation or another init for dead ReLUs"),
    "scaler_calibration": ("a GradScaler finding its scale: the first skipped steps are normal", "nothing"),
    "scaler_backoff": ("a GradScaler backing off after an occasional overflow: normal", "nothing"),
}


def advise(f: dict[str, Any]) -> dict[str, Any]:
    """The finding with its likely `cause` and `fix` (kept where the monitor already wrote them)."""
    cause, fix = ADVICE.get(f.get("kind", ""), ("", ""))
    return {**f, "cause": f.get("cause") or cause, "fix": f.get("fix") or fix}


@dataclass(frozen=True)
class Incident:
    """A finding and the findings that follow from it."""

    number: int
    first: dict[str, Any]
    following: tuple[dict[str, Any], ...]

    @property
    def start(self) -> int:
        return int(self.first["step"])

    @property
    def end(self) -> int:
        return max([self.start] + [int(f["step"]) for f in self.following])

    @property
    def severity(self) -> str:
        order = {"error": 0, "warning": 1, "info": 2}
        return min((f.get("severity", "info") for f in (self.first, *self.following)),
                   key=lambda v: order.get(v, 3))

    @property
    def layers(self) -> list[str]:
        return sorted({str(f.get("layer", "")) for f in (self.first, *self.following)} - {""})

    def follows(self) -> str:
        """'then 16 findings up to step 190: exploding_gradient on 6 layers, vanishing_gradient on 6 layers'"""
        if not self.following:
            return ""
        kinds: dict[str, set[str]] = {}
        for f in self.following:
            kinds.setdefault(f["kind"], set()).add(str(f.get("layer", "")))
        parts = [f"{k} on {len(v)} layer{'' if len(v) == 1 else 's'}" for k, v in kinds.items()]
        n = len(self.following)
        return f"then {n} finding{'' if n == 1 else 's'} up to step {self.end} follow from it: {', '.join(parts)}"

    def words(self) -> str:
        f = self.first
        text = f"step {f['step']}, {f.get('layer', '')}: {f['message']}"
        if f.get("cause"):
            text += f". Likely cause: {f['cause']}. Fix: {f['fix']}"
        follows = self.follows()
        return f"{text}. {follows[0].upper()}{follows[1:]}." if follows else f"{text}."

    def to_dict(self) -> dict[str, Any]:
        return {"number": self.number, "steps": [self.start, self.end], "severity": self.severity,
                "kind": self.first["kind"], "layer": self.first.get("layer"), "layers": self.layers,
                "finding": self.first, "cause": self.first.get("cause"), "fix": self.first.get("fix"),
                "following": [{k: f.get(k) for k in ("step", "kind", "layer", "severity", "message")}
                              for f in self.following],
                "words": self.words()}


def group_incidents(findings: list[dict[str, Any]], gap: int = DEFAULT_GAP) -> list[Incident]:
    """Findings (in step order) grouped into incidents: see the module's docstring for the rule."""
    groups: list[list[dict[str, Any]]] = []
    for f in sorted(findings, key=lambda f: int(f.get("step", 0))):    # stable: same-step order kept
        home = None if f.get("kind") in NEVER_FOLLOWS else _home(groups, f, gap)
        if home is None:
            groups.append([f])
        else:
            home.append(f)
    return [Incident(i + 1, g[0], tuple(g[1:])) for i, g in enumerate(groups)]


def _home(groups: list[list[dict[str, Any]]], f: dict[str, Any], gap: int) -> list[dict[str, Any]] | None:
    step = int(f.get("step", 0))
    for g in reversed(groups):
        if step - max(int(x.get("step", 0)) for x in g) > gap:
            continue
        root = g[0]
        if root.get("kind") in NEVER_FOLLOWS:
            continue
        if root.get("kind") in DISRUPTIVE:
            return g
        if f.get("kind") == root.get("kind") and f.get("layer") == root.get("layer"):
            return g
    return None


@dataclass
class RunSummary:
    """Findings of a run, and its per-step series (at most MAX_POINTS steps, evenly spaced)."""

    run: str
    model: str
    steps: int
    findings: list[dict[str, Any]]
    step_index: list[int] = field(default_factory=list)
    losses: dict[str, list[float]] = field(default_factory=dict)
    grad_norm: dict[str, list[float]] = field(default_factory=dict)      # per layer (module): the largest norm
    update_ratio: dict[str, list[float]] = field(default_factory=dict)
    outputs: dict[str, list[float]] = field(default_factory=dict)        # watched modules' std
    incidents: list[Incident] = field(default_factory=list)

    @property
    def errors(self) -> list[dict[str, Any]]:
        return [f for f in self.findings if f.get("severity") == "error"]

    @property
    def finding(self) -> bool:
        return any(f.get("severity") in ("error", "warning") for f in self.findings)

    def headline(self) -> str:
        if not self.findings:
            return f"{self.steps} steps of {self.model}: no finding."
        n, k = len(self.findings), len(self.incidents)
        first = self.incidents[0] if self.incidents else Incident(1, self.findings[0], ())
        return (f"{self.steps} steps of {self.model}: {k} incident{'' if k == 1 else 's'} "
                f"({n} finding{'' if n == 1 else 's'}); first at {first.words()}")

    def to_dict(self) -> dict[str, Any]:
        return {"run": self.run, "model": self.model, "steps": self.steps, "headline": self.headline(),
                "finding": self.finding, "incidents": [i.to_dict() for i in self.incidents],
                "findings": self.findings}


def summarize(run: str | os.PathLike) -> RunSummary:
    """Read RUN (streaming) into a `RunSummary`.

    >>> s = summarize("runs/a")                 # doctest: +SKIP
    >>> [(f["step"], f["kind"], f["layer"]) for f in s.findings]         # doctest: +SKIP
    """
    meta = read_meta(run)
    total = count_lines(Path(run) / STEPS)     # the stride only: no need to parse every row twice
    stride = max(1, math.ceil(total / MAX_POINTS))
    findings = [advise(f) for f in read_findings(run)]
    s = RunSummary(str(run), meta.get("model", "model"), 0, findings,
                   incidents=group_incidents(findings, int(meta.get("window") or DEFAULT_GAP)))
    for i, row in enumerate(read_rows(run)):
        s.steps = max(s.steps, int(row.get("step", -1)) + 1)
        if i % stride:
            continue
        s.step_index.append(int(row.get("step", i)))
        col = len(s.step_index) - 1
        layers: dict[str, float] = {}
        ratios: dict[str, float] = {}
        for key, value in row.items():
            v = as_float(value)
            if v is None:
                continue
            kind, _, name = key.partition("/")
            if key == "loss" or kind == "loss":
                _put(s.losses, key, col, v)
            elif kind == "grad_norm":
                layer = module_of(name, s.model)
                layers[layer] = v if not math.isfinite(v) else max(layers.get(layer, 0.0), v)
            elif kind == "update_ratio":
                layer = module_of(name, s.model)
                ratios[layer] = max(ratios.get(layer, 0.0), v)
            elif kind == "out_std":
                _put(s.outputs, name, col, v)
        for layer, v in layers.items():
            _put(s.grad_norm, layer, col, v)
        for layer, v in ratios.items():
            _put(s.update_ratio, layer, col, v)
    return s


def _put(series: dict[str, list[float]], name: str, col: int, v: float) -> None:
    values = series.setdefault(name, [])
    values.extend([math.nan] * (col - len(values)))
    values.append(v)


def run_exists(run: str | os.PathLike) -> bool:
    return (Path(run) / "meta.json").exists()
