"""`OnnxRuntimeAdapter`: capture every intermediate value of an ONNX model under ONNX Runtime (CPU)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from ...errors import TargetError
from ...record import KIND_MODEL_OUTPUT, KIND_OUTPUT, KIND_PARAM, KIND_RNG, parse_name
from ...stats import TensorStats, compute_stats, tensor_digest
from ...stats.batch import float_stats_many
from ..base import RuntimeAdapter, RuntimeTensor, Selection, _to_torch
from .export import export_onnx
from .names import (RNG_OPS, GraphNamer, MappingRules, ValuePlan, exported_state_names, graph_weights,
                    model_output_names)
from .session import (_STRING, POOL_BYTES, SharedInitializers, _itemsize, _last_use, _one_line, _OutputPool,
                      default_budget, estimate_bytes, graph_feeds, make_session, run_bound, segment_model,
                      split_segments)


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
    state_names: frozenset[str] | None = None   # the state dict of the model it was exported from, where known
    # what one capture prepares and the next capture of the same inputs' shapes reuses (a sweep's worker
    # captures every item from one artifact): the weights shared with each segment's session, the segments'
    # models by (plan, segment, values wanted)
    shared_weights: Any = None
    segment_models: dict[tuple, tuple] = field(default_factory=dict)
    data_files: tuple[Path, ...] = ()   # the external data files its weights were read from


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
        dynamic: export with every input dimension symbolic where the model allows (one file for inputs of
            any length; a sweep's plain runs use it). Captures name tuple outputs by the export's shapes.
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
                 threads: int | None = None, dynamic: bool = False) -> OnnxArtifact:
        path = workdir / "model.onnx"
        export_onnx(model, inputs, path, exporter=exporter, opset=opset, dynamic=dynamic)
        art = self._load(path, rules=rules, exporter=exporter, max_bytes=max_bytes, threads=threads)
        art.state_names = frozenset(model.state_dict())   # which one-element initializers are weights
        return art

    def import_error(self, model: torch.nn.Module, inputs: tuple) -> str | None:
        """Export `model` to ONNX and open an ONNX Runtime session on it (None: it opens), without running it."""
        import tempfile

        import onnx

        self.require()
        with tempfile.TemporaryDirectory(prefix="tensorprobe-ort-") as d:
            path = Path(d) / "model.onnx"
            try:
                export_onnx(model, inputs, path)
            except Exception as e:  # the exporter's own failure is preflight's export_error
                return f"torch.onnx.export failed: {type(e).__name__}: {_one_line(e)}"
            try:
                make_session(onnx.load(str(path)))
            except Exception as e:  # onnxruntime's Fail/NotImplemented/InvalidGraph
                return f"ONNX Runtime could not open the model: {type(e).__name__}: {_one_line(e)}"
        return None

    def _load(self, path: Path, *, rules: Any = None, exporter: str | None = None,
              max_bytes: int | None = None, threads: int | None = None) -> OnnxArtifact:
        import onnx

        if not path.is_file():
            raise TargetError(f"{path}: no such ONNX file")
        try:
            model = onnx.load(str(path), load_external_data=False)
            data_files = _external_data_files(model, path.parent)
            if data_files:
                onnx.external_data_helper.load_external_data_for_model(model, str(path.parent))
        except Exception as e:  # protobuf DecodeError and friends, a missing data file
            raise TargetError(f"{path}: not a readable ONNX model ({type(e).__name__}: {e})") from None
        if isinstance(rules, (str, os.PathLike)):
            rules = MappingRules.from_file(str(rules))
        art = OnnxArtifact(model=model, path=path, exporter=exporter, rules=rules, max_bytes=max_bytes, threads=threads,
                           state_names=exported_state_names(model), data_files=data_files)
        art.info = {"onnx_file": str(path), "exporter": exporter or "none (user file)",
                    "opset": {o.domain or "ai.onnx": o.version for o in model.opset_import},
                    "producer": f"{model.producer_name} {model.producer_version}".strip(),
                    "mapping_rules": len(rules.rules) if rules else 0,
                    # the model outputs in the graph's order: they are recorded in the order they are computed
                    "outputs": list(model_output_names([o.name for o in model.graph.output]).values())}
        return art

    def _run(self, artifact: OnnxArtifact, inputs: Any, selection: Selection) -> "_OrtRun":
        return _OrtRun(artifact, selection, self.last_run, inputs)   # its `notes` go to the bundle's header

    def _weights(self, artifact: OnnxArtifact) -> Iterator[RuntimeTensor]:
        # A file's weights are the same at every capture of it: which initializers are weights, their shapes,
        # statistics and digests are remembered, and their values are only made if a record keeps them
        # (keep="full"); decoding every initializer again cost ~0.9 ms of a 20 ms capture of CREPE tiny.
        key = _file_key(artifact)
        known = _WEIGHT_FACTS.get(key) if key is not None else None
        if known is not None:
            values = _GraphWeightValues(artifact)
            for name, module, tags, shape, dtype, stats, digest in known:
                yield RuntimeTensor(runtime_name=name, module=module, op="initializer",
                                    value=_LazyWeight(values, name, shape, dtype), name=name, tags=tags,
                                    kind=KIND_PARAM, stats=stats, digest=digest)
            return
        facts = []
        for name, value, tags in graph_weights(artifact.model.graph, artifact.state_names):
            module = name.rsplit(".", 1)[0] if "." in name else ""
            stats, digest = compute_stats(_to_torch(value), sketch=True), tensor_digest(value)
            facts.append((name, module, tags, tuple(value.shape), value.dtype, stats, digest))
            yield RuntimeTensor(runtime_name=name, module=module, op="initializer", value=value, name=name,
                                tags=tags, kind=KIND_PARAM, stats=stats, digest=digest)
        if key is not None:
            _remember(_WEIGHT_FACTS, key, facts)

    def _forget(self, artifact: OnnxArtifact) -> None:
        # an export into a temporary directory is captured once: what its captures kept (sessions above all,
        # which hold the weights) would serve nothing
        key = _file_key(artifact)
        if key is None:
            return
        for cache in _PER_FILE:
            for k in [k for k in cache if _of_file(k, key)]:
                del cache[k]

    def runtime_info(self, artifact: OnnxArtifact | None = None) -> dict[str, Any]:
        info = super().runtime_info()
        info.update(providers=["CPUExecutionProvider"], **(artifact.info if artifact is not None else {}))
        return info


class _OrtRun:
    """One run of an artifact on `inputs`, iterated for its records: its options, the records selected
    (--include/--exclude: unselected values are never made graph outputs) and its notes, which the capture
    puts in the bundle's `runtime.notes`. No state on the adapter or the artifact (threads and a sweep's
    items capture from one artifact)."""

    def __init__(self, artifact: OnnxArtifact, selection: Selection, last_run: dict[str, Any], inputs: Any = None):
        self.artifact = artifact
        self.selection = selection
        self.last_run = last_run
        self.inputs = inputs
        self.file_key: tuple | None = None   # set by `run`: the file's identity, read once for every cache
        self.plan_key: tuple | None = None   # set by `_planned`: what the per-file caches are keyed by
        self.notes: list[str] = []   # what this run did to the graph, for the bundle's `runtime.notes`

    def __iter__(self) -> Iterator[RuntimeTensor]:
        return self.run(self.inputs)

    def run(self, inputs: Any) -> Iterator[RuntimeTensor]:
        artifact = self.artifact
        self.file_key = _file_key(artifact)
        feeds = graph_feeds(artifact.model, inputs)
        model = self._exposable(artifact.model, feeds)
        sizes, shapes, types, all_plans = self._planned(model, feeds, isinstance(inputs, dict))
        self._note_text_values(model, feeds, types)
        plans = [p for p in all_plans if self.selection.wants(*p.names, p.value)]
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

    def _planned(self, model: Any, feeds: dict[str, np.ndarray], by_name: bool
                 ) -> tuple[dict[str, int], dict[str, tuple[int, ...]], dict[str, int], list[ValuePlan]]:
        """Sizes, shapes and types of every value (shape inference) and the record plan of the graph;
        remembered for the next capture of the same file with inputs of the same shapes (a sweep's items,
        a rerun): on a small model these passes cost as much as the run itself."""
        key = self.plan_key = _plan_key(self.artifact, self.file_key, feeds, by_name)
        got = _PLANS.get(key) if key is not None else None
        if got is None:
            sizes, shapes, types = estimate_bytes(model, feeds)
            records = {name: f"input.{name if by_name else i}" for i, name in enumerate(feeds)}
            got = (sizes, shapes, types, GraphNamer(model, self.artifact.rules, records, shapes, types).plan())
            if key is not None:
                _remember(_PLANS, key, got)
        return got

    def _note_text_values(self, model: Any, feeds: dict[str, np.ndarray], types: dict[str, int]) -> None:
        """Text inputs and values run, but a record holds numbers: say which are left out of the bundle."""
        text = [n for n, a in feeds.items() if a.dtype == object]
        text += [o for node in model.graph.node for o in node.output if types.get(o) == _STRING]
        if text:
            shown = ", ".join(text[:5]) + (f" and {len(text) - 5} more" if len(text) > 5 else "")
            self._note(f"{len(text)} text value(s) ran but are not records (a record holds numbers): {shown}")

    def _exposable(self, model: Any, feeds: dict[str, np.ndarray]) -> Any:
        """The graph made ready for a capture (`inline.py`): nodes in topological order where the file
        has them out of it, function bodies and the If branches these inputs take inlined (the graph as
        given when ONNX Runtime refuses the inlined one), and unseeded random ops seeded."""
        from .inline import inline_for_capture, seed_random_ops, topologically_sorted

        key = self.file_key if model is self.artifact.model else None
        if key is not None and key in _READY_AS_IS:
            return model   # this file was found in order, with nothing to inline or seed
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
        given = model
        model, seeded = seed_random_ops(model)
        if seeded:
            self._note(f"{seeded} random op(s) without a seed were given seeds 0..{seeded - 1} in graph order, "
                       f"so that captures of this graph and of its conversions draw the same numbers")
        if key is not None and model is given is self.artifact.model:
            _remember(_READY_AS_IS, key, True)
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
            if record in emitted or not _numeric(values[name]):
                continue
            p = by_value.get(name)
            yield RuntimeTensor(runtime_name=name, module="", op="output", name=record,
                                inputs=(p.names[0],) if p is not None and set(p.names) & emitted else (),
                                kind=KIND_MODEL_OUTPUT, value=values[name])

    def _notes(self, texts: list[str]) -> None:
        for text in texts:
            self._note(text)

    def _note(self, text: str) -> None:
        # on the run, not the artifact: a sweep's worker captures every item from one artifact, and each
        # bundle said again what every earlier item's run had noted
        self.notes.append(text)

    def _run_full(self, model: Any, feeds: dict[str, np.ndarray], plans: list[ValuePlan], sizes: dict[str, int],
                  shapes: dict[str, tuple[int, ...]], types: dict[str, int], budget: int) -> Iterator[RuntimeTensor]:
        """Run the graph as consecutive segments whose outputs fit one reusable buffer, each output bound
        into that buffer (IOBinding), and yield every planned value, borrowed from the buffer.

        Marking all ~1,000 values of a 10 s Kokoro decoder as outputs of one run makes ORT allocate 7.5 GiB
        at once; on this project's VMs the page faults of that fresh memory took 5x the run itself. Segments
        over one pre-faulted 256 MiB buffer keep memory flat and leave ORT's own run time (~1.0x) as the cost.
        """
        pool = _OutputPool(min(budget, POOL_BYTES))
        segments = split_segments(model, plans, sizes, pool.nbytes)
        self.last_run["session_runs"] = len(segments)
        try:
            yield from self._run_segments(model, feeds, plans, sizes, shapes, types, segments, pool)
        finally:   # every record has copied what it keeps from the buffer: the next capture reuses it
            pool.release()

    def _shared_weights(self, model: Any) -> SharedInitializers:
        """The model's large weights as OrtValues for the segments' sessions, made once per artifact."""
        if model is not self.artifact.model:
            return SharedInitializers(model)
        if self.artifact.shared_weights is None:
            self.artifact.shared_weights = SharedInitializers(model)
        return self.artifact.shared_weights

    def _segment_session(self, model: Any, segments: list[tuple[int, int]], k: int, live: dict[str, np.ndarray],
                         wanted: set[str], needed_later: dict[str, int], nbytes: int
                         ) -> tuple[Any, list[str], list[str]]:
        """(session, its inputs, its outputs) for segment k, whose values take `nbytes`. A session is kept
        for the next capture of the same file with the same plan (a sweep's items, a rerun): building one cost
        3.5 ms of a 17 ms capture of CREPE tiny. Only where running it again gives what a new session gives
        (`_sessions_reusable`), and for a small run: a kept session also keeps its arena, which grows to the
        run's scratch memory (a long input's session is built again, in a small share of its run)."""
        key = None
        if self.plan_key is not None and model is self.artifact.model and nbytes <= _SESSION_RUN_BYTES \
                and _sessions_reusable(model, self.file_key):
            from ...logs import is_quiet

            key = (self.plan_key, tuple(segments), k, frozenset(wanted), self.artifact.threads, is_quiet())
            got = _SESSIONS.get(key)
            if got is not None:
                return got
        lo, hi = segments[k]
        weights = self._shared_weights(model)
        sub, seg_in, seg_out = self._segment_model(model, lo, hi, live, wanted, needed_later, k, weights)
        made = (make_session(sub, self.artifact.threads, weights.values_for(sub)), seg_in, seg_out)
        if key is not None:
            _remember(_SESSIONS, key, made, kept=_SESSIONS_KEPT)
        return made

    def _segment_model(self, model: Any, lo: int, hi: int, live: dict[str, np.ndarray], wanted: set[str],
                       needed_later: dict[str, int], k: int, weights: SharedInitializers) -> tuple:
        """`segment_model`, remembered on the artifact for the next capture with the same plan."""
        key = None
        if self.plan_key is not None and model is self.artifact.model:
            key = (self.plan_key, lo, hi, frozenset(wanted))
            got = self.artifact.segment_models.get(key)
            if got is not None:
                return got
        made = segment_model(model, lo, hi, live, wanted, needed_later, k, weights.protos)
        if key is not None:
            _remember(self.artifact.segment_models, key, made, kept=_SEGMENT_MODELS_KEPT)
        return made

    def _run_segments(self, model: Any, feeds: dict[str, np.ndarray], plans: list[ValuePlan], sizes: dict[str, int],
                      shapes: dict[str, tuple[int, ...]], types: dict[str, int], segments: list[tuple[int, int]],
                      pool: _OutputPool) -> Iterator[RuntimeTensor]:
        live: dict[str, np.ndarray] = dict(feeds)
        key = (self.plan_key, tuple(segments)) if self.plan_key is not None else None
        needed_later = _LAST_USE.get(key) if key is not None else None
        if needed_later is None:
            needed_later = _last_use(model, segments)
            if key is not None:
                _remember(_LAST_USE, key, needed_later)
        for k, (lo, hi) in enumerate(segments):
            seg_plans = [p for p in plans if lo <= p.node_index < hi]
            wanted = {p.value for p in seg_plans}
            nbytes = sum(sizes.get(v, 0) for v in wanted)
            sess, seg_in, seg_out = self._segment_session(model, segments, k, live, wanted, needed_later, nbytes)
            outs = run_bound(sess, {v: live[v] for v in seg_in}, seg_out, shapes, types, pool)
            del sess
            for v in list(live):
                if needed_later.get(v, -1) <= k and v not in feeds:
                    del live[v]
            # values later segments read are copied out: the buffer is overwritten by the next segment
            live.update((v, np.array(a)) for v, a in outs.items() if needed_later.get(v, -1) > k)
            self.last_run["pool_bytes"] = pool.allocated
            yield from _emit(seg_plans, outs, drop=True, stats=_bulk_stats({v: a for v, a in outs.items() if v in wanted}))


_PLANS: dict[tuple, tuple] = {}   # `_OrtRun._planned`'s results, oldest first
_SEGMENT_MODELS_KEPT = 256   # segment models an artifact keeps (a 10 s Kokoro decoder runs in ~33)
_PLANS_KEPT = 8


# file -> its weights as (name, module, tags, shape, dtype, stats, digest), in `graph_weights`' order
_WEIGHT_FACTS: dict[tuple, list[tuple]] = {}
_READY_AS_IS: dict[tuple, bool] = {}   # files `_exposable` returns unchanged (a set, oldest first)
_LAST_USE: dict[tuple, dict[str, int]] = {}   # (plan key, segments) -> `_last_use`
# (plan key, segments, segment, values wanted, threads, quiet) -> (session, its inputs, its outputs)
_SESSIONS: dict[tuple, tuple] = {}
_SESSIONS_KEPT = 4                  # a session holds its own copy of the weights it reads:
_SESSION_WEIGHT_BYTES = 32 << 20    # at most 4 x 32 MiB kept
_SESSION_RUN_BYTES = 64 << 20       # values of a run whose session is kept (its arena holds the run's scratch)
_REUSABLE: dict[tuple, bool] = {}   # file -> `_sessions_reusable`
_PER_FILE = (_PLANS, _WEIGHT_FACTS, _READY_AS_IS, _LAST_USE, _REUSABLE, _SESSIONS)   # every cache keyed by file


def forget_kept() -> None:
    """Let go of everything captures kept for the next capture of the same file: the ONNX Runtime sessions
    (and the weights they hold), the plans, the weights' statistics. A file is known by its path and the
    (mtime, ctime, size, inode) of it and its external data files; on a filesystem with one-second
    timestamps, call this after rewriting a file within a second of capturing it.

        >>> from tensorprobe.runtimes.onnxruntime import forget_kept
        >>> forget_kept()
    """
    for cache in _PER_FILE:
        cache.clear()


_FORKED_AWAY: list[dict] = []   # a forked child's copies of its parent's sessions: never run, never destroyed


def _drop_sessions_in_child() -> None:
    # A session's thread pool does not survive a fork: a child builds its own sessions. The inherited ones
    # are set aside rather than destroyed, since their destructor would join threads the child does not have.
    _FORKED_AWAY.append(dict(_SESSIONS))
    _SESSIONS.clear()


os.register_at_fork(after_in_child=_drop_sessions_in_child)


def _sessions_reusable(model: Any, key: tuple) -> bool:
    """Whether a session of this file may serve several captures: it has no random op (a kept session's
    generator goes on where the last run left it, where a new one starts again from its seed; a Dropout with
    a training-mode input may draw a mask) and weights small enough to keep. `key`: the file's `_file_key`."""
    got = _REUSABLE.get(key)
    if got is None:
        weight_bytes = sum(math.prod(i.dims) * _itemsize(i.data_type) for i in model.graph.initializer)
        got = weight_bytes <= _SESSION_WEIGHT_BYTES and not any(
            n.op_type in RNG_OPS or (n.op_type == "Dropout" and len(n.input) > 2 and n.input[2])
            for n in model.graph.node)
        _remember(_REUSABLE, key, got)
    return got


