"""Verified rewrites: swap parts of a model for equivalents a target accepts, and prove each swap on the
user's inputs before keeping it.

    >>> result = rewrite(model, x, rules=["stable_norm", "fold_weight_norm"])     # doctest: +SKIP
    >>> [(r.rule, r.applied, r.max_rel_err) for r in result.rules]                # doctest: +SKIP
    [('stable_norm', True, 1.2e-07), ('fold_weight_norm', True, 0.0)]
    >>> ported = result.model                                                     # doctest: +SKIP

Each rule runs on a copy of the model as it stands. Its outputs on the inputs are compared with the exact
outputs (the model before the rule, run in float64): the rule is kept when its error, or its change to the
float32 outputs, is within `rtol`, or when its error is no larger than twice the error the model had before
it. The last clause matters where the model is ill-conditioned on these inputs (an instance norm of
near-constant channels amplifies float32 rounding 100,000-fold): there no float32 implementation agrees
with another to 1e-4, and "as accurate as before" is the equivalence that can be proven. It stops at a
model whose own error passes `ILL_CONDITIONED` (1%): there nothing but identical outputs proves anything.
A rule that fails is reported and not applied. A rule is a name
from `RULES` or any function `(model, *inputs) -> (model, changed paths)` (or `model -> …`).

Every run (and every rule, which may record random draws) starts from the same seed, so a model with
random ops is compared with itself on one draw.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from ..errors import InputError
from .functions import guard_atan2, record_random
from .stft import conv_stft

Rule = Callable[..., "tuple[nn.Module, list[str]]"]
SEED = 0
# Above this relative error of its own (float32 against float64), a model's outputs say nothing about the
# equivalence of a rewrite: only rules that leave its float32 outputs within rtol are kept.
ILL_CONDITIONED = 1e-2


def _two_pass_normalise(x: torch.Tensor, dims: tuple[int, ...], eps: float) -> torch.Tensor:
    """(x − mean) / sqrt(var + eps) by the corrected two-pass algorithm (Chan, Golub & LeVeque 1983): the
    float32 mean is off by its own rounding, which the mean of the centred values measures and removes.
    In float32 it is about as accurate as PyTorch's CPU norms, which accumulate in float64; a plain two-pass
    variance is not, and on an ill-conditioned model that difference alone fails the equivalence proof."""
    centred = x - x.mean(dim=dims, keepdim=True)
    correction = centred.mean(dim=dims, keepdim=True)
    centred = centred - correction
    var = (centred * centred).mean(dim=dims, keepdim=True)
    return centred * torch.rsqrt(var + eps)


class TwoPassInstanceNorm(nn.Module):
    """InstanceNorm with its variance written as E[(x − mean)²] (two passes): exported as plain mean, sub,
    mul and rsqrt ops, which no backend lowers into a one-pass E[x²] − E[x]²."""

    def __init__(self, norm: nn.modules.instancenorm._InstanceNorm):
        super().__init__()
        self.eps = norm.eps
        self.weight = norm.weight if norm.affine else None
        self.bias = norm.bias if norm.affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _two_pass_normalise(x, tuple(range(2, x.dim())), self.eps)
        if self.weight is not None:
            shape = (1, -1) + (1,) * (x.dim() - 2)
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y


class TwoPassGroupNorm(nn.Module):
    """GroupNorm with a two-pass variance (see `TwoPassInstanceNorm`)."""

    def __init__(self, norm: nn.GroupNorm):
        super().__init__()
        self.groups, self.eps = norm.num_groups, norm.eps
        self.weight = norm.weight if norm.affine else None
        self.bias = norm.bias if norm.affine else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        grouped = x.reshape(x.shape[0], self.groups, -1)
        y = _two_pass_normalise(grouped, (2,), self.eps).reshape(x.shape)
        if self.weight is not None:
            shape = (1, -1) + (1,) * (x.dim() - 2)
            y = y * self.weight.view(shape) + self.bias.view(shape)
        return y


class TwoPassLayerNorm(nn.Module):
    """LayerNorm with a two-pass variance (see `TwoPassInstanceNorm`)."""

    def __init__(self, norm: nn.LayerNorm):
        super().__init__()
        self.ndim, self.eps = len(norm.normalized_shape), norm.eps
        self.weight = norm.weight
        self.bias = norm.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _two_pass_normalise(x, tuple(range(x.dim() - self.ndim, x.dim())), self.eps)
        if self.weight is not None:
            y = y * self.weight
        if self.bias is not None:
            y = y + self.bias
        return y


def stable_norm(model: nn.Module, *inputs: Any) -> tuple[nn.Module, list[str]]:
    """Instance norms (without running statistics), group norms and layer norms -> two-pass equivalents."""
    changed = []
    for path, module in list(model.named_modules()):
        if isinstance(module, nn.modules.instancenorm._InstanceNorm) and not module.track_running_stats:
            new: nn.Module = TwoPassInstanceNorm(module)
        elif isinstance(module, nn.GroupNorm):
            new = TwoPassGroupNorm(module)
        elif isinstance(module, nn.LayerNorm):
            new = TwoPassLayerNorm(module)
        else:
            continue
        _replace(model, path, new)
        changed.append(path)
    return model, changed


def fold_weight_norm(model: nn.Module, *inputs: Any) -> tuple[nn.Module, list[str]]:
    """Weight norms (old-style `weight_g`/`weight_v`, or parametrizations) folded into plain weights."""
    changed = []
    for path, module in list(model.named_modules()):
        if hasattr(module, "weight_g") and hasattr(module, "weight_v"):
            nn.utils.remove_weight_norm(module)
            changed.append(path)
        elif nn.utils.parametrize.is_parametrized(module, "weight"):
            nn.utils.parametrize.remove_parametrizations(module, "weight", leave_parametrized=True)
            changed.append(path)
    return model, changed


RULES: dict[str, Rule] = {"stable_norm": stable_norm, "fold_weight_norm": fold_weight_norm,
                          "guard_atan2": guard_atan2, "record_random": record_random, "conv_stft": conv_stft}


@dataclass(frozen=True)
class RuleResult:
    rule: str
    applied: bool
    changed: tuple[str, ...]     # module paths the rule rewrote
    max_rel_err: float | None    # largest |after − exact| over the largest |exact|, over every output
    reason: str = ""
    model_rel_err: float | None = None   # the same figure for the model before the rule (its own float32 error)
    moved_rel_err: float | None = None   # largest |after − before| over the largest |before|: what the rule changed

    def to_dict(self) -> dict[str, Any]:
        from ..numbers import json_number

        return {"rule": self.rule, "applied": self.applied, "changed": list(self.changed),
                "max_rel_err": json_number(self.max_rel_err), "model_rel_err": json_number(self.model_rel_err),
                "moved_rel_err": json_number(self.moved_rel_err),
                "reason": self.reason}


@dataclass(frozen=True)
class RewriteResult:
    model: nn.Module
    rules: tuple[RuleResult, ...]

    def summary(self) -> str:
        parts = []
        for r in self.rules:
            if r.applied:
                parts.append(f"{r.rule}: {len(r.changed)} place(s) rewritten, outputs moved {r.moved_rel_err or 0:.1e}, "
                             f"within {r.max_rel_err:.1e} of float64 (the model's own float32 error: "
                             f"{r.model_rel_err or 0:.1e})")
            else:
                parts.append(f"{r.rule}: not applied ({r.reason})")
        return "; ".join(parts) + "."

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary(), "rules": [r.to_dict() for r in self.rules]}


def rewrite(model: nn.Module, *inputs: Any, rules: Sequence[str | Rule] = ("stable_norm", "fold_weight_norm"),
            rtol: float = 1e-4) -> RewriteResult:
    """Apply `rules` one by one to a copy of `model`, keeping each only if it proves equivalent on `inputs`
    (see module docstring). The original model is not modified."""
    current = clone_module(model).eval()
    results = []
    for rule in rules:
        name, fn = _resolve(rule)
        exact = _outputs(_exact(current, inputs), _double(inputs))
        before = _outputs(current, inputs)
        before_err = _max_rel_err(exact, before)
        with seeded():
            candidate, changed = fn(clone_module(current), *inputs)
        if not changed:
            results.append(RuleResult(name, False, (), None, "nothing to rewrite"))
            continue
        after = _outputs(candidate.eval(), inputs)
        err, moved = _max_rel_err(exact, after), _max_rel_err(before, after)
        reason = _refusal(err, moved, before_err, rtol)
        if reason:
            results.append(RuleResult(name, False, tuple(changed), err, reason, before_err, moved))
            continue
        current = candidate
        results.append(RuleResult(name, True, tuple(changed), err, model_rel_err=before_err, moved_rel_err=moved))
    return RewriteResult(current, tuple(results))


def _refusal(err: float | None, moved: float | None, own: float | None, rtol: float) -> str:
    """Why a rule's outputs do not prove it equivalent ('' when they do; see the module docstring)."""
    if err is None or moved is None:
        return "outputs change shape or become non-finite"
    own = own or 0.0
    if err <= rtol or moved <= rtol:
        return ""
    if own > ILL_CONDITIONED:
        return (f"outputs move {moved:.2g}, and the model's own float32 and float64 runs differ by {own:.2g} on these "
                "inputs: equivalence cannot be proven on them (use inputs on which the model is well-conditioned)")
    if err <= 2 * own:
        return ""
    return f"outputs move {err:.2g} from exact (> {rtol:.2g}, and more than twice the model's own {own:.2g})"


