"""`BundleWriter`: stream records and tensors of a capture into a bundle directory (needs torch)."""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import os
import platform
import queue
import shutil
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import safetensors.torch
import torch

from .._version import __version__
from ..errors import BundleError
from ..record import Record, dtype_name
from .format import (DEFAULT_SHARD_BYTES, FORMAT, FORMAT_VERSION, JOURNAL, MANIFEST, STATUS_COMPLETE,
                     STATUS_INCOMPLETE, STATUS_RUNNING, atomic_write_bytes, safetensors_header)
from .lock import LOCK, WriterLock
from .reader import Bundle, _TensorSource

_JOURNAL_BATCH = 256  # records journaled together (a crash loses at most the records since the last batch)
_JOURNAL_AFTER_S = 1.0  # no journal in a capture's first second: a short capture writes its records once


def tensor_sha256(t: torch.Tensor | np.ndarray) -> str:
    """SHA-256 of a tensor's bytes (of its text, for a string array: its bytes would be object pointers)."""
    if isinstance(t, torch.Tensor):
        arr = t.detach().cpu().contiguous().reshape(-1)   # 1-d: a 0-d tensor can't be viewed as bytes
        data = (arr.view(torch.uint8) if arr.numel() else arr).numpy().tobytes()
    elif np.asarray(t).dtype.kind in "OUS":
        data = "\x00".join(map(str, np.asarray(t).ravel())).encode()
    else:
        data = np.ascontiguousarray(t).tobytes()
    return hashlib.sha256(data).hexdigest()


def producer_info() -> dict[str, str]:
    return {"name": "tensorprobe", "version": __version__, "python": platform.python_version(),
            "torch": torch.__version__, "platform": platform.platform()}


