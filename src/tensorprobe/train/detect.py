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
from typing import Any, Callable

MIN_HISTORY = 10           # steps of a layer's own history before it can be called exploding or vanishing
EXPLODE_DECADES = 2.0      # a gradient norm 100x its recent median
VANISH_DECADES = 3.0       # a gradient norm 1/1000 of its recent median
COLLAPSE_RATIO = 1e-2      # an output's std below 1/100 of the largest it had in the run
PLATEAU_REL = 1e-6         # a loss that moves less than this (relative) over a whole window
FROZEN_RATIO = 1e-12       # |Δw|/|w| below this: the weights did not move


def finding(step: int, kind: str, severity: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"step": step, "kind": kind, "severity": severity, "message": message, **extra}


def module_of(param: str, root: str = "") -> str:
    """The layer (module) a parameter belongs to: its path; a parameter of the top-level module itself (a bare
    `nn.Linear`'s `weight`) belongs to the model, named by its class (`root`), never by the parameter.

    >>> module_of("enc.conv.weight"), module_of("weight", "Linear"), module_of("bias")
    ('enc.conv', 'Linear', '<root>')
    """
    return param.rsplit(".", 1)[0] if "." in param else (root or "<root>")


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

    root = ""     # the model's class: names the layer of the top-level module's own parameters

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
            for layer, members in _by_layer(group, self.root).items():
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
        self.root = ""
        self.jumps = Jumps(window, "gradient norm", "exploding_gradient", "vanishing_gradient")
        self.nonfinite = Episodes()     # steps of NaN gradients in a row are one finding, at the first

    @property
    def episodes(self) -> Episodes:
        return self.jumps.episodes

    def update(self, step: int, norms: dict[str, float], nonfinite: dict[str, int]) -> list[dict[str, Any]]:
        out = []
        if self.nonfinite.start("any", bool(nonfinite)):
            names = sorted(nonfinite)
            self.jumps.root = self.root
            layers = sorted({module_of(n, self.root) for n in names})
            worst = max(names, key=lambda n: nonfinite[n])
            out.append(finding(step, "nonfinite_gradient", "error",
                               f"non-finite gradients in {_count(len(names), 'parameter')} of "
                               f"{_count(len(layers), 'layer')} (most: {worst}, {nonfinite[worst]} values); "
                               "later steps in a row with non-finite gradients are not reported again",
                               layer=module_of(worst, self.root), layers=layers, params=names))
        return out + self.jumps.update(step, {n: v for n, v in norms.items() if n not in nonfinite})


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _by_layer(items: list[Any], root: str = "") -> dict[str, list[Any]]:
    """Group parameter names, or tuples that start with one, by the module (layer) they belong to."""
    out: dict[str, list[Any]] = {}
    for item in items:
        out.setdefault(module_of(item if isinstance(item, str) else item[0], root), []).append(item)
    return out


def _full_windows(history: dict[str, deque[float]], window: int, losses: dict[str, float]):
    """Append each finite loss to its window; yield (name, value, window) for the windows that are full."""
    for name, value in losses.items():
        if not math.isfinite(value):
            continue
        hist = history.setdefault(name, deque(maxlen=window))
        hist.append(value)
        if len(hist) == window:
            yield name, value, hist


class LossPlateau:
    """A loss (or loss term) that stops moving: max − min over the window below PLATEAU_REL of its size."""

    def __init__(self, window: int):
        self.window = window
        self.history: dict[str, deque[float]] = {}
        self.episodes = Episodes()

    def update(self, step: int, losses: dict[str, float]) -> list[dict[str, Any]]:
        out = []
        for name, value, hist in _full_windows(self.history, self.window, losses):
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

    root = ""

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
        for layer, names in _by_layer(frozen, self.root).items():
            out.append(finding(step, "frozen_weights", "warning",
                               f"the weights of {layer} stopped moving: {self.patience} optimizer steps left "
                               f"{', '.join(names)} unchanged although their gradient is not zero (a learning rate "
                               "of 0, a parameter missing from the optimizer's groups?)", layer=layer, params=names))
        return out


