"""Capture every intermediate tensor of a PyTorch model into a bundle.

Two levels, one recording funnel (`_Recorder.record`):

- `level="module"`: forward hooks on every submodule; one record per module call, named by module path
  (`generator.noise_res.0.adain1.0.norm`, `...norm@3` for the fourth call of a looped module).
- `level="op"`: a `TorchDispatchMode` sees every aten op; one record per op output, attributed to the
  innermost module that called it, with the op (`aten.rsqrt.default`) and the user-code source line.
  Pure aliasing ops (view, transpose, unsqueeze, ...) are not recorded: their output is the same data.

Random ops (randn, rand, dropout, ...) are always recorded (kind "rng"), at both levels, so a run in
another framework can be fed the same noise. Statistics are computed in the fused pass of `stats.py`;
with `keep="full"` tensors stream into safetensors shards (memory bounded by one shard).

    >>> import torch, tensorprobe as tp
    >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    >>> bundle = tp.capture(model, torch.randn(2, 4), level="op")
    >>> [r.name for r in bundle][:3]
    ['input.0', '0/addmm.0', '1/relu.0']

As a context manager around your own code:

    >>> with tp.capture(model, level="module", keep="full", out="ref") as cap:   # doctest: +SKIP
    ...     y = model(x); y = model(y)                                          # both calls recorded
    >>> cap.bundle                                                              # doctest: +SKIP
"""

from __future__ import annotations

import functools
import os
import re
import tempfile
import warnings
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakTensorKeyDictionary

from .bundle import Bundle
from .bundle.lock import refuse_if_locked
from .bundle.writer import BundleWriter, describe_inputs
from .environment import collect as collect_environment
from .errors import BundleError, InputError
from .record import (KIND_INPUT, KIND_MODEL_INPUT, KIND_MODEL_OUTPUT, KIND_OUTPUT, KIND_RNG, TAG_INPUTS_MADE_IN, TAG_OWN_CODE,
                     TAG_INPUTS_UNRECORDED, TAG_NONFINITE_CONSTANT, TAG_QUANTIZED,
                     TAG_REPLAYED, WEIGHT_KINDS, Record, dtype_name, module_label, record_name)
from .stats import compute_stats, tensor_digest
from .hooks import (ModuleStack, module_tensors, module_types, op_base_name, op_full_name, op_tensors,
                    user_source_line)
from .ops import ALIAS_OPS, ANGLE_OPS, RNG_OPS, SKIP_OPS
from .rng.draws import draw_tags
from .weights import is_quantized_module, named_weights

LEVELS = ("module", "op")
KEEPS = ("stats", "full")

class _Recorder:
    """The recording funnel: names, filters, statistics and storage of every captured tensor."""

    def __init__(self, writer: BundleWriter, keep: str, include: re.Pattern | None, exclude: re.Pattern | None,
                 channel_dim: int | None, on_record: Callable[[Record], None] | None):
        self.writer = writer
        self.keep_full = keep == "full"
        self.include = include
        self.exclude = exclude
        self.channel_dim = channel_dim
        self.on_record = on_record
        self.order = 0
        self.producer = WeakTensorKeyDictionary()  # tensor -> name of the record that produced it
        self.op_counts: dict[tuple[str, int, str], int] = {}
        self.rng_records = 0
        self.angles: set[str] = set()   # names of records holding angles (compared modulo 2π)

    def wanted(self, name: str, kind: str) -> bool:
        if kind in _ALWAYS_STORED:
            return True  # noise and model inputs and outputs are always kept: replay and diagnosis need them
        if self.include is not None and not self.include.search(name):
            return False
        return not (self.exclude is not None and self.exclude.search(name))

    def input_names(self, args: Iterable[Any]) -> tuple[str, ...]:
        names = []
        for a in args:
            if isinstance(a, torch.Tensor):
                n = self.producer.get(a)
                if n is not None and n not in names:
                    names.append(n)
        return tuple(names)

    def record(self, t: torch.Tensor, *, name: str, module: str, op: str, kind: str, call: int = 0,
               source: str | None = None, inputs: tuple[str, ...] = (), tags: tuple[str, ...] = ()) -> None:
        if not self.wanted(name, kind):
            return
        weight = kind in WEIGHT_KINDS
        store = self.keep_full or kind in _ALWAYS_STORED
        rec = Record(    # a value not stored carries its sketch: what statistics cannot see (stats.sketch)
            name=name, module=module, op=op, order=self.order, shape=tuple(t.shape), dtype=dtype_name(t.dtype),
            stats=compute_stats(t, self.channel_dim, sketch=not store), kind=kind, call=call, device=str(t.device),
            source=source, inputs=inputs, tags=tags, digest=tensor_digest(t) if weight else None,
        )
        rec = self.writer.add(rec, t if store else None)
        self.order += 1
        self.rng_records += kind == KIND_RNG
        if "angle" in tags:
            self.angles.add(rec.name)
        self.producer[t] = rec.name
        if self.on_record is not None:
            self.on_record(rec)