def describe_inputs(inputs: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for name, t in inputs.items():
        if isinstance(t, (torch.Tensor, np.ndarray)):
            text = isinstance(t, np.ndarray) and t.dtype.kind in "OUS"
            out.append({"name": name, "shape": list(t.shape), "dtype": "str" if text else dtype_name(t.dtype),
                        "sha256": tensor_sha256(t)})
        else:
            out.append({"name": name, "value": repr(t)[:200]})
    return out


class BundleWriter:
    """Stream records (and optionally tensors) into a bundle directory.

    Args:
        path: bundle directory. An existing bundle there is replaced; any other non-empty directory
            is refused, so a typo never wipes unrelated files, and so is a directory that another live
            capture is writing (`BundleError`; the writer holds a flock on `.tensorprobe.lock` there, which
            the kernel drops when its process ends, so a killed capture does not leave it stuck).
        model, runtime, capture: free-form descriptions stored in the manifest.
        inputs: the model inputs (name -> tensor); their shapes, dtypes and SHA-256 are stored.
        shard_bytes: tensor data buffered before a shard is written.
        reuse_buffers: copy tensors into at most three staging buffers that are reused (1 MiB at first,
            growing to `shard_bytes`), instead of a fresh allocation per tensor. For captures that keep many
            tensors: on virtual machines a first touch of fresh memory costs more than the copy itself
            (4 KiB page faults at 0.3-2 GB/s, measured here). The buffers are kept for the process's next
            capture (`PREFAULTED`, at most 256 MiB in all; `release_buffers()` lets them go).

    Example:
        >>> with BundleWriter("out") as w:                                  # doctest: +SKIP
        ...     w.add(record, tensor)
    """

    def __init__(self, path: str | os.PathLike, *, model: dict | None = None, runtime: dict | None = None,
                 capture: dict | None = None, inputs: dict[str, Any] | None = None,
                 shard_bytes: int = DEFAULT_SHARD_BYTES, reuse_buffers: bool = False):
        self.path = Path(path)
        self.shard_bytes = shard_bytes
        self._prepare_dir()
        self._header = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "producer": producer_info(),
            "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "model": model or {}, "runtime": runtime or {"name": "pytorch", "version": torch.__version__},
            "capture": capture or {}, "inputs": describe_inputs(inputs or {}),
        }
        self._lines: list[str] = []      # each record's JSON, made once: journal and manifest share it
        self._records: list[Record] = []  # the same records, handed to `bundle()` without a re-read
        self._manifest: dict[str, Any] = {}
        self._write_failed = False
        self._journaled = 0              # lines already in the journal
        self._names: set[str] = set()
        self._pending: dict[str, torch.Tensor] = {}
        self._pending_ptrs: set[int] = set()
        self._pending_bytes = 0
        self._shards: list[str] = []
        self._closed = False
        self._staging = _StagingBuffers(shard_bytes, count=3) if reuse_buffers else None
        self._stage: _StagedShard | None = None  # the staging buffer being filled
        self._shard_writer = _ShardWriter(release=self._staging.give if self._staging else None)
        # The lock file marks the directory as a bundle being written. The journal is opened, and the
        # provisional manifest (header and status "running") written, with the first journaled records: a
        # capture that closes before (within its first second) creates neither and writes its manifest once.
        self._journal: Any = None
        self._opened = time.monotonic()
        self._shards_journaled = 0       # shards whose records are in the journal

    def _prepare_dir(self) -> None:
        p = self.path
        if p.exists() and not p.is_dir():
            raise BundleError(f"{p}: exists and is not a directory")
        if p.is_dir() and any(p.iterdir()):
            if not ((p / MANIFEST).exists() or (p / JOURNAL).exists() or (p / LOCK).exists()):
                raise BundleError(f"{p}: directory is not empty and is not a tensorprobe bundle; "
                                  "choose another output directory")
        p.mkdir(parents=True, exist_ok=True)
        # The lock first: a directory that a live capture writes is refused before anything in it is touched.
        self._lock = WriterLock.acquire(p)
        try:
            for entry in p.iterdir():   # the bundle being replaced, less the lock we hold
                if entry.name == LOCK:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
        except BaseException:
            self._lock.release(remove=False)
            raise

    def __len__(self) -> int:
        return len(self._lines)

    def unique_name(self, name: str) -> str:
        """`name`, or `name~1`, `name~2`... if it is taken (two outputs can't share a key)."""
        if name not in self._names:
            return name
        i = 1
        while f"{name}~{i}" in self._names:
            i += 1
        return f"{name}~{i}"

    def add(self, record: Record, tensor: torch.Tensor | None = None, *, copy: bool = True) -> Record:
        """Append a record; with `tensor`, also store its data.

        The data is copied (so later in-place ops can't alter it) unless `copy=False`: for a fresh buffer
        nobody else writes to, such as a runtime's output array.
        """
        if self._closed:
            raise BundleError(f"{self.path}: bundle already closed")
        if record.name in self._names:
            record = record.with_(name=self.unique_name(record.name))
        if tensor is not None:
            if tensor.dtype == torch.complex128:
                # safetensors has no complex128: stored as its float64 (re, im) pairs, read back by `_TensorSource`
                tensor = torch.view_as_real(tensor.resolve_conj())
            shard = self._stage_copy(record.name, tensor) if copy and self._staging is not None else None
            if shard is None:
                if self._stage is not None:
                    self._submit_shard()  # a shard is either staged or a dict of tensors, never both
                t = _cpu_copy(tensor) if copy else tensor.detach().to("cpu").contiguous()
                if not copy and t.untyped_storage().data_ptr() in self._pending_ptrs:
                    t = t.clone()  # one buffer under two names: safetensors stores each key's own bytes
                self._pending_ptrs.add(t.untyped_storage().data_ptr())
                self._pending[record.name] = t
                self._pending_bytes += t.numel() * t.element_size()
                shard = self._shard_name(len(self._shards))
            record = record.with_(shard=shard)
        self._names.add(record.name)
        self._lines.append(orjson.dumps(record.to_dict(), option=orjson.OPT_SERIALIZE_NUMPY).decode())
        self._records.append(record)
        if self._pending_bytes >= self.shard_bytes:
            self._submit_shard()
        self._journal_if_due()
        return record

    def _journal_if_due(self) -> None:
        """Journal the new records once a batch is waiting, from `_JOURNAL_AFTER_S` on: a capture that ends
        sooner writes its records once, in the manifest (a kill before then leaves an empty journal)."""
        if (len(self._lines) - self._journaled >= _JOURNAL_BATCH or self._shards_journaled < len(self._shards)) \
                and time.monotonic() - self._opened >= _JOURNAL_AFTER_S:
            self._write_journal()

    def _stage_copy(self, name: str, tensor: torch.Tensor) -> str | None:
        """Copy `tensor` into the staging buffer (flushing it first when full) and return the name of its
        shard. None for a tensor larger than a buffer or of a dtype safetensors has no code for: those get
        their own allocation."""
        assert self._staging is not None
        code = _SAFETENSORS_DTYPES.get(tensor.dtype)
        nbytes = tensor.numel() * tensor.element_size()
        if code is None or not 0 < nbytes <= self._staging.nbytes or tensor.layout != torch.strided:
            return None
        if self._stage is not None and self._stage.used + nbytes > self._stage.capacity:
            self._submit_shard()
        if self._stage is None:
            if self._pending:
                self._submit_shard()
            self._stage = _StagedShard(*self._staging.take(at_least=nbytes))
        self._stage.add(name, code, tensor)
        shard = self._shard_name(len(self._shards))
        if self._stage.used >= self._stage.capacity:
            self._submit_shard()
        return shard

    def _write_journal(self) -> None:
        new = self._lines[self._journaled:]
        try:
            if new:
                if not self._journaled:  # a reader of a killed capture finds the header and the status here
                    self._write_manifest(STATUS_RUNNING, None, sync=False)
                if self._journal is None:
                    self._journal = open(self.path / JOURNAL, "w", encoding="utf-8")
                self._journal.write("\n".join(new) + "\n")
                self._journaled = len(self._lines)
            self._shards_journaled = len(self._shards)
            if self._journal is not None:
                self._journal.flush()
        except OSError as e:
            # Raised inside the model's forward (a hook adds the record): as a bare OSError it read as the
            # model's own failure ("the model's forward raised OSError"); it is the bundle's disk.
            raise BundleError(f"{self.path}: writing the bundle's journal failed: {e}") from None

    def flush(self) -> None:
        """Hand buffered tensors to the shard writer (one shard, written atomically) and sync the journal."""
        self._submit_shard()
        self._write_journal()

    def _submit_shard(self, last: bool = False) -> None:
        if self._pending or self._stage is not None:
            name = self._shard_name(len(self._shards))
            self._shard_writer.submit(self.path / name, self._stage if self._stage is not None else self._pending,
                                      last=last)
            self._shards.append(name)
            self._pending = {}
            self._stage = None
            self._pending_ptrs = set()
            self._pending_bytes = 0

    def close(self, error: BaseException | None = None) -> None:
        """Finish the bundle; with `error`, mark it incomplete and record the exception.

        The manifest records why a capture stopped. When the disk is full, the half-written shard is removed
        to make room for it; if the manifest still can't be written, the error goes into the lock file's
        reserved bytes, where `Bundle.open` finds it. Raises `BundleError` when the bundle could not be
        written whole and `error` is None (given an `error`, that first error is what the caller sees).
        """
        if self._closed:
            return
        given = error
        try:
            self._submit_shard(last=True)  # the records go to the manifest: journaling them now would be a second write
        except BundleError as e:   # the shard writer failed earlier: its error is the one recorded below
            error = error or e
        try:
            if self._journal is not None:
                self._journal.close()
        except OSError as e:   # its buffered tail could not be written (disk full)
            error = error or e
        self._closed = True
        write_error = self._shard_writer.finish()
        if self._staging is not None:
            self._staging.release()  # every shard is on disk: the buffers serve the next capture
        self._staging = None
        self._write_failed = write_error is not None
        if write_error is not None and error is None:
            error = BundleError(f"{self.path}: writing a tensor shard failed: {write_error}")
        err = None
        if error is not None:
            err = {"type": type(error).__name__, "message": str(error),
                   "traceback": "".join(traceback.format_exception(error))[-8000:]}
        try:
            try:
                self._write_manifest(STATUS_INCOMPLETE if error else STATUS_COMPLETE, err)
            except OSError:
                _remove_partial_files(self.path)   # a shard cut short by a full disk: its space, for the manifest
                self._write_manifest(STATUS_INCOMPLETE if error else STATUS_COMPLETE, err)
        except OSError as e:
            # The journal and the provisional manifest stay; the reason goes where no new space is needed.
            self._write_failed = True
            if err is None:
                err = {"type": type(e).__name__, "message": f"the bundle could not be finished: {e}",
                       "traceback": "".join(traceback.format_exception(e))[-8000:]}
            self._lock.record_stop(err)
            self._lock.release(remove=False)
            if given is None:
                if isinstance(error, BundleError):
                    raise error
                raise BundleError(f"{self.path}: the bundle could not be finished: {e}") from None
            return
        (self.path / JOURNAL).unlink(missing_ok=True)
        self._lock.release(remove=True)
        if error is not None and given is None:
            # The forward went through but the bundle did not (a shard or the journal could not be written):
            # the caller must not take the capture for a success. The manifest says the same.
            raise error if isinstance(error, BundleError) else BundleError(f"{self.path}: {error}")

    def bundle(self) -> "Bundle":
        """The closed bundle, built from what was written rather than by reading the manifest back
        (parsing costs ~20 µs a record). After a failed shard write it is opened from disk, which checks
        every shard."""
        if not self._closed:
            raise BundleError(f"{self.path}: close the writer before opening its bundle")
        if self._write_failed:
            return Bundle.open(self.path)
        return Bundle(self.path, self._manifest, list(self._records), _TensorSource(self.path))

    def set_header(self, **fields: Any) -> None:
        """Update manifest fields (e.g. `model`) before `close`."""
        self._header.update(fields)

    def _write_manifest(self, status: str, error: dict | None, *, sync: bool = False) -> None:
        # Renamed into place, not fsynced, like the shards (and like torch.save and safetensors): a killed
        # process leaves the old manifest or the new one, whole; only a power cut in the seconds after can
        # lose it. An fsync cost 1-4 ms of a 30 ms capture here, paid by every item of a sweep.
        head = json.dumps({**self._header, "status": status, "error": error, "shards": list(self._shards)})
        self._manifest = json.loads(head)  # what a reader of the file gets, less the records
        # One record per line keeps the file readable, and reuses the JSON made for the journal.
        body = ",\n".join(self._lines)
        atomic_write_bytes(self.path / MANIFEST, f'{head[:-1]}, "records": [\n{body}\n]}}\n'.encode(), sync=sync)

    @staticmethod
    def _shard_name(i: int) -> str:
        return f"tensors-{i:05d}.safetensors"

    def __enter__(self) -> "BundleWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(error=exc)


