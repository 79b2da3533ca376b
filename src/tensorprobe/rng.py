"""Randomness, recorded and replayed.

Capture stores the output of every random op (kind "rng", always with its tensor). `RngReplay` feeds
those tensors back, in call order, the next time the model runs: two runs that differ only in their
random generators (another seed, another framework's RNG) then compare equal, and a diff shows what
the port really changes.

    >>> import torch, tensorprobe as tp
    >>> class Noisy(torch.nn.Module):
    ...     def forward(self, x):
    ...         return torch.tanh(x + torch.randn_like(x))
    >>> model, x = Noisy(), torch.zeros(4)
    >>> ref = tp.capture(model, x, level="op", keep="full")                  # torch.randn_like recorded
    >>> again = tp.capture(model, x, level="op", keep="full", replay_rng=ref)
    >>> bool((ref.tensor("<root>/tanh.0") == again.tensor("<root>/tanh.0")).all())
    True

Matching: each random op asks for the record of the same name (`<module>[@call]/<op>.<k>`); when the
name is not in the recording (a port with other module paths, or a run without module hooks) it takes the
next unused random record in call order. Shape or dtype mismatches and a recording that runs out are
`InputError`s naming the op and its source line. The random op itself still runs, so the generator
advances as it would have, and in-place ops (`normal_`, `uniform_`, `bernoulli_`, dropout's mask) get the
recorded values copied into their target. Dropout in train mode is replayed through its mask.

For a port in another language, `export_noise(bundle, "noise.safetensors")` writes the recorded noise;
see `export_noise` for the layout a Swift/MLX/C++ port reads. `unreplayed_rng_before` tells a diff
whether its first divergence sits right after a random op whose noise was not replayed.
"""

from __future__ import annotations

import json
import os
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import safetensors
import safetensors.torch
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from .bundle import Bundle, atomic_write_bytes
from .hooks import ModuleStack, op_base_name, user_source_line
from .ops import RNG_OPS
from .errors import BundleError, InputError
from .record import KIND_RNG, Record, dtype_name, record_name

NOISE_FORMAT = "tensorprobe-noise"
NOISE_VERSION = 1
TAG_REPLAYED = "replayed"


@dataclass(frozen=True)
class NoiseEntry:
    """One recorded random tensor: its record name, the op that drew it and where it was called."""

    name: str
    op: str
    shape: tuple[int, ...]
    dtype: str
    order: int
    module: str = ""
    call: int = 0
    source: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "op": self.op, "shape": list(self.shape), "dtype": self.dtype,
                "order": self.order, "module": self.module, "call": self.call, "source": self.source}

    @classmethod
    def from_record(cls, r: Record, order: int) -> "NoiseEntry":
        return cls(r.name, r.op, tuple(r.shape), r.dtype, order, r.module, r.call, r.source)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "NoiseEntry":
        return cls(str(d["name"]), str(d.get("op", "")), tuple(int(s) for s in d.get("shape", ())),
                   str(d.get("dtype", "")), int(d.get("order", 0)), str(d.get("module", "")),
                   int(d.get("call", 0)), d.get("source"))


# ---------------------------------------------------------------------------------------------------
# The tape: recorded random tensors, in call order, loaded lazily


class _Tape:
    """Recorded random tensors in call order, served by name or by position."""

    def __init__(self, entries: list[NoiseEntry], loader: Any, origin: str):
        self.entries = entries
        self.loader = loader  # name -> torch.Tensor
        self.origin = origin
        self.by_name = {e.name: i for i, e in enumerate(entries)}
        self.used = [False] * len(entries)
        self.next_free = 0

    def take(self, name: str | None) -> NoiseEntry | None:
        i = self.by_name.get(name) if name is not None else None
        if i is None or self.used[i]:
            while self.next_free < len(self.entries) and self.used[self.next_free]:
                self.next_free += 1
            if self.next_free >= len(self.entries):
                return None
            i = self.next_free
        self.used[i] = True
        return self.entries[i]

    @property
    def unused(self) -> list[str]:
        return [e.name for e, u in zip(self.entries, self.used) if not u]


