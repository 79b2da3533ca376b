"""Forward hooks on many modules at once, always removed: the one way tensorprobe instruments a model.

    >>> with module_hooks(model.named_modules(), post=lambda path: record_output(path)):   # doctest: +SKIP
    ...     model(x)
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

import torch

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