# Kinds whose tensors are stored even at keep="stats": small, and what replay, `nan` and the default `diff`
# (element-wise comparison of the model's own outputs) need.
_ALWAYS_STORED = (KIND_RNG, KIND_MODEL_INPUT, KIND_MODEL_OUTPUT)


class _OpMode(TorchDispatchMode):
    """Sees every aten op. Records op outputs (level="op") or only random ops (level="module")."""

    def __init__(self, recorder: _Recorder, modules: ModuleStack, all_ops: bool, replay: Any = None):
        super().__init__()
        self.recorder = recorder
        self.modules = modules
        self.all_ops = all_ops
        self.replay = replay  # an rng.RngReplay: random ops return recorded tensors instead of fresh draws
        self.paused = False  # set while hooks compute statistics, so their ops are not recorded
        self.entered = False  # module level: set while a random entry point runs inside the mode

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        replay = self.replay
        replayed = False   # this draw took recorded values (a replay may leave a draw with no counterpart alone)
        if replay is not None and not self.paused and op_base_name(func) in RNG_OPS:
            name = replay.name_for(func, *self.modules.current)
            before = len(replay.replayed)
            out = replay.take(func, args, kwargs or {}, name, user_source_line())
            replayed = len(replay.replayed) > before
        else:
            out = func(*args, **(kwargs or {}))
        if self.paused:
            return out
        base = op_base_name(func)
        is_rng = base in RNG_OPS
        if base in SKIP_OPS or (not is_rng and not self.all_ops):
            return out
        rec = self.recorder
        flat_out = op_tensors(out)
        if base in ALIAS_OPS and not is_rng:
            self._alias(args, flat_out)
            return out
        module, call = self.modules.current
        key = (module, call, base)
        k = rec.op_counts.get(key, 0)
        rec.op_counts[key] = k + 1
        inputs = rec.input_names(op_tensors(args, kwargs or {}))
        source = user_source_line()
        tags = ("angle",) if base in ANGLE_OPS else ()
        if is_rng and replayed:
            tags += (TAG_REPLAYED,)
        if _nonfinite_scalar(args, kwargs):   # ±Inf it writes is a constant's: a mask, for `nan`
            tags += (TAG_NONFINITE_CONSTANT,)
        if _quantized_op(func):                 # int8 arithmetic (torch.ao): quantization error, not a bug
            tags += (TAG_QUANTIZED,)
        drawn = draw_tags(func, args, kwargs or {}, flat_out) if is_rng else None   # what each output draws
        multi = len(flat_out) > 1
        op = op_full_name(func)
        for i, t in enumerate(flat_out):
            name = record_name(module, call, op, k, output=i if multi else None)
            rec.record(t, name=name, module=module, op=op, kind=KIND_RNG if is_rng else KIND_OUTPUT,
                       call=call, source=source, inputs=inputs, tags=tags + drawn[i] if drawn else tags)
        return out

    def _alias(self, args: tuple, flat_out: list[torch.Tensor]) -> None:
        """Let an alias inherit the name of its source, so the op graph stays connected."""
        src = next((a for a in args if isinstance(a, torch.Tensor)), None)
        name = self.recorder.producer.get(src) if src is not None else None
        if name is not None:
            for t in flat_out:
                self.recorder.producer[t] = name