class _GraphWeightValues:
    """The weight values of an artifact's graph, decoded all at once the first time one is asked for."""

    def __init__(self, artifact: OnnxArtifact):
        self._artifact = artifact
        self._values: dict[str, np.ndarray] | None = None

    def __getitem__(self, name: str) -> np.ndarray:
        if self._values is None:
            a = self._artifact
            self._values = {n: v for n, v, _ in graph_weights(a.model.graph, a.state_names)}
        return self._values[name]


class _LazyWeight:
    """A remembered weight's shape and dtype, standing for its value: `np.asarray` decodes it."""

    __slots__ = ("_values", "_name", "shape", "dtype")

    def __init__(self, values: _GraphWeightValues, name: str, shape: tuple[int, ...], dtype: np.dtype):
        self._values, self._name, self.shape, self.dtype = values, name, shape, dtype

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        value = self._values[self._name]
        return value if dtype is None else value.astype(dtype, copy=False)


def _remember(cache: dict, key: tuple, value: Any, kept: int = _PLANS_KEPT) -> None:
    """Keep `value` under `key` in one of the caches (per file, per artifact), the newest `kept` only."""
    cache.pop(key, None)
    cache[key] = value
    while len(cache) > kept:
        cache.pop(next(iter(cache)))


def _file_key(artifact: OnnxArtifact) -> tuple | None:
    """The identity of an artifact's file contents as far as their metadata tells, or None: the path, then
    (mtime, ctime, size, inode) of the file and of each external data file. The ctime moves at every write
    even where the mtime is put back (`cp -p`, `rsync -t`, `tar x`)."""
    if artifact.path is None:
        return None
    try:
        stats = [os.stat(p) for p in (artifact.path, *artifact.data_files)]
    except OSError:
        return None
    return (str(artifact.path), *(x for st in stats for x in (st.st_mtime_ns, st.st_ctime_ns, st.st_size, st.st_ino)))


