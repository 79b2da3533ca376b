"""Per-component isolation: run each submodule alone in a runtime and bisect down to the smallest failing one.

When a runtime hides its internals (a delegate, a fused kernel) or the whole model won't even export, the
seed-001 workflow still works: record every module call's inputs and outputs in PyTorch, export each module
alone with its recorded inputs, run it in the runtime, compare with the PyTorch output. Starting at the root,
a failing module's children are checked; a failing leaf, or a failing module whose children all pass alone
("each component works, the full model does not": the composition), is a culprit.

Generic over runtimes: `run_module(module, inputs) -> list of arrays` is all it needs; every adapter with a
`run_module` method (ExecuTorch, TVM) provides one.

    >>> from tensorprobe.runtimes import get_runtime
    >>> from tensorprobe.runtimes.components import isolate_components          # doctest: +SKIP
    >>> report = isolate_components(model, inputs, get_runtime("tvm").run_module)  # doctest: +SKIP
    >>> report.culprits[0].path, report.culprits[0].nonfinite_channels          # doctest: +SKIP
    ('norm', (4, 6, 8))
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..errors import InputError, TensorprobeError
from ..record import module_label
from ..hooks import module_hooks
from .base import RuntimeAdapter

STATUS_OK = "ok"
STATUS_NONFINITE = "nonfinite"  # the runtime made NaN/Inf where PyTorch is finite
STATUS_DIVERGES = "diverges"    # finite, but further from PyTorch than the tolerance
STATUS_ERROR = "error"          # the module could not be exported, lowered or run alone

RunModule = Callable[[torch.nn.Module, tuple], Sequence[Any]]


@dataclass(frozen=True)
class ComponentResult:
    """How one module, run alone in the runtime on its recorded inputs, compares with PyTorch."""

    path: str
    module_type: str
    status: str
    max_abs_err: float = 0.0
    rel_err: float = 0.0
    new_nonfinite: int = 0
    nonfinite_channels: tuple[int, ...] = ()
    message: str = ""
    depth: int = 0

    @property
    def failed(self) -> bool:
        return self.status != STATUS_OK

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["nonfinite_channels"] = list(self.nonfinite_channels)
        d["path"] = module_label(self.path)
        return d


@dataclass(frozen=True)
class ComponentReport:
    """Every module checked (in the order checked) and the smallest failing ones (`culprits`)."""

    checked: tuple[ComponentResult, ...]
    culprits: tuple[ComponentResult, ...]
    composition: tuple[str, ...] = field(default=())  # culprits whose children all pass alone

    @property
    def ok(self) -> bool:
        return not self.culprits

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "culprits": [c.to_dict() for c in self.culprits],
                "composition": [module_label(p) for p in self.composition],
                "checked": [c.to_dict() for c in self.checked]}


@dataclass
class _Call:
    args: tuple
    kwargs: dict
    outputs: list[torch.Tensor]


def record_calls(model: torch.nn.Module, inputs: tuple) -> dict[str, _Call]:
    """Run `model` once in PyTorch; the first call of every module: inputs (cloned) and tensor outputs."""
    calls: dict[str, _Call] = {}
    pending: dict[str, tuple] = {}

    def pre(path: str):
        def hook(module, args, kwargs):
            if path not in calls and path not in pending:
                pending[path] = _clone((args, kwargs))
        return hook

    def post(path: str):
        def hook(module, args, kwargs, output):
            if path in pending:
                a, k = pending.pop(path)
                calls[path] = _Call(a, k, [t.detach().clone() for t in tree_flatten(output)[0]
                                           if isinstance(t, torch.Tensor)])
        return hook

    with module_hooks(model.named_modules(), pre=pre, post=post, pre_kwargs=True, post_kwargs=True), \
            torch.no_grad():
        model(*inputs)
    return calls


class _Bound(torch.nn.Module):
    """A module whose non-tensor arguments are fixed, so it exports with tensor inputs only."""

    def __init__(self, module: torch.nn.Module, args: tuple, kwargs: dict):
        super().__init__()
        self.inner = module
        leaves, self._spec = tree_flatten((args, kwargs))
        self._consts = [None if isinstance(x, torch.Tensor) else x for x in leaves]
        self.tensors = tuple(x for x in leaves if isinstance(x, torch.Tensor))

    def forward(self, *tensors: torch.Tensor) -> Any:
        it = iter(tensors)
        leaves = [next(it) if c is None else c for c in self._consts]
        args, kwargs = tree_unflatten(leaves, self._spec)
        return self.inner(*args, **kwargs)


def check_component(model: torch.nn.Module, path: str, call: _Call, run_module: RunModule, *,
                    rtol: float = 1e-3, depth: int = 0) -> ComponentResult:
    """Run one module alone through `run_module` on its recorded inputs and compare with PyTorch."""
    module = model.get_submodule(path)
    bound = _Bound(module, call.args, call.kwargs)
    kind = type(module).__name__
    try:
        got = [np.asarray(o) for o in run_module(bound, bound.tensors)]
    except TensorprobeError as e:
        return ComponentResult(path, kind, STATUS_ERROR, message=str(e), depth=depth)
    except Exception as e:  # a runtime's own failure is a finding about this module, not a crash
        return ComponentResult(path, kind, STATUS_ERROR, message=f"{type(e).__name__}: {e}"[:500], depth=depth)
    return _compare(path, kind, call.outputs, got, rtol=rtol, depth=depth)


def _compare(path: str, kind: str, ref: list[torch.Tensor], got: list[np.ndarray], *, rtol: float,
             depth: int) -> ComponentResult:
    if len(ref) != len(got):
        return ComponentResult(path, kind, STATUS_ERROR, depth=depth,
                               message=f"runtime returned {len(got)} outputs, PyTorch {len(ref)}")
    worst = ComponentResult(path, kind, STATUS_OK, depth=depth)
    for r, g in zip(ref, got):
        r = r.float().numpy() if r.is_floating_point() else r.numpy()
        g = g.astype(r.dtype, copy=False).reshape(r.shape) if g.size == r.size else g
        if g.shape != r.shape:
            return ComponentResult(path, kind, STATUS_ERROR, depth=depth,
                                   message=f"output shape {g.shape} != PyTorch {r.shape}")
        born = np.isfinite(r) & ~np.isfinite(g)
        both = np.isfinite(r) & np.isfinite(g)
        err = float(np.abs(r - g)[both].max()) if both.any() else 0.0
        scale = float(np.abs(r[np.isfinite(r)]).max()) if np.isfinite(r).any() else 0.0
        rel = err / max(scale, 1e-12)
        if born.any():
            channels = tuple(int(c) for c in np.nonzero(born.reshape(born.shape[0], born.shape[1], -1).any(axis=(0, 2)))[0]) \
                if born.ndim >= 2 else ()
            return ComponentResult(path, kind, STATUS_NONFINITE, err, rel, int(born.sum()), channels, depth=depth)
        if rel > rtol and rel > worst.rel_err:
            worst = ComponentResult(path, kind, STATUS_DIVERGES, err, rel, depth=depth)
    return worst


def isolate_components(model: torch.nn.Module, inputs: Sequence[Any], run_module: "RunModule | RuntimeAdapter", *,
                       rtol: float = 1e-3, max_depth: int | None = None,
                       on_result: Callable[[ComponentResult], None] | None = None) -> ComponentReport:
    """Bisect `model` down its module tree to the smallest components that fail alone in a runtime.

    Args:
        model: the PyTorch model (the reference).
        inputs: its forward inputs.
        run_module: a runtime adapter that can run one module alone (`RuntimeAdapter.can_run_modules()`),
            or any function running one module on a tuple of tensors and returning its outputs
            (e.g. `get_runtime("executorch").run_module`).
        rtol: largest accepted max-abs error relative to the largest |PyTorch output|.
        max_depth: stop descending below this depth (root = 0).
        on_result: called with each result as it is made (progress).

    Returns:
        A `ComponentReport`; `culprits` empty when the whole model already matches.

    Example:
        >>> report = isolate_components(model, (x,), get_runtime("tvm").run_module)   # doctest: +SKIP
        >>> [c.path for c in report.culprits]                                          # doctest: +SKIP
        ['norm']
    """
    if isinstance(run_module, RuntimeAdapter):
        if not run_module.can_run_modules():
            raise InputError(f"runtime {run_module.name!r} cannot run one module alone (no run_module): "
                             "per-component isolation needs one")
        run_module = run_module.run_module
    model = model.eval()
    calls = record_calls(model, tuple(inputs))
    checked: list[ComponentResult] = []
    culprits: list[ComponentResult] = []
    composition: list[str] = []

    def visit(path: str, depth: int) -> bool:
        result = check_component(model, path, calls[path], run_module, rtol=rtol, depth=depth)
        checked.append(result)
        if on_result:
            on_result(result)
        if not result.failed:
            return False
        children = _called_children(model, path, calls)
        failing = [c for c in children if max_depth is None or depth < max_depth]
        failing = [c for c in failing if visit(c, depth + 1)]
        if not failing:
            culprits.append(result)
            if children and result.status != STATUS_ERROR:
                composition.append(path)
        return True

    visit("", 0)
    return ComponentReport(tuple(checked), tuple(culprits), tuple(composition))


def _called_children(model: torch.nn.Module, path: str, calls: dict[str, _Call]) -> list[str]:
    """Direct children of `path` that ran, in the order they were first called."""
    module = model.get_submodule(path)
    prefix = f"{path}." if path else ""
    names = [f"{prefix}{n}" for n, _ in module.named_children()]
    order = {p: i for i, p in enumerate(calls)}
    ran = [n for n in names if n in calls]
    # containers (ModuleList) are never called themselves: descend through them
    for n in names:
        if n not in calls:
            ran.extend(_called_children(model, n, calls))
    return sorted(ran, key=lambda p: order.get(p, 1 << 30))


def _clone(x: Any) -> Any:
    leaves, spec = tree_flatten(x)
    return tree_unflatten([t.detach().clone() if isinstance(t, torch.Tensor) else t for t in leaves], spec)
