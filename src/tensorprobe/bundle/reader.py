"""`Bundle`: read a bundle directory (or a plain `.safetensors` / `.npz` file) lazily, with NumPy.

Torch is imported only by `Bundle.tensor`; `show`, `diff`, `nan` of a bundle and the audio commands
read with NumPy. bfloat16 data (which NumPy lacks) is widened exactly to float32 by `Bundle.numpy`.
"""

from __future__ import annotations

import json
import os
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import safetensors

from ..errors import BundleError
from ..record import KIND_OUTPUT, OP_UNKNOWN, Record
from ..stats import compute_stats
from .format import (DTYPE_NAMES, NUMPY_DTYPES, FORMAT, FORMAT_VERSION, JOURNAL, MANIFEST, STATUS_COMPLETE, STATUS_INCOMPLETE,
                     STATUS_RUNNING, read_safetensors_header)
from .lock import LOCK, holder


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
    def stops_at(self) -> Record | None:
        """The last record an incomplete bundle holds (None for a complete bundle)."""
        if self.complete or not self.records:
            return None
        return max(self.records, key=lambda r: r.order)

    def incomplete_note(self) -> str | None:
        """One sentence for an incomplete bundle: where its capture stopped and why; None when complete.

        >>> Bundle.open("killed_capture").incomplete_note()          # doctest: +SKIP
        'its capture stopped after record 10, b/relu.0 (RuntimeError: CUDA out of memory)'
        """
        if self.complete:
            return None
        last, err = self.stops_at, self.error or {}
        if err.get("type") == "Running":   # read while a live capture writes it (see bundle.lock)
            so_far = f"{len(self.records)} records so far" + (f", the last {last.name}" if last is not None else "")
            return f"its capture is still running ({err.get('message')}; {so_far})"
        why = f"{err.get('type', 'Interrupted')}: {err.get('message', 'the capture did not finish')}"
        where = f"after record {last.order}, {last.name}" if last is not None else "before its first record"
        return f"its capture stopped {where} ({why})"

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

    def tensor(self, name: str) -> Any:
        """The stored data of record `name` as a torch tensor, in its own dtype (imports torch)."""
        return self._source.tensor(self._stored(name))

    def numpy(self, name: str) -> np.ndarray:
        """The stored data of record `name` as a NumPy array (memory-mapped where the format allows;
        bfloat16 widened to float32). Does not import torch."""
        return self._source.array(self._stored(name))

    def check_nonfinite(self, name: str, count: int) -> None:
        """Raise `BundleError` when `count`, the NaN/Inf elements read from record `name`'s stored values,
        differs from the count its statistics recorded when it was captured: the data changed since (a shard
        overwritten or damaged), and no finding made from it would be about the model. Costs nothing: a pass
        that reads the values (diff's kernel) counts them anyway."""
        rec = self[name]
        expected = rec.stats.nonfinite
        if count == expected:
            return
        where = self.path / rec.shard if rec.shard and self.path.is_dir() else self.path
        raise BundleError(f"{where}: corrupt tensor {name!r}: its stored values hold {count:,} NaN/Inf element"
                          f"{'s' if count != 1 else ''} where the statistics recorded at capture count {expected:,} "
                          "(the file changed after the capture; capture again)")

    def _stored(self, name: str) -> Record:
        rec = self[name]
        if not rec.has_tensor:
            raise BundleError(f"{self.path}: record {name!r} has statistics only "
                              "(capture with keep='full' to store tensors)")
        return rec

    def close(self) -> None:
        self._source.close()

    def __enter__(self) -> "Bundle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Bundle({str(self.path)!r}, records={len(self.records)}, status={self.manifest.get('status')!r})"