def _remove_partial_files(root: Path) -> None:
    """Delete the temporary files a failed write leaves in a bundle (`.tensors-*.safetensors.tmp`,
    `.manifest.json.tmp-PID`): nothing reads them, and on a full disk their space is what the manifest needs."""
    for p in root.glob(".*.tmp*"):
        with contextlib.suppress(OSError):
            p.unlink()


def _cpu_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU copy of `tensor`; on the CPU by NumPy's memcpy (see `_StagedShard.add` for why)."""
    src = tensor.detach()
    if (src.device.type != "cpu" or src.layout != torch.strided or src.dtype not in _SAFETENSORS_DTYPES
            or src.numel() == 0):
        return src.to("cpu", copy=True).contiguous()
    src = src.contiguous()
    flat = src.as_strided((src.numel(),), (1,)).view(torch.uint8)
    return torch.from_numpy(flat.numpy().copy()).view(src.dtype).reshape(src.shape)


class _ShardWriter:
    """Writes shards on a background thread, so disk I/O overlaps the forward that is being captured.

    At most `depth` shards wait in the queue; with the one being filled and the one being written, a
    capture holds at most (depth + 2) × shard_bytes of tensor copies (3 × 128 MiB by default), whatever
    the model's size: the producer blocks when the queue is full.
    A shard is written to a temporary name and renamed: a reader never sees half a shard.
    The thread starts with the first shard that is not the last: a capture that writes one shard, at its
    close (a statistics-only capture keeps only the model's inputs and outputs), writes it on the caller's
    thread, since starting a thread cost ~2 ms of such a capture's ~30 ms on a loaded 2-core machine.
    """

    def __init__(self, depth: int = 1, release: Any = None):
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._release = release  # takes back a staging buffer once its shard is on disk
        self._thread: threading.Thread | None = None

    def submit(self, path: Path, tensors: "dict[str, torch.Tensor] | _StagedShard", last: bool = False) -> None:
        if self._error is not None:
            raise BundleError(f"{path.parent}: writing a tensor shard failed: {self._error}")
        if last and self._thread is None:
            self._write(path, tensors)
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="tensorprobe-shard-writer", daemon=True)
            self._thread.start()
        self._queue.put((path, tensors))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._write(*item)
            del item

    def _write(self, path: Path, tensors: "dict[str, torch.Tensor] | _StagedShard") -> None:
        if self._error is None:
            try:
                tmp = path.with_name(f".{path.name}.tmp")
                if isinstance(tensors, _StagedShard):
                    tensors.write(tmp)
                else:
                    safetensors.torch.save_file(tensors, str(tmp), metadata={"format": FORMAT})
                os.replace(tmp, path)
            except Exception as e:  # disk full, permissions: reported by finish()
                self._error = e
                with contextlib.suppress(OSError):   # what it holds of the shard is unreadable; free it
                    tmp.unlink(missing_ok=True)
        if isinstance(tensors, _StagedShard) and self._release is not None:
            self._release(tensors.buffer, tensors.capacity)

    def finish(self) -> BaseException | None:
        """Wait for every queued shard; the first write error, if any."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
        return self._error


_SAFETENSORS_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}
_PAGE = 4096  # O_DIRECT wants page-aligned addresses, lengths and file offsets
_HEADER_ROOM = 1 << 20  # bytes kept in front of a staging buffer's data for the shard's header
_FIRST_STAGE = 1 << 20  # data capacity of the first staging buffer of a capture


class _StagedShard:
    """Tensors packed back to back (no gaps: safetensors forbids holes) in one staging buffer, and written
    as a safetensors file straight from it: the header goes in the room kept in front of the data, and
    the file is written with O_DIRECT where the filesystem allows it. Page-cache writes of fresh pages ran
    at 0.3-0.4 GB/s on this project's VMs, O_DIRECT at ~2 GB/s, and it leaves the page cache to the user."""

    def __init__(self, buffer: torch.Tensor, capacity: int):
        self.buffer = buffer
        self.capacity = capacity  # bytes of tensor data it holds
        self.used = 0
        self.entries: list[tuple[str, str, tuple[int, ...], int, int]] = []

    def add(self, name: str, code: str, tensor: torch.Tensor) -> None:
        nbytes = tensor.numel() * tensor.element_size()
        src = tensor.detach()
        if not src.is_contiguous():
            src = src.contiguous()
        start = _HEADER_ROOM + self.used
        # as_strided, not reshape: a contiguous (1,) tensor may carry any stride, which view(uint8) refuses
        flat = src.as_strided((src.numel(),), (1,)).view(torch.uint8)
        if flat.device.type == "cpu":
            # NumPy's single-threaded memcpy: torch's copy_ splits a copy over its thread pool, and on a
            # loaded 2-core VM the pool's hand-offs made 34 MB of copies take 4 s instead of 20 ms
            self.buffer.numpy()[start:start + nbytes] = flat.numpy()
        else:
            self.buffer[start:start + nbytes].copy_(flat)
        self.entries.append((name, code, tuple(tensor.shape), self.used, self.used + nbytes))
        self.used += nbytes

    def write(self, path: Path) -> None:
        head = safetensors_header(self.entries, {"format": FORMAT}, align=_PAGE)
        data = self.buffer.numpy()
        end = _HEADER_ROOM + self.used
        if len(head) > _HEADER_ROOM:  # a header too big for the room (a shard of very many tiny tensors)
            with open(path, "wb") as f:
                f.write(head)
                f.write(memoryview(data)[_HEADER_ROOM:end])
            return
        start = _HEADER_ROOM - len(head)
        data[start:_HEADER_ROOM] = np.frombuffer(head, dtype=np.uint8)
        if not _write_direct(path, data, start, end):
            with open(path, "wb") as f:
                f.write(memoryview(data)[start:end])