def _tape_from(source: Any) -> _Tape:
    if isinstance(source, _Tape):
        return source
    if isinstance(source, Mapping):
        items = list(source.items())
        entries = [NoiseEntry(str(k), "tensor", tuple(v.shape), dtype_name(v.dtype), i) for i, (k, v) in enumerate(items)]
        table = {str(k): v for k, v in items}
        return _Tape(entries, table.__getitem__, "a dict of tensors")
    if isinstance(source, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in source):
        return _tape_from({f"rng.{i}": t for i, t in enumerate(source)})
    if isinstance(source, (str, os.PathLike)):
        p = Path(source)
        if p.is_file() and p.suffix == ".safetensors" and _is_noise_file(p):
            entries, tensors = _read_noise(p)
            return _Tape(entries, tensors.__getitem__, str(p))
        source = Bundle.open(p)
    if isinstance(source, Bundle):
        recs = [r for r in source if r.kind == KIND_RNG]
        missing = [r.name for r in recs if not r.has_tensor]
        if missing:
            raise BundleError(f"{source.path}: random record {missing[0]!r} has no stored tensor; "
                              "recapture the reference with tensorprobe >= 0.1 (random outputs are always kept)")
        entries = [NoiseEntry.from_record(r, i) for i, r in enumerate(recs)]
        return _Tape(entries, source.tensor, str(source.path))
    raise InputError(f"can't replay randomness from a {type(source).__name__}: give a bundle, a bundle path, "
                     "a noise .safetensors file or a dict of tensors")


# ---------------------------------------------------------------------------------------------------
# Replay


class RngReplay:
    """Feed recorded random tensors back into a run, in call order.

    Use through `tensorprobe.capture(..., replay_rng=BUNDLE)` (names come from capture's module stack),
    or as a context manager around your own code:

        >>> with RngReplay("ref_bundle", model=model) as replay:      # doctest: +SKIP
        ...     y = model(x)
        >>> replay.replayed[:1]                                       # doctest: +SKIP
        ['generator.m_source.l_sin_gen/rand.0']

    Args:
        source: a `Bundle`, a bundle path, a noise file from `export_noise`, a dict name -> tensor,
            or a list of tensors (matched by order).
        model: optional; with it the context manager names random ops by module path (match by name),
            without it they are matched by call order only.
        strict: refuse to fall back to call order when a name is not in the recording.
        cast: convert a recorded tensor to the dtype this run draws whatever its kind; without it only
            within a kind (float32 noise for a float16 or float64 run, int64 for int32). Shapes must agree,
            and the tensor goes to the device this run draws on (a CPU recording replays on CUDA).
    """

    def __init__(self, source: Any, *, model: torch.nn.Module | None = None, strict: bool = False,
                 cast: bool = False):
        self.tape = _tape_from(source)
        if not self.tape.entries:
            raise InputError(f"{self.tape.origin}: no random ops were recorded there, nothing to replay "
                             "(capture the reference run first: tensorprobe capture TARGET --keep full)")
        self.model = model
        self.strict = strict
        self.cast = cast
        self.replayed: list[str] = []
        self._counts: dict[tuple[str, int, str], int] = {}
        self._mode: _ReplayMode | None = None
        self._hooks: list[Any] = []
        self._modules: Any = None

    @property
    def unused(self) -> list[str]:
        """Names of recorded random tensors this run never asked for."""
        return self.tape.unused

    def name_for(self, func: Any, module: str, call: int) -> str:
        """The record name capture gives this random op (`<module>[@call]/<op>.<k>`), counting per call."""
        base = func._schema.name.split("::")[-1]
        key = (module, call, base)
        k = self._counts.get(key, 0)
        self._counts[key] = k + 1
        return record_name(module, call, str(func), k)

    def take(self, func: Any, args: tuple, kwargs: dict, name: str | None = None,
             source: str | None = None) -> Any:
        """Run random op `func`, then replace what it drew with the next recorded tensor(s)."""
        out = func(*args, **kwargs)
        base = func._schema.name.split("::")[-1]
        if base == "native_dropout":
            return self._dropout(args, kwargs, out, name, source)
        targets = _written_args(func, args, kwargs)
        flat, spec = tree_flatten(out)
        if targets:  # in-place / out= op: copy into what it wrote, return it as the op did
            for i, t in enumerate(targets):
                t.copy_(self._next(func, t, _sub(name, i, len(targets)), source))
            return out
        tensors = [i for i, t in enumerate(flat) if isinstance(t, torch.Tensor)]
        for j, i in enumerate(tensors):
            flat[i] = self._next(func, flat[i], _sub(name, j, len(tensors)), source).clone()
        return tree_unflatten(flat, spec)

    def _dropout(self, args: tuple, kwargs: dict, out: Any, name: str | None, source: str | None) -> Any:
        x, p = args[0], float(args[1] if len(args) > 1 else kwargs.get("p", 0.5))
        _, mask = out
        self._next(None, out[0], _sub(name, 0, 2), source)  # keep positions aligned with capture's two records
        mask = self._next(None, mask, _sub(name, 1, 2), source).to(mask.device)
        scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
        return x * mask * scale, mask

    def _next(self, func: Any, like: torch.Tensor, name: str | None, source: str | None) -> torch.Tensor:
        where = f"{name or (str(func) if func is not None else 'a random op')}" + (f" at {source}" if source else "")
        if self.strict and name is not None and name not in self.tape.by_name:
            raise InputError(f"random op {where} is not in the recording {self.tape.origin} "
                             "(strict replay matches by name only)")
        entry = self.tape.take(name)
        if entry is None:
            raise InputError(f"the recording {self.tape.origin} ran out: it holds {len(self.tape.entries)} random "
                             f"tensors, and this run asked for one more ({where}); was it captured from the same "
                             "model and inputs?")
        t = self.tape.loader(entry.name)
        if tuple(t.shape) == tuple(like.shape) and (self.cast or _same_kind(t.dtype, like.dtype)):
            t = t.to(like.dtype)  # float32 noise replayed by a float64, float16 or bfloat16 run
        if tuple(t.shape) != tuple(like.shape) or t.dtype != like.dtype:
            raise InputError(
                f"replaying {where}: the recording's next random tensor {entry.name!r} is {_desc(t)} but this run "
                f"drew {_desc(like)}; the bundle {self.tape.origin} comes from another model or other inputs")
        self.replayed.append(entry.name)
        return t.to(like.device)

    # ---- standalone use: a dispatch mode (and module hooks for names when `model` is given) -----------
    def __enter__(self) -> "RngReplay":
        if self.model is not None:
            self._modules = ModuleStack()
            for path, mod in self.model.named_modules():
                self._hooks.append(mod.register_forward_pre_hook(_enter_hook(self._modules, path)))
                self._hooks.append(mod.register_forward_hook(_exit_hook(self._modules, path), always_call=True))
        self._mode = _ReplayMode(self)
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._mode is not None:
            self._mode.__exit__(*exc)
            self._mode = None
        for h in self._hooks:
            h.remove()
        self._hooks.clear()


