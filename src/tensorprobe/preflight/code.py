"""Lint from the code: export the model the way the target does and list what it will trip on.

For `torch.export` targets (ExecuTorch, TVM, Core ML) the program is exported and decomposed to Core ATen
as their front ends do; every op left outside Core ATen, every random op, every complex value or FFT and
every weight norm computed at run time is a finding, with its module path and source line. For ONNX the
model goes through `torch.onnx.export` and what the exporter rejects is the finding. The export itself is
the test: nothing here is a hand-made list of unsupported ops.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import Any

import torch

from ..ops import ALIAS_OPS, RNG_OPS
from .findings import ERROR, INFO, WARNING, Finding, Target

# Ops that are bookkeeping of an exported program, not computation.
_IGNORED = {"_assert_tensor_metadata", "_assert_scalar", "sym_size", "sym_numel", "sym_storage_offset"}
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_TORCH_DIR = os.path.dirname(torch.__file__)
_OWN_DIR = os.path.dirname(os.path.dirname(__file__))

FIXES = {
    "random_op": "replace the draw by a recorded buffer (tensorprobe rewrite --rules record_random) or a noise "
                 "input, or zero it when the output does not depend on it (-O random=zeros)",
    "complex": "use a real-valued STFT/iSTFT made of convolutions (tensorprobe rewrite --rules conv_stft for "
               "iSTFTNet-style TorchSTFT modules; Kokoro's own disable_complex=True path)",
    "weight_norm": "fold the weight norm into plain weights (torch.nn.utils.remove_weight_norm, or "
                   "parametrize.remove_parametrizations)",
    "non_core_op": "rewrite it with Core ATen ops, or check that the target's backend has a kernel for it",
    "data_dependent_shape": "give the runtime a static shape: pad to a maximum and mask, or move the op outside "
                            "the exported graph",
    "input_mutation": "work on a copy (x = x.clone()) or return the new value instead of writing into the input",
    "constant": "compute it once: a Python float, or a buffer registered in __init__",
}


def lint_code(model: torch.nn.Module, inputs: tuple, target: Target, *,
              importer: bool = True) -> tuple[list[Finding], bool | None, str | None]:
    """Findings from exporting `model` for `target`, whether the export went through, and a note on the
    import check (`importer`: hand the export to the target's importer where its runtime is installed)."""
    findings = _weight_norms(model)
    if target.exporter == "torch.export":
        found, ok = _torch_export(model, inputs, target)
        normed = _weight_normed(model)   # their norm ops are the weight-norm finding, said once
        found = [f for f in found if not (f.kind == "non_core_op" and f.module in normed)]
    elif target.exporter == "torch.onnx":
        found, ok = _onnx_export(model, inputs)
    else:
        found, ok = [], None
    note = None
    if ok and importer and target.runtime:
        found_import, note = _import_check(model, inputs, target)
        found += found_import
    return findings + found, ok, note


def _import_check(model: torch.nn.Module, inputs: tuple, target: Target) -> tuple[list[Finding], str]:
    from ..runtimes import get_runtime

    adapter = get_runtime(target.runtime)
    if not adapter.available() or not adapter.can_check_import():
        return [], f"import check: {adapter.package} is not installed"
    error = adapter.import_error(model, inputs)
    if error is None:
        return [], f"import check: {target.runtime} takes the exported model"
    return [Finding("import_error", ERROR, f"{target.runtime} rejects the exported model: {error}",
                    fix="see the error; the findings above name the rewrites for what it usually rejects")], \
        f"import check: {target.runtime} rejects the exported model"


def _torch_export(model: torch.nn.Module, inputs: tuple, target: Target) -> tuple[list[Finding], bool]:
    try:
        with torch.no_grad():
            ep = torch.export.export(model, tuple(inputs), strict=False)
            ep = ep.run_decompositions()        # to Core ATen, as ExecuTorch's to_edge and TVM's importer do
    except Exception as e:
        return [Finding("export_error", ERROR, f"torch.export rejects the model: {_first_line(e)}",
                        fix="see the error; `tensorprobe preflight --target onnx` tries the ONNX exporter")], False
    seen: Counter = Counter()
    first: dict[tuple, Finding] = {}
    for node in ep.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        finding = _node_finding(node, target)
        if finding is None:
            continue
        key = (finding.kind, finding.op, finding.module, finding.source)
        seen[key] += 1
        first.setdefault(key, finding)
    out = [Finding(**{**f.__dict__, "count": seen[k]}) for k, f in first.items()]
    return _merge_complex(out) + _input_mutations(ep) + _constants(ep), True


def _node_finding(node: Any, target: Target) -> Finding | None:
    op = node.target
    base = op._schema.name.split("::")[-1]
    if base in _IGNORED:
        return None
    val = node.meta.get("val")
    module, mtype = _module_of(node)
    where = dict(module=module, source=_source_of(node), op=str(op))
    if base in RNG_OPS:
        rejected = "" if target.random_ops else f"{target.name}'s importer rejects it, and "
        return Finding("random_op", WARNING if target.random_ops else ERROR,
                       f"random op {base} inside the graph ({mtype or 'root'}): {rejected}another runtime draws "
                       "other numbers, so outputs cannot be compared", fix=FIXES["random_op"], rule="record_random",
                       **where)
    if "fft" in base or "stft" in base or (getattr(val, "dtype", None) is not None and val.dtype.is_complex):
        return Finding("complex", ERROR, f"complex tensors / FFT ({base}): ExecuTorch, TVM and Core ML have no "
                       "complex dtype", fix=FIXES["complex"], **where)
    if base == "_local_scalar_dense" or _unbacked(val):
        return Finding("data_dependent_shape", WARNING, f"{base} makes a shape (or a Python number) from the "
                       "values of a tensor: static-shape runtimes (Core ML, TVM, ExecuTorch's memory planner) need "
                       "an upper bound for it", fix=FIXES["data_dependent_shape"], **where)
    if torch.Tag.core not in op.tags:
        return Finding("non_core_op", WARNING, f"{base} is not a Core ATen op: the target needs its own kernel or "
                       "a decomposition for it", fix=FIXES["non_core_op"], **where)
    return None


def _unbacked(val: Any) -> bool:
    """An output whose shape holds a symbol only known at run time (torch.export's unbacked `u0`, `u1`…)."""
    for v in val if isinstance(val, (list, tuple)) else (val,):
        for d in getattr(v, "shape", ()):
            if isinstance(d, torch.SymInt) and any(str(s).startswith("u") for s in d.node.expr.free_symbols):
                return True
    return False


def _input_mutations(ep: Any) -> list[Finding]:
    mutated = sorted(set(ep.graph_signature.user_inputs_to_mutate.values()))
    return [Finding("input_mutation", WARNING, f"the forward writes into its input {name} in place: the exported "
                    "program copies the new value back as an extra output, which runtimes drop or reject",
                    evidence={"input": name}, fix=FIXES["input_mutation"]) for name in mutated]


# Ops that make a tensor from nothing (their operands are Python numbers): the leaves of a constant expression.
_CREATION_OPS = {"arange", "full", "zeros", "ones", "scalar_tensor", "empty", "linspace", "eye", "lift_fresh_copy"}


def _constants(ep: Any) -> list[Finding]:
    """Computations whose every tensor operand is a constant: folded once, they would cost nothing."""
    const_names = {spec.arg.name for spec in ep.graph_signature.input_specs
                   if spec.kind == torch.export.graph_signature.InputKind.CONSTANT_TENSOR}
    constant: set[str] = set()
    lines: Counter = Counter()
    first: dict[tuple, Any] = {}
    for node in ep.graph.nodes:
        if node.op == "placeholder":
            if node.name in const_names:
                constant.add(node.name)
            continue
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        operands = [a for a in node.all_input_nodes]
        base = node.target._schema.name.split("::")[-1]
        if base in RNG_OPS:
            continue
        if (not operands and base in _CREATION_OPS) or (operands and all(a.name in constant for a in operands)):
            constant.add(node.name)
            if operands and base not in _IGNORED and base not in ALIAS_OPS:   # creations and views are cheap
                key = (_module_of(node)[0], _source_of(node))
                lines[key] += 1
                first.setdefault(key, base)
    return [Finding("constant", INFO, f"{lines[key]} op(s) ({first[key]}…) compute a constant at every run",
                    module=key[0], source=key[1], op=first[key], count=lines[key], fix=FIXES["constant"])
            for key in lines]


def _merge_complex(findings: list[Finding]) -> list[Finding]:
    """An STFT shows up as a dozen complex ops on one source line: one finding per line, ops counted."""
    by_line: dict[tuple, list[Finding]] = {}
    rest = []
    for f in findings:
        (by_line.setdefault((f.module, f.source), []) if f.kind == "complex" else rest).append(f)
    for (module, source), group in by_line.items():
        ops = sorted({f.op.split(".")[1] for f in group if f.op})
        rest.append(Finding("complex", ERROR, f"complex tensors / FFT ({', '.join(ops)}): ExecuTorch, TVM and "
                            "Core ML have no complex dtype", module=module, source=source, op=group[0].op,
                            count=sum(f.count for f in group), fix=FIXES["complex"], rule="conv_stft"))
    return rest


def _weight_norms(model: torch.nn.Module) -> list[Finding]:
    paths = [path for path, m in model.named_modules()
             if (hasattr(m, "weight_g") and hasattr(m, "weight_v")) or torch.nn.utils.parametrize.is_parametrized(m, "weight")]
    if not paths:
        return []
    shown = ", ".join(paths[:4]) + (f" and {len(paths) - 4} more" if len(paths) > 4 else "")
    return [Finding("weight_norm", INFO, f"weight norm computed at run time in {len(paths)} module(s) ({shown}): a "
                    "norm and a division per forward, and weights an int8 quantizer cannot see", count=len(paths),
                    evidence={"modules": paths}, fix=FIXES["weight_norm"], rule="fold_weight_norm")]


def _weight_normed(model: torch.nn.Module) -> set[str]:
    return {path for path, m in model.named_modules() if hasattr(m, "weight_g")
            or torch.nn.utils.parametrize.is_parametrized(m, "weight")}


def _onnx_export(model: torch.nn.Module, inputs: tuple) -> tuple[list[Finding], bool]:
    import tempfile
    from pathlib import Path

    from ..runtimes.onnxruntime import export_onnx

    with tempfile.TemporaryDirectory(prefix="tensorprobe-preflight-") as d:
        try:
            export_onnx(model, tuple(inputs), Path(d) / "m.onnx", exporter="dynamo")
        except Exception as e:
            return [Finding("export_error", ERROR, f"torch.onnx.export rejects the model: {_first_line(e)}")], False
    return [], True


def _module_of(node: Any) -> tuple[str, str]:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, mtype = list(stack.values())[-1]
    path = re.sub(r"^L\['self'\]\.?", "", str(path))
    return path, str(mtype).rsplit(".", 1)[-1]


def _source_of(node: Any) -> str | None:
    """The innermost frame of the user's (or the model package's) code in the node's stack trace."""
    frames = _FRAME.findall(node.meta.get("stack_trace") or "")
    for fn, line, func in reversed(frames):
        if not fn.startswith("<") and not fn.startswith(_TORCH_DIR) and not fn.startswith(_OWN_DIR):
            return f"{fn}:{line} ({func})"
    return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0] if text else ''}"[:300]