def _write_direct(path: Path, buf: np.ndarray, start: int, end: int) -> bool:
    """Write `buf[start:end]` to a new file with O_DIRECT; `start` is page-aligned and `buf` has room for
    the last page to be written whole (the file is then truncated to size). False where O_DIRECT is not
    available (tmpfs, macOS) or refused: the caller then writes through the page cache."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | flag, 0o644)
    except OSError:
        return False
    padded_end = start + -(-(end - start) // _PAGE) * _PAGE
    view = memoryview(buf)[start:padded_end]
    try:
        done = 0
        while done < len(view):
            done += os.write(fd, view[done:done + (64 << 20)])
        os.ftruncate(fd, end - start)
    except OSError:
        os.close(fd)
        path.unlink(missing_ok=True)
        return False
    os.close(fd)
    return True


class _StagingBuffers:
    """At most `count` staging buffers, handed out and taken back, so tensor copies land in memory that
    was faulted in once. They start small (1 MiB of data) and grow 4x per new buffer up to `nbytes`, so a
    small capture does not fault in and hold three full shards; an outgrown buffer is dropped when it
    comes back."""

    def __init__(self, nbytes: int, count: int):
        self.nbytes = nbytes
        self._count = count
        self._live = 0
        self._next = min(nbytes, _FIRST_STAGE)
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        self._taken: list[torch.Tensor] = []   # every buffer handed out, given back to PREFAULTED at the end

    def take(self, at_least: int = 0) -> tuple[torch.Tensor, int]:
        """(buffer, capacity) with room for `at_least` bytes of data; when all buffers are in use, wait
        for the shard writer to give one back."""
        self._next = min(self.nbytes, max(self._next, at_least))
        while True:
            if self._free.empty() and self._live < self._count:
                self._live += 1
                buffer = PREFAULTED.take(_HEADER_ROOM + self._next + _PAGE, at_most=_HEADER_ROOM + self.nbytes + _PAGE)
                capacity = min(self.nbytes, buffer.numel() - _HEADER_ROOM - _PAGE)
                self._next = min(self.nbytes, 4 * max(self._next, capacity))
                self._taken.append(buffer)
                return buffer, capacity
            buffer, capacity = self._free.get()
            if capacity >= self._next:
                return buffer, capacity
            self._live -= 1  # outgrown: let it go and make a bigger one
            self._taken = [b for b in self._taken if b is not buffer]

    def give(self, buffer: torch.Tensor, capacity: int) -> None:
        self._free.put((buffer, capacity))

    def release(self) -> None:
        """Once no shard is pending: hand the buffers to the next capture (within PREFAULTED's bound)."""
        for buffer in self._taken:
            PREFAULTED.give(buffer)
        self._taken = []


def populated_bytes(nbytes: int) -> torch.Tensor:
    """A uint8 tensor of `nbytes` whose pages are already mapped (mmap MAP_POPULATE: one system call
    instead of one page fault per 4 KiB, ~7x faster on this project's VMs); a plain allocation elsewhere."""
    import mmap

    flags = getattr(mmap, "MAP_POPULATE", 0)
    if not flags or nbytes == 0:
        return torch.empty(nbytes, dtype=torch.uint8)
    try:
        mem = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | flags)
    except OSError:
        return torch.empty(nbytes, dtype=torch.uint8)
    return torch.frombuffer(mem, dtype=torch.uint8)  # the tensor keeps the mapping alive




