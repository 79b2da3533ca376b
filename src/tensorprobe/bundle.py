"""The bundle: a directory that any framework can read.

    my_capture/
        manifest.json              format version, producer, model/runtime, input hashes, records
        tensors-00000.safetensors  tensor data (keep="full"), in shards of at most `shard_bytes`
        tensors-00001.safetensors
        records.jsonl              journal, present only while a capture is running

`BundleWriter` streams: tensors are buffered up to one shard and flushed, so peak memory does not grow
with the number of captured tensors. Each record is appended to the journal as it is made; if the process
dies mid-capture the journal still yields a readable bundle marked incomplete. `close(error=...)` records
the exception of a forward that raised (often exactly what is being debugged).

`Bundle.open` reads a bundle directory lazily (shards are memory-mapped by safetensors), and also opens
a plain `.safetensors` or `.npz` file of named tensors, as dumped by a Swift/MLX/C++ port, computing
statistics on load.

    >>> b = Bundle.open("my_capture")                         # doctest: +SKIP
    >>> [r.name for r in b if not r.stats.all_finite][:1]     # doctest: +SKIP
    ['decoder.generator.noise_res.0.adain1.0.norm/rsqrt.0']
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import queue
import shutil
import struct
import threading
import traceback
import zipfile
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import safetensors
import safetensors.torch
import torch

from . import __version__
from .errors import BundleError
from .record import KIND_OUTPUT, OP_UNKNOWN, Record, dtype_name
from .stats import compute_stats

FORMAT = "tensorprobe-bundle"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
JOURNAL = "records.jsonl"
DEFAULT_SHARD_BYTES = 128 << 20
_JOURNAL_BATCH = 256  # records journaled together (a crash loses at most the records since the last batch)

STATUS_COMPLETE = "complete"
STATUS_INCOMPLETE = "incomplete"
STATUS_RUNNING = "running"


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` through a temporary file renamed into place: readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def tensor_sha256(t: torch.Tensor | np.ndarray) -> str:
    arr = t.detach().cpu().contiguous() if isinstance(t, torch.Tensor) else np.ascontiguousarray(t)
    if isinstance(arr, torch.Tensor):
        arr = arr.view(torch.uint8) if arr.numel() else arr
        data = arr.numpy().tobytes()
    else:
        data = arr.tobytes()
    return hashlib.sha256(data).hexdigest()


def producer_info() -> dict[str, str]:
    return {"name": "tensorprobe", "version": __version__, "python": platform.python_version(),
            "torch": torch.__version__, "platform": platform.platform()}


class BundleWriter:
    """Stream records (and optionally tensors) into a bundle directory.

    Args:
        path: bundle directory. An existing bundle there is replaced; any other non-empty directory
            is refused, so a typo never wipes unrelated files.
        model, runtime, capture: free-form descriptions stored in the manifest.
        inputs: the model inputs (name -> tensor); their shapes, dtypes and SHA-256 are stored.
        shard_bytes: tensor data buffered before a shard is written.
        reuse_buffers: copy tensors into at most three staging buffers that are reused (1 MiB at first,
            growing to `shard_bytes`), instead of a fresh allocation per tensor. For captures that keep many
            tensors: on virtual machines a first touch of fresh memory costs more than the copy itself
            (4 KiB page faults at 0.3-2 GB/s, measured here).

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
        self._write_manifest(STATUS_RUNNING, None)
        self._journal = open(self.path / JOURNAL, "w", encoding="utf-8")

    def _prepare_dir(self) -> None:
        p = self.path
        if p.exists() and not p.is_dir():
            raise BundleError(f"{p}: exists and is not a directory")
        if p.is_dir() and any(p.iterdir()):
            if not ((p / MANIFEST).exists() or (p / JOURNAL).exists()):
                raise BundleError(f"{p}: directory is not empty and is not a tensorprobe bundle; "
                                  "choose another output directory")
            shutil.rmtree(p)
        p.mkdir(parents=True, exist_ok=True)

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
                    self.flush()  # a shard is either staged or a dict of tensors, never both
                t = tensor.detach().to("cpu", copy=copy).contiguous()
                if not copy and t.untyped_storage().data_ptr() in self._pending_ptrs:
                    t = t.clone()  # one buffer under two names: safetensors stores each key's own bytes
                self._pending_ptrs.add(t.untyped_storage().data_ptr())
                self._pending[record.name] = t
                self._pending_bytes += t.numel() * t.element_size()
                shard = self._shard_name(len(self._shards))
            record = record.with_(shard=shard)
        self._names.add(record.name)
        self._lines.append(json.dumps(record.to_dict()))
        self._records.append(record)
        if self._pending_bytes >= self.shard_bytes:
            self.flush()
        elif len(self._lines) - self._journaled >= _JOURNAL_BATCH:
            self._write_journal()
        return record

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
            self.flush()
        if self._stage is None:
            if self._pending:
                self.flush()
            self._stage = _StagedShard(*self._staging.take(at_least=nbytes))
        self._stage.add(name, code, tensor)
        shard = self._shard_name(len(self._shards))
        if self._stage.used >= self._stage.capacity:
            self.flush()
        return shard

    def _write_journal(self) -> None:
        new = self._lines[self._journaled:]
        if new:
            self._journal.write("\n".join(new) + "\n")
            self._journaled = len(self._lines)
        self._journal.flush()

    def flush(self) -> None:
        """Hand buffered tensors to the shard writer (one shard, written atomically) and sync the journal."""
        if self._pending or self._stage is not None:
            name = self._shard_name(len(self._shards))
            self._shard_writer.submit(self.path / name, self._stage if self._stage is not None else self._pending)
            self._shards.append(name)
            self._pending = {}
            self._stage = None
            self._pending_ptrs = set()
            self._pending_bytes = 0
        self._write_journal()

    def close(self, error: BaseException | None = None) -> None:
        """Finish the bundle; with `error`, mark it incomplete and record the exception."""
        if self._closed:
            return
        self.flush()
        self._journal.close()
        self._closed = True
        write_error = self._shard_writer.finish()
        self._staging = None  # the buffers go back to the OS
        self._write_failed = write_error is not None
        if write_error is not None and error is None:
            error = write_error
        err = None
        if error is not None:
            err = {"type": type(error).__name__, "message": str(error),
                   "traceback": "".join(traceback.format_exception(error))[-8000:]}
        self._write_manifest(STATUS_INCOMPLETE if error else STATUS_COMPLETE, err)
        (self.path / JOURNAL).unlink(missing_ok=True)

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

    def _write_manifest(self, status: str, error: dict | None) -> None:
        head = json.dumps({**self._header, "status": status, "error": error, "shards": list(self._shards)})
        self._manifest = json.loads(head)  # what a reader of the file gets, less the records
        # One record per line keeps the file readable, and reuses the JSON made for the journal.
        body = ",\n".join(self._lines)
        atomic_write_bytes(self.path / MANIFEST, f'{head[:-1]}, "records": [\n{body}\n]}}\n'.encode())

    @staticmethod
    def _shard_name(i: int) -> str:
        return f"tensors-{i:05d}.safetensors"

    def __enter__(self) -> "BundleWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(error=exc)