def _quantized_op(func) -> bool:
    """An op of torch's int8 kernels: the `quantized::` namespace (`linear_dynamic`) or aten's `quantized_lstm`."""
    name = getattr(func, "name", lambda: "")()
    return name.startswith("quantized::") or name.startswith("aten::quantized_")


def _nonfinite_scalar(args: tuple, kwargs: dict | None) -> bool:
    """A Python float argument that is ±Inf or NaN (`masked_fill(m, -inf)`, `F.pad(x, p, value=-inf)`)."""
    for a in (*args, *(kwargs or {}).values()):
        if type(a) is float and a - a != 0.0:   # inf - inf and nan - nan are NaN
            return True
    return False


# Python entry points that draw random numbers. At module level the dispatch mode is entered only inside
# these calls: a mode that sees every op costs ~0.1x of a forward there, for the handful of ops that matter.
_RNG_ENTRY_POINTS: dict[Any, tuple[str, ...]] = {
    torch: ("rand", "randn", "rand_like", "randn_like", "randint", "randint_like", "randperm", "normal",
            "bernoulli", "multinomial", "poisson", "binomial", "dropout", "feature_dropout", "alpha_dropout",
            "feature_alpha_dropout", "rrelu"),
    torch.nn.functional: ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout",
                          "feature_alpha_dropout", "rrelu", "gumbel_softmax"),
    torch.Tensor: ("normal_", "uniform_", "bernoulli_", "bernoulli", "exponential_", "geometric_", "cauchy_",
                   "log_normal_", "random_", "multinomial"),
}


class _RngEntryPoints:
    """While active, every call of a `_RNG_ENTRY_POINTS` function runs inside `mode`.

    The patches are process-wide (refcounted, so nested captures share them); calls on other threads
    or through names bound before the capture began are not seen, which `Capture` detects afterwards
    from the generator state and reports."""

    _active: list["_OpMode"] = []
    _saved: dict[tuple[Any, str], Any] = {}

    def __init__(self, mode: "_OpMode"):
        self.mode = mode

    def __enter__(self) -> "_RngEntryPoints":
        if not self._active:
            for owner, names in _RNG_ENTRY_POINTS.items():
                for name in names:
                    original = owner.__dict__.get(name)
                    if original is None and not hasattr(owner, name):
                        continue  # not in this torch version
                    self._saved[(owner, name)] = original
                    setattr(owner, name, _entering_mode(getattr(owner, name)))
        self._active.append(self.mode)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._active.remove(self.mode)
        if self._active:
            return
        for (owner, name), original in self._saved.items():
            if original is None:
                delattr(owner, name)  # it was inherited (a TensorBase method): uncover it again
            else:
                setattr(owner, name, original)
        self._saved.clear()


def _entering_mode(fn: Callable) -> Callable:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        active = _RngEntryPoints._active
        mode = active[-1] if active else None
        if mode is None or mode.entered:
            return fn(*args, **kwargs)  # nested entry point (F.dropout -> torch.dropout): already inside
        mode.entered = True
        try:
            with mode:
                return fn(*args, **kwargs)
        finally:
            mode.entered = False
    return wrapper