class _PrefaultedBuffers:
    """Pre-faulted byte buffers kept between the captures of one process, up to `max_bytes` in all.

    Faulting in fresh memory is a fixed cost of every capture (34 MB of basic-pitch's values took 30 ms of
    `populated_bytes` in a 16 ms model run); a buffer given back here is handed to the next capture as it
    is. What is kept is bounded by `max_bytes` whatever the number of captures or records; a buffer that
    would go past it is let go (`release_buffers()` lets go of all of them)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._free: list[torch.Tensor] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int, at_most: int | None = None) -> torch.Tensor:
        """A uint8 buffer of at least `nbytes`, mapped in: the smallest kept one that fits (and holds at most
        `at_most` bytes, for a caller bound to a memory budget), else a new one of `nbytes`."""
        limit = at_most if at_most is not None else self.max_bytes
        with self._lock:
            fits = [i for i, b in enumerate(self._free) if nbytes <= b.numel() <= limit]
            if fits:   # (by index: `list.remove` would compare tensors by value)
                return self._free.pop(min(fits, key=lambda i: self._free[i].numel()))
        return populated_bytes(nbytes)

    def give(self, buffer: torch.Tensor) -> None:
        """Keep `buffer` for a later capture if it fits the bound (the smallest kept ones make room)."""
        if buffer.numel() > self.max_bytes:
            return
        with self._lock:
            self._free.append(buffer)
            self._free.sort(key=torch.Tensor.numel, reverse=True)
            while sum(b.numel() for b in self._free) > self.max_bytes:
                self._free.pop()

    def kept_bytes(self) -> int:
        with self._lock:
            return sum(b.numel() for b in self._free)

    def clear(self) -> None:
        with self._lock:
            self._free.clear()


# Kept between captures: the staging buffers of `BundleWriter(reuse_buffers=True)` and ONNX Runtime's output
# buffer. 256 MiB holds a small model's values and staging (basic-pitch: 34 MB) several times over.
PREFAULTED = _PrefaultedBuffers(256 << 20)


def release_buffers() -> None:
    """Let go of the pre-faulted buffers kept for later captures (their memory goes back to the OS)."""
    PREFAULTED.clear()
