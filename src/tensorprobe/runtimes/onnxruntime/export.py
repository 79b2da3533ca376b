"""Export a PyTorch model to ONNX with module scopes stamped on its nodes, so values name themselves back
to the PyTorch module path (`names.py`)."""

from __future__ import annotations

import contextlib
import inspect
import io
import re
import warnings
from pathlib import Path
from typing import Any

import torch

from ...errors import InputError, TargetError
from ...hooks import module_hooks
from .names import MODULE_OUTPUTS_KEY, SCOPE_KEY
from .session import save_model

EXPORTERS = ("dynamo", "legacy")


def export_onnx(model: torch.nn.Module, inputs: tuple, path: Path, *, exporter: str = "dynamo",
                opset: int | None = None) -> Path:
    """Export `model` to `path` with module scopes kept on every node.

    With the dynamo exporter each node is stamped with its module path and call index
    (`tensorprobe.scope`), taken from the ExportedProgram's `nn_module_stack`.

    Example:
        >>> export_onnx(model, (x,), Path("m.onnx"), exporter="dynamo")    # doctest: +SKIP
    """
    if exporter not in EXPORTERS:
        raise InputError(f"unknown exporter {exporter!r}; choose one of {', '.join(EXPORTERS)}")
    names = _input_names(model, len(inputs))
    kw = {} if opset is None else {"opset_version": opset}
    sink = io.StringIO()
    model = model.eval()
    # The forward first, in PyTorch: a model that cannot run on these inputs (a wrong shape or dtype) is
    # that error, not an exporter's failure. The same run gives the shapes of tuple-returning modules.
    shapes = forward_shapes(model, tuple(inputs))
    try:
        with contextlib.redirect_stdout(sink), warnings.catch_warnings(), torch.no_grad(), _exporter_logs_quiet():
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                prog = torch.onnx.export(model, tuple(inputs), dynamo=True, input_names=names, verbose=False, **kw)
                proto = prog.model_proto
                _stamp_scopes(proto, prog.exported_program, model, shapes)
                save_model(proto, path)
            else:
                torch.onnx.export(model, tuple(inputs), str(path), dynamo=False, input_names=names, **kw)
                _add_tuple_shapes(path, shapes)
    except (TargetError, InputError):
        raise
    except Exception as e:
        other = "legacy" if exporter == "dynamo" else "dynamo"
        raise TargetError(f"torch.onnx.export ({exporter} exporter) failed: {export_failure(e)}. "
                          f"Try exporter={other!r}, or export the model yourself and capture the .onnx file") from None
    return path


def forward_shapes(model: torch.nn.Module, inputs: tuple) -> dict[str, list[list[int]]]:
    """`tuple_output_shapes`, with an exception of the model's own forward as one InputError line."""
    try:
        return tuple_output_shapes(model, inputs)
    except (TargetError, InputError):
        raise
    except Exception as e:
        raise InputError(f"the model's forward raised {type(e).__name__}: {_first_line(e)} "
                         "(run in PyTorch before exporting)") from None


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _first_line(e: BaseException) -> str:
    text = _ANSI.sub("", str(e)).strip()
    return text.splitlines()[0].strip() if text else type(e).__name__


def export_failure(e: BaseException) -> str:
    r"""What went wrong in an export, in one line: the root cause's message where the exporter wraps it in
    its generic "Failed to export the model with torch.export ... Next steps" text (no terminal colours).

    >>> export_failure(RuntimeError("Failed to export the model with torch.export. \x1b[96mThis is step 1/3\x1b[0m"))
    'Failed to export the model with torch.export. This is step 1/3'
    """
    cause = e
    while cause.__cause__ is not None and _first_line(cause).startswith("Failed to export"):
        cause = cause.__cause__
    line = _first_line(cause)
    return f"{type(cause).__name__}: {line}" if cause is not e else line


@contextlib.contextmanager
def _exporter_logs_quiet():
    """Under the CLI's quiet mode, torch's own error log lines (`E1125 ... always_classified is unsupported`)
    and the graphs it dumps on stderr when tracing fails are the exporter talking to itself: the failure is
    said once, in our error. Library users keep theirs."""
    import logging

    from ...logs import is_quiet

    if not is_quiet():
        yield
        return
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


def _input_names(model: torch.nn.Module, n: int) -> list[str]:
    params = [p for p in inspect.signature(model.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [p.name for p in params[:n]]
    return names + [f"input_{i}" for i in range(len(names), n)]


def _stamp_scopes(proto: Any, ep: Any, model: torch.nn.Module, shapes: dict[str, list[list[int]]]) -> None:
    """Write each node's module chain into `tensorprobe.scope` metadata, named as PyTorch capture names it.

    Paths are canonical (a module shared by several parents keeps its first name, as in
    `named_modules()`), call indices count calls of the module object in execution order, and the
    output shapes of modules returning several tensors go into the model's metadata.
    """
    import json

    canonical: dict[int, str] = {}
    alias: dict[str, str] = {}
    for path, mod in model.named_modules(remove_duplicate=False):
        alias[path] = canonical.setdefault(id(mod), path)
    instances: dict[tuple[str, str], int] = {}
    calls: dict[str, int] = {}
    chains: dict[str, list[tuple[str, int]]] = {}
    for node in ep.graph.nodes:
        chain = []
        for key, val in (node.meta.get("nn_module_stack") or {}).items():
            path = val[0] if isinstance(val, tuple) else ""
            if not path:
                continue
            canon = alias.get(path, path)
            inst = (path, key)
            if inst not in instances:
                instances[inst] = calls.get(canon, -1) + 1
                calls[canon] = instances[inst]
            chain.append((canon, instances[inst]))
        chains[node.name] = chain
    fx_name = re.compile(r"^%(\S+) :")
    for node in proto.graph.node:
        md = {p.key: p for p in node.metadata_props}
        m = fx_name.match(md["pkg.torch.onnx.fx_node"].value) if "pkg.torch.onnx.fx_node" in md else None
        if m and m.group(1) in chains:
            entry = node.metadata_props.add()
            entry.key, entry.value = SCOPE_KEY, json.dumps(chains[m.group(1)])
    entry = proto.metadata_props.add()
    entry.key, entry.value = MODULE_OUTPUTS_KEY, json.dumps(shapes)


def _add_tuple_shapes(path: Path, shapes: dict[str, list[list[int]]]) -> None:
    import json

    import onnx

    proto = onnx.load(str(path))
    entry = proto.metadata_props.add()
    entry.key, entry.value = MODULE_OUTPUTS_KEY, json.dumps(shapes)
    save_model(proto, path)


def tuple_output_shapes(model: torch.nn.Module, inputs: tuple) -> dict[str, list[list[int]]]:
    """{"path@call": [shape, ...]} for every module call that returns more than one tensor (one forward)."""
    from torch.utils._pytree import tree_flatten

    shapes: dict[str, list[list[int]]] = {}
    calls: dict[str, int] = {}

    def hook(path: str):
        def fn(module: Any, args: Any, output: Any) -> None:
            call = calls.get(path, -1) + 1
            calls[path] = call
            flat = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)]
            if len(flat) > 1:
                shapes[f"{path}@{call}"] = [list(t.shape) for t in flat]
        return fn

    with module_hooks(model.named_modules(), post=hook), torch.no_grad():
        model(*inputs)
    return shapes


# ---- inputs ----------------------------------------------------------------------------------------