def _exact(model: nn.Module, inputs: tuple) -> nn.Module:
    """The model in float64, drawing the very random numbers its float32 run draws under `SEED` (a float64
    draw from the same seed is another sequence, which would make every comparison vacuous)."""
    with seeded():
        deterministic, _ = record_random(clone_module(model), *inputs)
    return deterministic.double()


def _double(inputs: tuple) -> tuple:
    return tuple(t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs)


def clone_module(model: nn.Module) -> nn.Module:
    """A deep copy of `model` that shares nothing a rewrite may change with it: not its tensors, and not the
    classes that `torch.nn.utils.parametrize` makes for each parametrized module (`ParametrizedConv1d`).
    `copy.deepcopy` copies instances but not classes, and `remove_parametrizations` deletes the weight's
    property from the class: on a shared class that breaks the original ("no attribute 'weight'").

    Also copies a model after a forward of old-style weight norm (`torch.nn.utils.weight_norm`), whose computed
    `weight` is not a leaf tensor and refuses deepcopy: the copy gets that weight detached (the weight norm
    recomputes it from `weight_g` and `weight_v` before every forward), the original keeps its own."""
    memo: dict[int, Any] = {}
    for m in model.modules():
        w = m.__dict__.get("weight")         # old-style weight norm keeps its computed weight as a plain attribute
        if hasattr(m, "weight_g") and isinstance(w, torch.Tensor) and not w.is_leaf:
            memo[id(w)] = w.detach().clone()
    copied = copy.deepcopy(model, memo)
    for m in copied.modules():
        if nn.utils.parametrize.is_parametrized(m):
            m.__class__ = _own_class(type(m))
    return copied


