"""TVM (Relax) runtime adapter: `torch.export` -> Relax -> `tvm.compile(target="llvm")` -> VirtualMachine on CPU.

What is captured:
- module outputs (default, `taps=True`): every submodule call's output is an extra output of the exported
  graph (`exported.TappedModule`), named exactly like PyTorch's module-level capture
  (`generator.noise_res.0.adain1.0.norm`), so `diff`/`nan` line them up with a PyTorch reference;
- kernel outputs (`kernels=True`): the Relax VM's instrument hook sees every compiled kernel call; each
  kernel's output buffer becomes a record `<root>/<kernel>.<k>` with the kernel symbol (e.g.
  `fused_conv1d_add`) as `runtime_name`. Fused kernels have no PyTorch module path.

Import rewrites (see `exported.REWRITES`, each exact and re-checked in PyTorch on the given inputs):
`x[mask] = v` -> `torch.where` (TVM's index_put needs integer indices) and integer `clamp` bounds of
None -> the dtype's limits (TVM casts ±inf to int and fails; from `F.interpolate(mode="linear")`).
Random ops are not importable; `random="zeros"` replaces them by zeros when that provably leaves the
output unchanged. Anything else TVM cannot import is reported by op name (InputError).

    >>> from tensorprobe.runtimes import get_runtime                                   # doctest: +SKIP
    >>> b = get_runtime("tvm").capture(model, inputs, out="tvm_bundle")                # doctest: +SKIP
    >>> tensorprobe.nan.find_nonfinite_in_bundle(b).record                             # doctest: +SKIP
    'generator.noise_res.0.adain1.0.norm'
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from ..bundle import atomic_write_bytes
from ..errors import InputError
from ..logs import native_stderr_silenced
from ..record import KIND_MODEL_OUTPUT
from .base import RuntimeAdapter, RuntimeTensor, Selection
from .exported import TapInfo, check_equivalent, export_tapped, rewrite_for_import, unsupported_ops_message

# Kernel symbols of the VM's own bookkeeping (allocation, shape checks): not numerical results.
_VM_BUILTIN_PREFIX = "vm.builtin."


@dataclass
class TvmArtifact:
    executable: Any
    taps: TapInfo
    target: str
    rewrites: dict[str, int]
    kernels: bool = False     # record every compiled kernel's output (run option)


class TvmAdapter(RuntimeAdapter):
    """Capture a model compiled by TVM Relax for CPU (`llvm`)."""

    name = "tvm"
    package = "tvm"
    extra = "tvm"
    artifact_suffixes = (".so",)

    def __init__(self, *, kernels: bool = False):
        self.kernels = kernels

    def _prepare(self, model: torch.nn.Module, inputs: tuple, workdir: Path, *, taps: bool = True,
                 target: str = "llvm", random: str = "keep", kernels: bool | None = None,
                 save: str | None = None) -> TvmArtifact:
        ep, info = export_tapped(model, inputs, taps=taps)
        executable, rewrites, replaced = compile_program(ep, inputs, target=target, random=random,
                                                         n_outputs=info.n_outputs)
        info = replace(info, replaced=replaced)
        if save:
            save_artifact(executable, info, Path(save))
        return TvmArtifact(executable, info, target, rewrites, self.kernels if kernels is None else kernels)

    def _load(self, path: Path, *, kernels: bool | None = None) -> TvmArtifact:
        """Open a library written with `save=`: `model.so` plus its `model.so.taps.json` (output names)."""
        import tvm

        if not path.exists():
            raise InputError(f"{path}: no such TVM library")
        meta = path.with_name(path.name + ".taps.json")
        info = TapInfo.from_dict(json.loads(meta.read_text())) if meta.exists() else TapInfo.untapped(1 << 30)
        return TvmArtifact(tvm.runtime.load_module(str(path)), info, "loaded", {},
                           self.kernels if kernels is None else kernels)

    def _run(self, artifact: TvmArtifact, inputs: Any, selection: Selection) -> Iterator[RuntimeTensor]:
        from tvm import relax

        import tvm

        vm = relax.VirtualMachine(artifact.executable, tvm.cpu())
        kernel_records: list[RuntimeTensor] = []
        if artifact.kernels:
            vm.set_instrument(_kernel_recorder(kernel_records))
        outs = vm["main"](*[tvm.runtime.tensor(_np(x)) for x in _values(inputs)])
        yield from kernel_records
        yield from _program_outputs(artifact.taps, _flatten_tvm(outs))

    def runtime_info(self, artifact: TvmArtifact | None = None) -> dict[str, Any]:
        import tvm

        return {"name": self.name, "version": tvm.__version__, "target": "llvm"}

    def import_error(self, model: torch.nn.Module, inputs: tuple) -> str | None:
        """What TVM's Relax importer says of `model` (None: it imports), without compiling it."""
        self.require()
        return _import_error(model, inputs)

    def run_module(self, module: torch.nn.Module, inputs: tuple, **options: Any) -> list[np.ndarray]:
        """Compile `module` alone and return its outputs (for `components.isolate_components`)."""
        import tvm
        from tvm import relax

        self.require()
        ep, _ = export_tapped(module, inputs, taps=False)
        executable, _, _ = compile_program(ep, inputs, target=options.get("target", "llvm"),
                                        random=options.get("random", "keep"))
        vm = relax.VirtualMachine(executable, tvm.cpu())
        return [t.numpy() for t in _flatten_tvm(vm["main"](*[tvm.runtime.tensor(_np(x)) for x in inputs]))]