class _ReplayMode(TorchDispatchMode):
    def __init__(self, replay: RngReplay):
        super().__init__()
        self.replay = replay

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if op_base_name(func) not in RNG_OPS:
            return func(*args, **(kwargs or {}))
        name = None
        mods = self.replay._modules
        if mods is not None:
            name = self.replay.name_for(func, *mods.current)
        return self.replay.take(func, args, kwargs or {}, name, user_source_line())


def _enter_hook(stack: Any, path: str):
    def hook(module, args):
        stack.enter(path)
    return hook


def _exit_hook(stack: Any, path: str):
    def hook(module, args, output):
        stack.exit(path)
    return hook


def _written_args(func: Any, args: tuple, kwargs: dict) -> list[torch.Tensor]:
    """Tensors an in-place or out= op writes (from its schema's alias annotations)."""
    out = []
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is None or not a.alias_info.is_write:
            continue
        v = args[i] if i < len(args) else kwargs.get(a.name)
        if isinstance(v, torch.Tensor):
            out.append(v)
    return out


def _sub(name: str | None, i: int, n: int) -> str | None:
    return f"{name}:{i}" if name is not None and n > 1 else name


def _same_kind(a: torch.dtype, b: torch.dtype) -> bool:
    return (a.is_floating_point == b.is_floating_point and a.is_complex == b.is_complex
            and (a == torch.bool) == (b == torch.bool))


def _desc(t: torch.Tensor) -> str:
    return f"{dtype_name(t.dtype)}[{'×'.join(map(str, t.shape)) or 'scalar'}]"


def as_replay(source: Any, **kw: Any) -> RngReplay:
    """`source` if it is already an `RngReplay`, else a new one over it (used by `capture(replay_rng=...)`)."""
    return source if isinstance(source, RngReplay) else RngReplay(source, **kw)


# ---------------------------------------------------------------------------------------------------
# Export for a port in another language


