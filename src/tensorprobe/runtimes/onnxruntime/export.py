"""Export a PyTorch model to ONNX with module scopes stamped on its nodes, so values name themselves back
to the PyTorch module path (`names.py`)."""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ...errors import InputError, TargetError
from ...hooks import module_hooks
from ...modes import eval_mode
from .names import MODULE_OUTPUT_NODES_KEY, MODULE_OUTPUTS_KEY, SCOPE_KEY, VALUE_SCOPES_KEY
from .session import save_model

EXPORTERS = ("dynamo", "legacy")


def export_onnx(model: torch.nn.Module, inputs: tuple, path: Path, *, exporter: str = "dynamo",
                opset: int | None = None, dynamic: bool = False) -> Path:
    """Export `model` to `path` with module scopes kept on every node.

    With the dynamo exporter each node is stamped with its module path and call index
    (`tensorprobe.scope`), taken from the ExportedProgram's `nn_module_stack`. `dynamic=True` leaves every
    input dimension symbolic where the model allows (dynamo: `torch.export.Dim.AUTO`, a dimension the code
    specializes stays fixed; legacy: `dynamic_axes` on every dimension, with no guard: a branch on a size is
    traced for this one), so one file runs inputs of other lengths; the module-output shapes
    stamped for naming are those of `inputs`, so a dynamic export is for plain runs (a sweep's tier 1).

    Example:
        >>> export_onnx(model, (x,), Path("m.onnx"), exporter="dynamo")    # doctest: +SKIP
    """
    with eval_mode(model):      # the exporter wants eval mode; the user's model keeps its own flags after
        return _export_onnx(model, inputs, path, exporter=exporter, opset=opset, dynamic=dynamic)


def _export_onnx(model: torch.nn.Module, inputs: tuple, path: Path, *, exporter: str, opset: int | None,
                 dynamic: bool) -> Path:
    if exporter not in EXPORTERS:
        raise InputError(f"unknown exporter {exporter!r}; choose one of {', '.join(EXPORTERS)}")
    names = _input_names(model, len(inputs))
    kw = {} if opset is None else {"opset_version": opset}
    sink = io.StringIO()
    # The forward first, in PyTorch: a model that cannot run on these inputs (a wrong shape or dtype) is
    # that error, not an exporter's failure. The same run gives the shapes of tuple-returning modules.
    outputs = forward_outputs(model, tuple(inputs))
    try:
        with contextlib.redirect_stdout(sink), warnings.catch_warnings(), torch.no_grad(), _exporter_logs_quiet():
            warnings.simplefilter("ignore")
            if dynamic and exporter == "dynamo":
                kw["dynamic_shapes"] = tuple({d: torch.export.Dim.AUTO for d in range(t.ndim)}
                                             if isinstance(t, torch.Tensor) else None for t in inputs)
            if exporter == "dynamo":
                prog = torch.onnx.export(model, tuple(inputs), dynamo=True, input_names=names, verbose=False, **kw)
                proto = prog.model_proto
                _stamp_scopes(proto, prog.exported_program, model, outputs, tuple(inputs))
                if dynamic:
                    entry = proto.metadata_props.add()
                    entry.key, entry.value = DYNAMIC_DIMS_KEY, json.dumps(dynamic_dims(prog.exported_program))
                save_model(proto, path)
            else:
                if dynamic:         # the trace keeps no guard: every dimension symbolic, valid for any size
                    kw["dynamic_axes"] = {n: {d: f"{n}_{d}" for d in range(t.ndim)}
                                          for n, t in zip(names, inputs) if isinstance(t, torch.Tensor)}
                torch.onnx.export(model, tuple(inputs), str(path), dynamo=False, input_names=names, **kw)
                _add_tuple_shapes(path, outputs.shapes)
                if dynamic:
                    _add_metadata(path, DYNAMIC_DIMS_KEY, json.dumps(
                        {"dims": [[f"{n}_{d}" for d in range(t.ndim)] for n, t in zip(names, inputs)
                                  if isinstance(t, torch.Tensor)], "ranges": {}}))
    except (TargetError, InputError):
        raise
    except Exception as e:
        other = "legacy" if exporter == "dynamo" else "dynamo"
        raise TargetError(f"torch.onnx.export ({exporter} exporter) failed: {export_failure(e)}. "
                          f"Try exporter={other!r}, or export the model yourself and capture the .onnx file") from None
    return path


