"""`RngReplay`: feed recorded random tensors back to the random ops of a torch run, in call order."""

from __future__ import annotations

import os
from pathlib import Path
from dataclasses import replace
from typing import Any, Mapping, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..bundle import Bundle
from ..errors import BundleError, InputError
from ..hooks import ModuleStack, op_base_name, user_source_line
from ..ops import RNG_OPS
from ..record import KIND_RNG, dtype_name, record_name
from .draws import Draw, DrawMismatch, draw_of_call, mismatch_words
from .noise_file import NoiseEntry, _is_noise_file, _read_noise

class _Tape:
    """Recorded random tensors in call order, served by name or by position."""

    def __init__(self, entries: list[NoiseEntry], loader: Any, origin: str):
        self.entries = entries
        self.loader = loader  # name -> torch.Tensor
        self.origin = origin
        self.by_name = {e.name: i for i, e in enumerate(entries)}
        self.used = [False] * len(entries)
        self.next_free = 0

    def take(self, name: str | None, draw: Draw | None = None, shape: tuple[int, ...] | None = None
             ) -> NoiseEntry | None:
        """The entry of this name; else, in call order, the next unused one that draws alike (same kind of draw
        and shape: a port that draws in another order still gets each draw its counterpart), else the next
        unused one (which `RngReplay` then refuses, or reports as from another model)."""
        i = self.by_name.get(name) if name is not None else None
        if i is None or self.used[i]:
            while self.next_free < len(self.entries) and self.used[self.next_free]:
                self.next_free += 1
            if self.next_free >= len(self.entries):
                return None
            i = next((j for j in range(self.next_free, len(self.entries))
                      if not self.used[j] and self._fits(self.entries[j], draw, shape)), self.next_free)
        self.used[i] = True
        return self.entries[i]

    @staticmethod
    def _fits(entry: NoiseEntry, draw: Draw | None, shape: tuple[int, ...] | None) -> bool:
        if shape is not None and tuple(entry.shape) != shape:
            return False
        recorded = entry.recorded_draw()
        return draw is None or recorded is None or draw.conflict(recorded) is None

    @property
    def unused(self) -> list[str]:
        return [e.name for e, u in zip(self.entries, self.used) if not u]

    def describe(self, draws: Sequence[Any]) -> None:
        """Give the entries, in order, what they draw (`Draw`, its text or None)."""
        self.entries = [replace(e, draw=d.text() if isinstance(d, Draw) else d) if d is not None else e
                        for e, d in zip(self.entries, list(draws) + [None] * (len(self.entries) - len(draws)))]


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
        draws: for a dict or list source, what each tensor draws (`rng.draws.Draw`, its text, or None), in
            order. A bundle or noise file says it itself.

    A recorded tensor is fed only to a random op that draws alike (same distribution, parameters and kind of
    number): an op that draws otherwise (`rand_like` where the recording has `randn_like`) keeps its own draw,
    and the refusal is listed in `refused` (`rng.draws.DrawMismatch`), since feeding it would hide a port
    difference.
    """

    def __init__(self, source: Any, *, model: torch.nn.Module | None = None, strict: bool = False,
                 cast: bool = False, draws: Sequence[Any] | None = None):
        self.tape = _tape_from(source)
        if draws:
            self.tape.describe(draws)
        if not self.tape.entries:
            raise InputError(f"{self.tape.origin}: no random ops were recorded there, nothing to replay "
                             "(capture the reference run first: tensorprobe capture TARGET --keep full)")
        self.model = model
        self.strict = strict
        self.cast = cast
        self.replayed: list[str] = []
        self.refused: list[DrawMismatch] = []   # draws not fed: the recording drew another kind of number there
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
        draw = draw_of_call(func, args, kwargs)
        if base == "native_dropout":
            return self._dropout(args, kwargs, out, name, source, draw)
        targets = _written_args(func, args, kwargs)
        flat, spec = tree_flatten(out)
        if targets:  # in-place / out= op: copy into what it wrote, return it as the op did
            for i, t in enumerate(targets):
                t.copy_(self._next(func, t, _sub(name, i, len(targets)), source, draw))
            return out
        tensors = [i for i, t in enumerate(flat) if isinstance(t, torch.Tensor)]
        for j, i in enumerate(tensors):
            flat[i] = self._next(func, flat[i], _sub(name, j, len(tensors)), source, draw).clone()
        return tree_unflatten(flat, spec)

    def _dropout(self, args: tuple, kwargs: dict, out: Any, name: str | None, source: str | None,
                 draw: Draw | None) -> Any:
        x, p = args[0], float(args[1] if len(args) > 1 else kwargs.get("p", 0.5))
        _, mask = out
        self._next(None, out[0], _sub(name, 0, 2), source, draw)  # keep positions aligned with capture's records
        mask = self._next(None, mask, _sub(name, 1, 2), source, draw).to(mask.device)
        scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
        return x * mask * scale, mask

    def _next(self, func: Any, like: torch.Tensor, name: str | None, source: str | None,
              draw: Draw | None = None) -> torch.Tensor:
        where = f"{name or (str(func) if func is not None else 'a random op')}" + (f" at {source}" if source else "")
        if self.strict and name is not None and name not in self.tape.by_name:
            raise InputError(f"random op {where} is not in the recording {self.tape.origin} "
                             "(strict replay matches by name only)")
        draw = draw.with_kind(like.dtype) if draw is not None else None
        entry = self.tape.take(name, draw, tuple(like.shape))
        if entry is None:
            raise InputError(f"the recording {self.tape.origin} ran out: it holds {len(self.tape.entries)} random "
                             f"tensors, and this run asked for one more ({where}); was it captured from the same "
                             "model and inputs?")
        if self._refuses(entry, draw, func, like, name, source):
            return like
        t = self.tape.loader(entry.name)
        if tuple(t.shape) == tuple(like.shape) and (self.cast or _same_kind(t.dtype, like.dtype)):
            t = t.to(like.dtype)  # float32 noise replayed by a float64, float16 or bfloat16 run
        if tuple(t.shape) != tuple(like.shape) or t.dtype != like.dtype:
            raise InputError(
                f"replaying {where}: the recording's next random tensor {entry.name!r} is {_desc(t)} but this run "
                f"drew {_desc(like)}; the bundle {self.tape.origin} comes from another model or other inputs")
        self.replayed.append(entry.name)
        return t.to(like.device)

    def _refuses(self, entry: NoiseEntry, draw: Draw | None, func: Any, like: torch.Tensor, name: str | None,
                 source: str | None) -> bool:
        """A recorded draw of another distribution or parameters is not fed (it would hide a port difference:
        normal noise where the port draws uniform); the op keeps its own draw and the refusal is kept."""
        recorded = entry.recorded_draw()
        if draw is None or recorded is None or tuple(entry.shape) != tuple(like.shape) \
                or draw.conflict(recorded) is None:
            return False
        op = str(func) if func is not None else "native_dropout"
        self.refused.append(DrawMismatch(name or op, entry.name, mismatch_words(draw, op, recorded, entry.op),
                                         source))
        return True

    # ---- standalone use: a dispatch mode (and module hooks for names when `model` is given) -----------
    def __enter__(self) -> "RngReplay":
        if self.model is not None:
            self._modules = ModuleStack()
            for path, mod in self.model.named_modules():
                self._hooks.append(mod.register_forward_pre_hook(self._modules.enter_hook(path)))
                self._hooks.append(mod.register_forward_hook(self._modules.exit_hook(path), always_call=True))
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