class Capture:
    """Capture intermediates of `model` while code runs; see `capture()` for the arguments.

    Use as a context manager around any code that calls the model, or call `run(*inputs)`.
    After exit, `bundle` is the opened `Bundle` (also when the forward raised: then it is marked
    incomplete and holds every record made before the failure).
    """

    def __init__(self, model: torch.nn.Module, *, level: str = "module", keep: str = "stats",
                 include: str | None = None, exclude: str | None = None, out: str | os.PathLike | None = None,
                 record_inputs: bool = False, channel_dim: int | None = 1,
                 on_record: Callable[[Record], None] | None = None, model_info: dict | None = None,
                 shard_bytes: int | None = None, replay_rng: Any = None, weights: bool = True):
        if level not in LEVELS:
            raise InputError(f"unknown capture level {level!r}; use one of {', '.join(LEVELS)}")
        if keep not in KEEPS:
            raise InputError(f"unknown keep mode {keep!r}; use one of {', '.join(KEEPS)}")
        if not isinstance(model, torch.nn.Module):
            raise InputError(f"capture needs a torch.nn.Module, got {type(model).__name__}")
        self.model = model
        self.level = level
        self.keep = keep
        self.include = _compile(include, "include")
        self.exclude = _compile(exclude, "exclude")
        self.record_inputs = record_inputs
        self.record_weights = weights
        self.channel_dim = channel_dim
        self.on_record = on_record
        self.model_info = {"class": type(model).__name__,
                           "parameters": sum(p.numel() for p in model.parameters()),
                           "module_types": module_types(model), **(model_info or {})}
        self.out = Path(out) if out is not None else None
        self.shard_bytes = shard_bytes
        self.replay = None
        self._warnings: list[str] = []   # the manifest's warnings (draws module level cannot see, refused replays)
        if replay_rng is not None:
            from .rng import as_replay  # rng imports this module
            self.replay = as_replay(replay_rng)
        self.bundle: Bundle | None = None
        self._writer: BundleWriter | None = None
        self._handles: list[Any] = []
        self._mode: _OpMode | None = None
        self._tmpdir: tempfile.TemporaryDirectory | None = None
        self._arrived = WeakTensorKeyDictionary()   # a tensor no record made -> the first module call it reached

    # ---- context manager ------------------------------------------------------------------------------
    def __enter__(self) -> "Capture":
        self._open_writer(inputs=None)
        try:
            self._install()
        except BaseException as e:   # recording the weights hit a full disk: the bundle still says why it stopped
            self._uninstall()
            assert self._writer is not None
            self._writer.close(error=e)
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._uninstall()
        assert self._writer is not None
        self._writer.close(error=exc)
        self.bundle = self._writer.bundle()
        if self._tmpdir is not None:
            weakref.finalize(self.bundle, self._tmpdir.cleanup)

    def run(self, *inputs: Any, **kwinputs: Any) -> Any:
        """Record the model inputs, run the forward, record and return its output."""
        self._record_model_inputs(inputs, kwinputs)
        with torch.no_grad():
            output = self.model(*inputs, **kwinputs)
        self.record_outputs(output)
        return output

    def record_outputs(self, output: Any, name: str = "output") -> None:
        """Record every tensor in `output` (a tensor, tuple, list, dict, dataclass or `ModelOutput`, nested) as a
        model output named by its path: `output`, `output.0`, `output.waveform`, `output.0.1`. `run` does this;
        call it yourself around your own code (`cap.record_outputs(audio)`)."""
        assert self._writer is not None, "record_outputs is called inside the capture"
        rec = self._recorder
        with self._paused():
            for path, t in output_tensors(output, name):
                inputs = rec.input_names([t])
                tags = ("angle",) if any(i in rec.angles for i in inputs) else ()  # an angle stays an angle
                rec.record(t, name=path, module="", op="output", kind=KIND_MODEL_OUTPUT, inputs=inputs, tags=tags)

    # ---- internals -------------------------------------------------------------------------------------
    def _open_writer(self, inputs: dict | None) -> None:
        out = self.out
        if out is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="tensorprobe-capture-")
            out = Path(self._tmpdir.name) / "bundle"
        kw = {} if self.shard_bytes is None else {"shard_bytes": self.shard_bytes}
        try:
            self._writer = BundleWriter(
                out, model=self.model_info, capture={"level": self.level, "keep": self.keep,
                                                     "include": _pattern(self.include),
                                                     "exclude": _pattern(self.exclude),
                                                     "replay_rng": self.replay.tape.origin if self.replay else None},
                inputs=inputs, reuse_buffers=self.keep == "full", **kw)
        except OSError as e:         # before the forward: the output directory, not the model, is at fault
            raise BundleError(_unwritable(out, e)) from None
        self._modules = ModuleStack()
        self._recorder = _Recorder(self._writer, self.keep, self.include, self.exclude, self.channel_dim,
                                   self.on_record)

    def _record_model_inputs(self, inputs: tuple, kwinputs: dict) -> None:
        named = {str(i): t for i, t in enumerate(inputs)} | {str(k): v for k, v in kwinputs.items()}
        assert self._writer is not None
        self._writer.set_header(inputs=describe_inputs(named))
        with self._paused():
            for key, value in named.items():   # nested too, by key: a forward taking one dict (`input.0.mel`)
                for path, t in output_tensors(value, f"input.{key}"):
                    self._recorder.record(t, name=path, module="", op="input", kind=KIND_MODEL_INPUT)

    def _install(self) -> None:
        self._writer.set_header(environment=collect_environment([*self.model.parameters(), *self.model.buffers()]))
        if self.record_weights:
            self._record_weights()
        for path, module in self.model.named_modules():
            # prepend: ops of the module's own pre-hooks (weight_norm computing `weight`) belong to the module
            self._handles.append(module.register_forward_pre_hook(self._pre_hook(path), with_kwargs=True,
                                                                  prepend=True))
            self._handles.append(module.register_forward_hook(self._post_hook(path), always_call=True))
        self._mode = _OpMode(self._recorder, self._modules, all_ops=self.level == "op", replay=self.replay)
        if self.level == "op":
            self._active = self._mode
        else:
            self._rng_state = _generator_state()
            self._active = _RngEntryPoints(self._mode)
        self._active.__enter__()

    def _record_weights(self) -> None:
        """Every parameter, buffer and derived weight (statistics and fingerprint; values with keep="full").
        Parameter tensors are registered as producers, so op records name the weights they read."""
        rec = self._recorder
        for name, module, t, kind, tags in named_weights(self.model):
            rec.record(t, name=name, module=module, op=kind, kind=kind, tags=tags)
            rec.producer[t] = name

    def _uninstall(self) -> None:
        if self._mode is not None:
            self._active.__exit__(None, None, None)
            if self.level == "module":
                self._check_unseen_draws()
            self._check_refused_draws()
            self._mode = None
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _check_unseen_draws(self) -> None:
        """The generator moved but no random op was recorded: the model draws through a path the module
        level cannot see (a C++ op, a name imported before the capture). Say so instead of staying silent."""
        if self._recorder.rng_records or _generator_state() == self._rng_state:
            return
        msg = ("the model drew random numbers that module-level capture could not record; "
               "capture with level='op' to record (and replay) them")
        self._warn(msg)

    def _check_refused_draws(self) -> None:
        """Replay fed no draw of another distribution or parameters than the recorded one (`rng.RngReplay`):
        each such op kept its own draw, which `diff` then reports as a difference at that op."""
        for m in (self.replay.refused if self.replay is not None else ())[:10]:
            self._warn(f"replay: {m.sentence()}")

    def _warn(self, msg: str) -> None:
        assert self._writer is not None
        self._warnings.append(msg)
        self._writer.set_header(warnings=list(self._warnings))
        warnings.warn(msg, stacklevel=5)

    @contextmanager
    def _paused(self):
        """Hooks compute statistics with torch ops: keep those out of the recording. Python dispatch is
        switched off too, so those ops skip the mode's Python handler (~10 µs each, thousands per forward)."""
        mode = self._mode
        if mode is not None:
            mode.paused = True
        try:
            with torch._C._DisableTorchDispatch():
                yield
        finally:
            if mode is not None:
                mode.paused = False

    def _pre_hook(self, path: str):
        def hook(module, args, kwargs):
            call = self._modules.enter(path)
            if self.level == "module":   # parents' pre-hooks run first: the outermost call to receive it
                for t in module_tensors(args):
                    if self._recorder.producer.get(t) is None and t not in self._arrived:
                        self._arrived[t] = path
            if self.record_inputs:
                tensors = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
                with self._paused():
                    for i, t in enumerate(tensors):
                        self._recorder.record(t, name=record_name(path, call, output=f"in{i}"), module=path,
                                              op="module_input", kind=KIND_INPUT, call=call)
        return hook

    def _post_hook(self, path: str):
        def hook(module, args, output):
            top, call = self._modules.current
            if top != path:  # a child raised and left its entry behind
                call = self._modules.calls.get(path, 0)
            self._modules.exit(path)
            if self.level != "module":
                return
            flat = module_tensors(output)
            rec = self._recorder
            arg_tensors = module_tensors(args)
            inputs = rec.input_names(arg_tensors)
            # an input no record made came from a parent's own code: `nan` must not blame this module alone, and
            # names the module whose code made it (the parent of the outermost call that received it)
            unrecorded = [t for t in arg_tensors if rec.producer.get(t) is None]
            tags = (TAG_INPUTS_UNRECORDED, TAG_INPUTS_MADE_IN + _parent_path(self._arrived.get(unrecorded[0], path))) \
                if unrecorded else ()
            if is_quantized_module(module):
                tags += (TAG_QUANTIZED,)
            if not type(module).__module__.startswith("torch."):
                tags += (TAG_OWN_CODE,)   # the model's own class: its forward is code no torch type describes
            with self._paused():
                for i, t in enumerate(flat):
                    rec.record(t, name=record_name(path, call, output=i if len(flat) > 1 else None),
                               module=path, op=f"module:{type(module).__name__}", kind=KIND_OUTPUT,
                               call=call, inputs=inputs, tags=tags)
        return hook


