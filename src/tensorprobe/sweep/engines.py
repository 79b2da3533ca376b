"""Where sweep items run: a local process pool (default), a Ray cluster or a Dask cluster.

Each engine keeps one `SweepWorker` per worker process (models built once) and hands back records as items
finish; the driver writes each one at once. A worker process that dies loses only the items it was running:
they are run again, alone, and an item that kills its worker `MAX_ATTEMPTS` times is recorded as failed.
"""

from __future__ import annotations

import os
from itertools import islice
from typing import Any, Callable, Iterator

from ..errors import InputError, RuntimeUnavailable
from .item import STATUS_FAILED
from .spec import Candidate, TargetSource
from .tiers import TieredWorker, Tiering

MAX_ATTEMPTS = 2
ENGINES = ("local", "ray", "dask")

_WORKER: TieredWorker | None = None          # the local pool's worker state, one per process
_DASK_WORKERS: dict[tuple, TieredWorker] = {}


def run_items(engine: str, names: list[str], source: TargetSource, candidate: Candidate, keep_dir: str,
              options: dict[str, Any], workers: int, address: str | None = None,
              scratch: str | None = None, replay_rng: bool | None = None,
              tiering: Tiering | None = None) -> Iterator[dict[str, Any]]:
    """Records of `names`, in the order they finish. `scratch`: a directory on this machine for the workers'
    prepared artifacts, which the caller removes (ignored on a remote cluster, whose workers clean up).
    `replay_rng`: overrides the Sweep's own (None keeps it). `tiering`: tier 1 first, the sample of
    passing items run at tier 2, and the shared artifact cache (default: tier 1, no sample, no cache)."""
    setup = (source, candidate, keep_dir, options, replay_rng, tiering or Tiering())
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


def _worker(setup: tuple, scratch: str | None) -> TieredWorker:
    *common, tiering = setup
    return TieredWorker(*common, scratch=scratch, tiering=tiering)


# ---- local process pool ------------------------------------------------------------------------------
def _init_local(setup: tuple, scratch: str | None) -> None:
    global _WORKER
    import torch

    _die_with_parent()
    torch.set_num_threads(1)     # the pool's processes share the cores: one thread each, no oversubscription
    _WORKER = _worker(setup, scratch)


def _die_with_parent() -> None:
    """Linux: the kernel kills this worker when the driver dies (a `kill -9` of the driver left its workers
    running their items for minutes). Elsewhere a no-op: the pool ends them when the driver exits normally."""
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)      # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _run_local(name: str) -> dict[str, Any]:
    assert _WORKER is not None
    return _WORKER.run(name)


def _local(names, setup, workers, scratch) -> Iterator[dict[str, Any]]:
    attempts = {n: 0 for n in names}
    queue = list(names)
    while queue:
        suspects = yield from _pool_pass(queue, setup, max(1, workers), scratch, attempts)
        # the items running when a worker died: each runs again alone, one pool of one at a time, so the one
        # that kills its worker is found and the innocent ones just finish
        while suspects:
            n = suspects.pop(0)
            if attempts[n] >= MAX_ATTEMPTS:
                yield _died(n, attempts[n], "local pool")
            else:
                suspects += (yield from _pool_pass([n], setup, 1, scratch, attempts))


def _pool_pass(queue: list[str], setup: tuple, size: int, scratch: str | None,
               attempts: dict[str, int]) -> Iterator[dict[str, Any]]:
    """Run `queue`'s items (popped as submitted) on a pool of `size` until it is empty or a worker dies;
    returns the items that were running when one died (their futures are lost with the pool)."""
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    ctx = multiprocessing.get_context("spawn")      # fork after torch's threads start is unsafe
    pool = ProcessPoolExecutor(max_workers=min(size, len(queue)), mp_context=ctx, initializer=_init_local,
                               initargs=(setup, scratch))
    running: dict[Any, str] = {}
    suspects: list[str] = []
    depth = 2 * size if size > 1 else 1     # one item in flight when isolating: a crash names it alone
    try:
        while queue or running:
            while queue and len(running) < depth:
                n = queue.pop(0)
                attempts[n] += 1
                running[pool.submit(_run_local, n)] = n
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in finished:
                n = running.pop(fut)
                try:
                    yield {**fut.result(), "attempts": attempts[n]}
                except BrokenProcessPool:
                    suspects.append(n)
            if suspects:
                suspects += list(running.values())
                running.clear()
                return suspects
        return suspects
    finally:
        pool.shutdown(wait=not suspects, cancel_futures=True)


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
        self.worker = _worker(setup, scratch)

    def run(self, name: str) -> dict[str, Any]:
        return self.worker.run(name)

    def close(self) -> None:
        self.worker.close()


# ---- Dask --------------------------------------------------------------------------------------------
def _dask_key(setup: tuple) -> tuple:
    source, candidate, keep_dir, options, replay_rng, tiering = setup
    return (source, candidate, keep_dir, tuple(sorted(options.items())), replay_rng, tiering)


def _dask_run(setup: tuple, scratch: str | None, name: str) -> dict[str, Any]:
    worker = _DASK_WORKERS.get(_dask_key(setup))
    if worker is None:
        import torch

        torch.set_num_threads(1)
        worker = _DASK_WORKERS[_dask_key(setup)] = _worker(setup, scratch)
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
    # worker-saturation 1.0: a worker holds only the items it runs. At Dask's default (1.1) a worker holds one
    # more queued, and when an item kills the worker, the item queued behind it counts that death too: in one
    # loaded test run an innocent item shared the killer's worker three times and failed as "the worker
    # process died".
    with dask.config.set({"distributed.scheduler.allowed-failures": MAX_ATTEMPTS - 1,
                          "distributed.scheduler.worker-saturation": 1.0,
                          "distributed.worker.daemon": False}):
        if address:
            client = Client(address)
        else:
            cluster = LocalCluster(n_workers=max(1, workers), threads_per_worker=1, processes=True,
                                   dashboard_address=None, silence_logs=50)
            client = Client(cluster)
        try:
            # a window of futures, not every item at once: the scheduler's memory stays bounded for any corpus
            pending = iter(enumerate(names))
            futures: dict[Any, str] = {}

            def submit(i: int, n: str) -> Any:
                fut = client.submit(_dask_run, setup, scratch, n, pure=False, key=f"item-{i}")
                futures[fut] = n
                return fut

            flow = as_completed([submit(i, n) for i, n in islice(pending, 4 * max(1, workers))])
            for fut in flow:
                n = futures.pop(fut)
                try:
                    yield fut.result()
                except KilledWorker:
                    yield _died(n, MAX_ATTEMPTS, "Dask worker")
                fut.release()
                for i, nxt in islice(pending, 1):
                    flow.add(submit(i, nxt))
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
