"""`find_first_nonfinite_backward`: the backward op where a NaN or Inf gradient is born.

The hardest NaN of a training run is born in the backward pass while the forward and the loss stay finite:
a branch that `torch.where` selects away still differentiates `sqrt` at 0 (0 · ∞ = NaN), a hand-written
standard deviation of a constant segment has the gradient 0/0. `torch.autograd.detect_anomaly` names the
backward function and raises at the first one; this names the forward op and module it differentiates, the
elements, the parameters the NaN reaches, and why.

How: the forward and the loss run once under a `TorchDispatchMode` that names each autograd node after the
aten op that made it (the dispatch mode sees the op below autograd; the node is set on the very tensor it
returned, and is read back at the next op). A hook on every node of the graph then checks, in backward
execution order, whether the gradients it produced are non-finite while the gradients it received were
finite: the first such node is the origin. The backward runs to the end (the weights' gradients show where
the damage lands) and the model's `.grad`s are restored afterwards: nothing is trained.

    >>> origin = find_first_nonfinite_backward(model, (mel, f0), loss_fn)     # doctest: +SKIP
    >>> origin.record, origin.backward_op                                     # doctest: +SKIP
    ('energy/sqrt.0', 'SqrtBackward0')
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import InputError
from ..hooks import ModuleStack, module_hooks, op_base_name, op_full_name, op_tensors, user_source_line
from ..record import record_name
from .diagnose import Evidence, diagnose
from .live import _check_inputs_and_parameters, _has_nonfinite
from .origin import CAUSE_OP, LOSS_MODULE, LOSS_MODULE_ALT, NanOrigin, TensorSummary

MAX_NAMED = 8                 # parameters and positions named in full; the rest are counted

# Ops whose derivative is infinite at a point where the op itself is finite: what each one needs, and the
# saved tensor (autograd's `_saved_<name>`) that shows the point.
_SINGULAR = {
    "sqrt": ("x = 0 (d/dx √x = 1/(2√x))", "result", lambda v: v == 0),
    "rsqrt": ("x = 0", "result", lambda v: torch.isinf(v)),
    "log": ("x = 0 (d/dx ln x = 1/x)", "self", lambda v: v == 0),
    "log2": ("x = 0", "self", lambda v: v == 0),
    "log10": ("x = 0", "self", lambda v: v == 0),
    "log1p": ("x = -1", "self", lambda v: v == -1),
    "reciprocal": ("x = 0", "result", lambda v: torch.isinf(v)),
    "pow": ("x = 0 with an exponent below 1", "self", lambda v: v == 0),
    "div": ("a divisor of 0 (d/dy x/y = -x/y²)", "other", lambda v: v == 0),
    "acos": ("x = ±1 (d/dx acos x = -1/√(1-x²))", "self", lambda v: v.abs() == 1),
    "asin": ("x = ±1", "self", lambda v: v.abs() == 1),
    "atanh": ("x = ±1", "self", lambda v: v.abs() == 1),
    "atan2": ("(0, 0)", "self", lambda v: v == 0),
}
# Backward nodes of a variance: the mean of squared deviations, or torch's var (std's own backward is
# safe at 0: PyTorch masks it)
_VARIANCE_NODES = ("VarBackward0", "VarMeanBackward0", "MeanBackward1", "MeanBackward0")
_SAFE = {
    "sqrt": "torch.sqrt(x.clamp_min(1e-12)), or torch.hypot(a, b) for √(a² + b²) and torch.linalg.vector_norm "
            "for a norm (both have a finite gradient at 0)",
    "log": "torch.log(x.clamp_min(1e-12)) (or log(x + eps))",
    "pow": "x.clamp_min(1e-12) ** p",
    "div": "x / y.clamp_min(eps) (or y + eps with the sign kept)",
    "acos": "torch.acos(x.clamp(-1 + 1e-7, 1 - 1e-7))",
    "asin": "torch.asin(x.clamp(-1 + 1e-7, 1 - 1e-7))",
}


@dataclass(frozen=True)
class _Site:
    """The forward op that made one autograd node."""

    record: str
    op: str
    base: str
    module: str
    module_type: str
    source: str | None


class _NodeNamer(TorchDispatchMode):
    """Names autograd nodes after the aten ops that made them; notes the first non-finite forward value."""

    def __init__(self, modules: ModuleStack, module_types: dict[str, str]):
        super().__init__()
        self.modules = modules
        self.module_types = module_types
        self.sites: dict[Any, _Site] = {}
        self._pending: list[tuple[torch.Tensor, _Site]] = []
        self.op_counts: dict[tuple[str, int, str], int] = {}
        self.forward_nonfinite: tuple[_Site, list[torch.Tensor], torch.Tensor] | None = None
        self.ops = 0
        self.loss_scope = LOSS_MODULE     # the module path the loss function's ops run under

    def resolve(self) -> None:
        for t, site in self._pending:
            node = t.grad_fn
            if node is not None and node not in self.sites:
                self.sites[node] = site
        self._pending.clear()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.resolve()           # the previous op's outputs have their grad_fn now
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops += 1
        module, call = self.modules.current
        base = op_base_name(func)
        key = (module, call, base)
        k = self.op_counts.get(key, 0)
        self.op_counts[key] = k + 1
        flat_out = [t for t in op_tensors(out) if t.is_floating_point() or t.is_complex()]
        if not flat_out:
            return out
        op = op_full_name(func)
        site = _Site(record_name(module, call, op, k), op, base, module, self.module_types.get(module, ""),
                     user_source_line())
        self._pending.extend((t, site) for t in flat_out)
        if self.forward_nonfinite is None:
            bad = next((t for t in flat_out if _has_nonfinite(t)), None)
            if bad is not None:
                ins = [t.detach().clone() for t in op_tensors(args, kwargs)]
                if not any(_has_nonfinite(t) for t in ins):
                    self.forward_nonfinite = (site, ins, bad.detach().clone())
        return out


def find_first_nonfinite_backward(model: torch.nn.Module, inputs: Sequence[Any] | Any,
                                  loss_fn: Callable[[Any], torch.Tensor], *, full: bool = True,
                                  call: Callable[..., Any] | None = None) -> NanOrigin:
    """Run one training step's forward, loss and backward, and return where a NaN/Inf gradient is born.

    The step is `loss = loss_fn(model(*inputs))` then `loss.backward()`. The loss function is part of the
    search (its ops are named `loss/<op>.<k>`). When the forward or the loss is already non-finite, the
    finding is that forward op (`direction="forward"`), as `find_first_nonfinite` would report it. The
    model's parameters are not changed; their `.grad`s are restored.

    Args:
        full: run the whole backward, so that `reaches` lists the parameters whose gradient ends non-finite
            (and none when a later op masks it). False stops at the origin, as detect_anomaly does (the rest
            of the backward is not paid for): `reaches` then lists the parameters the origin's gradient flows
            to, whether or not a later op would mask it.
        call: how the model is run on the inputs, `call(model, *inputs)` (default `model(*inputs)`): a
            LightningModule's `lambda m, batch: m.training_step(batch, 0)`, with `loss_fn` picking the loss.

    Returns:
        A `NanOrigin` with `direction="backward"`: `record`, `op` and `module` name the forward op whose
        gradient is non-finite, `backward_op` the autograd node, `elements` which elements, `reaches` the
        parameters whose gradient ends non-finite (empty when a later op masks it), and `diagnosis`.

    Example:
        >>> o = find_first_nonfinite_backward(model, (x,), lambda y: (y - target).pow(2).mean())  # doctest: +SKIP
        >>> print(o.summary())                                                                   # doctest: +SKIP
    """
    if not isinstance(model, torch.nn.Module):
        raise InputError(f"the backward NaN search needs a torch.nn.Module, got {type(model).__name__}")
    if not callable(loss_fn):
        raise InputError("the backward NaN search needs a loss function: loss_fn(model(*inputs)) -> scalar")
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    pre = _check_inputs_and_parameters(model, inputs, {})
    if pre is not None:
        return pre
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise InputError("the model has no parameter that requires a gradient: there is no backward pass")
    saved_grads = [p.grad for _, p in params]
    try:
        for _, p in params:
            p.grad = None
        return _search(model, inputs, loss_fn, params, full, call)
    finally:
        for (_, p), g in zip(params, saved_grads):
            p.grad = g


def _search(model, inputs, loss_fn, params, full: bool, call=None) -> NanOrigin:
    modules = ModuleStack()
    types = {path: type(m).__name__ for path, m in model.named_modules()}
    # the loss function's ops get a scope of their own, one no module of the model has (a model may hold its
    # criterion as `self.loss`, and its root's own ops are "": neither is the loss function)
    scope = LOSS_MODULE if LOSS_MODULE not in types else LOSS_MODULE_ALT
    types[scope] = getattr(loss_fn, "__name__", type(loss_fn).__name__)
    namer = _NodeNamer(modules, types)
    namer.loss_scope = scope
    hooks = module_hooks(model.named_modules(), pre=modules.enter_hook, post=modules.exit_hook, always_call=True)
    with torch.enable_grad(), hooks, namer:
        out = call(model, *inputs) if call is not None else model(*inputs)
        modules.enter(scope)
        loss = loss_fn(out)
        modules.exit(scope)
        namer.resolve()
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise InputError(f"loss_fn must return a scalar tensor, got "
                         f"{tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__}")
    if loss.grad_fn is None:
        raise InputError("the loss does not depend on any parameter (no grad_fn): nothing to differentiate")
    if not math.isfinite(float(loss.detach())):
        return _forward_finding(namer, loss)
    watch = _BackwardWatch(namer.sites, stop=not full, loss_scope=scope)
    handles = [node.register_hook(watch.hook(node)) for node in _graph_nodes(loss.grad_fn)]
    try:
        loss.backward(retain_graph=True)     # the origin's saved tensors (sqrt's result: where x = 0) are evidence
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    if watch.origin is None:
        bad = [n for n, p in params if p.grad is not None and _has_nonfinite(p.grad)]
        if bad:   # born in a node we could not hook (a custom C++ function): say where it landed
            return NanOrigin(found=True, cause=CAUSE_OP, direction="backward", reaches=tuple(bad),
                             ops_checked=watch.nodes, diagnosis=(
                                 f"the gradients of {len(bad)} parameters are non-finite, but no backward node "
                                 "that tensorprobe could watch produced the NaN/Inf",))
        return NanOrigin(found=False, direction="backward", ops_checked=watch.nodes)
    if full:
        reaches = tuple(n for n, p in params if p.grad is not None and _has_nonfinite(p.grad))
    else:
        reachable = {id(v) for v in _leaves_below(watch.origin[0])}
        reaches = tuple(n for n, p in params if id(p) in reachable)
    found = watch.finding(reaches, checked_downstream=full)
    if namer.forward_nonfinite is not None:    # made and masked in the forward: often the same op
        site = namer.forward_nonfinite[0]
        found = replace(found, note=f"the forward made a non-finite value at {site.record} ({site.op}) that a later "
                                    "op masked: the loss stayed finite")
    return found


class _Stop(Exception):
    """Raised from a backward hook to end the backward at the origin (`full=False`)."""


class _BackwardWatch:
    def __init__(self, sites: dict[Any, _Site], stop: bool = False, loss_scope: str = LOSS_MODULE):
        self.sites = sites
        self.loss_scope = loss_scope
        self.stop = stop
        self.origin: tuple[Any, tuple, tuple] | None = None
        self.nodes = 0

    def hook(self, node):
        def check(grad_inputs, grad_outputs):
            self.nodes += 1
            if self.origin is not None:
                return None
            made = [g for g in grad_inputs if isinstance(g, torch.Tensor)]
            if any(_has_nonfinite(g) for g in made):
                received = [g for g in grad_outputs if isinstance(g, torch.Tensor)]
                if not any(_has_nonfinite(g) for g in received):
                    self.origin = (node, tuple(g.detach().clone() if isinstance(g, torch.Tensor) else None
                                               for g in grad_inputs),
                                   tuple(g.detach().clone() if isinstance(g, torch.Tensor) else None
                                         for g in grad_outputs))
                    if self.stop:
                        raise _Stop
            return None
        return check

    def finding(self, reaches: tuple[str, ...], checked_downstream: bool = True) -> NanOrigin:
        node, made, received = self.origin
        site = self.sites.get(node)
        which = next(i for i, g in enumerate(made) if g is not None and _has_nonfinite(g))
        grad = made[which]
        incoming = next((g for g in received if g is not None), None)
        masked = _masked_fraction(grad, incoming)
        elements = describe_positions(grad)
        base = site.base if site else node.name().removesuffix("Backward0").removesuffix("Backward1").lower()
        diagnosis = _diagnose(node, base, grad, incoming, masked, reaches, site, checked_downstream)
        return NanOrigin(
            found=True, cause=CAUSE_OP, direction="backward", backward_op=node.name(),
            record=site.record if site else node.name(), op=site.op if site else None,
            module=site.module if site else None, module_type=site.module_type if site else None,
            source=site.source if site else None, op_index=self.nodes - 1,
            inputs=tuple(TensorSummary.of(f"incoming gradient {i}", g) for i, g in enumerate(received)
                         if g is not None),
            output=TensorSummary.of(f"gradient of input {which}", grad), diagnosis=tuple(diagnosis),
            elements=elements, reaches=reaches, masked=masked is not None and masked >= 0.999,
            ops_checked=self.nodes, in_loss=site is not None and site.module == self.loss_scope)


def _graph_nodes(root) -> list[Any]:
    seen, order, stack = set(), [], [root]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        order.append(node)
        stack.extend(n for n, _ in node.next_functions)
    return order


def _leaves_below(node) -> list[torch.Tensor]:
    """The leaf tensors (parameters) whose AccumulateGrad nodes the gradient of `node` flows to."""
    return [n.variable for n in _graph_nodes(node) if hasattr(n, "variable")]


def _masked_fraction(grad: torch.Tensor, incoming: torch.Tensor | None) -> float | None:
    """Of the elements whose gradient is non-finite, the fraction whose incoming gradient is exactly 0 (a
    value selected away downstream); None when the two do not line up element by element."""
    if incoming is None or incoming.shape != grad.shape:
        return None
    bad = ~torch.isfinite(grad)
    n = int(bad.sum())
    return float((incoming[bad] == 0).sum()) / n if n else None


def describe_positions(t: torch.Tensor) -> str:
    """Where a tensor is non-finite, per dimension: 'batch rows 1, 3; 25 of 200 frames (12–36)'."""
    bad = ~torch.isfinite(t.detach())
    total = int(bad.sum())
    if total == 0:
        return ""
    parts = [f"{total} of {t.numel()} elements"]
    names = _dim_names(t.dim())
    for d, label in enumerate(names):
        if t.shape[d] <= 1:
            continue
        others = [i for i in range(t.dim()) if i != d]
        hit = bad.any(dim=others) if others else bad
        idx = hit.nonzero().flatten().tolist()
        if len(idx) == t.shape[d]:
            parts.append(f"every {label[:-1] if label.endswith('s') else label}")
            continue
        shown = ", ".join(map(str, idx[:MAX_NAMED])) + (", ..." if len(idx) > MAX_NAMED else "")
        span = f" ({idx[0]}–{idx[-1]})" if len(idx) > MAX_NAMED else ""
        parts.append(f"{len(idx)} of {t.shape[d]} {label}: {shown}{span}" if len(idx) > MAX_NAMED
                     else f"{label} {shown}")
    return "; ".join(parts)


def _dim_names(ndim: int) -> list[str]:
    if ndim == 3:                       # (batch, channels, frames): the audio models' layout
        return ["batch rows", "channels", "frames"]
    if ndim == 2:
        return ["batch rows", "columns"]
    return [f"dim-{d} indices" for d in range(ndim)]


def _saved(node, name: str) -> torch.Tensor | None:
    try:
        v = getattr(node, f"_saved_{name}")
    except (AttributeError, RuntimeError):
        return None
    return v if isinstance(v, torch.Tensor) else None


def _reads_a_variance(node) -> bool:
    """The root's input is a variance: var(), or the mean of a square (of x - mean)."""
    for parent, _ in node.next_functions:
        if parent is None or parent.name() not in _VARIANCE_NODES:
            continue
        if parent.name().startswith("Var"):
            return True
        for square, _ in parent.next_functions:     # mean((x - m)²): a square of a difference
            if square is not None and square.name() in ("PowBackward0", "MulBackward0") and any(
                    d is not None and d.name() == "SubBackward0" for d, _ in square.next_functions):
                return True
    return False


