"""ExecuTorch runtime adapter: `torch.export` -> edge (portable kernels or XNNPACK) -> `.pte` -> ExecuTorch runtime.

Two sources of intermediates, both named with the record grammar:
- ETDump debug buffer (ExecuTorch's own devtools): the runtime writes the output of every instruction it
  executes outside a delegate; ETRecord (written at lowering time) maps each instruction's debug handle back
  to the nn.Module stack. Each becomes `<module path>/<op>.<k>` (e.g. `norm/_native_batch_norm_legit.0:2`),
  with the ETDump event name and debug handle as `runtime_name`. A delegate (XNNPACK) shows only its outputs.
- module taps (`taps=True`, default): every submodule call's output is an extra program output
  (`exported.TappedModule`), named exactly like PyTorch's module-level capture. This also reaches inside
  delegated regions, since a tapped value must leave the delegate.

Both are merged in execution order (a module output follows the instruction that produced it).

    >>> from tensorprobe.runtimes import get_runtime                                    # doctest: +SKIP
    >>> b = get_runtime("executorch").capture(model, inputs, out="et_bundle")           # doctest: +SKIP
    >>> b2 = get_runtime("executorch-xnnpack").capture(model, inputs, out="et_xnn")     # doctest: +SKIP
"""

from __future__ import annotations

import io
import json
import tempfile
from contextlib import redirect_stdout
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from ..bundle import atomic_write_bytes
from ..errors import InputError
from ..logs import native_stderr_silenced
from ..record import KIND_MODEL_OUTPUT, TAG_OPAQUE, TAG_RANDOM_REPLACED, short_op
from .base import RuntimeAdapter, RuntimeTensor, Selection
from .exported import (RANDOM_REWRITE, RANDOM_TO_ZEROS_OPS, TapInfo, check_equivalent, export_tapped,
                       rewrite_for_import)

# Edge ops that only move data: never the "main" op of an instruction.
_MOVE_OPS = ("view_copy", "permute_copy", "expand_copy", "squeeze_copy", "unsqueeze_copy", "clone", "getitem",
             "alias_copy", "_to_copy", "slice_copy", "select_copy")
_MIN_DEBUG_BUFFER = 16 << 20


@dataclass
class PteArtifact:
    pte: Path
    etrecord: Path | None
    taps: TapInfo
    debug_buffer_size: int
    random_zeros: bool = False  # rand/randn were replaced by zeros (random="zeros")