class _ShardWriter:
    """Writes shards on a background thread, so disk I/O overlaps the forward that is being captured.

    At most `depth` shards wait in the queue; with the one being filled and the one being written, a
    capture holds at most (depth + 2) × shard_bytes of tensor copies (3 × 128 MiB by default), whatever
    the model's size: the producer blocks when the queue is full.
    A shard is written to a temporary name and renamed: a reader never sees half a shard.
    """

    def __init__(self, depth: int = 1, release: Any = None):
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._release = release  # takes back a staging buffer once its shard is on disk
        self._thread = threading.Thread(target=self._run, name="tensorprobe-shard-writer", daemon=True)
        self._thread.start()

    def submit(self, path: Path, tensors: "dict[str, torch.Tensor] | _StagedShard") -> None:
        if self._error is not None:
            raise BundleError(f"{path.parent}: writing a tensor shard failed: {self._error}")
        self._queue.put((path, tensors))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            path, tensors = item
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
            if isinstance(tensors, _StagedShard) and self._release is not None:
                self._release(tensors.buffer, tensors.capacity)
            del tensors, item

    def finish(self) -> BaseException | None:
        """Wait for every queued shard; the first write error, if any."""
        self._queue.put(None)
        self._thread.join()
        return self._error


_SAFETENSORS_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}
_PAGE = 4096  # O_DIRECT wants page-aligned addresses, lengths and file offsets
_HEADER_ROOM = 1 << 20  # bytes kept in front of a staging buffer's data for the shard's header
_FIRST_STAGE = 1 << 20  # data capacity of the first staging buffer of a capture