def _external_data_files(model: Any, base: Path) -> tuple[Path, ...]:
    """The files the model's external tensors (initializers, Constant nodes' values) are stored in."""
    import onnx

    tensors = list(model.graph.initializer) + [a.t for n in model.graph.node for a in n.attribute
                                               if a.type == onnx.AttributeProto.TENSOR]
    places = {e.value for t in tensors if t.data_location == onnx.TensorProto.EXTERNAL
              for e in t.external_data if e.key == "location"}
    return tuple(base / p for p in sorted(places))


def _of_file(cache_key: tuple, file_key: tuple) -> bool:
    """Whether a per-file cache's key is `file_key`'s: the file key itself, or a plan key (which starts
    with it) or a tuple that starts with a plan key."""
    n = len(file_key)
    return cache_key[:n] == file_key or (isinstance(cache_key[0], tuple) and cache_key[0][:n] == file_key)


def _plan_key(artifact: OnnxArtifact, key: tuple | None, feeds: dict[str, np.ndarray], by_name: bool
              ) -> tuple | None:
    """What a plan depends on, for a graph that is the same whenever its file is (`key`, its `_file_key`):
    a file on disk, no mapping rules, and nothing inlined by input value (If/Loop/Scan, functions). None:
    not remembered."""
    source = artifact.model   # (`model` may have had these inlined, by the inputs' values)
    if artifact.rules is not None or len(source.functions) \
            or any(n.op_type in ("If", "Loop", "Scan") for n in source.graph.node):
        return None
    if key is None:
        return None
    return (*key, by_name, tuple((name, a.shape, a.dtype.str) for name, a in feeds.items()))