class ExecuTorchAdapter(RuntimeAdapter):
    """Capture a model lowered to ExecuTorch (portable kernels; `backend="xnnpack"` to delegate).

    Options of `capture`: `taps` (module outputs as extra program outputs, default True), `backend`,
    `save` (keep the `.pte`, `.etrecord` and `.taps.json` at this path), `random="zeros"` (ExecuTorch has
    no kernels for `rand`/`randn`: replace them by zeros, allowed only when the model's output is then
    unchanged in PyTorch, which is checked).
    """

    name = "executorch"
    package = "executorch"
    extra = "executorch"
    artifact_suffixes = (".pte",)
    backend = "portable"

    def _prepare(self, model: torch.nn.Module, inputs: tuple, workdir: Path, *, taps: bool = True,
                 backend: str | None = None, save: str | None = None, random: str = "keep") -> PteArtifact:
        backend = backend or self.backend
        ep, info = export_tapped(model, inputs, taps=taps)
        random_zeros = False
        if random == "zeros":  # ExecuTorch has no random kernels; allowed only where the output ignores them
            rewritten, counts = rewrite_for_import(ep, random="zeros")
            changed = check_equivalent(ep, rewritten, inputs, n_outputs=info.n_outputs) if counts else ()
            ep, info = rewritten, replace(info, replaced=changed)
            random_zeros = bool(counts.get(RANDOM_REWRITE[0]))
        elif random != "keep":
            raise InputError(f"unknown random={random!r}; use 'keep' or 'zeros'")
        pte = Path(save) if save else workdir / "model.pte"
        etrecord = pte.with_suffix(".etrecord")
        lower_to_pte(ep, pte, backend=backend, etrecord=etrecord)
        atomic_write_bytes(pte.with_suffix(".taps.json"), json.dumps(info.to_dict()).encode())
        buffer = _buffer_size(ep)
        # what a later `load` of this file needs to run it as this call would (a sweep's shared export cache)
        atomic_write_bytes(pte.with_suffix(".run.json"),
                           json.dumps({"debug_buffer_size": buffer, "random_zeros": random_zeros}).encode())
        return PteArtifact(pte, etrecord, info, buffer, random_zeros)

    def _load(self, path: Path, *, debug_buffer_mb: int | None = None, **options: Any) -> PteArtifact:
        """Open `model.pte`, with `model.etrecord`, `model.taps.json` and `model.run.json` (the debug buffer
        it needs, whether its random ops were replaced) beside it when they exist."""
        if not path.exists():
            raise InputError(f"{path}: no such .pte file")
        etrecord = path.with_suffix(".etrecord")
        meta, run = path.with_suffix(".taps.json"), path.with_suffix(".run.json")
        info = TapInfo.from_dict(json.loads(meta.read_text())) if meta.exists() else TapInfo.untapped(1 << 30)
        facts = json.loads(run.read_text()) if run.exists() else {}
        buffer = (debug_buffer_mb << 20 if debug_buffer_mb is not None
                  else int(facts.get("debug_buffer_size", 512 << 20)))
        return PteArtifact(path, etrecord if etrecord.exists() else None, info, buffer,
                           bool(facts.get("random_zeros", False)))

    def _run(self, artifact: PteArtifact, inputs: Any, selection: Selection) -> Iterator[RuntimeTensor]:
        values = [_torch(v) for v in (inputs.values() if isinstance(inputs, dict) else inputs)]
        outputs, events = run_pte(artifact, values)
        outs = _program_outputs(artifact.taps, outputs)
        yield from _merge(events, outs, artifact.random_zeros)

    def runtime_info(self, artifact: PteArtifact | None = None) -> dict[str, Any]:
        from executorch import version

        return {"name": self.name, "version": version.__version__, "backend": self.backend}

    def import_error(self, model: torch.nn.Module, inputs: tuple) -> str | None:
        """What ExecuTorch's lowering (`to_edge_transform_and_lower`, `to_executorch`) says of `model` (None:
        it lowers), without running it."""
        self.require()
        try:
            ep, _ = export_tapped(model, inputs, taps=False)
            with tempfile.TemporaryDirectory(prefix="tensorprobe-et-") as d:
                lower_to_pte(ep, Path(d) / "m.pte", backend=self.backend, etrecord=None)
        except InputError as e:
            return str(e)
        return None

    def run_module(self, module: torch.nn.Module, inputs: tuple, **options: Any) -> list[np.ndarray]:
        """Lower `module` alone, run it, return its outputs (for `components.isolate_components`)."""
        self.require()
        ep, _ = export_tapped(module, inputs, taps=False)
        with tempfile.TemporaryDirectory(prefix="tensorprobe-et-") as d:
            pte = Path(d) / "m.pte"
            lower_to_pte(ep, pte, backend=options.get("backend", self.backend), etrecord=None)
            from executorch.runtime import Runtime

            with native_stderr_silenced():
                method = Runtime.get().load_program(str(pte)).load_method("forward")
                return [_torch(t).numpy() for t in method.execute([_torch(x) for x in inputs])]


class ExecuTorchXnnpackAdapter(ExecuTorchAdapter):
    """ExecuTorch with the XNNPACK partitioner (what a mobile CPU port uses)."""

    name = "executorch-xnnpack"
    backend = "xnnpack"


def lower_to_pte(ep: Any, pte: Path, *, backend: str = "portable", etrecord: Path | None = None) -> None:
    """Lower an ExportedProgram to a `.pte` (and its ETRecord); InputError naming the stage that failed."""
    from executorch.exir import to_edge_transform_and_lower

    partitioners = []
    if backend == "xnnpack":
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import XnnpackPartitioner

        partitioners = [XnnpackPartitioner()]
        ep = ep.run_decompositions()  # eval-mode dropout becomes the clone that _drop_clones removes
        _drop_clones(ep)
    elif backend != "portable":
        raise InputError(f"unknown ExecuTorch backend {backend!r}; use 'portable' or 'xnnpack'")
    try:
        edge = to_edge_transform_and_lower(ep, partitioner=partitioners, generate_etrecord=etrecord is not None)
        program = edge.to_executorch()
    except Exception as e:  # exir raises many error types; the first line names the op
        hint = ("; random ops can be replaced by zeros with random='zeros' when the output does not depend on "
                "them (checked)") if "aten.rand" in str(e) else ""
        raise InputError(f"ExecuTorch could not lower the graph ({backend}): {type(e).__name__}: "
                         f"{_first_line(e)}{hint}") from None
    pte.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(pte, program.buffer)
    if etrecord is not None:
        program.get_etrecord().save(str(etrecord))


