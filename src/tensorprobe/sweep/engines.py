"""Where sweep items run: a local process pool (default), a Ray cluster or a Dask cluster.

Each engine keeps one `SweepWorker` per worker process (models built once) and hands back records as items
finish; the driver writes each one at once. A worker process that dies loses only the items it was running:
they are run again, alone, and an item that kills its worker `MAX_ATTEMPTS` times is recorded as failed.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator

from ..errors import InputError, RuntimeUnavailable
from .item import STATUS_FAILED, SweepWorker
from .spec import Candidate, TargetSource

MAX_ATTEMPTS = 2
ENGINES = ("local", "ray", "dask")

_WORKER: SweepWorker | None = None          # the local pool's worker state, one per process
_DASK_WORKERS: dict[tuple, SweepWorker] = {}


def run_items(engine: str, names: list[str], source: TargetSource, candidate: Candidate, keep_dir: str,
              options: dict[str, Any], workers: int, address: str | None = None,
              scratch: str | None = None, replay_rng: bool | None = None) -> Iterator[dict[str, Any]]:
    """Records of `names`, in the order they finish. `scratch`: a directory on this machine for the workers'
    prepared artifacts, which the caller removes (ignored on a remote cluster, whose workers clean up).
    `replay_rng`: overrides the Sweep's own (None keeps it)."""
    setup = (source, candidate, keep_dir, options, replay_rng)
    if engine == "local":
        yield from _local(names, setup, workers, scratch)
    elif engine == "ray":
        yield from _ray(names, setup, workers, address, None if address else scratch)
    elif engine == "dask":
        yield from _dask(names, setup, workers, address, None if address else scratch)
    else:
        raise InputError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")


def _died(name: str, attempts: int, how: str) -> dict[str, Any]:
    return {"item": name, "status": STATUS_FAILED, "attempts": attempts,
            "error": f"the worker process died running it ({how}; {attempts} attempts)", "seconds": 0.0}


# ---- local process pool ------------------------------------------------------------------------------
def _init_local(setup: tuple, scratch: str | None) -> None:
    global _WORKER
    import torch

    torch.set_num_threads(1)     # the pool's processes share the cores: one thread each, no oversubscription
    _WORKER = SweepWorker(*setup, scratch=scratch)


def _run_local(name: str) -> dict[str, Any]:
    assert _WORKER is not None
    return _WORKER.run(name)


def _local(names, setup, workers, scratch) -> Iterator[dict[str, Any]]:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    ctx = multiprocessing.get_context("spawn")      # fork after torch's threads start is unsafe
    attempts = {n: 0 for n in names}
    queue, suspects = list(names), []
    size = max(1, workers)
    while queue:
        pool = ProcessPoolExecutor(max_workers=min(size, len(queue)), mp_context=ctx, initializer=_init_local,
                                   initargs=(setup, scratch))
        running = {}
        broken = False
        try:
            while queue or running:
                while queue and len(running) < 2 * size and not broken:
                    n = queue.pop(0)
                    attempts[n] += 1
                    running[pool.submit(_run_local, n)] = n
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    n = running.pop(fut)
                    try:
                        yield {**fut.result(), "attempts": attempts[n]}
                    except BrokenProcessPool:
                        broken = True
                        suspects.append(n)
                if broken:
                    suspects += list(running.values())     # their futures are lost with the pool
                    running.clear()
                    break
        finally:
            pool.shutdown(wait=not broken, cancel_futures=True)
        if broken:
            # run each suspect alone: the one that kills its worker is found; the others just finish
            for n in suspects:
                if attempts[n] >= MAX_ATTEMPTS:
                    yield _died(n, attempts[n], "local pool")
                else:
                    queue.insert(0, n)
            suspects = []
            size = 1 if queue else size
        # a pool of one after a crash keeps a second crash from taking innocent items with it


