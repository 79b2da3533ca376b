"""ONNX Runtime: export a PyTorch model to ONNX, expose every intermediate value, run it on CPU.

Every intermediate value becomes a graph output ("mark all", as Polygraphy calls it) or, with
`include=REGEX`, a chosen subset. Values are named back to the PyTorch module path they come from
(see `_onnx_names`), so a capture lines up with `tensorprobe.capture(model, ..., level="module")`:

    >>> from tensorprobe.runtimes import get_runtime
    >>> ort = get_runtime("onnxruntime")
    >>> b = ort.capture(model, inputs, out="ort_bundle")                              # doctest: +SKIP
    >>> b["generator.noise_res.0.adain1.0.norm"].runtime_name                          # doctest: +SKIP
    'instance_norm_25'
    >>> b = ort.capture_artifact("model_int8.onnx", {"asr": asr, ...}, out="int8")     # doctest: +SKIP

Memory: all outputs of a 10 s Kokoro decoder run take ~8 GB. The graph is cut into consecutive segments,
each run as its own session on the values the previous ones produced (every node still runs once), whose
outputs ORT writes into one reused buffer of min(`max_bytes`, 256 MiB); records are yielded one at a time,
each borrowed from that buffer until the next segment runs (see `_run_full`).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from ..bundle.writer import populated_bytes
from ..errors import InputError, TargetError
from ..record import KIND_MODEL_OUTPUT, KIND_OUTPUT, KIND_PARAM, KIND_RNG, parse_name
from ._onnx_names import (MODULE_OUTPUTS_KEY, SCOPE_KEY, GraphNamer, MappingRules, ValuePlan, graph_weights,
                          model_output_names,
                          node_inputs)
from .base import RuntimeAdapter, RuntimeTensor, Selection
from ..hooks import module_hooks

EXPORTERS = ("dynamo", "legacy")
_MIN_BUDGET = 256 << 20
_POOL_BYTES = 256 << 20  # reusable output buffer of a capture run (see `_run_full`)


@dataclass
class OnnxArtifact:
    """An ONNX model ready to run: the proto, where it came from, and how its names map back."""

    model: Any                       # onnx.ModelProto with its weights loaded
    path: Path | None = None
    exporter: str | None = None      # "dynamo" / "legacy" when tensorprobe exported it, None for a user file
    rules: MappingRules | None = None
    info: dict[str, Any] = field(default_factory=dict)
    max_bytes: int | None = None     # run options: given at export/load, used by every run of this artifact
    threads: int | None = None


class OnnxRuntimeAdapter(RuntimeAdapter):
    """Capture every intermediate value of an ONNX model under ONNX Runtime (CPU).

    Options (keyword arguments of `capture` / `capture_artifact`):
        exporter: "dynamo" (default; `torch.onnx.export(dynamo=True)`, needs onnxscript) or "legacy"
            (TorchScript exporter; note it turns `atan2` into a 0/0 division that gives NaN).
        opset: ONNX opset for the export (exporter default if None).
        rules: a mapping-rule file (`REGEX -> MODULE` per line) or `MappingRules`, for graphs whose node
            names carry no module path.
        max_bytes: memory for outputs held at once: the run is cut into segments whose outputs fit
            min(max_bytes, 256 MiB) (default max_bytes: a third of available memory).
        threads: ONNX Runtime intra-op threads (default: ORT's choice).
    """

    name = "onnxruntime"
    package = "onnxruntime"
    extra = "onnx"
    artifact_suffixes = (".onnx",)

    def __init__(self) -> None:
        self.last_run: dict[str, Any] = {}   # figures of the latest run (outputs, segments, pool): for benchmarks

    # ---- hooks ------------------------------------------------------------------------------------
    def _prepare(self, model: torch.nn.Module, inputs: tuple, workdir: Path, *, exporter: str = "dynamo",
                 opset: int | None = None, rules: Any = None, max_bytes: int | None = None,
                 threads: int | None = None) -> OnnxArtifact:
        path = workdir / "model.onnx"
        export_onnx(model, inputs, path, exporter=exporter, opset=opset)
        return self._load(path, rules=rules, exporter=exporter, max_bytes=max_bytes, threads=threads)

    def _load(self, path: Path, *, rules: Any = None, exporter: str | None = None,
              max_bytes: int | None = None, threads: int | None = None) -> OnnxArtifact:
        import onnx

        if not path.is_file():
            raise TargetError(f"{path}: no such ONNX file")
        try:
            model = onnx.load(str(path))
        except Exception as e:  # protobuf DecodeError and friends
            raise TargetError(f"{path}: not a readable ONNX model ({type(e).__name__}: {e})") from None
        if isinstance(rules, (str, os.PathLike)):
            rules = MappingRules.from_file(str(rules))
        art = OnnxArtifact(model=model, path=path, exporter=exporter, rules=rules, max_bytes=max_bytes, threads=threads)
        art.info = {"onnx_file": str(path), "exporter": exporter or "none (user file)",
                    "opset": {o.domain or "ai.onnx": o.version for o in model.opset_import},
                    "producer": f"{model.producer_name} {model.producer_version}".strip(),
                    "mapping_rules": len(rules.rules) if rules else 0}
        return art

    def _run(self, artifact: OnnxArtifact, inputs: Any, selection: Selection) -> Iterator[RuntimeTensor]:
        return _OrtRun(artifact, selection, self.last_run).run(inputs)

    def _weights(self, artifact: OnnxArtifact) -> Iterator[RuntimeTensor]:
        for name, value, tags in graph_weights(artifact.model.graph):
            module = name.rsplit(".", 1)[0] if "." in name else ""
            yield RuntimeTensor(runtime_name=name, module=module, op="initializer", value=value, name=name,
                                tags=tags, kind=KIND_PARAM)

    def runtime_info(self, artifact: OnnxArtifact | None = None) -> dict[str, Any]:
        info = super().runtime_info()
        info.update(providers=["CPUExecutionProvider"], **(artifact.info if artifact is not None else {}))
        return info


class _OrtRun:
    """One run of an artifact: its options, the records selected (--include/--exclude: unselected values
    are never made graph outputs) and the notes it leaves on the artifact's info. No state on the adapter."""

    def __init__(self, artifact: OnnxArtifact, selection: Selection, last_run: dict[str, Any]):
        self.artifact = artifact
        self.selection = selection
        self.last_run = last_run

    def run(self, inputs: Any) -> Iterator[RuntimeTensor]:
        artifact = self.artifact
        feeds = graph_feeds(artifact.model, inputs)
        model = self._exposable(artifact.model, feeds)
        sizes, shapes, types = estimate_bytes(model, feeds)
        records = {name: f"input.{name if isinstance(inputs, dict) else i}" for i, name in enumerate(feeds)}
        plans = [p for p in GraphNamer(model, artifact.rules, records, shapes, types).plan() if self.selection.wants(*p.names, p.value)]
        budget = artifact.max_bytes or default_budget()
        total = sum(sizes.get(p.value, 0) for p in plans)
        self.last_run.clear()
        self.last_run.update(outputs=len(plans), estimated_bytes=total, budget_bytes=budget)
        emitted: set[str] = set()
        try:
            for rt in self._run_full(model, feeds, plans, sizes, shapes, types, budget):
                emitted.add(rt.name or rt.runtime_name)
                yield rt
        except Exception as e:   # ORT refuses the rewritten graph where it ran the user's: keep what we have
            reason = _one_line(e)
            missing = sum(1 for p in plans if not set(p.names) & emitted)
            self._note(f"{missing} of {len(plans)} values could not be exposed ({reason}); the model outputs "
                       f"come from the graph as given")
            yield from self._outputs_only(artifact.model, feeds, plans, emitted)

    def _exposable(self, model: Any, feeds: dict[str, np.ndarray]) -> Any:
        """The graph made ready for a capture (`_onnx_inline`): nodes in topological order where the file
        has them out of it, function bodies and the If branches these inputs take inlined (the graph as
        given when ONNX Runtime refuses the inlined one), and unseeded random ops seeded."""
        from ._onnx_inline import inline_for_capture, seed_random_ops, topologically_sorted

        ordered = topologically_sorted(model)
        if ordered is not None:
            self._note("nodes put in topological order (the file lists some before the values they read)")
            model = ordered
        if len(model.functions) or any(n.op_type in ("If", "Loop", "Scan") for n in model.graph.node):
            try:
                inlined, notes = inline_for_capture(model, feeds, self._values)
                make_session(inlined, self.artifact.threads)
            except Exception as e:
                self._note(f"If, Loop and Scan nodes and functions left as single ops ({_one_line(e)})")
            else:
                self._notes(notes)
                model = inlined
        model, seeded = seed_random_ops(model)
        if seeded:
            self._note(f"{seeded} random op(s) without a seed were given seeds 0..{seeded - 1} in graph order, "
                       f"so that captures of this graph and of its conversions draw the same numbers")
        return model

    def _values(self, model: Any, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
        sess = make_session(model, self.artifact.threads)
        return dict(zip(names, sess.run(names, feeds)))

    def _outputs_only(self, model: Any, feeds: dict[str, np.ndarray], plans: list[ValuePlan],
                      emitted: set[str]) -> Iterator[RuntimeTensor]:
        outputs = [o.name for o in model.graph.output]
        try:
            values = self._values(model, feeds, outputs)
        except Exception as e:
            raise TargetError(f"ONNX Runtime failed on this graph: {_one_line(e)}") from None
        by_value = {p.value: p for p in plans}
        records = model_output_names(outputs)
        for name in outputs:
            record = records[name]
            if record in emitted:
                continue
            p = by_value.get(name)
            yield RuntimeTensor(runtime_name=name, module="", op="output", name=record,
                                inputs=(p.names[0],) if p is not None and set(p.names) & emitted else (),
                                kind=KIND_MODEL_OUTPUT, value=values[name])

    def _notes(self, texts: list[str]) -> None:
        for text in texts:
            self._note(text)

    def _note(self, text: str) -> None:
        self.artifact.info.setdefault("notes", []).append(text)

    def _run_full(self, model: Any, feeds: dict[str, np.ndarray], plans: list[ValuePlan], sizes: dict[str, int],
                  shapes: dict[str, tuple[int, ...]], types: dict[str, int], budget: int) -> Iterator[RuntimeTensor]:
        """Run the graph as consecutive segments whose outputs fit one reusable buffer, each output bound
        into that buffer (IOBinding), and yield every planned value, borrowed from the buffer.

        Marking all ~1,000 values of a 10 s Kokoro decoder as outputs of one run makes ORT allocate 7.5 GiB
        at once; on this project's VMs the page faults of that fresh memory took 5x the run itself. Segments
        over one pre-faulted 256 MiB buffer keep memory flat and leave ORT's own run time (~1.0x) as the cost.
        """
        pool = _OutputPool(min(budget, _POOL_BYTES))
        segments = split_segments(model, plans, sizes, pool.nbytes)
        self.last_run["session_runs"] = len(segments)
        live: dict[str, np.ndarray] = dict(feeds)
        needed_later = _last_use(model, segments)
        weights = SharedInitializers(model)
        for k, (lo, hi) in enumerate(segments):
            seg_plans = [p for p in plans if lo <= p.node_index < hi]
            sub, seg_in, seg_out = segment_model(model, lo, hi, live, {p.value for p in seg_plans}, needed_later, k,
                                                 weights.protos)
            sess = make_session(sub, self.artifact.threads, weights.values_for(sub))
            outs = run_bound(sess, {v: live[v] for v in seg_in}, seg_out, shapes, types, pool)
            del sess, sub
            for v in list(live):
                if needed_later.get(v, -1) <= k and v not in feeds:
                    del live[v]
            # values later segments read are copied out: the buffer is overwritten by the next segment
            live.update((v, np.array(a)) for v, a in outs.items() if needed_later.get(v, -1) > k)
            self.last_run["pool_bytes"] = pool.allocated
            yield from _emit(seg_plans, outs, drop=True)


def _emit(plans: list[ValuePlan], outs: dict[str, np.ndarray], drop: bool) -> Iterator[RuntimeTensor]:
    last = {p.value: i for i, p in enumerate(plans)}
    for i, p in enumerate(plans):
        arr = outs.get(p.value)
        if arr is None or getattr(arr, "dtype", None) is None or arr.dtype == object:
            continue
        yield from _tensors_for(p, arr)
        if drop and last[p.value] == i:
            del outs[p.value]   # drop our reference as soon as the record is written
        del arr


def _tensors_for(p: ValuePlan, value: np.ndarray) -> Iterator[RuntimeTensor]:
    """One RuntimeTensor per record name of a value (one value can be several modules' output, and a graph
    output is also a model output), borrowing `value` from the output buffer."""
    for name in p.names:
        module, call = parse_name(name)
        yield RuntimeTensor(runtime_name=p.value, module=p.module if "/" in name else module, op=p.op, name=name,
                            inputs=p.inputs, tags=p.tags, call=call,
                            kind=KIND_RNG if "rng" in p.tags else KIND_OUTPUT, value=value, borrowed=True)
    if p.model_output is not None:
        yield RuntimeTensor(runtime_name=p.value, module="", op="output", name=p.model_output,
                            inputs=(p.names[0],) if p.names else p.inputs, kind=KIND_MODEL_OUTPUT,
                            value=value, borrowed=True)


# ---- export ----------------------------------------------------------------------------------------
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
    try:
        with contextlib.redirect_stdout(sink), warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            if exporter == "dynamo":
                prog = torch.onnx.export(model, tuple(inputs), dynamo=True, input_names=names, verbose=False, **kw)
                proto = prog.model_proto
                _stamp_scopes(proto, prog.exported_program, model, tuple(inputs))
                _save(proto, path)
            else:
                torch.onnx.export(model, tuple(inputs), str(path), dynamo=False, input_names=names, **kw)
                _add_tuple_shapes(path, model, inputs)
    except (TargetError, InputError):
        raise
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        other = "legacy" if exporter == "dynamo" else "dynamo"
        raise TargetError(f"torch.onnx.export ({exporter} exporter) failed: {first}. "
                          f"Try exporter={other!r}, or export the model yourself and capture the .onnx file") from None
    return path


def _input_names(model: torch.nn.Module, n: int) -> list[str]:
    params = [p for p in inspect.signature(model.forward).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    names = [p.name for p in params[:n]]
    return names + [f"input_{i}" for i in range(len(names), n)]


def _stamp_scopes(proto: Any, ep: Any, model: torch.nn.Module, inputs: tuple) -> None:
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
    entry.key, entry.value = MODULE_OUTPUTS_KEY, json.dumps(tuple_output_shapes(model, inputs))


def _add_tuple_shapes(path: Path, model: torch.nn.Module, inputs: tuple) -> None:
    import json

    import onnx

    proto = onnx.load(str(path))
    entry = proto.metadata_props.add()
    entry.key, entry.value = MODULE_OUTPUTS_KEY, json.dumps(tuple_output_shapes(model, tuple(inputs)))
    _save(proto, path)


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


def _save(proto: Any, path: Path) -> None:
    import onnx

    if proto.ByteSize() > (1 << 31) - (64 << 20):
        onnx.save(proto, str(path), save_as_external_data=True, location=path.name + ".data")
    else:
        onnx.save(proto, str(path))


# ---- inputs ----------------------------------------------------------------------------------------
def load_inputs(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Named input arrays from an `.npz` (never unpickled) or `.safetensors` file.

    Example:
        >>> feeds = load_inputs("inputs.npz")       # doctest: +SKIP
    """
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: no such inputs file")
    try:
        if p.suffix == ".safetensors":
            import safetensors.numpy
            return dict(safetensors.numpy.load_file(str(p)))
        with np.load(p, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as e:
        raise InputError(f"{p}: can't read inputs ({type(e).__name__}: {e}); expected a .npz or .safetensors "
                         "file of named arrays") from None


def graph_feeds(model: Any, inputs: Any) -> dict[str, np.ndarray]:
    """Match `inputs` (a tuple in graph-input order, or a dict by name) to the graph's inputs."""
    import onnx

    inits = {i.name for i in model.graph.initializer}
    specs = [i for i in model.graph.input if i.name not in inits]
    names = [s.name for s in specs]
    if isinstance(inputs, dict):
        missing = [n for n in names if n not in inputs]
        extra = [k for k in inputs if k not in names]
        if missing or extra:
            raise InputError(f"inputs don't match the graph: missing {missing or 'none'}, unknown {extra or 'none'}; "
                             f"the graph takes {', '.join(_describe(s) for s in specs)}")
        values = [inputs[n] for n in names]
    else:
        values = list(inputs)
        if len(values) != len(names):
            raise InputError(f"the graph takes {len(names)} inputs ({', '.join(_describe(s) for s in specs)}), "
                             f"got {len(values)}")
    feeds = {}
    for spec, v in zip(specs, values):
        arr = v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
        want = onnx.helper.tensor_dtype_to_np_dtype(spec.type.tensor_type.elem_type) \
            if spec.type.tensor_type.elem_type else arr.dtype
        if arr.dtype != want:
            if arr.dtype.kind != np.dtype(want).kind and not (arr.dtype.kind in "iu" and np.dtype(want).kind in "iu"):
                raise InputError(f"input {spec.name!r}: got {arr.dtype}, the graph expects {np.dtype(want)}")
            arr = arr.astype(want)
        dims = spec.type.tensor_type.shape.dim
        fixed = [d.dim_value if d.HasField("dim_value") else None for d in dims]
        if dims and (len(fixed) != arr.ndim or any(f is not None and f != n for f, n in zip(fixed, arr.shape))):
            raise InputError(f"input {spec.name!r}: got shape {list(arr.shape)}, the graph expects {_describe(spec)} "
                             "(export with inputs of this shape, or with dynamic axes)")
        feeds[spec.name] = np.ascontiguousarray(arr)
    return feeds


def _describe(spec: Any) -> str:
    import onnx

    t = spec.type.tensor_type
    dims = [d.dim_param or str(d.dim_value) if (d.dim_param or d.HasField("dim_value")) else "?" for d in t.shape.dim]
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)).name if t.elem_type else "?"
    return f"{spec.name}[{','.join(dims)}] {dtype}"


# ---- sessions, sizes, segments ------------------------------------------------------------------------
class SharedInitializers:
    """The large initializers of a model, handed to each segment's session from memory.

    Serializing a segment with its weights inline, for ORT to parse them back, cost ~0.9 s over the 33
    segments of a 10 s Kokoro decoder (200 MB of weights, fresh memory each time). Each large initializer is
    instead read once into an `OrtValue`; segments carry a stub that marks its data external, and ORT copies
    the data in from the `OrtValue` before it optimizes the graph (`add_external_initializers`), so constant
    folding and weight pre-packing still see real weights.

        >>> w = SharedInitializers(model)                                                 # doctest: +SKIP
        >>> sess = make_session(segment, initializers=w.values_for(segment))              # doctest: +SKIP
    """

    # Smaller ones stay inline: shape-like constants must be readable by shape inference.
    MIN_BYTES = 4096

    def __init__(self, model: Any):
        import onnx
        import onnxruntime as ort

        self.protos: dict[str, Any] = {}  # name -> initializer proto to put in a segment (maybe a stub)
        self._values: dict[str, Any] = {}  # name -> OrtValue over the data (it keeps its array alive)
        for init in model.graph.initializer:
            self.protos[init.name] = init
            dtype = _BINDABLE.get(init.data_type)
            if dtype is None or init.data_location == onnx.TensorProto.EXTERNAL:
                continue
            raw = init.raw_data  # a copy, made once
            if len(raw) < self.MIN_BYTES:
                continue
            arr = np.frombuffer(raw, dtype=dtype).reshape(tuple(init.dims))
            stub = onnx.TensorProto(name=init.name, data_type=init.data_type, dims=init.dims,
                                    data_location=onnx.TensorProto.EXTERNAL)
            stub.external_data.add(key="location", value="tensorprobe-in-memory")
            self.protos[init.name] = stub
            self._values[init.name] = ort.OrtValue.ortvalue_from_numpy(arr)

    def values_for(self, model: Any) -> dict[str, Any]:
        """name -> OrtValue for the stubbed initializers `model` holds."""
        return {i.name: self._values[i.name] for i in model.graph.initializer if i.name in self._values}


def make_session(model: Any, threads: int | None = None, initializers: dict[str, Any] | None = None) -> Any:
    """An ONNX Runtime CPU session for an in-memory model (written to a temp dir past 2 GB).

    `initializers`: name -> OrtValue for initializers whose data the model marks external
    (see `SharedInitializers`)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    if initializers:
        opts.add_external_initializers(list(initializers), list(initializers.values()))
    opts.log_severity_level = 3
    # ORT's pool threads spin after a run; meanwhile the statistics (torch, multi-threaded) wait for cores
    # those threads hold: 40x slower statistics on a 2-core machine. Let them sleep instead.
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    # A capture runs a session once. The memory pattern ORT plans after a run pre-allocates one block for
    # all values of the next run: with every value marked or reduced, faulting that block in made the
    # second run 4x slower than the first (6.1 s against 1.5 s for 3 s of Kokoro audio).
    opts.enable_mem_pattern = False
    if threads:
        opts.intra_op_num_threads = threads
    try:  # protobuf refuses to serialize past 2 GB; asking ByteSize() first would cost a serialization
        data = model.SerializeToString()
    except Exception:  # noqa: BLE001 - protobuf's EncodeError/ValueError, depending on the backend
        data = None
    if data is not None:
        return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    import tempfile

    with tempfile.TemporaryDirectory(prefix="tensorprobe-ort-") as d:
        path = Path(d) / "model.onnx"
        _save(model, path)
        return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def with_outputs(model: Any, values: list[str]) -> Any:
    """A copy of `model` whose graph outputs are exactly `values` (the "mark all" step)."""
    import onnx

    out = onnx.ModelProto()
    out.CopyFrom(model)
    known = {v.name: v for v in list(model.graph.value_info) + list(model.graph.output)}
    del out.graph.output[:]
    for v in values:
        out.graph.output.append(known[v] if v in known else onnx.helper.make_empty_tensor_value_info(v))
    return out


def estimate_bytes(model: Any, feeds: dict[str, np.ndarray]) -> tuple[dict[str, int], dict[str, tuple[int, ...]],
                                                                      dict[str, int]]:
    """Bytes, shape and ONNX element type of each value, from shape inference with the concrete input shapes."""
    import onnx

    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    g = light.graph
    g.node.extend(model.graph.node)
    for init in model.graph.initializer:  # big weights become typed inputs: shapes without data
        if int(np.prod(init.dims, dtype=np.int64)) > 512:  # (not len(raw_data): each access copies the bytes)
            g.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
        else:
            g.initializer.append(init)
    for name, arr in feeds.items():
        g.input.append(onnx.helper.make_tensor_value_info(
            name, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype), list(arr.shape)))
    # Data propagation (shapes computed by Shape/Gather/Concat chains) costs 13x the plain inference on the
    # Kokoro decoder (0.38 s against 0.03 s) and finds nothing more there: it is tried only when the plain
    # pass leaves many shapes unknown, as dynamic-axis exports do.
    shapes, types = _inferred_shapes(light, data_prop=False)
    n_values = sum(1 for node in model.graph.node for o in node.output if o)
    if n_values - len(shapes) > _UNKNOWN_SHAPES_RETRY * n_values:
        shapes_dp, types_dp = _inferred_shapes(light, data_prop=True)
        if len(shapes_dp) > len(shapes):
            shapes, types = shapes_dp, types_dp
    sizes = {v: int(np.prod(shape, dtype=np.int64)) * _itemsize(types[v]) for v, shape in shapes.items()}
    for name, arr in feeds.items():
        sizes[name] = arr.nbytes
    for node in model.graph.node:  # unknown: as large as the largest input of the node
        guess = max((sizes.get(v, 0) for v in node.input), default=0)
        for o in node.output:
            sizes.setdefault(o, guess)
    return sizes, shapes, types


_UNKNOWN_SHAPES_RETRY = 0.05  # fraction of values without a shape that makes `estimate_bytes` retry


def _inferred_shapes(light: Any, *, data_prop: bool) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """ONNX shape inference on `light`: (value -> concrete shape, value -> element type)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(light, data_prop=data_prop)
    except Exception:  # noqa: BLE001 - inference is an estimate: a model it cannot handle still runs
        inferred = light
    shapes: dict[str, tuple[int, ...]] = {}
    types: dict[str, int] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        t = vi.type.tensor_type
        if not t.elem_type:
            continue
        types[vi.name] = t.elem_type
        if t.HasField("shape") and all(d.HasField("dim_value") for d in t.shape.dim):
            shapes[vi.name] = tuple(d.dim_value for d in t.shape.dim)
    return shapes, types


def _itemsize(elem_type: int) -> int:
    import onnx

    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type)).itemsize