def safetensors_header(entries: Any, metadata: dict[str, str] | None = None, align: int = 8) -> bytes:
    """The head of a safetensors file: u64 length + JSON, space-padded so the data starts at a multiple of
    `align` (the format allows trailing spaces in the header).

    `entries` yields `(name, dtype code, shape, begin, end)`, offsets relative to the data section.

    >>> len(safetensors_header([("x", "F32", (2,), 0, 8)], align=64))
    64
    """
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    for name, code, shape, begin, end in entries:
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [begin, end]}
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-(8 + len(head)) % align)
    return struct.pack("<Q", len(head)) + head


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
        flat = src.as_strided((src.numel(),), (1,))
        self.buffer[start:start + nbytes].copy_(flat.view(torch.uint8))
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

    def take(self, at_least: int = 0) -> tuple[torch.Tensor, int]:
        """(buffer, capacity) with room for `at_least` bytes of data; when all buffers are in use, wait
        for the shard writer to give one back."""
        self._next = min(self.nbytes, max(self._next, at_least))
        while True:
            if self._free.empty() and self._live < self._count:
                self._live += 1
                capacity, self._next = self._next, min(self.nbytes, 4 * self._next)
                return populated_bytes(_HEADER_ROOM + capacity + _PAGE), capacity
            buffer, capacity = self._free.get()
            if capacity >= self._next:
                return buffer, capacity
            self._live -= 1  # outgrown: let it go and make a bigger one

    def give(self, buffer: torch.Tensor, capacity: int) -> None:
        self._free.put((buffer, capacity))


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