DYNAMIC_DIMS_KEY = "tensorprobe.dynamic_dims"    # what input shapes a dynamic export is valid for


def dynamic_dims(ep: Any) -> dict[str, Any]:
    """Each user input's dimensions as the export left them (`"4"` fixed, `"s53"` symbolic, `"2*s53"`
    derived) and each symbol's range. The range is the export's guard: code that branches on a length
    (`if x.shape[-1] > 250`) is baked into the graph for one side of the branch and bounds the symbol
    (`s53 <= 250`); ONNX keeps no such guard, so `dims_accept` checks it before a run."""
    users = set(ep.graph_signature.user_inputs)
    dims = [[str(d.node.expr) if isinstance(d, torch.SymInt) else str(int(d)) for d in n.meta["val"].shape]
            for n in ep.graph.nodes if n.op == "placeholder" and n.name in users and "val" in n.meta
            and hasattr(n.meta["val"], "shape")]
    ranges = {}
    for sym, vr in ep.range_constraints.items():
        unbounded = str(vr.upper) in ("int_oo", "oo")       # torch's int_oo says is_finite
        ranges[str(sym)] = [int(vr.lower), None if unbounded else int(vr.upper)]
    return {"dims": dims, "ranges": ranges}


def dims_accept(meta: dict[str, Any], shapes: list[tuple[int, ...]]) -> str | None:
    """None when inputs of `shapes` are within what the dynamic export was made for (`dynamic_dims`); else
    why not, e.g. 's53 = 285 is outside [0, 250]: the model's code depends on this size'.

        >>> dims_accept({"dims": [["1", "s0"], ["2*s0"]], "ranges": {"s0": [2, 250]}}, [(1, 100), (200,)]) is None
        True
        >>> dims_accept({"dims": [["1", "s0"]], "ranges": {"s0": [2, 250]}}, [(1, 285)])
        's0 = 285 is outside [2, 250]: the export fixed what the model does beyond it'
    """
    import sympy

    dims = meta.get("dims", [])
    if len(dims) != len(shapes) or any(len(d) != len(s) for d, s in zip(dims, shapes)):
        return "the inputs' ranks differ from the export's"
    values: dict[str, int] = {}
    for d, s in zip(dims, shapes):
        for expr, size in zip(d, s):
            if expr.isdigit() and int(expr) != size:
                return f"a dimension the export fixed at {expr} is {size}"
            if expr.isidentifier():
                if values.setdefault(expr, size) != size:
                    return f"{expr} is {values[expr]} and {size} in one call"
    for name, (lo, hi) in meta.get("ranges", {}).items():
        v = values.get(name)
        if v is not None and lo == hi and v != lo:
            return (f"{name} = {v}: the dynamo export fixed it at {lo} (the model's code specializes this size, as "
                    f"torch.export does unrolling a recurrent layer over time), so each size is exported on its own; "
                    f"-O exporter=legacy exports with every dimension symbolic")
        if v is not None and (v < lo or (hi is not None and v > hi)):
            return f"{name} = {v} is outside [{lo}, {hi if hi is not None else '∞'}]: the export fixed what the model does beyond it"
    for d, s in zip(dims, shapes):
        for expr, size in zip(d, s):
            if not (expr.isdigit() or expr.isidentifier()):
                free = sympy.sympify(expr)
                if free.free_symbols - {sympy.Symbol(k) for k in values}:
                    return f"cannot evaluate {expr}"
                if int(free.subs({sympy.Symbol(k): v for k, v in values.items()})) != size:
                    return f"a dimension the export derives as {expr} is {size}"
    return None


def forward_outputs(model: torch.nn.Module, inputs: tuple) -> "ModuleOutputs":
    """`module_outputs`, with an exception of the model's own forward as one InputError line."""
    try:
        return module_outputs(model, inputs)
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


