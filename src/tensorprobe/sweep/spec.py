"""What a sweep runs: the `Sweep` a SWEEP_TARGET factory returns, and how a worker anywhere loads it.

A worker needs only the installed package and the sweep target's source: `TargetSource` carries the text
of a `file.py:factory` target (or the name of an importable module), so that a Ray or Dask worker on
another machine imports it from a temporary copy. The factory must be deterministic (seed what it draws):
each worker calls it once and finds the items by name.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

import torch

from ..errors import TargetError


@dataclass
class Sweep:
    """A reference model, the items to run it on, and what to compare it with.

    Args:
        reference: the PyTorch model.
        items: `{name: inputs}`, an iterable of `(name, inputs)`, or a sequence of names with `inputs`
            given (a function name -> inputs: nothing is built for items a worker does not run).
        candidate: a runtime name (`"onnxruntime"`, `"tvm"`, …), an exported artifact's path (`"model.onnx"`,
            run by the runtime its suffix names), a second PyTorch model (a converted or fp16 port), or None
            (the CLI's `--runtime`/`--cand`, else ONNX Runtime).
        sample_rate: when the output is audio: `audio check` on the candidate's and `audio diff`.
        runtime_options: passed to the runtime (`-O` of the CLI).
        replay_rng: the candidate's and the reference's random ops draw the same numbers: a PyTorch candidate
            replays the reference's draws; a runtime's draws are fed to the reference (`compare(replay_rng=True)`).
        pipeline: instead of a reference: a TTS pipeline whose `run(text)` returns `(audio, StageReport)`
            (`tensorprobe.tts`; e.g. `tensorprobe.tts.kokoro.KokoroPipeline`); the items are then texts (or
            `{name: text}`), each run through every stage checker.

        >>> def build():                                                              # doctest: +SKIP
        ...     items = {f"utt{i:03d}": make_inputs(seed=i) for i in range(500)}
        ...     return Sweep(MyDecoder().eval(), items, candidate="onnxruntime", sample_rate=24000)
    """

    reference: torch.nn.Module | None
    items: Any
    candidate: Any = None
    inputs: Callable[[str], Any] | None = None
    sample_rate: float | None = None
    runtime_options: dict[str, Any] = field(default_factory=dict)
    pipeline: Any = None
    replay_rng: bool = False

    def __post_init__(self) -> None:
        if (self.reference is None) == (self.pipeline is None):
            raise TargetError("a Sweep takes a reference model, or a TTS pipeline (pipeline=, with texts as items), "
                              "not both")
        if self.inputs is None:
            pairs = self.items.items() if isinstance(self.items, Mapping) else self.items
            table: dict[str, Any] = {}
            for pair in pairs:
                if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
                    raise TargetError("Sweep items must be {name: inputs}, (name, inputs) pairs, or names with "
                                      "inputs=function")
                table[str(pair[0])] = pair[1]
            self._table = table
            self.names = list(table)
        else:
            self.names = [str(n) for n in self.items]
        if len(set(self.names)) != len(self.names):
            raise TargetError("Sweep item names must be unique")

    def inputs_of(self, name: str) -> tuple:
        value = self.inputs(name) if self.inputs is not None else self._table[name]
        return tuple(value) if isinstance(value, (tuple, list)) else (value,)


def as_sweep(result: Any, spec: str) -> Sweep:
    if isinstance(result, Sweep):
        return result
    if isinstance(result, (tuple, list)) and len(result) == 2 and isinstance(result[0], torch.nn.Module):
        return Sweep(result[0], result[1])
    raise TargetError(f"SWEEP_TARGET {spec!r}: the factory must return tensorprobe.sweep.Sweep(...) or "
                      f"(model, items), got {type(result).__name__}")


@dataclass(frozen=True)
class TargetSource:
    """A factory as a worker can load it: the file's text (shipped with each task) or a module name.

    A sweep ships two: the SWEEP_TARGET, and a `--cand` factory when the candidate is a second model.
    """

    spec: str
    file_name: str | None = None
    text: str | None = None
    home: str | None = None      # the file's own directory: its sibling modules import from there

    @staticmethod
    def of(spec: str, what: str = "SWEEP_TARGET") -> "TargetSource":
        where, _, attr = spec.rpartition(":")
        if not attr or not where:
            raise TargetError(f"{what} {spec!r} must look like path/to/file.py:factory or package.module:factory")
        if where.endswith(".py") or "/" in where:
            path = Path(where)
            if not path.is_file():
                raise TargetError(f"{what} {spec!r}: no such file {where}")
            return TargetSource(spec, path.name, path.read_text(), str(path.resolve().parent))
        return TargetSource(spec)

    def call(self) -> Any:
        """What the factory returns, imported from a temporary copy of the shipped file."""
        from ..targets import call_factory

        if self.text is None:
            return call_factory(self.spec)
        where, _, attr = self.spec.rpartition(":")
        with tempfile.TemporaryDirectory(prefix="tensorprobe-sweep-") as d, _importable(self.home):
            path = Path(d) / self.file_name
            path.write_text(self.text)
            try:
                return call_factory(f"{path}:{attr}")
            except TargetError as e:        # name the user's file, not the copy
                raise TargetError(str(e).replace(str(path), where)) from None

    def load(self) -> Sweep:
        return as_sweep(self.call(), self.spec)


@contextlib.contextmanager
def _importable(home: str | None) -> Iterator[None]:
    """The sweep file's own directory on sys.path while its copy is imported (after the copy's directory),
    as `python file.py` would have it: `from my_model import Net` beside the file works. A worker on
    another machine that lacks the directory imports what its own environment has."""
    if home is None or not Path(home).is_dir():
        yield
        return
    sys.path.insert(0, home)
    try:
        yield
    finally:
        try:
            sys.path.remove(home)
        except ValueError:
            pass


@dataclass(frozen=True)
class Candidate:
    """What a sweep compares its reference with, as a worker can rebuild it.

    One of: `runtime` alone (export the reference to it, once per worker and input shape); `runtime` and
    `artifact`, an exported file (`model.onnx`, `model.pte`) loaded once per worker, whose path must be
    readable where the workers run; or `factory`, a second PyTorch model (a converted or fp16 port).
    None of them: the Sweep's own `candidate`, else ONNX Runtime.
    """

    runtime: str | None = None
    artifact: str | None = None
    factory: TargetSource | None = None

    @staticmethod
    def of(cand: str | None, runtime: str | None) -> "Candidate":
        """From the CLI's `--cand` (a `file.py:factory` or an artifact path) and `--runtime`."""
        if cand is None:
            return Candidate(runtime=runtime)
        from ..runtimes import runtime_for_artifact

        path = Path(cand)
        if path.suffix and path.suffix != ".py" and ":" not in path.name:
            if not path.is_file():
                raise TargetError(f"--cand {cand!r}: no such artifact file")
            opener = runtime or runtime_for_artifact(cand)
            if opener is None:
                raise TargetError(f"--cand {cand!r}: no runtime opens {path.suffix} files; name one with --runtime")
            return Candidate(runtime=opener, artifact=str(path.resolve()))
        if runtime is not None:
            raise TargetError("--cand FACTORY is a PyTorch model; --runtime does not apply to it")
        return Candidate(factory=TargetSource.of(cand, "--cand"))

    def build(self, sweep: Sweep) -> tuple[Any, str | None]:
        """What a worker compares with: (a runtime name or an eval-mode module, the artifact path or None)."""
        if self.factory is not None:
            model = self.factory.call()
            model = model[0] if isinstance(model, (tuple, list)) else model
            if not isinstance(model, torch.nn.Module):
                raise TargetError(f"--cand {self.factory.spec!r}: the factory must return a torch.nn.Module "
                                  f"(or (model, ...)), got {type(model).__name__}")
            return model.eval(), None
        if self.artifact is not None:
            return self.runtime, self.artifact
        cand = self.runtime or (sweep.candidate if sweep.candidate is not None else "onnxruntime")
        if isinstance(cand, torch.nn.Module):
            return cand.eval(), None
        if isinstance(cand, (str, Path)) and Path(cand).suffix and Path(cand).is_file():
            return Candidate.of(str(cand), None).build(sweep)        # the factory named an exported file
        return str(cand), None


def names_of(items: Iterable[Any]) -> list[str]:
    return [str(n) for n in items]
