"""Modules that can be called as their main function: `tp.diff(ref, cand)` and `tensorprobe.diff.core`.

`tensorprobe.diff`, `.capture`, `.compare` and `.isolate` are each both a module (or subpackage) and the
verb users call. A package attribute can hold only one of the two, and Python's import system sets it to
the module whenever the module is first imported; so instead the module itself is made callable, with the
verb's signature and docstring.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
from typing import Any, Callable


def make_callable(module_name: str, verb: Callable[..., Any]) -> None:
    """Make `sys.modules[module_name]` callable as `verb` (signature and docs included)."""
    module = sys.modules[module_name]

    class _VerbModule(types.ModuleType):
        @functools.wraps(verb)
        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            return verb(*args, **kwargs)

    module.__class__ = _VerbModule
    module.__signature__ = inspect.signature(verb)  # what inspect.signature(tp.diff) reports