def import_program(ep: Any, inputs: tuple, *, random: str = "keep",
                   n_outputs: int | None = None) -> tuple[Any, dict, tuple[int, ...]]:
    """Rewrite an ExportedProgram and import it into Relax. Returns (IRModule, rewrite counts, indices of the
    taps that the random->zeros rewrite changed); InputError with the importer's complaint."""
    from tvm.relax.frontend.torch import from_exported_program

    rewritten, counts = rewrite_for_import(ep, random=random)
    changed = check_equivalent(ep, rewritten, inputs, n_outputs=n_outputs) if counts else ()
    missing = _unsupported(rewritten)
    if missing:
        raise InputError(unsupported_ops_message("TVM Relax", missing, counts))
    try:
        return from_exported_program(rewritten, run_ep_decomposition=False), counts, changed
    except Exception as e:  # the importer raises TypeError/AssertionError/TVMError with the op in the text
        raise InputError(f"TVM Relax could not import the graph: {type(e).__name__}: {_first_line(e)}") from None


def _import_error(model: torch.nn.Module, inputs: tuple) -> str | None:
    try:
        ep, _ = export_tapped(model, inputs, taps=False)
        import_program(ep, inputs)
    except InputError as e:
        return str(e)
    return None


def compile_program(ep: Any, inputs: tuple, *, target: str = "llvm", random: str = "keep",
                    n_outputs: int | None = None) -> tuple[Any, dict, tuple[int, ...]]:
    """Rewrite, import and compile an ExportedProgram for `target`. Returns (executable, rewrite counts,
    indices of the taps that the random->zeros rewrite changed)."""
    import tvm

    mod, counts, changed = import_program(ep, inputs, random=random, n_outputs=n_outputs)
    try:
        with native_stderr_silenced():
            return tvm.compile(mod, target=target), counts, changed
    except Exception as e:
        raise InputError(f"TVM could not compile the graph for {target!r}: {type(e).__name__}: "
                         f"{_first_line(e)}") from None


def save_artifact(executable: Any, info: TapInfo, path: Path) -> None:
    """Write the compiled library and the names of its outputs next to it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    executable.export_library(str(path))
    atomic_write_bytes(path.with_name(path.name + ".taps.json"), json.dumps(info.to_dict()).encode())


def _unsupported(ep: Any) -> list[str]:
    from tvm.relax.frontend.torch.exported_program_translator import ExportedProgramImporter

    known = ExportedProgramImporter().create_convert_map()
    ops = {n.target.__name__ for n in ep.graph.nodes
           if n.op == "call_function" and hasattr(n.target, "_schema")}
    return sorted(op for op in ops if op not in known)


def _kernel_recorder(out: list[RuntimeTensor]):
    counts: dict[str, int] = {}

    def instrument(func, symbol, before_run, ret_value, *args):
        symbol = str(symbol)
        if before_run or symbol.startswith(_VM_BUILTIN_PREFIX) or not args:
            return 0
        last = args[-1]  # destination-passing style: the last argument is the output buffer
        if hasattr(last, "numpy") and hasattr(last, "shape"):
            k = counts.get(symbol, 0)
            counts[symbol] = k + 1
            out.append(RuntimeTensor(runtime_name=symbol, module="", op=f"tvm.{symbol}",
                                     value=last.numpy().copy(), name=f"<root>/{symbol}.{k}"))
        return 0

    return instrument


def _program_outputs(taps: TapInfo, outs: list[Any]) -> Iterator[RuntimeTensor]:
    values = [t.numpy() for t in outs]
    for i, name, module, consumed in taps.records():
        if i < len(values):
            yield RuntimeTensor(runtime_name=f"main:output[{i}]", module=module, op="tvm.output",
                                value=values[i], name=name, inputs=consumed, tags=taps.tags(i))
    for i, name in taps.model_outputs():
        if i < len(values):
            yield RuntimeTensor(runtime_name=f"main:output[{i}]", module="", op="output", value=values[i], name=name,
                                tags=taps.tags(i), kind=KIND_MODEL_OUTPUT)


def _flatten_tvm(value: Any) -> list[Any]:
    if hasattr(value, "numpy"):
        return [value]
    out: list[Any] = []
    for v in value:
        out.extend(_flatten_tvm(v))
    return out


def _values(inputs: Any) -> list[Any]:
    return list(inputs.values()) if isinstance(inputs, dict) else list(inputs)


def _np(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _first_line(e: BaseException) -> str:
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return lines[-1] if lines else ""