def _bulk_stats(outs: dict[str, np.ndarray]) -> dict[str, TensorStats]:
    """Statistics of a run's float values, all at once: they lie in the one output buffer (`stats.batch`)."""
    names = list(outs)
    return {n: s for n, s in zip(names, float_stats_many([outs[n] for n in names])) if s is not None}


def _emit(plans: list[ValuePlan], outs: dict[str, np.ndarray], drop: bool,
          stats: dict[str, TensorStats] | None = None) -> Iterator[RuntimeTensor]:
    last = {p.value: i for i, p in enumerate(plans)}
    stats = stats or {}
    for i, p in enumerate(plans):
        arr = outs.get(p.value)
        if not _numeric(arr):
            continue
        yield from _tensors_for(p, arr, stats.get(p.value))
        if drop and last[p.value] == i:
            del outs[p.value]   # drop our reference as soon as the record is written
        del arr


def _numeric(arr: Any) -> bool:
    """A value a record can hold: numbers (text values and sequences are left out: see the run's notes)."""
    return arr is not None and getattr(arr, "dtype", None) is not None and arr.dtype.kind not in "OUS"


def _tensors_for(p: ValuePlan, value: np.ndarray, stats: TensorStats | None = None) -> Iterator[RuntimeTensor]:
    """One RuntimeTensor per record name of a value (one value can be several modules' output, and a graph
    output is also a model output), borrowing `value` from the output buffer."""
    for name in p.names:
        module, call = parse_name(name)
        yield RuntimeTensor(runtime_name=p.value, module=p.module if "/" in name else module, op=p.op, name=name,
                            inputs=p.inputs, tags=p.tags, call=call,
                            kind=KIND_RNG if "rng" in p.tags else KIND_OUTPUT, value=value, borrowed=True,
                            stats=stats)
    if p.model_output is not None:
        yield RuntimeTensor(runtime_name=p.value, module="", op="output", name=p.model_output,
                            inputs=(p.names[0],) if p.names else p.inputs, kind=KIND_MODEL_OUTPUT,
                            value=value, borrowed=True, stats=stats)


# ---- export ----------------------------------------------------------------------------------------
