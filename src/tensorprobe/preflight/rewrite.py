"""Verified rewrites: swap parts of a model for equivalents a target accepts, and prove each swap on the
user's inputs before keeping it.

    >>> result = rewrite(model, x, rules=["stable_norm", "fold_weight_norm"])     # doctest: +SKIP
    >>> [(r.rule, r.applied, r.basis, r.moved_rel_err) for r in result.rules]     # doctest: +SKIP
    [('stable_norm', True, 'rounding', 1.2e-07), ('fold_weight_norm', True, 'rounding', 0.0)]
    >>> ported = result.model                                                     # doctest: +SKIP

Each rule runs on a copy of the model as it stands. Three runs judge it: the model before the rule in
float32 (`before`), the same in float64 (`exact`), and the model after the rule in float32 (`after`). Every
figure is a relative error over all outputs, the larger of max |Δ| / max |ref| and ‖Δ‖ / ‖ref‖ (`diff`'s
measure): `moved` (after against before: what the rule changed), `err` (after against exact) and `own`
(before against exact: the model's own float32 rounding on these inputs). A rule is kept on one of three
grounds (`RuleResult.basis`):

- `rounding` (proven): `moved` is within float32 rounding, `tolerance()`: `MARGIN` times the model's own
  error, at least `LOCAL_UNITS` float32 roundings (2^-24 each) and at most `NOISE_UNITS` of them, the least
  noise floor `diff` gives a float32 value that a rewrite recomputes. `diff` of the original against the
  rewritten model then finds the outputs within rounding noise.
- `accuracy` (kept, not proven equal): `moved` is larger, but the rewritten model is as accurate as the
  original (`err` at most twice `own`): the move is the original's own rounding, which the rule removes or
  replaces. This is what can be shown where the model is ill-conditioned on these inputs (an instance norm of
  near-constant channels amplifies float32 rounding 100,000-fold): no two float32 implementations agree there,
  and `diff` against the original reports the move as a divergence (rounding amplified). It stops at a model
  whose own error passes `ILL_CONDITIONED` (1%): there the float64 run says nothing about equivalence.
- `rtol` (kept, not proven): the caller's `rtol` is looser than float32 rounding and `moved` or `err` is
  within it.

A rule that fails is reported and not applied. A rule is a name from `RULES` or any function
`(model, *inputs) -> (model, changed)` (or `model -> (model, changed)`): `model` the rewritten module,
`changed` a list of the module paths it rewrote (strings; empty when there was nothing to rewrite).

Every run (and every rule, which may record random draws) starts from the same seed, so a model with
random ops is compared with itself on one draw.
"""

from __future__ import annotations

import contextlib
import copy
import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from ..diff.noise import LOCAL_UNITS, NOISE_UNITS, OWN_MARGIN as MARGIN, SAME_PRECISION_ROUNDOFF as U32
from ..errors import InputError, TensorprobeError
from ..modes import eval_mode
from .functions import guard_atan2, record_random
from .stft import conv_stft

Rule = Callable[..., "tuple[nn.Module, list[str]]"]
SEED = 0
# Above this relative error of its own (float32 against float64), a model's outputs say nothing about the
# equivalence of a rewrite: only rules that leave its float32 outputs within rounding (or rtol) are kept.
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
    """One rule's outcome. The figures are relative errors over every output (module docstring)."""

    rule: str
    applied: bool
    changed: tuple[str, ...]     # module paths the rule rewrote
    max_rel_err: float | None    # `err`: the model after the rule against the exact outputs (float64)
    reason: str = ""             # why it was not applied
    model_rel_err: float | None = None   # `own`: the model before the rule against float64 (its float32 rounding)
    moved_rel_err: float | None = None   # `moved`: after against before, both float32: what the rule changed
    tolerance: float | None = None       # the move float32 rounding explains on this model (`tolerance()`)
    basis: str = ""                      # why it was kept: rounding (proven), accuracy or rtol (module docstring)
    rtol: float | None = None            # the caller's rtol, when one was given

    @property
    def proven(self) -> bool:
        """Kept because its outputs stay within float32 rounding of the original's."""
        return self.applied and self.basis == "rounding"

    def describe(self) -> str:
        """One clause: what happened to this rule, with its figures."""
        if not self.applied:
            return f"{self.rule}: not applied ({self.reason})"
        head = f"{self.rule}: {len(self.changed)} place(s) rewritten"
        moved, err, own, tol = self.moved_rel_err or 0.0, self.max_rel_err or 0.0, self.model_rel_err, self.tolerance
        if self.basis == "rounding":
            return f"{head}, proven: outputs moved {moved:.1e}, within float32 rounding ({tol:.1e}, {_allowance(own)})"
        against = f"{err:.1e} from float64 (the original: {own:.1e})" if own is not None else f"{err:.1e} from float64"
        if self.basis == "accuracy":
            return (f"{head}, as accurate as the original but not proven equal to it: outputs moved {moved:.1e}, "
                    f"beyond float32 rounding ({tol:.1e}), and the rewritten model is {against}; `diff` against "
                    "the original will report that move (judge a port against the rewritten model)")
        return (f"{head} within --rtol {self.rtol:g}, not proven: outputs moved {moved:.1e}, beyond float32 rounding "
                f"({tol:.1e}), and the rewritten model is {against}")

    def to_dict(self) -> dict[str, Any]:
        from ..numbers import json_number

        return {"rule": self.rule, "applied": self.applied, "proven": self.proven, "basis": self.basis or None,
                "changed": list(self.changed), "max_rel_err": json_number(self.max_rel_err),
                "model_rel_err": json_number(self.model_rel_err), "moved_rel_err": json_number(self.moved_rel_err),
                "tolerance": json_number(self.tolerance), "reason": self.reason}