def module_chains(ep: Any, model: torch.nn.Module | None = None) -> dict[str, list[tuple[str, int]]]:
    """fx node name -> its module chain [(module path, call index), ...], outermost first, from the
    ExportedProgram's `nn_module_stack`: paths canonical with `model` (a module shared by several parents keeps
    its first name, as in `named_modules()`), a call index per distinct stack entry of the module (`act`,
    `act@1`: its first and second call). What `_stamp_scopes` writes and the isolate overlay reads."""
    alias: dict[str, str] = {}
    if model is not None:
        canonical: dict[int, str] = {}
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
            if (path, key) not in instances:
                instances[(path, key)] = calls.get(canon, -1) + 1
                calls[canon] = instances[(path, key)]
            chain.append((canon, instances[(path, key)]))
        chains[node.name] = chain
    return chains


def _stamp_scopes(proto: Any, ep: Any, model: torch.nn.Module, outputs: "ModuleOutputs", inputs: tuple) -> None:
    """Write each node's module chain into `tensorprobe.scope` metadata, named as PyTorch capture names it.

    Paths are canonical (a module shared by several parents keeps its first name, as in
    `named_modules()`), call indices count calls of the module object in execution order, and the
    output shapes of modules returning several tensors go into the model's metadata, with the graph node
    that computes each output where shapes alone cannot tell them apart (`tied_output_nodes`).
    """
    import json

    chains = module_chains(ep, model)
    fx_name = re.compile(r"^%(\S+) :")
    value_scopes: dict[str, list] = {}
    for node in proto.graph.node:
        md = {p.key: p for p in node.metadata_props}
        m = fx_name.match(md["pkg.torch.onnx.fx_node"].value) if "pkg.torch.onnx.fx_node" in md else None
        if m and m.group(1) in chains:
            entry = node.metadata_props.add()
            entry.key, entry.value = SCOPE_KEY, json.dumps(chains[m.group(1)])
            if chains[m.group(1)]:
                value_scopes.update((o, chains[m.group(1)]) for o in node.output if o)
    entry = proto.metadata_props.add()
    entry.key, entry.value = VALUE_SCOPES_KEY, json.dumps(value_scopes, separators=(",", ":"))
    entry = proto.metadata_props.add()
    entry.key, entry.value = MODULE_OUTPUTS_KEY, json.dumps(outputs.shapes)
    nodes = tied_output_nodes(ep, chains, outputs, inputs)
    if nodes:
        entry = proto.metadata_props.add()
        entry.key, entry.value = MODULE_OUTPUT_NODES_KEY, json.dumps(nodes)


def _add_metadata(path: Path, key: str, value: str) -> None:
    import onnx

    proto = onnx.load(str(path))
    entry = proto.metadata_props.add()
    entry.key, entry.value = key, value
    save_model(proto, path)


def _add_tuple_shapes(path: Path, shapes: dict[str, list[list[int]]]) -> None:
    _add_metadata(path, MODULE_OUTPUTS_KEY, json.dumps(shapes))


@dataclass
class ModuleOutputs:
    """The module calls that return several tensors, from one eager forward."""

    shapes: dict[str, list[list[int]]]      # {"path@call": [shape, ...]}
    tied: dict[str, list[torch.Tensor]]     # calls with two outputs of one shape: their values (LSTMCell's h, c)
    rng_state: torch.Tensor | None = None   # the generator state the forward started from


def module_outputs(model: torch.nn.Module, inputs: tuple) -> ModuleOutputs:
    """Shapes of every module call that returns more than one tensor (one forward); the values too where
    two of them share a shape, since only their values can tell which graph value is which output."""
    from torch.utils._pytree import tree_flatten

    shapes: dict[str, list[list[int]]] = {}
    tied: dict[str, list[torch.Tensor]] = {}
    calls: dict[str, int] = {}

    def hook(path: str):
        def fn(module: Any, args: Any, output: Any) -> None:
            call = calls.get(path, -1) + 1
            calls[path] = call
            flat = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)]
            if len(flat) > 1:
                shapes[f"{path}@{call}"] = [list(t.shape) for t in flat]
                if len({tuple(t.shape) for t in flat}) < len(flat):
                    tied[f"{path}@{call}"] = [t.detach().clone() for t in flat]
        return fn

    state = torch.random.get_rng_state()
    with module_hooks(model.named_modules(), post=hook), torch.no_grad():
        model(*inputs)
    return ModuleOutputs(shapes, tied, state)