class SkippedSteps:
    """Optimizer steps that did not happen (a GradScaler skips the step when a gradient is inf/NaN).

    Without a scaler, 10% of the window skipped is a warning. With one, its calibration (the skips before the
    first step taken, while the scale comes down) and its occasional back-offs are info; an error needs skips
    beyond its normal rate (about one back-off per `growth_interval` steps)."""

    def __init__(self, window: int, scaler: Any = None):
        self.recent: deque[bool] = deque(maxlen=window)
        self.episodes = Episodes()
        self.total = 0
        self.scaler = scaler
        self.calibrating = scaler is not None
        self.calibration_skips = 0

    def normal_rate(self) -> float:
        interval = getattr(self.scaler, "get_growth_interval", lambda: 2000)()
        return 1.0 / (interval + 1)

    def in_window(self) -> int:
        return sum(self.recent)

    def update(self, step: int, skipped: bool, scale: float | None = None) -> list[dict[str, Any]]:
        if self.scaler is None:
            return self._plain(step, skipped)
        if self.calibrating:
            if skipped:
                self.calibration_skips += 1
                self.total += 1
                return []
            self.calibrating = False
            if self.calibration_skips:
                return [finding(step, "scaler_calibration", "info",
                                f"the GradScaler skipped the first {self.calibration_skips} steps while its scale "
                                f"came down to {scale:.6g}: its normal calibration, not a fault",
                                layer="optimizer", skipped=self.calibration_skips)]
            return []
        self.recent.append(skipped)
        self.total += skipped
        rate, share = self.normal_rate(), sum(self.recent) / len(self.recent)
        many = sum(self.recent) >= 3 and share > 3 * rate
        out = []
        if self.episodes.start("skips", many):
            out.append(finding(step, "skipped_steps", "error",
                               f"{sum(self.recent)} of the last {len(self.recent)} optimizer steps were skipped "
                               f"({share:.0%}); a healthy GradScaler backs off about once per growth_interval "
                               f"({rate:.2%} of steps): the gradients overflow or go NaN at every scale, so the "
                               "model stops learning while the loss curve looks calm; lower the lr, clip the "
                               "gradients, or find the op (nan --backward)", layer="optimizer", rate=share,
                               normal_rate=rate))
        elif skipped and not many:
            out.append(finding(step, "scaler_backoff", "info",
                               f"the GradScaler skipped this step and backed off its scale to {scale:.6g}: an "
                               "occasional overflow it handles", layer="optimizer"))
        return out

    def _plain(self, step: int, skipped: bool) -> list[dict[str, Any]]:
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


# ---- rules that need no history: absolute bounds and the model's other layers --------------------------------

UPDATE_BOUND = 1e-1        # |Δw|/|w| per step: healthy SGD/Adam steps are ~1e-4..1e-2
CROSS_LAYER = 100.0        # a layer ≥100x the median of the model's other layers
CROSS_LAYER_GRAD = 1000.0  # gradient RMS spreads more between layers (depth, fan-in) than update ratios do


def _median_of_others(values: dict[str, float], name: str) -> float | None:
    others = [v for n, v in values.items() if n != name and math.isfinite(v) and v > 0]
    return median(others) if len(others) >= 2 else None


class CrossLayer:
    """A figure per parameter (update ratio, gradient RMS) judged at every step, from step 0, against an
    absolute bound and against the median of the model's other layers. Only matrices and kernels (≥2-D) are
    judged: a bias or a norm gain starts at 0 or 1 by design, so its ratio says nothing about the lr."""

    root = ""

    def __init__(self, kind: str, bound: float | None, factor: float, describe: Callable[..., str]):
        self.kind, self.bound, self.factor, self.describe = kind, bound, factor, describe
        self.episodes = Episodes()

    def update(self, step: int, values: dict[str, float]) -> list[dict[str, Any]]:
        flagged = []
        for name, value in values.items():
            if not math.isfinite(value):
                continue
            ref = _median_of_others(values, name)
            high_vs_others = ref is not None and value >= self.factor * ref
            over_bound = self.bound is not None and value > self.bound
            if self.episodes.start(name, high_vs_others or over_bound):
                flagged.append((name, value, ref))
        out = []
        for layer, members in _by_layer(flagged, self.root).items():
            name, value, ref = max(members, key=lambda m: m[1])
            # far above every other layer is an error; over the absolute bound alone (a high lr for all), a warning
            severe = self.kind == "exploding_update" and ref is not None and value >= self.factor * ref
            out.append(finding(step, self.kind, "error" if severe else "warning",
                               self.describe(name, value, ref), layer=layer, params=[m[0] for m in members],
                               value=value, reference=ref))
        return out