def _drop_clones(ep: Any) -> int:
    """Replace every layout-preserving `clone` of the exported graph by its input (exact: the graph is
    functional). An eval-mode dropout traces to such a clone; inside an XNNPACK partition it is a no-op,
    and when its value is a program output (a module tap) the partition returns its own input, which
    XNNPACK refuses ("pass through arguments": the tapped Kokoro decoder failed to lower that way)."""
    graph = ep.graph_module.graph
    dropped = 0
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target == torch.ops.aten.clone.default \
                and node.kwargs.get("memory_format") in (None, torch.preserve_format):
            node.replace_all_uses_with(node.args[0])
            graph.erase_node(node)
            dropped += 1
    if dropped:
        graph.lint()
        ep.graph_module.recompile()
    return dropped


def run_pte(artifact: PteArtifact, inputs: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[Any]]:
    """Execute with ETDump + debug buffer; return (program outputs, Inspector events in execution order)."""
    from executorch.runtime import Runtime

    with native_stderr_silenced():     # cpuinfo's probing of /sys, printed when the runtime starts
        program = Runtime.get().load_program(str(artifact.pte), enable_etdump=True,
                                             debug_buffer_size=artifact.debug_buffer_size)
    try:
        with native_stderr_silenced():     # the thread pool's first start probes the CPU and says so
            outputs = list(program.load_method("forward").execute(inputs))
    except Exception as e:
        raise InputError(f"ExecuTorch failed to run {artifact.pte.name}: {type(e).__name__}: {_first_line(e)}") from None
    with tempfile.TemporaryDirectory(prefix="tensorprobe-etdump-") as d:
        etdump, debug = Path(d) / "run.etdp", Path(d) / "debug.bin"
        program.write_etdump_result_to_file(str(etdump), str(debug))
        return [_torch(o) for o in outputs], _events(etdump, debug, artifact.etrecord)


def _events(etdump: Path, debug: Path, etrecord: Path | None) -> list[Any]:
    from executorch.devtools import Inspector

    with redirect_stdout(io.StringIO()):
        inspector = Inspector(etdump_path=str(etdump), debug_buffer_path=str(debug),
                              etrecord=str(etrecord) if etrecord else None)
    out = []
    for block in inspector.event_blocks:
        if block.name != "Execute":
            continue
        previous = None
        for ev in block.events:
            # OPERATOR_CALL repeats the data of the native_call just before it. Only that repeat is dropped:
            # several kernels can share one debug handle (a linear's permute and addmm, instance norm's
            # repeat and batch-norm kernel), and each has its own output.
            repeat = ev.name == "OPERATOR_CALL" and previous is not None and previous.name.startswith(
                "native_call_") and _handles(previous) == _handles(ev)
            previous = ev
            if ev.debug_data and not repeat:
                out.append(ev)
    return out


def _handles(ev: Any) -> tuple:
    handles = ev.debug_handles if isinstance(ev.debug_handles, (list, tuple)) else [ev.debug_handles]
    return tuple(h for h in handles if h is not None)


def _kernel_op(ev: Any) -> str:
    """The edge op whose kernel the event ran. Its debug handle may cover several ops (`op_types`); the
    event's name (`native_call_mul.out`) says which of them this kernel is."""
    op_types = list(ev.op_types or [])
    kernel = ev.name.removeprefix("native_call_").split(".")[0]
    for op in op_types:
        parts = op.split(".")
        if len(parts) >= 2 and parts[-2] == kernel:
            return op
    return _main_op(op_types)


def _event_outputs(ev: Any) -> list[torch.Tensor]:
    """The tensors an event's kernel wrote. A delegate call logs every argument, its inputs first
    (ExecuTorch cannot tell them apart at run time), so only its last `num_outputs` are its outputs; a kernel
    returning a tensor list (`split_with_sizes_copy`) gives one tensor per element."""
    data = list(ev.debug_data)
    if ev.delegate_backend_name and 0 < getattr(ev, "num_outputs", 0) < len(data):
        data = data[-ev.num_outputs:]
    flat = [t for d in data for t in (d if isinstance(d, (list, tuple)) else [d])]
    return [t for t in flat if isinstance(t, torch.Tensor)]


