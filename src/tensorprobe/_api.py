"""Modules that can be called as their main function: `tp.diff(ref, cand)` and `tensorprobe.diff.core`.

`tensorprobe.diff`, `.capture`, `.compare` and `.isolate` are each both a module (or subpackage) and the
verb users call. A package attribute can hold only one of the two, and Python's import system sets it to
the module whenever the module is first imported; so instead the module itself is made callable, with the
verb's signature and docstring.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from typing import Any, Callable


def make_callable(module_name: str, verb: Callable[..., Any] | str) -> None:
    """Make `sys.modules[module_name]` callable as `verb` (signature and docs included).

    `verb` may be `"package.module:function"`, imported on the first call: a package whose verb needs torch
    stays importable without it (`tensorprobe.isolate`).
    """
    module = sys.modules[module_name]

    def resolve() -> Callable[..., Any]:
        if callable(verb):
            return verb
        mod, _, attr = verb.partition(":")
        return getattr(importlib.import_module(mod), attr)

    class _VerbModule(types.ModuleType):
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return resolve()(*args, **kwargs)

        @property
        def __signature__(self) -> inspect.Signature:   # what inspect.signature(tp.diff) reports
            return inspect.signature(resolve())

    module.__class__ = _VerbModule
