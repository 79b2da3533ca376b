"""The `if __name__ == "__main__":` guard a script needs before it starts worker processes.

The local pool (and a local Dask cluster) start workers with the spawn method: each worker runs the main
script again, as module `__mp_main__`, to import what it defines. A script that calls `tp.sweep(...)` at its
top level, unguarded, starts the sweep again in every worker, where multiprocessing refuses to start more
processes; each worker dies before it runs anything, and every item would read "the worker process died".
`require_main_guard` finds that call before any worker starts and says what is missing.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from types import FrameType

from ..errors import InputError


def require_main_guard(what: str = "tp.sweep(...)") -> None:
    """Raise `InputError` when this call comes from the main script's top-level code outside an
    `if __name__ == "__main__":` block, which spawned workers would run again."""
    found = unguarded_main_call()
    if found is not None:
        path, line = found
        raise InputError(
            f"{path}:{line} calls {what} at the script's top level, without `if __name__ == \"__main__\":`. "
            "The sweep's worker processes are spawned and run the script again, so each would start the sweep "
            "anew and die. Put the call under `if __name__ == \"__main__\":` (or use `tensorprobe sweep`).")


def unguarded_main_call() -> tuple[str, int] | None:
    """(script, line) of the main script's top-level statement that led to this call, when spawned workers
    would run it again; None when the call is guarded, or the main module is not a script spawn re-runs
    (an interactive session, `python -c`, a package's `__main__`)."""
    main = sys.modules.get("__main__")
    path = _rerun_path(main)
    if path is None:
        return None
    frame = _top_level_frame(main.__dict__)
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None        # can't read the script: say nothing rather than guess
    if any(_is_main_test(node.test) and node.body[0].lineno <= line <= (node.body[-1].end_lineno or line)
           for node in ast.walk(tree) if isinstance(node, ast.If)):
        return None
    return path, line


def _rerun_path(main: object) -> str | None:
    """The main script's path when spawned workers run it again (mirrors multiprocessing.spawn)."""
    if main is None:
        return None
    spec_name = getattr(getattr(main, "__spec__", None), "name", None)
    if spec_name is not None and (spec_name == "__main__" or spec_name.endswith(".__main__")):
        return None                      # `python -m pkg`: spawn does not run a package's __main__ again
    path = getattr(main, "__file__", None)
    return str(path) if path else None


def _top_level_frame(main_globals: dict) -> FrameType | None:
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals is main_globals:
            return frame
        frame = frame.f_back
    return None


def _is_main_test(test: ast.expr) -> bool:
    """`__name__ == "__main__"` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return (any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
            and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides))