@dataclass(frozen=True)
class RewriteResult:
    model: nn.Module
    rules: tuple[RuleResult, ...]

    def summary(self) -> str:
        return "; ".join(r.describe() for r in self.rules) + "."

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary(), "rules": [r.to_dict() for r in self.rules]}


def rewrite(model: nn.Module, *inputs: Any, rules: Sequence[str | Rule] = ("stable_norm", "fold_weight_norm"),
            rtol: float | None = None) -> RewriteResult:
    """Apply `rules` one by one to a copy of `model`, keeping each only if its outputs on `inputs` prove it
    equivalent (module docstring); `rtol`, when given, is a looser relative tolerance the caller accepts.
    The original model is not modified. A model whose forward raises, or a rule that raises or does not
    return `(model, changed)`, is an `InputError`."""
    current = clone_module(model).eval()
    results = []
    for rule in rules:
        name, fn = _resolve(rule)
        with forward_errors():
            before = _outputs(current, inputs)
        with forward_errors("the float64 copy of the model (the exact outputs a rule is judged against)"):
            exact = _outputs(_exact(current, inputs), _double(inputs))
        own = _rel_err(exact, before)
        with forward_errors(f"rewrite rule {name!r}"), seeded():
            candidate, changed = _checked(name, fn(clone_module(current), *inputs))
        if not changed:
            results.append(RuleResult(name, False, (), None, "nothing to rewrite"))
            continue
        try:
            after = _outputs(candidate.eval(), inputs)
        except TensorprobeError:
            raise
        except Exception as e:      # the rule broke the model: refused, with what the forward said
            results.append(RuleResult(name, False, changed, None, f"the rewritten model raised {type(e).__name__}: "
                                      f"{e}", own, rtol=rtol))
            continue
        err, moved, tol = _rel_err(exact, after), _rel_err(before, after), tolerance(own)
        basis, reason = _judge(err, moved, own, rtol)
        result = RuleResult(name, bool(basis), changed, err, reason, own, moved, tol, basis, rtol)
        results.append(result)
        if result.applied:
            current = candidate
    return RewriteResult(current, tuple(results))


def tolerance(own: float | None) -> float:
    """The largest output move float32 rounding explains on a model whose own error (float32 against float64)
    is `own`: `MARGIN` x `own`, at least `LOCAL_UNITS` and at most `NOISE_UNITS` float32 roundings (the
    least noise floor `diff` gives a recomputed float32 value, so that a proven rewrite is a `diff` match)."""
    scaled = MARGIN * own if own is not None and own <= ILL_CONDITIONED else 0.0
    return min(max(scaled, LOCAL_UNITS * U32), NOISE_UNITS * U32)


def _allowance(own: float | None) -> str:
    """Where `tolerance(own)` comes from, in words."""
    if own is not None and LOCAL_UNITS * U32 < MARGIN * own < NOISE_UNITS * U32:
        return f"{MARGIN:g}x the model's own float32 error against float64, {own:.1e}"
    if own is not None and MARGIN * own >= NOISE_UNITS * U32 and own <= ILL_CONDITIONED:
        return f"{NOISE_UNITS} float32 roundings, the least noise floor diff gives; the model's own error is {own:.1e}"
    return f"{LOCAL_UNITS} float32 roundings"