def describe_inputs(inputs: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for name, t in inputs.items():
        if isinstance(t, (torch.Tensor, np.ndarray)):
            out.append({"name": name, "shape": list(t.shape), "dtype": dtype_name(t.dtype),
                        "sha256": tensor_sha256(t)})
        else:
            out.append({"name": name, "value": repr(t)[:200]})
    return out


class Bundle:
    """A captured set of records, read lazily. Open with `Bundle.open(path)`."""

    def __init__(self, path: Path, manifest: dict[str, Any], records: list[Record],
                 tensor_source: "_TensorSource"):
        self.path = path
        self.manifest = manifest
        self.records = records
        self._by_name = {r.name: r for r in records}
        self._source = tensor_source

    @classmethod
    def open(cls, path: str | os.PathLike) -> "Bundle":
        """Open a bundle directory, or a plain `.safetensors` / `.npz` file of named tensors.

        Raises:
            BundleError: missing, corrupt, truncated or unsafe bundle (the message names the file).
        """
        p = Path(path)
        if not p.exists():
            raise BundleError(f"{p}: no such bundle (expected a directory with {MANIFEST}, "
                              "a .safetensors or a .npz file)")
        if p.is_dir():
            return _open_dir(p)
        if p.suffix == ".npz":
            return _open_npz(p)
        if p.suffix == ".safetensors":
            return _open_safetensors_file(p)
        raise BundleError(f"{p}: not a bundle (expected a directory, .safetensors or .npz)")

    @property
    def complete(self) -> bool:
        return self.manifest.get("status") == STATUS_COMPLETE

    @property
    def error(self) -> dict | None:
        return self.manifest.get("error")

    @property
    def runtime(self) -> dict:
        return self.manifest.get("runtime", {})

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def __contains__(self, name: str) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> Record:
        try:
            return self._by_name[name]
        except KeyError:
            raise BundleError(f"{self.path}: no record named {name!r}") from None

    def get(self, name: str) -> Record | None:
        return self._by_name.get(name)

    def tensor(self, name: str) -> torch.Tensor:
        """The stored data of record `name` (memory-mapped where the format allows)."""
        rec = self[name]
        if not rec.has_tensor:
            raise BundleError(f"{self.path}: record {name!r} has statistics only "
                              "(capture with keep='full' to store tensors)")
        return self._source.get(rec)

    def numpy(self, name: str) -> np.ndarray:
        t = self.tensor(name)
        if t.dtype == torch.bfloat16:
            t = t.float()
        return t.numpy()

    def close(self) -> None:
        self._source.close()

    def __enter__(self) -> "Bundle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Bundle({str(self.path)!r}, records={len(self.records)}, status={self.manifest.get('status')!r})"


class _TensorSource:
    """Reads tensors from safetensors shards of a bundle directory, opening each shard once."""

    def __init__(self, root: Path):
        self.root = root
        self._handles: dict[str, Any] = {}

    def get(self, rec: Record) -> torch.Tensor:
        shard = rec.shard
        assert shard is not None
        h = self._handles.get(shard)
        if h is None:
            path = self.root / shard
            try:
                h = safetensors.safe_open(str(path), framework="pt")
            except Exception as e:  # safetensors raises its own error type for corrupt headers
                raise BundleError(f"{path}: corrupt or truncated tensor shard ({e})") from None
            self._handles[shard] = h
        try:
            t = h.get_tensor(rec.name)
        except Exception as e:
            raise BundleError(f"{self.root / shard}: can't read tensor {rec.name!r} ({e})") from None
        if rec.dtype == "complex128" and not t.is_complex():
            t = torch.view_as_complex(t)  # stored as (re, im) pairs: see BundleWriter.add
        return t

    def close(self) -> None:
        self._handles.clear()


def _check_shard_path(root: Path, shard: str) -> None:
    if os.path.isabs(shard) or ".." in Path(shard).parts or "/" in shard or "\\" in shard:
        raise BundleError(f"{root / MANIFEST}: unsafe shard path {shard!r} (must be a file name inside the bundle)")


def _read_manifest(root: Path) -> dict[str, Any]:
    mpath = root / MANIFEST
    if not mpath.exists():
        if (root / JOURNAL).exists():
            return {"format": FORMAT, "format_version": FORMAT_VERSION, "status": STATUS_RUNNING, "records": []}
        raise BundleError(f"{root}: not a tensorprobe bundle ({MANIFEST} is missing)")
    try:
        manifest = json.loads(mpath.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BundleError(f"{mpath}: corrupt manifest ({e})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BundleError(f"{mpath}: not a tensorprobe manifest")
    if int(manifest.get("format_version", 0)) > FORMAT_VERSION:
        raise BundleError(f"{mpath}: format version {manifest['format_version']} is newer than this "
                          f"tensorprobe supports ({FORMAT_VERSION}); upgrade tensorprobe")
    return manifest


def _open_dir(root: Path) -> Bundle:
    manifest = _read_manifest(root)
    raw_records = manifest.get("records", [])
    if manifest.get("status") == STATUS_RUNNING:
        raw_records = _read_journal(root)
        manifest = {**manifest, "status": STATUS_INCOMPLETE,
                    "error": {"type": "Interrupted", "message": "capture did not finish (the process was "
                              "killed); records up to the last flushed shard are kept"}}
    try:
        records = [Record.from_dict(d) for d in raw_records]
    except (KeyError, TypeError, ValueError) as e:
        raise BundleError(f"{root / MANIFEST}: malformed record ({e})") from None
    records = _validate_shards(root, records, manifest)
    return Bundle(root, manifest, records, _TensorSource(root))


def _validate_shards(root: Path, records: list[Record], manifest: dict) -> list[Record]:
    """Check every referenced shard is safe and readable; after a crash, drop references to unwritten shards."""
    status_ok = manifest.get("status") == STATUS_COMPLETE
    checked: dict[str, bool] = {}
    out = []
    for r in records:
        if r.shard is not None:
            if r.shard not in checked:
                _check_shard_path(root, r.shard)
                path = root / r.shard
                if path.exists():
                    try:
                        with safetensors.safe_open(str(path), framework="pt") as f:
                            f.keys()
                    except Exception as e:
                        raise BundleError(f"{path}: corrupt or truncated tensor shard ({e})") from None
                    checked[r.shard] = True
                elif status_ok:
                    raise BundleError(f"{path}: tensor shard listed in the manifest is missing")
                else:
                    checked[r.shard] = False
            if not checked[r.shard]:
                r = r.with_(shard=None)
        out.append(r)
    return out


def _read_journal(root: Path) -> list[dict]:
    out = []
    with open(root / JOURNAL, encoding="utf-8") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break  # the last line may be cut short by the crash
    return out


class _DictSource:
    """Tensors of a plain file, loaded on demand."""

    def __init__(self, loader):
        self._loader = loader

    def get(self, rec: Record) -> torch.Tensor:
        return self._loader(rec.name)

    def close(self) -> None:
        pass


def _plain_manifest(path: Path, kind: str) -> dict[str, Any]:
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "status": STATUS_COMPLETE, "error": None,
            "producer": {"name": kind}, "runtime": {"name": "external", "file": path.name}, "records": []}


def _records_from_tensors(items: Iterator[tuple[str, torch.Tensor]], shard: str) -> list[Record]:
    return [
        Record(name=name, module=name, op=OP_UNKNOWN, order=i, shape=tuple(t.shape), dtype=dtype_name(t.dtype),
               stats=compute_stats(t), kind=KIND_OUTPUT, device="cpu", shard=shard)
        for i, (name, t) in enumerate(items)
    ]


def _open_safetensors_file(path: Path) -> Bundle:
    try:
        handle = safetensors.safe_open(str(path), framework="pt")
        keys = list(handle.keys())
        order = _safetensors_key_order(path, keys)
        records = _records_from_tensors(((k, handle.get_tensor(k)) for k in order), path.name)
    except BundleError:
        raise
    except Exception as e:
        raise BundleError(f"{path}: corrupt or truncated safetensors file ({e})") from None
    return Bundle(path, _plain_manifest(path, "safetensors file"), records,
                  _DictSource(lambda name: handle.get_tensor(name)))


def _safetensors_key_order(path: Path, keys: list[str]) -> list[str]:
    """Keys in the order they were written (data offset), which for a dump is execution order."""
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    return sorted(keys, key=lambda k: header[k]["data_offsets"][0])


def _open_npz(path: Path) -> Bundle:
    try:
        npz = np.load(path, allow_pickle=False)
        names = list(npz.files)
        records = _records_from_tensors(((k, torch.from_numpy(np.array(npz[k]))) for k in names), path.name)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise BundleError(f"{path}: corrupt or truncated .npz file ({e})") from None
    return Bundle(path, _plain_manifest(path, "npz file"), records,
                  _DictSource(lambda name: torch.from_numpy(np.array(npz[name]))))
