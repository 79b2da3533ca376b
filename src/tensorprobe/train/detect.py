"""What goes wrong in a training run, found from each step's numbers against the run's own history.

Each detector sees one step at a time and keeps a bounded window of history, so a run of a million steps
costs no more memory than one of a hundred. A detector reports an episode once, at its first step, and again
only after the condition has cleared.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from statistics import median
from typing import Any

MIN_HISTORY = 10           # steps of a layer's own history before it can be called exploding or vanishing
EXPLODE_DECADES = 2.0      # a gradient norm 100x its recent median
VANISH_DECADES = 3.0       # a gradient norm 1/1000 of its recent median
COLLAPSE_RATIO = 1e-2      # an output's std below 1/100 of the largest it had in the run
PLATEAU_REL = 1e-6         # a loss that moves less than this (relative) over a whole window
FROZEN_RATIO = 1e-12       # |Δw|/|w| below this: the weights did not move


def finding(step: int, kind: str, severity: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"step": step, "kind": kind, "severity": severity, "message": message, **extra}


def module_of(param: str) -> str:
    return param.rsplit(".", 1)[0] if "." in param else param


@dataclass
class Episodes:
    """Report a condition at the first step it holds, not at every step until it clears."""

    active: set[str] = field(default_factory=set)

    def start(self, key: str, holds: bool) -> bool:
        if not holds:
            self.active.discard(key)
            return False
        if key in self.active:
            return False
        self.active.add(key)
        return True


class Jumps:
    """Per parameter, a figure (gradient norm, update ratio) that jumps far above or below the parameter's own
    recent history (median of its log over a window): reported per layer, the largest jump first."""

    def __init__(self, window: int, what: str, up: str, down: str | None):
        self.window, self.what, self.up, self.down = window, what, up, down
        self.history: dict[str, deque[float]] = {}
        self.episodes = Episodes()

    def update(self, step: int, values: dict[str, float]) -> list[dict[str, Any]]:
        jumps: dict[str, list[tuple[str, float, float]]] = {}
        for name, value in values.items():
            if not math.isfinite(value):
                continue
            hist = self.history.setdefault(name, deque(maxlen=self.window))
            if len(hist) >= MIN_HISTORY:
                ref = median(hist)
                now = math.log10(value) if value > 0 else -math.inf
                if self.episodes.start(f"up:{name}", now - ref > EXPLODE_DECADES):
                    jumps.setdefault(self.up, []).append((name, value, 10 ** ref))
                if self.down and self.episodes.start(f"down:{name}", ref - now > VANISH_DECADES):
                    jumps.setdefault(self.down, []).append((name, value, 10 ** ref))
            if value > 0:
                hist.append(math.log10(value))
        out = []
        for kind, group in jumps.items():
            words = "explodes" if kind == self.up else "vanishes"
            for layer, members in _by_layer(group).items():
                name, value, ref = max(members, key=_decades)
                out.append(finding(step, kind, "warning",
                                   f"{self.what} of {layer} {words}: {value:.3g} against {ref:.3g} over its last "
                                   f"{self.window} steps ({name})", layer=layer,
                                   params=[m[0] for m in members], value=value, reference=ref,
                                   decades=round(_decades(max(members, key=_decades)), 2)))
        return sorted(out, key=lambda f: -f["decades"])


def _decades(m: tuple[str, float, float]) -> float:
    return abs(math.log10(max(m[1], 1e-300) / m[2]))


class GradientHistory:
    """Per parameter: non-finite gradients, and norms that explode or vanish against their own history."""

    def __init__(self, window: int):
        self.jumps = Jumps(window, "gradient norm", "exploding_gradient", "vanishing_gradient")
        self.nonfinite = Episodes()     # steps of NaN gradients in a row are one finding, at the first

    @property
    def episodes(self) -> Episodes:
        return self.jumps.episodes

    def update(self, step: int, norms: dict[str, float], nonfinite: dict[str, int]) -> list[dict[str, Any]]:
        out = []
        if self.nonfinite.start("any", bool(nonfinite)):
            names = sorted(nonfinite)
            layers = sorted({module_of(n) for n in names})
            worst = max(names, key=lambda n: nonfinite[n])
            out.append(finding(step, "nonfinite_gradient", "error",
                               f"non-finite gradients in {_count(len(names), 'parameter')} of "
                               f"{_count(len(layers), 'layer')} (most: {worst}, {nonfinite[worst]} values); "
                               "later steps in a row with non-finite gradients are not reported again",
                               layer=module_of(worst), layers=layers, params=names))
        return out + self.jumps.update(step, {n: v for n, v in norms.items() if n not in nonfinite})


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _by_layer(items: list[Any]) -> dict[str, list[Any]]:
    """Group parameter names, or tuples that start with one, by the module (layer) they belong to."""
    out: dict[str, list[Any]] = {}
    for item in items:
        out.setdefault(module_of(item if isinstance(item, str) else item[0]), []).append(item)
    return out


class LossPlateau:
    """A loss (or loss term) that stops moving: max − min over the window below PLATEAU_REL of its size."""

    def __init__(self, window: int):
        self.window = window
        self.history: dict[str, deque[float]] = {}
        self.episodes = Episodes()

    def update(self, step: int, losses: dict[str, float]) -> list[dict[str, Any]]:
        out = []
        for name, value in losses.items():
            if not math.isfinite(value):
                continue
            hist = self.history.setdefault(name, deque(maxlen=self.window))
            hist.append(value)
            if len(hist) < self.window:
                continue
            span = max(hist) - min(hist)
            stuck = span <= PLATEAU_REL * max(abs(sum(hist) / len(hist)), 1e-12)
            if self.episodes.start(name, stuck):
                out.append(finding(step, "loss_plateau", "warning",
                                   f"{name} is stuck at {value:.6g}: it moved {span:.3g} over the last "
                                   f"{self.window} steps", layer=name, value=value))
        return out


class OutputCollapse:
    """A watched module output whose spread across batch and time falls to ~0: the model outputs a constant
    (seed 002's "Mel std: 0.0001"). The reference is the largest std the output had in this run (a constant
    output from the first step on is not a collapse this can see)."""

    def __init__(self):
        self.largest: dict[str, float] = {}
        self.seen: dict[str, int] = {}
        self.episodes = Episodes()

    def update(self, step: int, stds: dict[str, float]) -> list[dict[str, Any]]:
        out = []
        for name, std in stds.items():
            if not math.isfinite(std):
                continue
            ref = self.largest.get(name, 0.0)
            self.seen[name] = self.seen.get(name, 0) + 1
            collapsed = self.seen[name] > MIN_HISTORY and ref > 0 and std < COLLAPSE_RATIO * ref
            if self.episodes.start(name, collapsed):
                out.append(finding(step, "output_collapse", "error",
                                   f"{name} collapsed to a constant: its std across batch and time is {std:.3g}, "
                                   f"under {COLLAPSE_RATIO:.0%} of the {ref:.3g} it reached earlier in the run",
                                   layer=name, value=std, reference=ref))
            self.largest[name] = max(ref, std)
        return out


class FrozenWeights:
    """Parameters whose optimizer steps stop changing them while their gradient is not zero."""

    def __init__(self, patience: int):
        self.patience = patience
        self.still: dict[str, int] = {}
        self.episodes = Episodes()

    def update(self, step: int, ratios: dict[str, float], norms: dict[str, float]) -> list[dict[str, Any]]:
        frozen = []
        for name, ratio in ratios.items():
            moving = not (ratio <= FROZEN_RATIO and norms.get(name, 0.0) > 0)
            self.still[name] = 0 if moving else self.still.get(name, 0) + 1
            if self.episodes.start(name, self.still[name] >= self.patience):
                frozen.append(name)
        out = []
        for layer, names in _by_layer(frozen).items():
            out.append(finding(step, "frozen_weights", "warning",
                               f"the weights of {layer} stopped moving: {self.patience} optimizer steps left "
                               f"{', '.join(names)} unchanged although their gradient is not zero (a learning rate "
                               "of 0, a parameter missing from the optimizer's groups?)", layer=layer, params=names))
        return out


class SkippedSteps:
    """Optimizer steps that did not happen (a GradScaler skips the step when a gradient is inf/NaN)."""

    def __init__(self, window: int):
        self.recent: deque[bool] = deque(maxlen=window)
        self.episodes = Episodes()
        self.total = 0

    def update(self, step: int, skipped: bool) -> list[dict[str, Any]]:
        self.recent.append(skipped)
        self.total += skipped
        share = sum(self.recent) / len(self.recent)
        many = len(self.recent) >= MIN_HISTORY and share >= 0.1
        if self.episodes.start("skips", many):
            return [finding(step, "skipped_steps", "warning",
                            f"{sum(self.recent)} of the last {len(self.recent)} optimizer steps were skipped "
                            f"({self.total} in the run): the gradients keep overflowing or going NaN; the loss "
                            "curve does not show it", layer="optimizer")]
        return []