def export_noise(bundle: Bundle | str | os.PathLike, path: str | os.PathLike) -> list[NoiseEntry]:
    """Write a bundle's recorded random tensors to one `.safetensors` file, for a port to load.

    Layout (readable by `safetensors` in any language; MLX: `mx.load(path, return_metadata=True)`,
    Swift: `MLX.loadArraysAndMetadata(url:)`):

        tensors     one per random op, keyed by record name in call order, e.g.
                    "generator.m_source.l_sin_gen/rand.0", "generator.m_source.l_sin_gen/randn_like.0"
                    (`<module path>[@<call>]/<op>.<k>`; `@<call>` for the 2nd+ call of a looped module;
                    `:<i>` for an op with several outputs, e.g. dropout's mask is `.../native_dropout.0:1`)
        metadata    "format": "tensorprobe-noise", "version": "1",
                    "entries": JSON list in call order of {name, op, shape, dtype, order, module, call, source}

    The port replaces its own draws with these tensors, one per random call, in that order.

    Args:
        bundle: a captured bundle (random outputs are always stored), or its path.
        path: the `.safetensors` file to write (atomically).

    Returns:
        The entries written, in call order.

    Example:
        >>> export_noise("ref_bundle", "noise.safetensors")[0].name     # doctest: +SKIP
        'generator.m_source.l_sin_gen/rand.0'
    """
    b = bundle if isinstance(bundle, Bundle) else Bundle.open(bundle)
    recs = [r for r in b if r.kind == KIND_RNG]
    if not recs:
        raise InputError(f"{b.path}: no random ops were recorded in this bundle, nothing to export")
    entries = [NoiseEntry.from_record(r, i) for i, r in enumerate(recs)]
    tensors = {r.name: b.tensor(r.name).contiguous() for r in recs}
    meta = {"format": NOISE_FORMAT, "version": str(NOISE_VERSION),
            "entries": json.dumps([e.to_dict() for e in entries])}
    atomic_write_bytes(path, safetensors.torch.save(tensors, metadata=meta))
    return entries


def load_noise(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], list[NoiseEntry]]:
    """Read a noise file written by `export_noise`: (name -> tensor, entries in call order).

    Example:
        >>> tensors, entries = load_noise("noise.safetensors")          # doctest: +SKIP
        >>> tensors[entries[0].name].shape                              # doctest: +SKIP
        torch.Size([1, 9])
    """
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: no such noise file")
    if not _is_noise_file(p):
        raise BundleError(f"{p}: not a tensorprobe noise file (write one with `tensorprobe rng export`)")
    entries, tensors = _read_noise(p)
    return tensors, entries


def _is_noise_file(p: Path) -> bool:
    try:
        with safetensors.safe_open(str(p), framework="pt") as f:
            return (f.metadata() or {}).get("format") == NOISE_FORMAT
    except Exception:
        return False