class DeadGradients:
    """Parameters whose gradient has been exactly zero (or absent) at every step since the first: a dead ReLU
    layer, a branch detached from the loss."""

    root = ""

    def __init__(self, patience: int):
        self.patience = patience
        self.zero_since_start: dict[str, int] = {}
        self.reported = False

    def update(self, step: int, norms: dict[str, float]) -> list[dict[str, Any]]:
        for name, norm in norms.items():
            count = self.zero_since_start.get(name, 0)
            if count >= 0:
                self.zero_since_start[name] = count + 1 if norm == 0 else -1
        if self.reported or step + 1 < self.patience:
            return []
        self.reported = True
        dead = [n for n, c in self.zero_since_start.items() if c >= self.patience]
        out = []
        for layer, names in _by_layer(dead, self.root).items():
            out.append(finding(step, "dead_gradient", "warning",
                               f"{layer} gets no gradient: {', '.join(names)} had a gradient of exactly 0 (or none) "
                               f"at every step since step 0 ({self.patience} steps): a layer whose ReLU is dead on "
                               "every input, or a branch detached from the loss (.detach(), torch.no_grad, an output "
                               "the loss does not use)", layer=layer, params=names))
        return out


class LossTrend:
    """A loss whose smoothed trend (the mean of a window) has not improved for a window while it is far from
    the best it has shown: still more than half its starting level, or twice its best. Noise does not hide it
    (the window mean absorbs it); a run that converged near zero and plateaus is not flagged."""

    def __init__(self, window: int):
        self.window = window
        self.recent: dict[str, deque[float]] = {}
        self.first: dict[str, float] = {}
        self.best: dict[str, float] = {}
        self.best_at: dict[str, int] = {}
        self.episodes = Episodes()

    def update(self, step: int, losses: dict[str, float], skips: int = 0) -> list[dict[str, Any]]:
        out = []
        for name, value, hist in _full_windows(self.recent, self.window, losses):
            smooth = sum(hist) / len(hist)
            self.first.setdefault(name, smooth)
            if smooth < self.best.get(name, math.inf) * 0.99:
                self.best[name], self.best_at[name] = smooth, step
            best, first = self.best[name], self.first[name]
            stalled = step - self.best_at[name] >= self.window
            # far: little progress since the start, or fallen back well above its best (not the noise of a
            # loss that has converged near zero)
            far = smooth > 0.5 * first or (smooth > 2 * best and smooth - best > 0.1 * (first - best))
            if self.episodes.start(name, stalled and far):
                out.append(finding(step, "loss_not_decreasing",
                                   "error" if skips else "warning",
                                   f"{name} is not decreasing: its mean over the last {self.window} steps is "
                                   f"{smooth:.4g}, no better than the {best:.4g} it reached by step "
                                   f"{self.best_at[name]} (it started at {first:.4g})"
                                   + (f"; {skips} optimizer steps were skipped in that window" if skips else "")
                                   + ": check the learning rate, the targets (shuffled, misaligned?), the data",
                                   layer=name, value=smooth, reference=best))
        return out


# ---- collapse against the data ---------------------------------------------------------------------------------

COLLAPSE_VS_TARGET = 0.1   # a prediction's spread below a tenth of its target's (or of its own first steps)
EARLY_STEPS = 5            # the steps whose spread is "its own spread in the first steps"
MEAN_LOSS_TOL = 0.05       # a loss within 5% of what predicting the targets' mean costs
FROM_START_PATIENCE = 3    # a state held since step 0 needs 3x the patience: most models start near-constant
RISING = 1.25              # a prediction whose spread grew 25% since it went low is learning, not collapsed
LEARNING_BELOW = 0.97      # a loss under 97% of the mean's cost and still falling (by 1% of it in `patience` steps)
LEARNING_FALL = 0.01       # is a model learning, slowly: no collapse, no loss-at-mean while it lasts


