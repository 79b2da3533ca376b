"""How tensorprobe watches a torch model: forward hooks on many modules at once (always removed), which
module is running (`ModuleStack`), the tensors among an op's or a module's arguments, op names of a
dispatch, and the user's source line. Shared by capture, NaN search, RNG replay and isolation.

    >>> with module_hooks(model.named_modules(), post=lambda path: record_output(path)):   # doctest: +SKIP
    ...     model(x)
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

import torch
from torch.utils._pytree import tree_flatten

HookFactory = Callable[[str], Callable[..., Any]]


@contextmanager
def module_hooks(modules: Iterable[tuple[str, torch.nn.Module]], *, pre: HookFactory | None = None,
                 post: HookFactory | None = None, pre_kwargs: bool = False, post_kwargs: bool = False,
                 always_call: bool = False) -> Iterator[None]:
    """Register `pre(path)` as forward pre-hook and `post(path)` as forward hook on each `(path, module)`,
    and remove every one of them on exit, whatever happens inside.

    Args:
        modules: `(path, module)` pairs, e.g. `model.named_modules()`.
        pre, post: factories returning the hook for one module path.
        pre_kwargs, post_kwargs: pass keyword inputs to the hooks (`with_kwargs=True`).
        always_call: run post-hooks also when the forward raises.
    """
    handles = []
    try:
        for path, module in modules:
            if pre is not None:
                handles.append(module.register_forward_pre_hook(pre(path), with_kwargs=pre_kwargs))
            if post is not None:
                handles.append(module.register_forward_hook(post(path), with_kwargs=post_kwargs,
                                                            always_call=always_call))
        yield
    finally:
        for h in handles:
            h.remove()


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep   # the separator: torchcrepe/, torchaudio/ are not torch
_OWN_DIR = os.path.dirname(__file__)
_EXAMPLES_DIR = os.path.join(_OWN_DIR, "examples")


def op_tensors(*groups: Any) -> list[torch.Tensor]:
    """Tensors among an aten op's arguments or outputs: a tensor, or tensors in a tuple/list/dict (and one
    level of lists inside, e.g. `cat`'s). torch's pytree would do too, at ~10x the cost on every op."""
    out: list[torch.Tensor] = []
    for g in groups:
        if isinstance(g, torch.Tensor):
            out.append(g)
            continue
        for a in (g.values() if isinstance(g, dict) else g if isinstance(g, (list, tuple)) else ()):
            if isinstance(a, torch.Tensor):
                out.append(a)
            elif isinstance(a, (list, tuple)):
                out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out


_BASE_NAMES: dict[Any, str] = {}
_FULL_NAMES: dict[Any, str] = {}


def op_base_name(func: Any) -> str:
    """'aten.rsqrt.default' -> 'rsqrt' (cached: asked for on every op)."""
    name = _BASE_NAMES.get(func)
    if name is None:
        name = _BASE_NAMES[func] = func._schema.name.split("::")[-1]
    return name


def op_full_name(func: Any) -> str:
    """'aten.rsqrt.default' (cached: `str()` of an op overload costs ~4 µs)."""
    name = _FULL_NAMES.get(func)
    if name is None:
        name = _FULL_NAMES[func] = str(func)
    return name


def module_types(model: torch.nn.Module) -> dict[str, str]:
    """Path -> class name of every module (the root's path is ""): what a bundle's manifest keeps so that a
    diagnosis can see that `gen.norm` is an `InstanceNorm1d` rather than guess it from its name."""
    return {path: type(m).__name__ for path, m in model.named_modules()}


def module_tensors(value: Any) -> list[torch.Tensor]:
    """Tensors in a module's inputs or output, at any depth; the common cases (a tensor, a flat tuple of
    tensors) without torch's pytree, which costs ~10 µs a call."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple) and all(isinstance(v, torch.Tensor) for v in value):
        return list(value)
    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def user_source_line() -> str | None:
    """`file.py:123 (function)` of the innermost frame outside torch and tensorprobe's own machinery."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        ours = fn.startswith(_OWN_DIR) and not fn.startswith(_EXAMPLES_DIR)
        if not ours and not fn.startswith(_TORCH_DIR) and not fn.startswith("<frozen"):
            return f"{fn}:{f.f_lineno} ({f.f_code.co_name})"
        f = f.f_back
    return None


class ModuleStack:
    """Which module is running now, and how often each module has been called (for `@<call>` names)."""

    def __init__(self) -> None:
        self.stack: list[tuple[str, int]] = []
        self.calls: dict[str, int] = {}

    def enter(self, path: str) -> int:
        call = self.calls.get(path, -1) + 1
        self.calls[path] = call
        self.stack.append((path, call))
        return call

    def exit(self, path: str) -> None:
        # Pop up to and including `path`: a module that raised may have left entries behind.
        while self.stack:
            if self.stack.pop()[0] == path:
                break

    @property
    def current(self) -> tuple[str, int]:
        return self.stack[-1] if self.stack else ("", 0)

    def enter_hook(self, path: str):
        """A forward pre-hook that enters `path` (for `module_hooks(pre=stack.enter_hook)`)."""
        def hook(module, args):
            self.enter(path)  # returns None: a pre-hook's return value would replace the inputs
        return hook

    def exit_hook(self, path: str):
        """A forward hook that leaves `path` (register it with always_call=True)."""
        def hook(module, args, output):
            self.exit(path)
        return hook