def _diagnose(node, base: str, grad, incoming, masked: float | None, reaches, site: _Site | None,
              checked_downstream: bool = True) -> list[str]:
    where = f"{site.record}" if site else node.name()
    bad = ~torch.isfinite(grad)
    out: list[str] = []
    is_masked = masked is not None and masked >= 0.999
    if base in ("sqrt", "rsqrt", "pow") and _reads_a_variance(node):
        out.append(f"{base} of a variance that is 0: the standard deviation of a constant segment (a silent "
                   "frame, a padded row). Forward, (x − mean) / (std + eps) is finite; backward, d√v/dv = ∞ at "
                   "v = 0 and the gradient is 0 · ∞ = NaN. Put eps inside the root, torch.sqrt(var + 1e-5), or "
                   "use F.layer_norm / F.instance_norm / F.group_norm, whose gradients are finite there.")
        if is_masked:
            out.append("The incoming gradient is exactly 0 there (those elements are selected away or do not "
                       "affect the loss), yet 0 × ∞ = NaN.")
    elif base in _SINGULAR:
        point, saved_name, at_point = _SINGULAR[base]
        saved = _saved(node, saved_name)
        hits = None
        if saved is not None and saved.shape == grad.shape:
            hits = int(at_point(saved.detach())[bad].sum())
        count = f" ({hits} of the {int(bad.sum())} elements are there)" if hits else ""
        out.append(f"{base} is differentiated at its singular point, {point}{count}: the forward value is finite, "
                   "its derivative is not.")
        if is_masked:
            out.append("The incoming gradient is exactly 0 at those elements: a torch.where (or a mask) downstream "
                       "selects this value away, but the gradient still passes through it and 0 × ∞ = NaN. Fix "
                       f"with the double-where trick: torch.where(mask, {base}(torch.where(mask, x, safe)), 0.0) "
                       "with `safe` a value where the op is smooth (1.0), so the masked elements never reach the "
                       "singularity.")
        else:
            out.append(f"Keep the input away from it: {_SAFE.get(base, 'clamp the input before the op')}.")
    has_nan = bool(torch.isnan(grad).any())
    if not out and not has_nan and grad.dtype in (torch.float16, torch.bfloat16):
        peak = float(incoming.detach().abs().float().max()) if incoming is not None else float("nan")
        out.append(f"The gradient overflows {str(grad.dtype).removeprefix('torch.')} (largest finite "
                   f"{torch.finfo(grad.dtype).max:.6g}) at this op; the incoming gradient reaches {peak:.3g}. A "
                   "GradScaler would skip this step and lower its scale; compute this op in float32 (autocast "
                   "leaves it out) or scale the loss down.")
    if not out:
        ev = Evidence(op=base, module_type=site.module_type if site else "", inputs=[], output=grad)
        generic = [d for d in diagnose(ev) if "channel" in d]
        out.append(f"The gradient of {base} is non-finite where every gradient it received is finite: its "
                   f"derivative is infinite (or 0/0) at these inputs." + (f" {generic[0]}" if generic else ""))
    if reaches and not checked_downstream:
        out.append(f"Its gradient flows to {len(reaches)} parameters (the search stopped at the origin: whether a "
                   "later op masks it was not checked; the full search says).")
    elif reaches:
        names = ", ".join(reaches[:MAX_NAMED]) + (f" and {len(reaches) - MAX_NAMED} more" if len(reaches) > MAX_NAMED
                                                  else "")
        out.append(f"It reaches the gradients of {len(reaches)} parameters ({names}): an optimizer step would "
                   "write NaN into them, or a GradScaler would skip the step.")
    else:
        out.append(f"No parameter gradient is non-finite: an op after {where} in the backward pass masks it "
                   "(a ReLU, clamp or torch.where that passes 0 there). Harmless now; fragile.")
    return out


def _forward_finding(namer: _NodeNamer, loss: torch.Tensor) -> NanOrigin:
    if namer.forward_nonfinite is None:
        return NanOrigin(found=True, cause=CAUSE_OP, direction="forward", record=namer.loss_scope,
                         module=namer.loss_scope, module_type=namer.module_types.get(namer.loss_scope), in_loss=True,
                         diagnosis=("The loss is non-finite but no op made it so from finite inputs.",))
    site, ins, out = namer.forward_nonfinite
    ev = Evidence(op=site.base, module_type=site.module_type, inputs=ins, output=out)
    return NanOrigin(
        found=True, cause=CAUSE_OP, direction="forward", record=site.record, op=site.op, module=site.module,
        module_type=site.module_type, source=site.source, output=TensorSummary.of(site.record, out),
        in_loss=site.module == namer.loss_scope,
        inputs=tuple(TensorSummary.of(f"input {i}", t) for i, t in enumerate(ins)), ops_checked=namer.ops,
        diagnosis=tuple(diagnose(ev)) + ("The forward (or the loss) is already non-finite: this is not a "
                                         "backward NaN; fix the forward first.",))