def _parent_path(path: str) -> str:
    return path.rsplit(".", 1)[0] if "." in path else ""


def capture(model: torch.nn.Module, *inputs: Any, level: str = "module", keep: str = "stats",
            include: str | None = None, exclude: str | None = None, out: str | os.PathLike | None = None,
            record_inputs: bool = False, channel_dim: int | None = 1,
            on_record: Callable[[Record], None] | None = None, replay_rng: Any = None, weights: bool = True,
            compile: bool = False, backend: str = "inductor", mode: str | None = None,
            inductor_config: dict[str, Any] | None = None, **kwinputs: Any) -> Bundle | Capture:
    """Capture every intermediate of `model` into a bundle.

    Args:
        model: the PyTorch module.
        *inputs, **kwinputs: forward inputs. Given: the forward runs now and the `Bundle` is returned.
            Omitted: a `Capture` context manager is returned, to wrap your own code.
        level: "module" (one record per module call, forward hooks) or "op" (one record per aten op
            output, `TorchDispatchMode`, attributed to the innermost module, with the source line).
        keep: "stats" (statistics only) or "full" (also the tensors, streamed to safetensors shards).
            Random-op outputs and model inputs are always stored, for replay and diagnosis.
        include / exclude: regexes searched in record names.
        out: bundle directory; default a temporary directory that lives as long as the returned Bundle.
        record_inputs: also record each module call's tensor inputs (`<module>:in<i>`), for isolating a
            module in another runtime.
        channel_dim: dimension analysed for entirely non-finite channels.
        on_record: called with each new Record (progress display).
        replay_rng: a bundle (or its path, a noise file, an `rng.RngReplay`) whose recorded random tensors
            are fed back in call order instead of fresh draws (see `tensorprobe.rng`); replayed random
            records are tagged "replayed".
        weights: record every parameter and buffer (statistics and a content fingerprint; values with
            keep="full") so that `diff` compares the weights before the forward.
        compile: capture the model as `torch.compile(model, backend=backend)` runs it: the statistics are computed
            inside the compiled graph, records keep the eager names (`tensorprobe.compiled`); graph breaks are
            warnings in the bundle. Op level needs backend="aot_eager".
        backend, mode: the torch.compile backend ("inductor", "aot_eager", "eager", any registered one) and
            Inductor's mode ("max-autotune", ...), with compile=True.
        inductor_config: Inductor settings for the compile (`torch._inductor.config` names, e.g.
            `{"emulate_precision_casts": True}`), with compile=True and backend "inductor".

    Every tensor the forward returns is recorded as a model output (`output`, `output.0`, `output.wav`)
    with its values, whatever `keep` is, and the bundle records the numerics environment (device, dtypes,
    TF32 flags, versions: `tensorprobe.environment`).

    Returns:
        The `Bundle` (inputs given), or a `Capture` context manager. A forward that raises leaves a
        readable bundle marked incomplete (at `out`), then the exception propagates.

    Example:
        >>> bundle = capture(model, x, level="op", keep="full", out="ref")   # doctest: +SKIP
        >>> bundle["generator.noise_res.0.adain1.0.norm/rsqrt.0"].stats.nonfinite_channels  # doctest: +SKIP
        38
    """
    kw = dict(level=level, keep=keep, include=include, exclude=exclude, out=out, record_inputs=record_inputs,
              channel_dim=channel_dim, on_record=on_record, replay_rng=replay_rng, weights=weights)
    if compile:
        from .compiled import compiled_capture
        cap = compiled_capture(Capture, model, backend=backend, mode=mode, inductor_config=inductor_config, **kw)
    else:
        if mode is not None or inductor_config:
            raise InputError("mode and inductor_config are torch.compile settings: pass compile=True with them")
        cap = Capture(model, **kw)
    if not inputs and not kwinputs:
        return cap
    with cap:
        cap.run(*inputs, **kwinputs)
    assert cap.bundle is not None
    return cap.bundle