def _read_noise(p: Path) -> tuple[list[NoiseEntry], dict[str, torch.Tensor]]:
    try:
        with safetensors.safe_open(str(p), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        entries = [NoiseEntry.from_dict(d) for d in json.loads(meta.get("entries", "[]"))]
    except Exception as e:
        raise BundleError(f"{p}: corrupt noise file ({e})") from None
    missing = [e.name for e in entries if e.name not in tensors]
    if missing:
        raise BundleError(f"{p}: noise file lists {missing[0]!r} but holds no such tensor")
    return sorted(entries, key=lambda e: e.order), tensors


# ---------------------------------------------------------------------------------------------------
# Diff integration: was the first divergence caused by noise that was not replayed?


@dataclass(frozen=True)
class RngSuspect:
    """A random op whose noise differs between two runs and was not replayed, just before a divergence."""

    rng: str                 # record name of the random op
    op: str
    source: str | None
    divergent: str           # the first divergent record it explains
    direct: bool             # the divergent record consumes the noise directly (op graph), or is the noise
    pearson: float | None    # correlation of the two noise tensors, when both were stored
    replayed: bool           # True when the candidate was replayed but this op still differs

    def sentence(self) -> str:
        where = f" ({self.source})" if self.source else ""
        corr = f", correlation {self.pearson:.4f}" if self.pearson is not None else ""
        if self.rng == self.divergent:
            head = f"the first divergence is the random op {self.rng}{where} itself{corr}"
        else:
            rel = "right after" if self.direct else "after"
            head = f"the first divergence {self.divergent} sits {rel} random op {self.rng}{where}{corr}"
        if self.replayed:
            return head + "; it was replayed yet differs: the replay matched a different recorded tensor"
        return head + ", whose noise was not replayed: rerun the candidate with --replay-rng REF_BUNDLE"

    def to_dict(self) -> dict[str, Any]:
        return {"rng": self.rng, "op": self.op, "source": self.source, "divergent": self.divergent,
                "direct": self.direct, "pearson": self.pearson, "replayed": self.replayed,
                "message": self.sentence()}


def unreplayed_rng_before(report_or_records: Any, divergent: str | None = None, *, ref: Any = None,
                          cand: Any = None) -> RngSuspect | None:
    """If the first divergence follows a random op whose noise differs and was not replayed, name that op.

    Args:
        report_or_records: a diff report (anything with `first_divergence` naming a record, and `ref`/
            `cand` bundles or paths), a candidate `Bundle`, or the candidate's records in order.
        divergent: name of the first divergent record (taken from the report when omitted).
        ref, cand: the two bundles (or paths), to check that the noise really differs; without them the
            decision uses the records' "replayed" tags alone.

    Returns:
        An `RngSuspect` (with `.sentence()` for the report), or None when no unreplayed random op
        precedes the divergence.

    Example:
        >>> s = unreplayed_rng_before(cand_bundle, "<root>/tanh.0", ref=ref_bundle)   # doctest: +SKIP
        >>> s.sentence()                                                              # doctest: +SKIP
        'the first divergence <root>/tanh.0 sits right after random op <root>/randn_like.0 (...)'
    """
    recs, divergent, ref, cand = _unpack(report_or_records, divergent, ref, cand)
    if divergent is None:
        return None
    by_name = {r.name: r for r in recs}
    target = by_name.get(divergent)
    if target is None:
        return None
    ancestors = _ancestors(target, by_name)
    ref_recs = {r.name: r for r in ref} if isinstance(ref, Bundle) else {}
    before = sorted((r for r in recs if r.kind == KIND_RNG and r.order <= target.order),
                    key=lambda r: r.order, reverse=True)
    suspects = []
    for r in before:
        replayed = TAG_REPLAYED in r.tags
        pearson, differs = _noise_differs(ref, cand, r, ref_recs)
        if differs is False or (differs is None and replayed):
            continue
        direct = r.name == target.name or r.name in target.inputs
        suspects.append(RngSuspect(r.name, r.op, r.source, divergent, direct, pearson, replayed))
    # Noise the divergence depends on (op graph) first; else the nearest one before it (module-level
    # captures don't record the functional ops that link them).
    linked = [s for s in suspects if s.rng == target.name or s.rng in ancestors]
    return (linked or suspects or [None])[0]


def _unpack(obj: Any, divergent: str | None, ref: Any, cand: Any):
    if isinstance(obj, Bundle) or (isinstance(obj, Iterable) and not hasattr(obj, "first_divergence")):
        recs = list(obj)
        cand = cand if cand is not None else (obj if isinstance(obj, Bundle) else None)
    else:  # a diff report, duck-typed
        first = getattr(obj, "first_divergence", None)
        if divergent is None and first is not None:
            divergent = first if isinstance(first, str) else (getattr(first, "cand_name", None)
                                                             or getattr(first, "name", None))
        ref = ref if ref is not None else getattr(obj, "ref", None) or getattr(obj, "ref_path", None)
        cand = cand if cand is not None else getattr(obj, "cand", None) or getattr(obj, "cand_path", None)
        if cand is None:
            return [], None, ref, cand
        cand = cand if isinstance(cand, Bundle) else Bundle.open(cand)
        recs = list(cand)
    if ref is not None and not isinstance(ref, Bundle):
        ref = Bundle.open(ref)
    if cand is not None and not isinstance(cand, Bundle):
        cand = Bundle.open(cand)
    return recs, divergent, ref, cand


def _ancestors(target: Record, by_name: dict[str, Record]) -> set[str]:
    """Names of every record `target` depends on through the op graph (empty without a graph)."""
    seen: set[str] = set()
    todo = deque(target.inputs)
    while todo:
        n = todo.popleft()
        if n in seen:
            continue
        seen.add(n)
        r = by_name.get(n)
        if r is not None:
            todo.extend(r.inputs)
    return seen


def _noise_differs(ref: Any, cand: Any, r: Record, ref_recs: dict[str, Record]) -> tuple[float | None, bool | None]:
    """(pearson, differs) for random record `r` across both bundles; (None, None) when unknown."""
    other = ref_recs.get(r.name)
    if not isinstance(cand, Bundle) or other is None or not (other.has_tensor and r.has_tensor):
        return None, None
    a, b = ref.tensor(r.name), cand.tensor(r.name)
    if a.shape != b.shape:
        return None, True
    if torch.equal(a, b):
        return 1.0, False
    from .diff.metrics import compare
    return compare(a, b).get("pearson"), True


__all__ = ["RngReplay", "RngSuspect", "NoiseEntry", "as_replay", "export_noise", "load_noise",
           "unreplayed_rng_before", "TAG_REPLAYED"]