def _judge(err: float | None, moved: float | None, own: float | None, rtol: float | None) -> tuple[str, str]:
    """(basis, '') when the rule is kept, ('', why not) when it is refused (module docstring)."""
    if err is None or moved is None:
        return "", "outputs change shape or become non-finite"
    tol = tolerance(own)
    if moved <= tol:
        return "rounding", ""
    conditioned = own is not None and own <= ILL_CONDITIONED
    if conditioned and err <= 2 * own:
        return "accuracy", ""
    if rtol is not None and rtol > tol and (err <= rtol or moved <= rtol):
        return "rtol", ""
    need = _round_up(min(err, moved))
    looser = (f"beyond --rtol {rtol:g}; " if rtol is not None else "") + f"--rtol {need:.2g} would accept it"
    if not conditioned:
        measured = f"differ by {own:.2g}" if own is not None else "do not even agree on which values are finite"
        return "", (f"outputs move {moved:.2g}, and the model's own float32 and float64 runs {measured} on these "
                    f"inputs: equivalence cannot be proven on them (use inputs on which the model is "
                    f"well-conditioned; {looser})")
    times = f"{moved / own:,.0f}x" if own else "more than"
    return "", (f"outputs move {moved:.2g}, {times} the model's own float32 error against float64 ({own:.2g}; "
                f"rounding explains {tol:.2g}), and the rewritten model is {err:.2g} from float64: it changes what "
                f"the model computes ({looser})")


def _round_up(x: float) -> float:
    """`x` rounded up to two significant digits (a tolerance printed that way still accepts `x`)."""
    if x <= 0 or not math.isfinite(x):
        return x
    step = 10.0 ** (math.floor(math.log10(x)) - 1)
    return math.ceil(x / step * (1 - 1e-12)) * step


def _checked(name: str, returned: Any) -> tuple[nn.Module, tuple[str, ...]]:
    """What a rule returned, as (model, changed paths); anything else is one clear `InputError`."""
    ok = (isinstance(returned, (tuple, list)) and len(returned) == 2 and isinstance(returned[0], nn.Module)
          and isinstance(returned[1], (list, tuple, set, frozenset))
          and all(isinstance(p, str) for p in returned[1]))
    if not ok:
        raise InputError(f"rewrite rule {name!r} returned {_shape_of(returned)}; a rule must return (model, changed): "
                         "the rewritten torch.nn.Module and a list of the module paths it rewrote (strings; an empty "
                         "list when it changed nothing)")
    return returned[0], tuple(returned[1])


def _shape_of(value: Any) -> str:
    """A short description of what a rule returned: `(Net, True)`, `None`, `Net`."""
    if isinstance(value, (tuple, list)):
        inner = ", ".join(type(v).__name__ if isinstance(v, nn.Module) else _short(v) for v in value[:3])
        return f"({inner}{', …' if len(value) > 3 else ''})"
    return type(value).__name__ if isinstance(value, nn.Module) else _short(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


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


def _resolve(rule: str | Rule) -> tuple[str, Rule]:
    if callable(rule):
        return getattr(rule, "__name__", "rule"), _with_inputs(rule)
    if rule not in RULES:
        raise InputError(f"unknown rewrite rule {rule!r}; known rules: {', '.join(RULES)}")
    return rule, RULES[rule]


@contextlib.contextmanager
def forward_errors(what: str = "the model's forward") -> Iterator[None]:
    """The user's model raising inside (a wrong input shape, a missing kernel) becomes one `InputError`:
    "`what` raised RuntimeError: ...", the line the CLI prints (exit 2), not a traceback."""
    try:
        yield
    except TensorprobeError:
        raise
    except Exception as e:
        raise InputError(f"{what} raised {type(e).__name__}: {e}") from None


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


def _rel_err(ref: list[torch.Tensor], other: list[torch.Tensor]) -> float | None:
    """The relative error of `other` against `ref` over every output: the larger of max |Δ| / max |ref| and
    ‖Δ‖ / ‖ref‖ (`diff`'s measure), on the elements finite in `ref`. None when the shapes differ or `other`
    is non-finite where `ref` is finite."""
    if len(ref) != len(other) or any(a.shape != b.shape for a, b in zip(ref, other)):
        return None
    worst = 0.0
    for b, a in zip(ref, other):
        ok = torch.isfinite(b)
        if not bool(torch.isfinite(a)[ok].all()):
            return None
        if not bool(ok.any()):
            continue
        d, b = (a[ok] - b[ok]), b[ok]
        for delta, scale in ((float(d.abs().max()), float(b.abs().max())), (float(d.norm()), float(b.norm()))):
            worst = max(worst, delta / scale if scale > 0 else delta)
    return worst


def _replace(model: nn.Module, path: str, new: nn.Module) -> None:
    parent, _, name = path.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, name, new)