class _TensorSource:
    """Reads tensors from safetensors shards of a bundle directory, opening each shard once per framework."""

    def __init__(self, root: Path):
        self.root = root
        self._handles: dict[tuple[str, str], Any] = {}
        self._maps: dict[str, tuple[dict[str, Any], int, np.ndarray]] = {}   # NumPy reads: header + memory map

    def _handle(self, shard: str, framework: str) -> Any:
        h = self._handles.get((shard, framework))
        if h is None:
            path = self.root / shard
            try:
                h = safetensors.safe_open(str(path), framework=framework)
            except Exception as e:  # safetensors raises its own error type for corrupt headers
                raise BundleError(f"{path}: corrupt or truncated tensor shard ({e})") from None
            self._handles[(shard, framework)] = h
        return h

    def array(self, rec: Record) -> np.ndarray:
        """A read-only view into the memory-mapped shard (no copy; bfloat16 is widened to float32)."""
        assert rec.shard is not None
        header, data_start, mm = self._mapped(rec.shard)
        entry = header.get(rec.name)
        if entry is None:
            raise BundleError(f"{self.root / rec.shard}: can't read tensor {rec.name!r} (not in the shard)")
        begin, end = entry["data_offsets"]
        code = entry["dtype"]
        raw = mm[data_start + begin:data_start + end]
        if code == "BF16":
            a = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        elif code in NUMPY_DTYPES:
            a = raw.view(NUMPY_DTYPES[code])
        else:
            raise BundleError(f"{self.root / rec.shard}: tensor {rec.name!r} has dtype {code}, which NumPy cannot read")
        a = a.reshape(entry["shape"])
        if rec.dtype == "complex128" and a.dtype != np.complex128:
            a = np.ascontiguousarray(a).view(np.complex128)[..., 0]  # stored as (re, im) pairs: BundleWriter.add
        return a

    def _mapped(self, shard: str) -> tuple[dict[str, Any], int, np.ndarray]:
        m = self._maps.get(shard)
        if m is None:
            path = self.root / shard
            try:
                header, data_start = read_safetensors_header(path)
                mm = np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else np.empty(0, np.uint8)
            except (OSError, ValueError) as e:
                raise BundleError(f"{path}: corrupt or truncated tensor shard ({e})") from None
            m = self._maps[shard] = (header, data_start, mm)
        return m

    def tensor(self, rec: Record) -> Any:
        import torch

        t = self._read(rec, "pt")
        if rec.dtype == "complex128" and not t.is_complex():
            t = torch.view_as_complex(t)  # stored as (re, im) pairs: see BundleWriter.add
        return t

    def _read(self, rec: Record, framework: str) -> Any:
        assert rec.shard is not None
        handle = self._handle(rec.shard, framework)
        try:
            return handle.get_tensor(rec.name)
        except Exception as e:
            raise BundleError(f"{self.root / rec.shard}: can't read tensor {rec.name!r} ({e})") from None

    def close(self) -> None:
        self._handles.clear()
        self._maps.clear()