def _event_records(ev: Any, counts: dict[tuple[str, str], int], random_zeros: bool = False) -> list[RuntimeTensor]:
    if ev.delegate_backend_name:  # a delegate call: its outputs, attributed to the modules it covers
        op = f"delegate.{ev.delegate_backend_name}"
        module = _common_path(ev.module_hierarchy or {})
    else:
        op = _kernel_op(ev)
        module = _module_path(ev.module_hierarchy or {}, op)
    k = counts.get((module, op), 0)
    counts[(module, op)] = k + 1
    base = f"{module or '<root>'}/{_op_base(op)}.{k}"
    data = _event_outputs(ev)
    runtime_name = f"{ev.name}#{','.join(str(h) for h in _handles(ev))}"
    # the rewritten node keeps its name, so its kernel's record is named after the random op it replaced
    tags = (TAG_RANDOM_REPLACED,) if random_zeros and _op_base(op) in RANDOM_TO_ZEROS_OPS else ()
    if ev.delegate_backend_name:
        tags += (TAG_OPAQUE,)
    return [RuntimeTensor(runtime_name=runtime_name + (f"[{i}]" if len(data) > 1 else ""), module=module,
                          op=op or ev.name, value=d, name=base + (f":{i}" if len(data) > 1 else ""), tags=tags)
            for i, d in enumerate(data)]


def _merge(events: list[Any], outs: list[RuntimeTensor], random_zeros: bool = False) -> Iterator[RuntimeTensor]:
    """Op records in execution order; each module output right after the first instruction that produced
    an identical tensor (a delegate's output, or a portable kernel's)."""
    pending = list(outs)
    counts: dict[tuple[str, str], int] = {}
    for ev in events:
        records = _event_records(ev, counts, random_zeros)
        yield from records
        for rec in records:
            for o in [o for o in pending if _same(o.value, rec.value)]:
                pending.remove(o)
                yield o
    yield from pending


def _same(a: Any, b: Any) -> bool:
    a, b = _torch(a), _torch(b)
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)) \
        and torch.equal(a.isnan(), b.isnan())


def _main_op(op_types: list[str]) -> str:
    for op in op_types:
        if not any(m in op for m in _MOVE_OPS):
            return op
    return op_types[0] if op_types else ""


def _op_base(op: str) -> str:
    parts = op.split(".")
    if parts[0] == "delegate":
        return "delegate"
    return parts[1] if len(parts) > 2 and parts[0] == "aten" else short_op(op) or "op"


def _module_path(hierarchy: dict[str, dict], op: str) -> str:
    """Deepest module path of the instruction's main op (ETRecord's nn_module_stack), minus the wrapper."""
    key = op.replace(".", "_") + "_"
    stacks = [v for k, v in hierarchy.items() if k.startswith(key)] or list(hierarchy.values())
    paths = [p for stack in stacks for p, _cls in stack.values()]
    best = max(paths, key=lambda p: p.count(".") + bool(p), default="")
    return best.removeprefix("model.") if best != "model" else ""


def _common_path(hierarchy: dict[str, dict]) -> str:
    """Longest module path shared by every op of a delegate call."""
    deepest = [max((p for p, _ in stack.values()), key=lambda p: p.count(".") + bool(p), default="").split(".")
               for stack in hierarchy.values()]
    common: list[str] = []
    for parts in zip(*deepest) if deepest else ():
        if len(set(parts)) != 1:
            break
        common.append(parts[0])
    path = ".".join(common)
    return path.removeprefix("model.") if path != "model" else ""


def _program_outputs(taps: TapInfo, outputs: list[torch.Tensor]) -> list[RuntimeTensor]:
    """One record per name the program's outputs hold, in execution order (an output holds several names
    when modules returned the same tensor)."""
    records = [RuntimeTensor(runtime_name=f"forward:output[{i}]", module=module, op="executorch.output",
                             value=outputs[i], name=name, inputs=consumed, tags=taps.tags(i))
               for i, name, module, consumed in taps.records() if i < len(outputs)]
    return records + [RuntimeTensor(runtime_name=f"forward:output[{i}]", module="", op="output", value=outputs[i],
                                    name=name, tags=taps.tags(i), kind=KIND_MODEL_OUTPUT)
                      for i, name in taps.model_outputs() if i < len(outputs)]


def _buffer_size(ep: Any) -> int:
    """Bytes of every intermediate of the graph (the debug buffer must hold them all), with margin."""
    total = 0
    for node in ep.graph.nodes:
        vals = node.meta.get("val")
        for v in vals if isinstance(vals, (list, tuple)) else [vals]:
            if isinstance(v, torch.Tensor):
                total += v.numel() * v.element_size() + 64
    return max(_MIN_DEBUG_BUFFER, int(total * 1.5))


def _torch(x: Any) -> torch.Tensor:
    return x.detach().cpu() if isinstance(x, torch.Tensor) else torch.from_numpy(np.ascontiguousarray(x))


def _first_line(e: BaseException) -> str:
    lines = [ln for ln in str(e).splitlines() if ln.strip()]
    return lines[0][:500] if lines else ""