class DataCollapse:
    """A watched prediction whose spread across batch and time (per channel) stays below a tenth of its
    target's, or of its own spread in its first steps, for `patience` steps (a constant from step 0 for three
    times as long: an initialisation that is slow to start learning is not a collapse), and a loss that stays at
    what predicting the targets' mean would cost."""

    def __init__(self, patience: int):
        self.patience = patience
        self.early: dict[str, list[float]] = {}
        self.low_for: dict[str, int] = {}
        self.low_start: dict[str, float] = {}
        self.at_mean_for = 0
        self.updates = 0    # how many steps were judged: a state held for all of them was held since the start
        self.ratios: list[float] = []   # loss / cost of predicting the targets' global mean, per judged step
        self.episodes = Episodes()

    def update(self, step: int, stats: dict[str, dict[str, float]], loss: float | None) -> list[dict[str, Any]]:
        out = []
        self.updates += 1
        learning = self._learning(stats, loss)
        for name, s in stats.items():
            spread, target = s["spread"], s.get("target_spread")
            early = self.early.setdefault(name, [])
            own = median(early) if len(early) >= EARLY_STEPS else None
            if len(early) < EARLY_STEPS:
                early.append(spread)
            if target is not None and target > 0:
                ref, against = target, "target"
            elif own is not None and own > 0:
                ref, against = own, "its own in the first steps"
            else:
                continue
            low = spread < COLLAPSE_VS_TARGET * ref
            if low and self.low_for.get(name, 0) == 0:
                self.low_start[name] = spread
            self.low_for[name] = self.low_for.get(name, 0) + 1 if low else 0
            # a prediction still growing its spread is learning, not collapsed; one that has been low since
            # step 0 may just be an initialisation that has not started to learn (an LSTM under SGD takes ~20 steps)
            rising = spread > RISING * self.low_start.get(name, spread) + 1e-12
            from_start = self.low_for[name] == self.updates
            patience = self.patience * (FROM_START_PATIENCE if from_start else 1)
            collapsed = self.low_for[name] >= patience and not rising and not learning
            # one collapse is one finding: the episode ends when the spread recovers, not when the loss's trend
            # flickers (a model fed silence learns the targets' positional mean in spells, its output still flat)
            if not low:
                self.episodes.start(name, False)
            if collapsed and self.episodes.start(name, True):
                since = step - self.low_for[name] + 1
                out.append(finding(step, "output_collapse", "error",
                                   f"{name}: predicted std {spread:.3g} against {against} std {ref:.3g} "
                                   f"(since step {since}): the model outputs a near-constant; check the target "
                                   "normalisation and the loss (a model that predicts the mean pays only the "
                                   "targets' variance)", layer=name, value=spread, reference=ref, since=since))
        out += self._loss_at_mean(step, stats, loss, learning)
        return out

    def _learning(self, stats: dict[str, dict[str, float]], loss: float | None) -> bool:
        """Whether the loss is below what predicting the targets' global mean costs, and still falling: a model
        slow to start (an LSTM under SGD beats the mean by 1% a step after ~15 steps at it) is not collapsed,
        and a falling loss that crosses a per-channel mean's cost on its way down has not 'stayed' there."""
        globals_ = [s["mean_baselines"][0] for s in stats.values() if s.get("mean_baselines")]
        if loss is None or not math.isfinite(loss) or not globals_ or max(globals_) <= 0:
            return False
        self.ratios.append(loss / max(globals_))
        recent, before = self.ratios[-self.patience:], self.ratios[-2 * self.patience:-self.patience]
        return (len(before) == self.patience and median(recent) < LEARNING_BELOW
                and median(before) - median(recent) > LEARNING_FALL)

    def _falling_through(self) -> bool:
        """Whether the loss is passing through the mean's cost on its way down: over the last `patience` steps
        its trend (least squares, against the global mean's cost) fell by more than the band's half-width. A
        model that starts worse than the mean and learns crosses the ±5% band in a dozen steps (a GRU under SGD
        from 1.05x to 0.91x of it); a loss that stays there only wobbles about it."""
        r = self.ratios[-self.patience:]
        n = len(r)
        if n < max(3, self.patience):
            return False
        xm, ym = (n - 1) / 2, sum(r) / n
        slope = sum((i - xm) * (y - ym) for i, y in enumerate(r)) / sum((i - xm) ** 2 for i in range(n))
        return -slope * (n - 1) > MEAN_LOSS_TOL

    def _loss_at_mean(self, step: int, stats: dict[str, dict[str, float]], loss: float | None,
                      learning: bool = False) -> list[dict[str, Any]]:
        baselines = [b for s in stats.values() for b in s.get("mean_baselines", ())]
        if loss is None or not math.isfinite(loss) or not baselines:
            return []
        near = min(baselines, key=lambda b: abs(loss - b))
        at_mean = near > 0 and abs(loss - near) <= MEAN_LOSS_TOL * near
        self.at_mean_for = self.at_mean_for + 1 if at_mean else 0
        from_start = self.at_mean_for == self.updates
        patience = self.patience * (FROM_START_PATIENCE if from_start else 1)
        held = self.at_mean_for >= patience and not learning and not self._falling_through()
        if not at_mean:      # as for a collapse: the episode ends when the loss leaves the mean's cost
            self.episodes.start("loss@mean", False)
        if held and self.episodes.start("loss@mean", True):
            return [finding(step, "loss_at_mean", "error",
                            f"the loss has stayed at {loss:.4g} for {self.at_mean_for} steps, the cost of "
                            f"predicting the targets' mean ({near:.4g}): the model has learnt nothing of the "
                            "input; check the targets' normalisation and that inputs and targets are paired",
                            layer="loss", value=loss, reference=near)]
        return []