def default_budget() -> int:
    """A third of the memory available now (at least 256 MiB)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return max(_MIN_BUDGET, int(line.split()[1]) * 1024 // 3)
    except OSError:
        pass
    return 4 << 30


def split_segments(model: Any, plans: list[ValuePlan], sizes: dict[str, int], budget: int) -> list[tuple[int, int]]:
    """Consecutive node ranges whose selected outputs each fit in `budget` bytes."""
    per_node: dict[int, int] = {}
    for p in plans:
        per_node[p.node_index] = per_node.get(p.node_index, 0) + sizes.get(p.value, 0)
    n = len(model.graph.node)
    segments, lo, acc = [], 0, 0
    for i in range(n):
        cost = per_node.get(i, 0)
        if acc and acc + cost > budget:
            segments.append((lo, i))
            lo, acc = i, 0
        acc += cost
    segments.append((lo, n))
    return segments


class _OutputPool:
    """One pre-faulted byte buffer handed out as NumPy arrays for a segment's outputs, and reused by the
    next segment. It is sized to what the segments need, doubling up to `nbytes` (so a small model does
    not fault in 256 MiB), and past `nbytes` only for a segment that needs more on its own."""

    def __init__(self, nbytes: int):
        self.nbytes = max(int(nbytes), 1)
        self._buffer: np.ndarray | None = None

    @property
    def allocated(self) -> int:
        return 0 if self._buffer is None else self._buffer.nbytes

    def arrays(self, specs: dict[str, tuple[tuple[int, ...], np.dtype]]) -> dict[str, np.ndarray]:
        """Arrays of the given shapes and dtypes, 64-byte aligned, valid until the next call."""
        spans, end = {}, 0
        for name, (shape, dtype) in specs.items():
            n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            spans[name] = (end, n)
            end += -(-n // 64) * 64
        if end > self.allocated:
            # grow to twice the need (capped), so a slightly larger later segment does not fault in a new buffer
            self._buffer = populated_bytes(max(end, min(self.nbytes, 2 * max(end, self.allocated)))).numpy()
        return {name: self._buffer[start:start + n].view(dtype).reshape(shape)
                for (name, (shape, dtype)), (start, n) in zip(specs.items(), spans.values())}


_BINDABLE = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64, 9: np.bool_,
             10: np.float16, 11: np.float64}  # TensorProto element types NumPy holds as they are


def run_bound(sess: Any, feeds: dict[str, np.ndarray], names: list[str], shapes: dict[str, tuple[int, ...]],
              types: dict[str, int], pool: _OutputPool) -> dict[str, np.ndarray]:
    """Run `sess`, each output of inferred shape written straight into `pool` (the others allocated by
    ORT), and return every output by name."""
    specs = {v: (shapes[v], np.dtype(_BINDABLE[types[v]])) for v in names if v in shapes and types.get(v) in _BINDABLE}
    try:
        return _run_into(sess, feeds, names, pool.arrays(specs))
    except Exception:  # noqa: BLE001 - ORT refuses a buffer when shape inference was wrong: let it allocate
        if not specs:
            raise
        return _run_into(sess, feeds, names, {})


def _run_into(sess: Any, feeds: dict[str, np.ndarray], names: list[str], bufs: dict[str, np.ndarray]
              ) -> dict[str, np.ndarray]:
    io = sess.io_binding()
    for name, arr in feeds.items():
        io.bind_cpu_input(name, np.ascontiguousarray(arr))
    for v in names:
        if v in bufs:
            b = bufs[v]
            io.bind_output(v, "cpu", 0, b.dtype.type, list(b.shape), b.ctypes.data)
        else:
            io.bind_output(v, "cpu")
    sess.run_with_iobinding(io)
    got = io.get_outputs()
    return {v: bufs[v] if v in bufs else got[i].numpy() for i, v in enumerate(names)}


def _last_use(model: Any, segments: list[tuple[int, int]]) -> dict[str, int]:
    """value -> index of the last segment that reads it (graph outputs: past the end)."""
    seg_of = {}
    for k, (lo, hi) in enumerate(segments):
        for i in range(lo, hi):
            seg_of[i] = k
    last: dict[str, int] = {}
    for i, node in enumerate(model.graph.node):
        for v in node_inputs(node):
            last[v] = max(last.get(v, -1), seg_of[i])
    for o in model.graph.output:
        last[o.name] = len(segments)
    return last


def segment_model(model: Any, lo: int, hi: int, live: dict[str, np.ndarray], wanted: set[str],
                  needed_later: dict[str, int], k: int, inits: dict[str, Any] | None = None
                  ) -> tuple[Any, list[str], list[str]]:
    """Nodes [lo, hi) as a model reading the live values it needs and returning `wanted` + what later needs.
    `inits`: the initializer protos to use by name (default: the model's own)."""
    import onnx

    nodes = model.graph.node[lo:hi]
    if inits is None:
        inits = {i.name: i for i in model.graph.initializer}
    produced = {o for nd in nodes for o in nd.output if o}
    reads = list(dict.fromkeys(v for nd in nodes for v in node_inputs(nd) if v not in produced))
    seg_in = [v for v in reads if v in live]
    outs = [o for nd in nodes for o in nd.output if o and (o in wanted or needed_later.get(o, -1) > k)]
    sub = onnx.ModelProto()
    sub.ir_version = model.ir_version
    sub.opset_import.extend(model.opset_import)
    sub.functions.extend(model.functions)
    g = sub.graph
    g.name = f"segment_{k}"
    g.node.extend(nodes)
    g.initializer.extend(inits[v] for v in reads if v in inits and v not in live)
    for v in seg_in:
        arr = live[v]
        g.input.append(onnx.helper.make_tensor_value_info(v, onnx.helper.np_dtype_to_tensor_dtype(arr.dtype),
                                                          list(arr.shape)))
    g.output.extend(onnx.helper.make_empty_tensor_value_info(o) for o in outs)
    return sub, seg_in, list(dict.fromkeys(outs))


def _one_line(e: BaseException) -> str:
    """An ORT exception as one line: its last line, without the '[ONNXRuntimeError] : 1 : FAIL :' prefix."""
    text = str(e).strip().splitlines()
    line = text[-1] if text else type(e).__name__
    return re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", line)


