"""The runtime interface: run a PyTorch model (or an exported artifact) somewhere else and capture it.

A runtime is one module under `runtimes/` with one `RuntimeAdapter` subclass, registered by name in
`runtimes/__init__.py`. The base class does the common work once: checking that the optional package
is installed (with a message naming the extra), opening the bundle writer, computing statistics, naming
records with the PyTorch module path while keeping the runtime's own node name in `runtime_name`.
A subclass fills in these methods:

    _prepare(model, inputs, workdir, **options) -> artifact   export / lower / compile (torch.onnx.export)
    _load(path, **options)            -> artifact    open a user's existing artifact (.onnx, .pte, .so)
    _run(artifact, inputs, selection) -> iterator of RuntimeTensor, in execution order; the model's own
                                         outputs with kind "model_output" (`output`, `output.0`, ...);
                                         `selection.wants(name)` says which records the capture keeps
    _weights(artifact)                -> iterator of RuntimeTensor of kind "param" (optional): the weights
                                         the artifact holds, named by state-dict name where it can tell
    run_module(module, inputs)        -> list of arrays (optional): one torch module alone in this runtime,
                                         what per-component isolation (`components.isolate_components`) needs

The keyword options of `_prepare` / `_load` are the runtime's options (`-O KEY=VALUE`): `check_options`
reads them from the signatures, so an unknown option fails before anything runs. Options a run needs
(threads, memory) travel on the artifact, never on the adapter: one adapter serves many captures.

    >>> from tensorprobe.runtimes import get_runtime                                # doctest: +SKIP
    >>> bundle = get_runtime("onnxruntime").capture(model, inputs, out="ort_bundle")  # doctest: +SKIP
"""

from __future__ import annotations

import importlib.util
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Iterable, Iterator, Sequence

import numpy as np
import torch

from ..bundle import Bundle
from ..bundle.writer import BundleWriter
from ..environment import collect as collect_environment
from ..errors import RuntimeUnavailable
from ..hooks import module_types
from ..record import KIND_MODEL_INPUT, KIND_MODEL_OUTPUT, KIND_OUTPUT, KIND_RNG, Record, dtype_name
from ..stats import TensorStats, compute_stats, tensor_digest, with_sketch


@dataclass(frozen=True)
class Selection:
    """Which records a capture keeps (`--include` / `--exclude` regexes on record names). A runtime that
    can skip work for values nobody keeps (ONNX Runtime: not making them graph outputs) asks `wants`.

    >>> Selection.of(include=r"norm").wants("decode.0.norm1", "other")
    True
    """

    include: re.Pattern | None = None
    exclude: re.Pattern | None = None

    @classmethod
    def of(cls, include: str | None = None, exclude: str | None = None) -> "Selection":
        return cls(re.compile(include) if include else None, re.compile(exclude) if exclude else None)

    def wants(self, *names: str) -> bool:
        """True when one of `names` (a record's names) is included and none is excluded."""
        if self.include is not None and not any(self.include.search(n) for n in names):
            return False
        return not (self.exclude is not None and any(self.exclude.search(n) for n in names))


@dataclass
class RuntimeTensor:
    """One intermediate value produced by a runtime, before it becomes a record."""

    runtime_name: str          # the runtime's own name (ONNX value name, ExecuTorch debug handle, ...)
    module: str                # PyTorch module path it maps to ("" for the root / unknown)
    op: str                    # the runtime's op type, e.g. "InstanceNormalization"
    value: np.ndarray | torch.Tensor
    name: str | None = None    # record name; default derived from module/op by the adapter
    inputs: tuple[str, ...] = ()  # record names of the values this op consumed (op graph)
    tags: tuple[str, ...] = field(default_factory=tuple)
    call: int = 0              # call index of `module` (a module the runtime ran several times)
    kind: str = KIND_OUTPUT    # record kind: "output", or "rng" for a random op
    borrowed: bool = False            # `value` lives in a buffer the runtime reuses: copied when kept
    stats: TensorStats | None = None  # `compute_stats(value)`, where the runtime computed a run's in bulk
    digest: str | None = None         # `tensor_digest(value)` of a weight, where the runtime remembers it


