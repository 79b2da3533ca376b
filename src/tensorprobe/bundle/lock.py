"""The writer's lock: one live capture per bundle directory, and the reason a capture stopped when the disk
had no room left for the manifest.

A writer holds `fcntl.flock` on `.tensorprobe.lock` in the bundle directory for as long as it writes. The
kernel drops a flock when its process ends, however it ends (SIGKILL included), so a crashed capture never
leaves the directory stuck: the next capture takes the lock and replaces the bundle. A second capture into a
directory whose writer is alive is refused at once (`BundleError`, exit 2 in the CLI).

The lock file also holds, as one JSON object padded with spaces, who writes (pid, host, start) and, when
the capture stops on an error that the manifest could not be written after (a full disk), the error. Its
`RESERVE` bytes are written when the capture starts, so recording the error later overwrites bytes the file
already owns and needs no free space (tmpfs, ext4, xfs; a copy-on-write filesystem may still refuse).

    >>> lock = WriterLock.acquire(Path("out"))          # doctest: +SKIP
    >>> holder(Path("out"))                             # doctest: +SKIP
    {'pid': 4242, 'host': 'vm-1', 'started': '2026-11-27T17:46:11+00:00', 'live': True}
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from ..errors import BundleError

try:   # POSIX; elsewhere captures are not locked (and a second one replaces the first, as before)
    import fcntl
except ImportError:   # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

LOCK = ".tensorprobe.lock"
RESERVE = 16 * 1024   # bytes the lock file owns from the start: room for the stop reason (traceback ≤ 8000)


class WriterLock:
    """An exclusive flock on `<bundle>/.tensorprobe.lock`, held by the process writing the bundle."""

    def __init__(self, path: Path, fd: int | None, info: dict[str, Any]):
        self.path, self._fd, self.info = path, fd, info
        self.created = False        # `reserve` made the directory (removed again if nothing was written)

    @classmethod
    def acquire(cls, directory: Path) -> "WriterLock":
        """Take the lock of `directory` (which exists) or raise `BundleError` naming the live writer. A lock
        this process `reserve`d for the directory is taken over (once: a second writer is refused)."""
        path = directory / LOCK
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "started": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        held = _RESERVED.pop(_key(directory), None)
        if held is not None:
            held.info, held.created = info, False
            return held
        if fcntl is None:   # pragma: no cover
            return cls(path, None, info)
        while True:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            if not _try_exclusive(fd):
                who = _describe(_read(fd))
                os.close(fd)
                raise BundleError(f"{directory}: another capture{who} is writing this bundle; wait for it to "
                                  "finish or choose another output directory")
            # A writer that finishes unlinks the file: if it did between our open and our flock, we hold a
            # lock on a file nobody else will open. Take the one at the path instead.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        lock = cls(path, fd, info)
        try:
            lock._write(info)
        except OSError:
            lock.release(remove=True)
            raise
        return lock

    def _write(self, doc: dict[str, Any]) -> None:
        if self._fd is None:   # pragma: no cover
            return
        data = json.dumps(doc).encode()
        if len(data) > RESERVE:
            data = json.dumps({**doc, "error": {**doc.get("error", {}), "traceback": ""}}).encode()[:RESERVE]
        data, at = data.ljust(RESERVE), 0
        while at < RESERVE:   # the same RESERVE bytes every time; a short write means the disk is full: go on
            at += os.pwrite(self._fd, data[at:], at)   # until it raises ENOSPC

    def record_stop(self, error: dict[str, Any]) -> bool:
        """Write the error the capture stopped on into the reserved bytes; False if even that failed."""
        try:
            self._write({**self.info, "status": "incomplete", "error": error})
            return True
        except OSError:
            return False

    def release(self, *, remove: bool) -> None:
        """Drop the lock; `remove`: delete the file first (the manifest holds everything it held)."""
        if self._fd is None:
            return
        if remove:
            try:
                self.path.unlink()
            except OSError:
                pass
        os.close(self._fd)
        self._fd = None


def _try_exclusive(fd: int) -> bool:
    """flock(LOCK_EX) without waiting on a writer. A reader's `holder` probe holds a shared lock for
    microseconds: a few retries 20 ms apart tell that from a writer, which holds the lock for its whole run."""
    for attempt in range(4):
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except OSError:
            if attempt < 3:
                time.sleep(0.02)
    return False


def _read(fd: int) -> dict[str, Any]:
    try:
        doc = json.loads(os.pread(fd, RESERVE, 0).decode("utf-8", "replace").strip() or "{}")
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _describe(doc: dict[str, Any]) -> str:
    if not doc.get("pid"):
        return ""
    where = f" on {doc['host']}" if doc.get("host") and doc.get("host") != socket.gethostname() else ""
    since = f", started {doc['started']}" if doc.get("started") else ""
    return f" (pid {doc['pid']}{where}{since})"


def holder(directory: Path) -> dict[str, Any] | None:
    """What the lock file of `directory` says, with `live`: whether a process holds the lock now.
    None when there is no lock file (a finished bundle, or one written before locks existed)."""
    path = directory / LOCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        doc = _read(fd)
        live = False
        if fcntl is not None:
            try:   # a shared lock, dropped at once: it fails only while a writer holds the exclusive one
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError:
                live = True
        return {**doc, "live": live}
    finally:
        os.close(fd)


_RESERVED: dict[str, WriterLock] = {}      # directory -> the lock this process holds for its coming writer


def _key(directory: str | os.PathLike) -> str:
    return os.path.realpath(directory)


def reserve(directory: str | os.PathLike) -> WriterLock:
    """Take `directory`'s lock now, before the model loads or exports, and hold it until this process's
    `BundleWriter` takes it over (`release_reservation` after the capture, whatever happened).

    Without it the lock is taken only when the writer opens: a capture whose export takes minutes (ONNX
    Runtime, ExecuTorch) left that time open, and a second capture started then wrote the directory, exited 0,
    and was replaced when the first one's writer opened (both exited 0). The directory is created if missing
    (removed again by `release_reservation` when nothing was written); a non-empty directory that is not a
    bundle is refused here, as the writer refuses it, so the lock file never makes one look like a bundle.

    Raises:
        BundleError: another live capture holds the lock, or the directory is not a bundle's.
    """
    from .format import JOURNAL, MANIFEST

    p = Path(directory)
    if p.is_dir() and any(p.iterdir()) and not any((p / n).exists() for n in (MANIFEST, JOURNAL, LOCK)):
        raise BundleError(f"{p}: directory is not empty and is not a tensorprobe bundle; "
                          "choose another output directory")
    created = not p.exists()
    p.mkdir(parents=True, exist_ok=True)
    try:
        lock = WriterLock.acquire(p)
    except BaseException:
        if created:
            _rmdir_quietly(p)
        raise
    lock.created = created
    _RESERVED[_key(p)] = lock
    return lock


def release_reservation(directory: str | os.PathLike) -> None:
    """Drop a reservation no writer took over (the capture failed before writing): its lock file goes, and the
    directory too when `reserve` created it and it is empty."""
    lock = _RESERVED.pop(_key(directory), None)
    if lock is None:
        return
    lock.release(remove=True)
    if getattr(lock, "created", False):
        _rmdir_quietly(Path(directory))


def _rmdir_quietly(p: Path) -> None:
    try:
        p.rmdir()
    except OSError:
        pass


def refuse_if_locked(directory: str | os.PathLike) -> None:
    """Raise `BundleError` when a live capture is writing `directory` (checked before a model is loaded, so
    a second capture into the same directory is refused at once)."""
    h = holder(Path(directory))
    if h and h.get("live"):
        raise BundleError(f"{directory}: another capture{_describe(h)} is writing this bundle; wait for it to "
                          "finish or choose another output directory")


__all__ = ["LOCK", "RESERVE", "WriterLock", "holder", "refuse_if_locked", "release_reservation", "reserve"]