# ---- Ray ---------------------------------------------------------------------------------------------
def _ray(names, setup, workers, address, scratch) -> Iterator[dict[str, Any]]:
    try:
        import ray
    except ImportError:
        raise RuntimeUnavailable.missing("ray", "ray") from None
    started = False
    if not ray.is_initialized():
        import logging

        from ..logs import is_quiet

        kwargs = {"address": address} if address else {"num_cpus": workers}
        ray.init(include_dashboard=False, log_to_driver=False,
                 logging_level=logging.ERROR if is_quiet() else logging.INFO, **kwargs)
        started = True
    try:
        Actor = ray.remote(num_cpus=1, max_restarts=-1)(_RayWorker)
        actors = [Actor.remote(setup, scratch) for _ in range(max(1, workers))]
        attempts = {n: 0 for n in names}
        queue = list(names)
        running: dict[Any, tuple[Any, str]] = {}
        idle = list(actors)
        while queue or running:
            while queue and idle:
                n, actor = queue.pop(0), idle.pop()
                attempts[n] += 1
                running[actor.run.remote(n)] = (actor, n)
            ready, _ = ray.wait(list(running), num_returns=1)
            for ref in ready:
                actor, n = running.pop(ref)
                idle.append(actor)
                try:
                    yield {**ray.get(ref), "attempts": attempts[n]}
                except ray.exceptions.RayActorError:
                    if attempts[n] >= MAX_ATTEMPTS:
                        yield _died(n, attempts[n], "Ray actor")
                    else:
                        queue.insert(0, n)     # the actor restarts (max_restarts) and takes it again
        _quietly(lambda: ray.get([a.close.remote() for a in actors], timeout=60))
    finally:
        if started:
            ray.shutdown()


class _RayWorker:
    def __init__(self, setup: tuple, scratch: str | None):
        import torch

        torch.set_num_threads(1)
        self.worker = SweepWorker(*setup, scratch=scratch)

    def run(self, name: str) -> dict[str, Any]:
        return self.worker.run(name)

    def close(self) -> None:
        self.worker.close()


# ---- Dask --------------------------------------------------------------------------------------------
def _dask_key(setup: tuple) -> tuple:
    source, candidate, keep_dir, options, replay_rng = setup
    return (source, candidate, keep_dir, tuple(sorted(options.items())), replay_rng)


def _dask_run(setup: tuple, scratch: str | None, name: str) -> dict[str, Any]:
    worker = _DASK_WORKERS.get(_dask_key(setup))
    if worker is None:
        import torch

        torch.set_num_threads(1)
        worker = _DASK_WORKERS[_dask_key(setup)] = SweepWorker(*setup, scratch=scratch)
    return worker.run(name)


def _dask_close(setup: tuple) -> None:
    worker = _DASK_WORKERS.pop(_dask_key(setup), None)
    if worker is not None:
        worker.close()


def _dask(names, setup, workers, address, scratch) -> Iterator[dict[str, Any]]:
    try:
        from distributed import Client, LocalCluster, as_completed
        from distributed.scheduler import KilledWorker
    except ImportError:
        raise RuntimeUnavailable.missing("distributed", "dask") from None
    import dask

    cluster = None
    with dask.config.set({"distributed.scheduler.allowed-failures": MAX_ATTEMPTS - 1,
                          "distributed.worker.daemon": False}):
        if address:
            client = Client(address)
        else:
            cluster = LocalCluster(n_workers=max(1, workers), threads_per_worker=1, processes=True,
                                   dashboard_address=None, silence_logs=50)
            client = Client(cluster)
        try:
            futures = {client.submit(_dask_run, setup, scratch, n, pure=False, key=f"item-{i}"): n
                       for i, n in enumerate(names)}
            for fut in as_completed(futures):
                n = futures[fut]
                try:
                    yield fut.result()
                except KilledWorker:
                    yield _died(n, MAX_ATTEMPTS, "Dask worker")
            _quietly(lambda: client.run(_dask_close, setup))
        finally:
            client.close()
            if cluster is not None:
                cluster.close()


def _quietly(cleanup: Callable[[], Any]) -> None:
    """Remove the workers' artifacts; a worker already gone has nothing left to remove."""
    try:
        cleanup()
    except Exception:  # noqa: BLE001 - cleanup must not turn a finished sweep into an error
        pass


def default_workers() -> int:
    return os.cpu_count() or 1


ProgressFn = Callable[[dict[str, Any]], None]