class RuntimeAdapter:
    """Base class of runtime adapters. Subclasses set `name`, `package`, `extra` and fill in the hooks."""

    name: ClassVar[str] = ""
    package: ClassVar[str] = ""        # import name checked by `available()`
    extra: ClassVar[str] = ""          # `pip install tensorprobe[<extra>]`
    artifact_suffixes: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def available(cls) -> bool:
        return importlib.util.find_spec(cls.package) is not None

    @classmethod
    def require(cls) -> None:
        if not cls.available():
            raise RuntimeUnavailable.missing(cls.package, cls.extra)

    @classmethod
    def option_names(cls, artifact: bool = False) -> tuple[str, ...] | None:
        """The keyword options `_prepare` (or `_load`, for an artifact) takes; None when it takes any."""
        import inspect

        hook = cls._load if artifact else cls._prepare
        params = list(inspect.signature(hook).parameters.values())
        if any(p.kind is p.VAR_KEYWORD for p in params) and hook is not RuntimeAdapter._prepare:
            return None
        return tuple(p.name for p in params if p.kind is p.KEYWORD_ONLY)

    @classmethod
    def check_options(cls, options: dict[str, Any], artifact: bool = False) -> None:
        """Raise InputError naming an option this runtime does not take, before anything runs.

        >>> get_runtime("onnxruntime").check_options({"exporter": "legacy"})     # doctest: +SKIP
        """
        known = cls.option_names(artifact)
        unknown = sorted(set(options) - set(known)) if known is not None else []
        if unknown:
            from ..errors import InputError

            raise InputError(f"runtime {cls.name!r} does not take option(s) {', '.join(unknown)}; it takes "
                             + (", ".join(known) if known else "no options")
                             + (" for an artifact" if artifact else ""))

    # ---- the public verbs -------------------------------------------------------------------------
    def capture(self, model: torch.nn.Module, inputs: Sequence[torch.Tensor], out: str | os.PathLike,
                *, keep: str = "full", include: str | None = None, exclude: str | None = None,
                workdir: str | os.PathLike | None = None, **options: Any) -> Bundle:
        """Export `model` to this runtime, run it on `inputs`, and write every intermediate to `out`."""
        self.require()
        self.check_options(options)
        with _Workdir(workdir) as wd:
            artifact = self._prepare(model, tuple(inputs), wd, **options)
            try:
                return self._capture_artifact(artifact, tuple(inputs), out, keep=keep, include=include,
                                              exclude=exclude, model_info={"class": type(model).__name__,
                                                                              "module_types": module_types(model)})
            finally:
                if workdir is None:   # the artifact's files go with the temporary directory
                    self._forget(artifact)

    def prepare(self, model: torch.nn.Module, inputs: Sequence[torch.Tensor], workdir: str | os.PathLike,
                **options: Any) -> Any:
        """Export and load `model` once (files in `workdir`, which must outlive the artifact): the handle
        `capture_prepared` runs on any inputs of the same shapes. A sweep prepares once per worker."""
        self.require()
        self.check_options(options)
        Path(workdir).mkdir(parents=True, exist_ok=True)
        return self._prepare(model, tuple(inputs), Path(workdir), **options)

    def load(self, path: str | os.PathLike, **options: Any) -> Any:
        """Load an exported artifact (e.g. `model.onnx`) once: the handle `capture_prepared` runs on any
        inputs it takes. A sweep against an artifact loads it once per worker."""
        self.require()
        self.check_options(options, artifact=True)
        return self._load(Path(path), **options)

    def capture_prepared(self, artifact: Any, inputs: Sequence[Any], out: str | os.PathLike, *,
                         keep: str = "full", include: str | None = None, exclude: str | None = None) -> Bundle:
        """Run an artifact from `prepare` on `inputs` and capture its intermediates."""
        return self._capture_artifact(artifact, tuple(inputs), out, keep=keep, include=include, exclude=exclude,
                                      model_info={"prepared": True})

    def capture_artifact(self, path: str | os.PathLike, inputs: Sequence[Any] | dict[str, Any],
                         out: str | os.PathLike, *, keep: str = "full", include: str | None = None,
                         exclude: str | None = None, **options: Any) -> Bundle:
        """Run an existing artifact (e.g. `model.onnx`) on `inputs` and capture its intermediates."""
        artifact = self.load(path, **options)
        return self._capture_artifact(artifact, inputs, out, keep=keep, include=include, exclude=exclude,
                                      model_info={"artifact": str(path)})

    # ---- hooks for subclasses -----------------------------------------------------------------------
    def _prepare(self, model: torch.nn.Module, inputs: tuple, workdir: Path, **options: Any) -> Any:
        raise NotImplementedError

    def _load(self, path: Path, **options: Any) -> Any:
        raise NotImplementedError(f"{self.name} can't load an existing artifact")

    def _run(self, artifact: Any, inputs: Any, selection: Selection) -> Iterable[RuntimeTensor]:
        """The run's records, in the order they are computed. The iterable may carry `notes` (a list of
        sentences on what the run did to the artifact), which the capture puts in `runtime.notes`."""
        raise NotImplementedError

    def _weights(self, artifact: Any) -> Iterator[RuntimeTensor]:
        """The artifact's weights (kind "param"), compared by `diff` before the forward; none by default."""
        return iter(())

    def _forget(self, artifact: Any) -> None:
        """Drop what captures of `artifact` kept for the next one (its files are about to be removed)."""

    def runtime_info(self, artifact: Any = None) -> dict[str, Any]:
        """Name, version and settings of the runtime (and of `artifact`, where the adapter knows some)."""
        mod = importlib.import_module(self.package)
        return {"name": self.name, "version": getattr(mod, "__version__", "unknown")}

    def run_module(self, module: torch.nn.Module, inputs: tuple, **options: Any) -> list[np.ndarray]:
        """Run one torch module alone in this runtime (export, lower, run) and return its outputs: what
        `components.isolate_components` needs to tell which component breaks. Optional."""
        raise NotImplementedError(f"runtime {self.name!r} cannot run one module alone (no run_module)")

    def import_error(self, model: torch.nn.Module, inputs: tuple) -> str | None:
        """Export `model` and hand it to this runtime's importer (or lowering), without compiling or running
        it: the importer's error, or None when it takes the model. What `preflight` reports as
        `import_error`. Optional."""
        raise NotImplementedError(f"runtime {self.name!r} has no import check")

    @classmethod
    def can_check_import(cls) -> bool:
        return cls.import_error is not RuntimeAdapter.import_error

    @classmethod
    def can_run_modules(cls) -> bool:
        """True when this runtime implements `run_module` (per-component isolation works with it)."""
        return cls.run_module is not RuntimeAdapter.run_module

    # ---- common work --------------------------------------------------------------------------------
    def _capture_artifact(self, artifact: Any, inputs: Any, out: str | os.PathLike, *, keep: str,
                          include: str | None, exclude: str | None, model_info: dict) -> Bundle:
        selection = Selection.of(include, exclude)
        named_inputs = _name_inputs(inputs)
        writer = BundleWriter(out, model=model_info, runtime=self.runtime_info(artifact),
                              capture={"level": "runtime", "keep": keep, "include": include, "exclude": exclude},
                              inputs=named_inputs, reuse_buffers=keep == "full")
        with writer:
            order = 0
            for rt in self._weights(artifact):
                name = rt.name or rt.runtime_name
                if not selection.wants(name):
                    continue
                data, shape, dtype = _data_of(rt, keep == "full" or rt.digest is None)
                stats = rt.stats if rt.stats is not None else compute_stats(data)
                writer.add(Record(name=name, module=rt.module, op=rt.op, order=order, shape=shape, dtype=dtype,
                                  stats=stats if keep == "full" else _sketched(stats, rt, data), kind=rt.kind,
                                  runtime_name=rt.runtime_name, tags=rt.tags,
                                  digest=rt.digest if rt.digest is not None else tensor_digest(data)),
                           data if keep == "full" else None, copy=rt.borrowed)
                order += 1
            for name, value in named_inputs.items():
                if isinstance(value, np.ndarray) and value.dtype.kind in "USO":   # text: described in the manifest
                    continue
                t = _to_torch(value)
                writer.add(Record(name=f"input.{name}", module="", op="input", order=order, shape=tuple(t.shape),
                                  dtype=dtype_name(t.dtype), stats=compute_stats(t), kind=KIND_MODEL_INPUT),
                           t)   # always kept: `diff` tells "the inputs already differ" by their values
                order += 1
            dtypes: set[str] = set()
            run = self._run(artifact, inputs, selection)
            for rt in run:
                name = rt.name or rt.runtime_name
                kept = rt.kind in _ALWAYS_KEPT
                if not kept and not selection.wants(name):
                    continue
                data, shape, dtype = _data_of(rt, keep == "full" or kept)
                dtypes.add(dtype)
                stats = rt.stats if rt.stats is not None else compute_stats(data)
                if not (keep == "full" or kept):
                    stats = _sketched(stats, rt, data)
                writer.add(Record(name=name, module=rt.module, op=rt.op, order=order, shape=shape,
                                  dtype=dtype, stats=stats,
                                  kind=rt.kind, call=rt.call, runtime_name=rt.runtime_name, inputs=rt.inputs,
                                  tags=rt.tags),
                           data if (keep == "full" or kept) else None, copy=rt.borrowed)
                order += 1
            info = self.runtime_info(artifact)
            notes = list(getattr(run, "notes", ()))   # what this run did to the artifact (reordered, seeded...)
            if notes:
                info["notes"] = notes
            env = collect_environment(runtime=info)
            env["dtypes"] = sorted(d for d in dtypes if d.startswith(("float", "bfloat")))
            writer.set_header(environment=env, runtime=info)
        return writer.bundle()


