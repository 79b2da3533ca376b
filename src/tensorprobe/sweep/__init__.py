"""Sweep a port over a corpus: every item through what `compare` runs, the worst items and the layers that fail
most often, on a local process pool, a Ray cluster or a Dask cluster.

    # my_sweep.py
    from tensorprobe.sweep import Sweep
    def build():
        items = {f"utt{i:03d}": make_inputs(seed=i) for i in range(500)}
        return Sweep(MyDecoder().eval(), items, candidate="onnxruntime", sample_rate=24000)

    >>> import tensorprobe as tp
    >>> summary = tp.sweep("my_sweep.py:build", "results", workers=2)          # doctest: +SKIP
    >>> summary.first_divergence[0]                                            # doctest: +SKIP
    ('generator.noise_res.1.adain1.0.norm', 37)

Each item runs plainly first (tier 1: both models, no capture, the outputs judged); only the items that do not
pass, and a sample of the rest (`sample_passing`), are captured and diffed (tier 2: `tensorprobe.sweep.tiers`).

RESULTS holds `items.jsonl` (one line per item as it finishes; a rerun skips the items done and retries
the ones that failed), `summary.json`, `report.html`, `bundles/<item>/` (statistics-only) for the items with
a finding, and `prepared/` with the runtime exports, one per model and input shape, that a rerun reuses.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from ..errors import InputError
from .engines import ENGINES, MAX_ATTEMPTS, default_workers, run_items
from .guard import require_main_guard
from .results import ResultStore, SweepSummary, summarize
from .spec import Candidate, Sweep, TargetSource
from .tiers import Tiering

PREPARED_DIR = "prepared"        # RESULTS/prepared/<key>/: runtime exports shared by workers and reruns


def sweep(target: str, out: str | os.PathLike, *, runtime: str | None = None, cand: str | None = None,
          workers: int | None = None,
          engine: str = "local", address: str | None = None, options: dict[str, Any] | None = None,
          limit: int | None = None, replay_rng: bool | None = None, sample_passing: int = 0,
          capture_all: bool = False, on_item: Callable[[dict[str, Any], int, int], None] | None = None) -> SweepSummary:
    """Run SWEEP_TARGET's items through reference and candidate; write RESULTS; return the aggregate.

    Args:
        target: `file.py:factory` or `package.module:factory` returning a `Sweep` (or `(model, items)`).
        out: the RESULTS directory (created; reused to resume).
        runtime: the candidate runtime, overriding the factory's candidate (default ONNX Runtime).
        cand: instead, an exported artifact of the reference (`model.onnx`, `model.pte`: run by `runtime`,
            else the runtime its suffix names) or a `file.py:factory` returning a second PyTorch model.
        workers: worker processes (default: the number of cores).
        engine: local, ray or dask; `address`: the Ray address (`auto`, `ray://HOST:PORT`) or the Dask
            scheduler (`tcp://HOST:PORT`); without it a local Ray or Dask cluster of `workers` is started.
        options: runtime options (`-O`).
        limit: run at most this many of the items not yet done.
        replay_rng: reference and candidate draw the same random numbers (overrides the Sweep's `replay_rng`):
            a runtime's draws are fed to the reference, a PyTorch candidate replays the reference's.
        sample_passing: besides the items whose plain run (tier 1) fails, run this many more at tier 2
            (captures, `diff`, `nan`), drawn evenly from the items to run, to show the distribution.
        capture_all: skip tier 1: every item gets the captures (what every item cost before tiers).
        on_item: called with (record, finished so far, to run) as each item finishes (progress).
    """
    from ..logs import quiet_third_party

    quiet_third_party()
    if engine not in ENGINES:
        raise InputError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    if engine == "local" or (engine == "dask" and not address):
        require_main_guard()          # spawned workers run the main script again
    candidate = Candidate.of(cand, runtime)
    if candidate.runtime is not None:
        from ..runtimes import get_runtime

        get_runtime(candidate.runtime).require()      # an unknown or missing runtime fails before any item runs
    source = TargetSource.of(target)
    loaded = source.load()
    names = loaded.names
    if not names:
        raise InputError(f"sweep {target!r}: the Sweep has no items; nothing would be checked")
    if candidate.factory is not None:
        candidate.build(loaded)      # a factory that does not return a module: one line here, not in every worker
    store = ResultStore(out)
    store.claim(_identity(target, cand, runtime, options, replay_rng))
    done = store.done()
    todo = [n for n in names if n not in done]
    if limit is not None:
        todo = todo[:limit]
    tiering = Tiering(tier1=not capture_all, sample=_sample(todo, sample_passing),
                      cache_dir=str(store.root / PREPARED_DIR))
    with tempfile.TemporaryDirectory(prefix="tensorprobe-sweep-") as scratch, store:
        for i, record in enumerate(run_items(engine, todo, source, candidate, str(store.bundles), options or {},
                                             workers or default_workers(), address, scratch, replay_rng,
                                             tiering), start=1):
            store.append(record)
            if on_item is not None:
                on_item(record, i, len(todo))
    latest = store.read()
    summary = summarize(latest[n] for n in names if n in latest)
    _write_json(store.root / "summary.json", summary.to_dict())
    from ..report.sweep import write_sweep_html

    write_sweep_html(store.root / "report.html", summary, [latest[n] for n in names if n in latest], target)
    return summary


def _identity(target: str, cand: str | None, runtime: str | None, options: dict[str, Any] | None,
              replay_rng: bool | None) -> dict[str, Any]:
    """What makes a sweep's results: a rerun into RESULTS must be the same sweep, or its old lines would
    be reported as this one's (files by absolute path: the same file from another directory is the same)."""
    def where(spec: str | None) -> str | None:
        if spec is None:
            return None
        file, sep, factory = spec.rpartition(":")
        path = file if sep else spec
        resolved = str(Path(path).resolve()) if Path(path).is_file() else path
        return f"{resolved}{sep}{factory}" if sep else resolved
    return {"target": where(target), "cand": where(cand), "runtime": runtime,
            "options": json.loads(json.dumps(options or {}, default=str)), "replay_rng": replay_rng}


def _sample(names: list[str], n: int) -> frozenset:
    """`n` of `names`, evenly spaced (the same on a rerun of the same list; no random draw to seed)."""
    if n <= 0 or not names:
        return frozenset()
    step = max(1.0, len(names) / n)
    return frozenset(names[int(i * step)] for i in range(min(n, len(names))))


def _write_json(path: Path, doc: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=False, default=str))
    os.replace(tmp, path)


from .._api import make_callable  # noqa: E402

make_callable(__name__, sweep)  # `tp.sweep(...)` calls it; `tensorprobe.sweep.<submodule>` still imports

__all__ = ["ENGINES", "MAX_ATTEMPTS", "ResultStore", "Sweep", "SweepSummary", "TargetSource", "summarize", "sweep"]