def _read_bfloat16(path: Path, name: str) -> np.ndarray:
    """A bfloat16 tensor of a safetensors file, widened exactly to float32 (NumPy has no bfloat16)."""
    try:
        header, data_start = read_safetensors_header(path)
        entry = header[name]
        begin, end = entry["data_offsets"]
        bits = np.fromfile(path, dtype="<u2", count=(end - begin) // 2, offset=data_start + begin)
    except (OSError, KeyError, ValueError) as e:
        raise BundleError(f"{path}: can't read tensor {name!r} ({e})") from None
    return (bits.astype(np.uint32) << 16).view(np.float32).reshape(entry["shape"])


def _check_shard_path(root: Path, shard: str) -> None:
    if os.path.isabs(shard) or ".." in Path(shard).parts or "/" in shard or "\\" in shard:
        raise BundleError(f"{root / MANIFEST}: unsafe shard path {shard!r} (must be a file name inside the bundle)")


def _read_manifest(root: Path) -> dict[str, Any]:
    mpath = root / MANIFEST
    if not mpath.exists():
        if (root / JOURNAL).exists() or (root / LOCK).exists():
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
        raw_records = _read_journal(root) if (root / JOURNAL).exists() else []
        manifest = {**manifest, "status": STATUS_INCOMPLETE, "error": _unfinished_reason(root)}
    try:
        records = [Record.from_dict(d) for d in raw_records]
    except (KeyError, TypeError, ValueError) as e:
        raise BundleError(f"{root / MANIFEST}: malformed record ({e})") from None
    records = _validate_shards(root, records, manifest)
    return Bundle(root, manifest, records, _TensorSource(root))


def _unfinished_reason(root: Path) -> dict[str, Any]:
    """Why a bundle whose manifest still says "running" is not finished: the error its writer recorded in the
    lock file when the manifest could not be written (a full disk), a writer that is still alive, or, when
    neither, a process that ended without closing it."""
    h = holder(root) or {}
    err = h.get("error")
    if isinstance(err, dict) and err.get("message"):
        return {"type": str(err.get("type") or "Error"), "message": str(err["message"]),
                "traceback": str(err.get("traceback") or "")}
    if h.get("live"):
        who = f" (pid {h['pid']})" if h.get("pid") else ""
        return {"type": "Running", "message": f"a capture{who} is still writing it; the records so far are shown"}
    return {"type": "Interrupted", "message": "capture did not finish (the process was killed); records up to "
                                              "the last flushed shard are kept"}


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
                        with safetensors.safe_open(str(path), framework="numpy") as f:
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
    with open(root / JOURNAL, encoding="utf-8", errors="replace") as f:   # a crash can cut a character short
        for line in f:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                break  # the last line may be cut short by the crash
    return out


class _DictSource:
    """Tensors of a plain file, loaded on demand: `array` reads NumPy, `tensor` converts for torch."""

    def __init__(self, loader: Callable[[str], np.ndarray]):
        self._loader = loader

    def array(self, rec: Record) -> np.ndarray:
        return self._loader(rec.name)

    def tensor(self, rec: Record) -> Any:
        import torch

        return torch.from_numpy(np.array(self._loader(rec.name)))

    def close(self) -> None:
        pass


def _plain_manifest(path: Path, kind: str) -> dict[str, Any]:
    return {"format": FORMAT, "format_version": FORMAT_VERSION, "status": STATUS_COMPLETE, "error": None,
            "producer": {"name": kind}, "runtime": {"name": "external", "file": path.name}, "records": []}


def _records_from_arrays(items: Iterator[tuple[str, np.ndarray, str]], shard: str) -> list[Record]:
    return [
        Record(name=name, module=name, op=OP_UNKNOWN, order=i, shape=tuple(a.shape), dtype=dtype,
               stats=compute_stats(a), kind=KIND_OUTPUT, device="cpu", shard=shard)
        for i, (name, a, dtype) in enumerate(items)
    ]


def _open_safetensors_file(path: Path) -> Bundle:
    try:
        header, _ = read_safetensors_header(path)
        handle = safetensors.safe_open(str(path), framework="numpy")

        def load(name: str) -> np.ndarray:
            if header[name]["dtype"] == "BF16":
                return _read_bfloat16(path, name)
            return handle.get_tensor(name)

        order = sorted(header, key=lambda k: header[k]["data_offsets"][0])   # written order: execution order
        records = _records_from_arrays(
            ((k, load(k), DTYPE_NAMES.get(header[k]["dtype"], header[k]["dtype"].lower())) for k in order), path.name)
    except BundleError:
        raise
    except Exception as e:
        raise BundleError(f"{path}: corrupt or truncated safetensors file ({e})") from None
    return Bundle(path, _plain_manifest(path, "safetensors file"), records, _DictSource(load))


def _open_npz(path: Path) -> Bundle:
    npz = _open_npz_file(path)
    arrays = ((k, _npz_array(path, npz, k)) for k in npz.files)
    try:
        records = _records_from_arrays(((k, _numeric(path, k, a), a.dtype.name) for k, a in arrays), path.name)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise BundleError(f"{path}: corrupt or truncated .npz file ({e})") from None
    return Bundle(path, _plain_manifest(path, "npz file"), records, _DictSource(lambda name: npz[name]))


_ZIP_MAGIC = (b"PK\x03\x04", b"PK\x05\x06")    # a zip archive's first bytes (with entries, empty)
_NPY_MAGIC = b"\x93NUMPY"


def _open_npz_file(path: Path) -> Any:
    # np.load takes a file that is neither a zip nor an .npy for a pickle, and says "load it unsafely"
    try:
        with open(path, "rb") as f:
            head = f.read(6)
    except OSError as e:
        raise BundleError(f"{path}: can't read ({e.strerror or e})") from None
    if head.startswith(_NPY_MAGIC):
        raise BundleError(f"{path}: a single .npy array, not an .npz file: save named arrays with "
                          "np.savez(path, name=array)")
    if not head.startswith(_ZIP_MAGIC):
        raise BundleError(f"{path}: not an .npz file (an .npz is a zip archive of .npy arrays; this file "
                          f"{'is empty' if not head else 'starts with ' + repr(head[:4])})")
    try:
        return np.load(path, allow_pickle=False)
    except (zipfile.BadZipFile, ValueError, OSError, EOFError) as e:
        raise BundleError(f"{path}: corrupt or truncated .npz file ({e})") from None


def _npz_array(path: Path, npz: Any, name: str) -> np.ndarray:
    """One array of an .npz, never unpickled: an object array is refused with what to save instead."""
    try:
        return npz[name]
    except ValueError as e:
        if "allow_pickle" in str(e):
            raise BundleError(f"{path}: array {name!r} holds Python objects, which load only by unpickling, and "
                              "tensorprobe never unpickles; save text as fixed-width strings "
                              "(np.savez(path, x=np.array(texts, dtype=str)))") from None
        raise BundleError(f"{path}: corrupt or truncated .npz file ({e})") from None
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise BundleError(f"{path}: corrupt or truncated .npz file ({e})") from None


def _numeric(path: Path, name: str, a: np.ndarray) -> np.ndarray:
    if a.dtype.kind in "USV":
        raise BundleError(f"{path}: array {name!r} holds text ({a.dtype}): a bundle's records are numbers (text "
                          "arrays are taken as a model's inputs: capture model.onnx --inputs)")
    return a


def load_arrays(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Named arrays of an `.npz` (never unpickled; fixed-width text arrays, dtype `<U`/`S`, included, for
    models that take strings) or a `.safetensors` file, in the file's order: a model's inputs.

    Example:
        >>> feeds = load_arrays("inputs.npz")       # doctest: +SKIP
    """
    p = Path(path)
    if not p.is_file():
        raise BundleError(f"{p}: no such inputs file")
    if p.suffix == ".npz":
        npz = _open_npz_file(p)
        return {k: _npz_array(p, npz, k) for k in npz.files}
    if p.suffix == ".safetensors":
        b = _open_safetensors_file(p)
        return {r.name: b.numpy(r.name) for r in b}
    raise BundleError(f"{p}: inputs are read from a .npz or .safetensors file of named arrays")