def output_tensors(value: Any, name: str = "output") -> list[tuple[str, torch.Tensor]]:
    """(path, tensor) for every tensor in a forward's return value, depth first, in order.

        >>> [p for p, _ in output_tensors((torch.zeros(1), {"wav": torch.zeros(2), "n": 3}))]
        ['output.0', 'output.1.wav']
    """
    import dataclasses

    if isinstance(value, torch.Tensor):
        return [(name, value)]
    if isinstance(value, dict):  # transformers' ModelOutput is an OrderedDict of its non-None fields
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, (tuple, list)):
        items = [(str(i), v) for i, v in enumerate(value)]
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    else:
        return []
    return [pair for key, v in items for pair in output_tensors(v, f"{name}.{key}")]


def _generator_state() -> bytes:
    """The default CPU generator's state (a few KB), to tell whether anything drew from it."""
    return bytes(torch.default_generator.get_state().numpy())


def check_output_dir(path: str | os.PathLike) -> None:
    """Raise `BundleError` unless a bundle can be written at `path`: an existing directory we may write in, or
    a new one we may create (probed with a temporary directory in its nearest existing parent, removed
    again). Called before anything runs, so a bad `-o` is named as such, not as the model's failure."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise BundleError(f"{p}: exists and is not a directory; choose another output directory")
    refuse_if_locked(p)   # another live capture writes there: refused before the model loads
    parent = p
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise BundleError(f"cannot create the output directory {p}: {parent} is not a directory")
    try:
        tempfile.TemporaryDirectory(prefix=".tensorprobe-probe-", dir=parent).cleanup()
    except OSError as e:
        where = "" if parent == p else f" ({parent} refuses new directories)"
        raise BundleError(f"cannot write the bundle to {p}{where}: {e.strerror or type(e).__name__}") from None


def _unwritable(path: Path, e: OSError) -> str:
    reason = e.strerror or type(e).__name__
    return f"cannot write the bundle to {path}: {reason}{f' ({e.filename})' if e.filename else ''}"


def _compile(pattern: str | None, what: str) -> re.Pattern | None:
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as e:
        raise InputError(f"invalid --{what} regex {pattern!r}: {e}") from None


def _pattern(p: re.Pattern | None) -> str | None:
    return p.pattern if p is not None else None




__all__ = ["Capture", "capture", "check_output_dir", "module_label"]


from ._api import make_callable  # noqa: E402

make_callable(__name__, capture)  # `tp.capture(...)` calls it; `tensorprobe.capture.<submodule>` still imports