def _own_class(cls: type) -> type:
    """A class like `cls` (same name, bases and attributes) that is no other module's."""
    attrs = {k: v for k, v in vars(cls).items() if k not in ("__dict__", "__weakref__")}
    return type(cls.__name__, cls.__bases__, attrs)


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """`model` in eval mode inside, every module's training flag as it was after."""
    flags = [(m, m.training) for m in model.modules()]
    try:
        yield model.eval()
    finally:
        for m, training in flags:
            m.training = training


def _resolve(rule: str | Rule) -> tuple[str, Rule]:
    if callable(rule):
        return getattr(rule, "__name__", "rule"), _with_inputs(rule)
    if rule not in RULES:
        raise InputError(f"unknown rewrite rule {rule!r}; known rules: {', '.join(RULES)}")
    return rule, RULES[rule]


@contextlib.contextmanager
def seeded() -> Iterator[None]:
    """The global generators forked and seeded with `SEED` (the caller's state is restored after)."""
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
        torch.manual_seed(SEED)
        yield


def _with_inputs(rule: Rule) -> Rule:
    """A user's rule may take the model alone (`model -> (model, changed)`) or the inputs too."""
    import inspect

    try:
        params = list(inspect.signature(rule).parameters.values())
    except (TypeError, ValueError):
        return rule
    if any(p.kind is p.VAR_POSITIONAL for p in params) or len(params) > 1:
        return rule
    return lambda model, *inputs: rule(model)


def _outputs(model: nn.Module, inputs: tuple) -> list[torch.Tensor]:
    with torch.no_grad(), seeded():
        out = model(*inputs)
    return [t.detach().double() for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]


def _max_rel_err(before: list[torch.Tensor], after: list[torch.Tensor]) -> float | None:
    if len(before) != len(after) or any(a.shape != b.shape for a, b in zip(before, after)):
        return None
    worst = 0.0
    for b, a in zip(before, after):
        ok = torch.isfinite(b)
        if not bool(torch.isfinite(a)[ok].all()):
            return None
        scale = float(b[ok].abs().max()) if bool(ok.any()) else 0.0
        diff = float((a[ok] - b[ok]).abs().max()) if bool(ok.any()) else 0.0
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


def _replace(model: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, new)
