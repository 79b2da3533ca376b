"""The runtime artifacts of a sweep, made once per model and input shape and shared through a directory.

An ONNX export of the Kokoro decoder takes 35-45 s: a sweep whose every worker exported it again spent
minutes before its first item. `ArtifactCache` keys an export by what makes it (runtime, options, the
reference's class and weights, the input shapes and dtypes, the torch and tensorprobe versions) and keeps
it under RESULTS/prepared/<key>/. The first worker to need a key exports it under a file lock; every other
worker, and every rerun, waits for the lock and loads the file: an ONNX model, an ExecuTorch program (its
`.pte`, ETRecord and tap names), a TVM library (its `.so` and tap names). A runtime without a file its
loader reopens is prepared per worker.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import torch

from ..bundle import atomic_write_bytes

# runtime -> the file its `_prepare` writes in the workdir (TVM writes its library only when told where: `save`)
CACHED_FILES = {"onnxruntime": "model.onnx", "executorch": "model.pte", "tvm": "model.so"}
SAVED_ON_REQUEST = {"tvm"}
DYNAMIC_RUNTIMES = {"onnxruntime"}     # exported once with symbolic dimensions for the plain runs of tier 1
FAILED = "failed"                      # `<key>.failed`: this model has no dynamic export (the exporter's reason)
DONE = "complete"                                # written last: a key directory without it is not used


class ArtifactCache:
    """Exports keyed by model and input shape under `root`, shared by every worker and by a rerun."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    @staticmethod
    def supports(runtime: str) -> bool:
        return runtime in CACHED_FILES

    def get(self, runtime: str, model: torch.nn.Module, inputs: tuple, options: dict[str, Any],
            model_digest: str) -> tuple[Any, bool]:
        """(the loaded artifact, True when this call exported it). Exports under a lock, at most once per key."""
        from ..runtimes import get_runtime

        adapter = get_runtime(runtime)
        key = artifact_key(runtime, model, inputs, options, model_digest)

        def export(work: Path) -> None:
            save = {"save": str(work / CACHED_FILES[runtime])} if runtime in SAVED_ON_REQUEST else {}
            adapter.prepare(model, inputs, work, **options, **save)

        made, _ = self._made_once(key, export)
        return _load(adapter, self.root / key / CACHED_FILES[runtime], model, options), made

    def get_dynamic(self, runtime: str, model: torch.nn.Module, inputs: tuple, options: dict[str, Any],
                    model_digest: str, make: bool = True) -> tuple[Any, bool, str | None]:
        """(the artifact exported with symbolic input dimensions, or None; True when this call exported it;
        why there is none). One per model and input ranks, for plain runs of items of any length; a model
        the exporter cannot export dynamically is remembered (`FAILED`), so no worker or rerun tries again.
        `make=False`: only one already made (or None, with no reason)."""
        from ..runtimes import get_runtime

        if runtime not in DYNAMIC_RUNTIMES:
            return None, False, f"{runtime} is exported per input shape"
        if options.get("dynamic") is False:
            return None, False, "dynamic=False: exported per input shape"
        adapter = get_runtime(runtime)
        ranks = tuple(torch.empty((0,) * t.ndim, dtype=t.dtype) if isinstance(t, torch.Tensor) else t for t in inputs)
        key = "dyn-" + artifact_key(runtime, model, ranks, {**options, "dynamic": True}, model_digest)
        dynamic = {**options, "dynamic": True}
        made, why = self._made_once(key, lambda work: adapter.prepare(model, inputs, work, **dynamic),
                                    make=make, remember_failure=True)
        if made is None:
            return None, False, why
        return _load(adapter, self.root / key / CACHED_FILES[runtime], model, options), made, None

    def _made_once(self, key: str, export: Callable[[Path], None], *, make: bool = True,
                   remember_failure: bool = False) -> tuple[bool | None, str | None]:
        """Make `root/key` at most once across workers and reruns: under the key's file lock, `export` writes
        a fresh work directory that is renamed into place complete. (True: made by this call; False: there
        already; None: not there and `make` is False, or, with `remember_failure`, the export failed now or
        before, with why: the `<key>.failed` file that keeps others from trying again)."""
        final, failed = self.root / key, self.root / f"{key}.{FAILED}"
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f"{key}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)        # another worker exporting this key: wait, then load its file
            if remember_failure and failed.exists():
                return None, failed.read_text()
            if (final / DONE).exists():
                return False, None
            if not make:
                return None, None
            work = self.root / f".{key}.tmp-{os.getpid()}"
            shutil.rmtree(work, ignore_errors=True)
            try:
                export(work)
            except Exception as e:  # noqa: BLE001 - remembered where asked (no dynamic export), else raised
                shutil.rmtree(work, ignore_errors=True)
                if not remember_failure:
                    raise
                why = f"no dynamic-shape export: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
                atomic_write_bytes(failed, why.encode())
                return None, why
            (work / DONE).write_text(key)
            shutil.rmtree(final, ignore_errors=True)       # a key left half-made by a killed run
            os.replace(work, final)
        return True, None


def artifact_key(runtime: str, model: torch.nn.Module, inputs: tuple, options: dict[str, Any],
                 model_digest: str) -> str:
    """What makes an export: a change to any of it is another key (an edited model is exported again)."""
    import tensorprobe

    shapes = [(tuple(t.shape), str(t.dtype)) if isinstance(t, torch.Tensor) else repr(t) for t in inputs]
    run_only = {"threads", "max_bytes"}          # options of a run, not of the export
    # the class by name only: a worker imports the sweep file from its own temporary copy, a module of
    # another name each time; the weights' digest and the shapes tell models apart
    parts = [runtime, repr(sorted((k, repr(v)) for k, v in options.items() if k not in run_only)),
             type(model).__qualname__, model_digest, repr(shapes), torch.__version__,
             getattr(tensorprobe, "__version__", "")]
    return hashlib.blake2b("\0".join(parts).encode(), digest_size=12).hexdigest()


def model_digest(model: torch.nn.Module, code: str | None = None) -> str:
    """A digest of the model's state (names, dtypes, shapes and bytes of every parameter and buffer) and of
    its code: `code` (the sweep file's text), else the source file of the model's class where it has one.
    An edited forward is exported again, not served the old graph."""
    h = hashlib.blake2b(digest_size=16)
    h.update((code if code is not None else _class_file_text(model)).encode())
    for name, t in model.state_dict().items():
        if not isinstance(t, torch.Tensor):
            continue
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        flat = t.detach().cpu().contiguous().reshape(-1)
        if flat.numel():
            h.update(flat.view(torch.uint8).numpy().data)
    return h.hexdigest()


def _class_file_text(model: torch.nn.Module) -> str:
    import inspect

    try:
        return Path(inspect.getfile(type(model))).read_text()
    except (TypeError, OSError, UnicodeDecodeError):
        return ""


def _load(adapter: Any, path: Path, model: torch.nn.Module, options: dict[str, Any]) -> Any:
    """The cached file loaded as `prepare` would have returned it (run options and export facts applied)."""
    takes = adapter.option_names(artifact=True) or ()
    given = {k: v for k, v in options.items() if k in takes}
    if "exporter" in takes:
        given.setdefault("exporter", "dynamo")              # `prepare`'s default: names its graph that way
    art = adapter.load(path, **given)
    if hasattr(art, "state_names"):
        art.state_names = frozenset(model.state_dict())      # which one-element initializers are weights
    return art