# The model's own outputs and the random draws keep their values whatever `keep` is (model inputs too, above),
# as a PyTorch capture keeps them: diagnosis and replay need them.
_ALWAYS_KEPT = (KIND_MODEL_OUTPUT, KIND_RNG)


def _sketched(stats: TensorStats, rt: RuntimeTensor, data: torch.Tensor | None) -> TensorStats:
    """`stats` with the value's sketch (`stats.sketch`), for a value whose tensor the bundle does not keep:
    from the tensor at hand, or the runtime's array; a weight the runtime reads lazily is left as it is."""
    value = data if data is not None else rt.value if isinstance(rt.value, np.ndarray) else None
    return stats if value is None else with_sketch(stats, value)


def _data_of(rt: RuntimeTensor, kept: bool) -> tuple[torch.Tensor | None, tuple[int, ...], str]:
    """(tensor, shape, dtype name) of a runtime value; no tensor where the record keeps no data and the
    runtime computed its figures (`stats`, and `digest` for a weight): the value is then not touched."""
    if kept or rt.stats is None:
        data = _to_torch(rt.value)
        return data, tuple(data.shape), dtype_name(data.dtype)
    return None, tuple(rt.value.shape), dtype_name(rt.value.dtype)


def _name_inputs(inputs: Any) -> dict[str, Any]:
    if isinstance(inputs, dict):
        return dict(inputs)
    return {str(i): v for i, v in enumerate(inputs)}


def _to_torch(value: Any) -> torch.Tensor:
    """A CPU tensor over `value`; copies only when NumPy can't lend its buffer (read-only or strided)."""
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    arr = np.require(np.asarray(value), requirements="C")   # not ascontiguousarray: it makes a 0-d array 1-d
    if not arr.flags.writeable:
        arr = arr.copy()
    return torch.from_numpy(arr)


class workdir:
    """A user-given directory (created if needed), or a temporary one removed on exit; yields a Path.

    >>> with workdir(None) as d:          # doctest: +SKIP
    ...     (d / "model.onnx").write_bytes(b"...")
    """

    def __init__(self, path: str | os.PathLike | None, prefix: str = "tensorprobe-"):
        self._path = path
        self._prefix = prefix
        self._tmp: tempfile.TemporaryDirectory | None = None

    def __enter__(self) -> Path:
        if self._path is not None:
            Path(self._path).mkdir(parents=True, exist_ok=True)
            return Path(self._path)
        self._tmp = tempfile.TemporaryDirectory(prefix=self._prefix)
        return Path(self._tmp.name)

    def __exit__(self, *exc: Any) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()


_Workdir = workdir  # `capture()` has a parameter named `workdir`
