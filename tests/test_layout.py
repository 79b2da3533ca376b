"""The layout holds: no import cycles between tensorprobe's modules (function-level imports included),
and no public verb shadows its subpackage."""

from __future__ import annotations

import ast
import pathlib

import tensorprobe

ROOT = pathlib.Path(tensorprobe.__file__).parent


def _modules() -> dict[str, pathlib.Path]:
    mods = {}
    for f in ROOT.rglob("*.py"):
        parts = f.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = f
    return mods


def _imports(name: str, path: pathlib.Path, mods: dict[str, pathlib.Path]) -> set[str]:
    """tensorprobe modules `name` imports anywhere in its code (not under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - (node.level - 1)] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
            names = [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        for full in names:
            while full and full not in mods:
                full = full.rpartition(".")[0]
            if full and full != name and full.startswith("tensorprobe"):
                out.add(full)
    return out


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    mods = _modules()
    edges = {name: _imports(name, path, mods) for name, path in mods.items()}
    assert "tensorprobe.ops" in edges["tensorprobe.nan.in_bundle"]          # the checker sees imports
    assert _cycles(edges) == []


def test_verbs_and_their_subpackages_both_work():
    import inspect

    import tensorprobe as tp
    import tensorprobe.diff.core as core
    import tensorprobe.isolate.passes as passes

    assert core.__name__ == "tensorprobe.diff.core" and passes.__name__ == "tensorprobe.isolate.passes"
    assert "ref" in inspect.signature(tp.diff).parameters and "ref_model" in inspect.signature(tp.isolate).parameters
    assert callable(tp.capture) and callable(tp.compare)