def tuple_output_shapes(model: torch.nn.Module, inputs: tuple) -> dict[str, list[list[int]]]:
    """{"path@call": [shape, ...]} for every module call that returns more than one tensor (one forward)."""
    return module_outputs(model, inputs).shapes


def tied_output_nodes(ep: Any, chains: dict[str, list[tuple[str, int]]], outputs: ModuleOutputs,
                      inputs: tuple) -> dict[str, list[str | None]]:
    """{"path@call": [fx node name per output]} for module calls whose outputs share a shape.

    Which value leaving a module's scope is its first output cannot be told by shape, nor by the order the
    graph computes them (`LSTMCell` computes c before h, returns (h, c)). The exported program runs once
    more, keeping only those candidate values, and each output takes the candidate closest to it.
    Any failure leaves the shape-and-order rule in place.
    """
    if not outputs.tied:
        return {}
    keys = {k: (k.rsplit("@", 1)[0], int(k.rsplit("@", 1)[1])) for k in outputs.tied}
    candidates: dict[str, list[str]] = {}
    for node in ep.graph.nodes:
        inside = set(chains.get(node.name, ()))
        for k, key in keys.items():
            if key in inside and any(key not in set(chains.get(u.name, ())) for u in node.users):
                candidates.setdefault(k, []).append(node.name)
    try:
        values = _run_exported(ep, inputs, {n for names in candidates.values() for n in names},
                               outputs.rng_state)
    except Exception:   # a program that will not run eagerly here: keep the order rule
        return {}
    found = {}
    for k, outs in outputs.tied.items():
        free = [n for n in candidates.get(k, []) if n in values]
        picks: list[str | None] = []
        for out in outs:
            same = [n for n in free if tuple(values[n].shape) == tuple(out.shape)]
            best = min(same, key=lambda n: _distance(values[n], out), default=None)
            if best is not None:
                free.remove(best)
            picks.append(best)
        found[k] = picks
    return found


def _run_exported(ep: Any, inputs: tuple, wanted: set[str], rng_state: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The values of the nodes `wanted` when the exported program runs on `inputs`."""
    from torch.export.graph_signature import InputKind
    from torch.utils._pytree import tree_flatten

    user = iter(tree_flatten(inputs)[0])
    args = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            args.append(next(user))
        else:
            args.append(ep.state_dict[spec.target] if spec.target in ep.state_dict else ep.constants[spec.target])
    values: dict[str, torch.Tensor] = {}
    last = max((i for i, n in enumerate(ep.graph.nodes) if n.name in wanted), default=-1)

    class Tap(torch.fx.Interpreter):
        def run_node(self, n: Any) -> Any:
            out = super().run_node(n)
            if n.name in wanted and isinstance(out, torch.Tensor):
                values[n.name] = out.detach().clone()
            self.seen = getattr(self, "seen", 0) + 1
            if self.seen > last:
                raise _Enough   # the rest of the program is not needed
            return out

    after = torch.random.get_rng_state()
    try:
        if rng_state is not None:
            torch.random.set_rng_state(rng_state)   # the eager forward's draws, as far as the program draws alike
        with torch.no_grad():
            Tap(ep.graph_module).run(*args)
    except _Enough:
        pass
    finally:
        torch.random.set_rng_state(after)
    return values


class _Enough(Exception):
    """Stops the exported program once every value wanted is computed."""


def _distance(a: torch.Tensor, b: torch.Tensor) -> float:
    a64, b64 = a.detach().double().nan_to_num(), b.detach().double().nan_to_num()
    return float((a64 - b64).norm() / (b64.norm() + 1e-30))


# ---- inputs ----------------------------------------------------------------------------------------
