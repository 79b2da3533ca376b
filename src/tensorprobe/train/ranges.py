"""Training versus inference: the module outputs whose values at inference leave the range seen in training.

A model trained with teacher forcing (ground-truth durations, targets fed back) runs differently at
inference (predicted durations, its own outputs fed back), and a clamp or a normalisation present on one path
only goes unnoticed until the audio is wrong: seed 002's "mel range during training [-11.5, 0.0]" against
"[-20, 10]" at inference, its duration predictor "not clamped during inference". Both are measurable.

    >>> stats = record_ranges(model, train_batches, forward=lambda m, b: m(*b, teacher_forcing=True))  # doctest: +SKIP
    >>> stats.save("train_stats.json")                                                               # doctest: +SKIP
    >>> report = check_ranges(model, infer_inputs, stats)                                            # doctest: +SKIP
    >>> report.first.name, report.first.words()                                                      # doctest: +SKIP
    ('mel_out', 'inference range [-20.1, 9.7], training [-11.5, 0.0]: 41% of values outside')

Statistics are kept per tensor, aggregated over calls and batches in constant memory (min, max, mean, std,
count), for every tensor a module returns and every value its own forward code computes between submodules:

    decoder                       a module that returns one tensor (the model's own output is `output`)
    dur.output.1                  the 2nd element of a tuple or list a module returns
    dur.output["durations"]       a dict entry (transformers' ModelOutput too); `.output.field` of a dataclass
    regulator.input.1             an input no module returned: computed in the parent's forward code
                                  (`durations.clamp(1, 8)`), or an index tensor fed from outside (an Embedding's)
    model/clamp.0                 with `ops=True`, each op's output, attributed to the module whose code ran it

Integer tensors (token indices, durations) count too: one inference value outside the range seen in training is
a finding there (an embedding row never trained). Clamps are watched in both modes: a clamp a module's forward
code runs in training and not at inference (or the reverse) is named, with its source line.
"""

from __future__ import annotations

import json
import math
import os
import weakref
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import torch

from ..errors import InputError
from torch.utils._python_dispatch import TorchDispatchMode

from ..hooks import ModuleStack, op_base_name, op_tensors, user_source_line
from ..ops import ALIAS_OPS, SKIP_OPS

FORMAT = "tensorprobe-train-ranges/1"
OUTSIDE_FRACTION = 0.01      # a float record is reported when more than 1% of its inference values leave the range
CLAMP_OPS = frozenset({"clamp", "clamp_", "clamp_min", "clamp_min_", "clamp_max", "clamp_max_", "clip", "clip_",
                       "hardtanh", "hardtanh_"})
_MAX_DEPTH = 4               # nesting of a module's output structure that is walked


@dataclass
class Range:
    """Running statistics of one record over batches."""

    min: float = math.inf
    max: float = -math.inf
    total: float = 0.0
    total_sq: float = 0.0
    count: int = 0
    order: int = 0            # first call's position in execution order
    integer: bool = False     # indices, durations: one value outside the range is a finding

    def add(self, t: torch.Tensor) -> None:
        self.integer = not t.is_floating_point()
        x = t.detach().float()
        finite = x[torch.isfinite(x)]
        if finite.numel() == 0:
            return
        lo, hi, s, s2 = torch.stack([finite.min(), finite.max(), finite.sum(dtype=torch.float64).float(),
                                     (finite.double() ** 2).sum().float()]).tolist()
        self.min, self.max = min(self.min, lo), max(self.max, hi)
        self.total += s
        self.total_sq += s2
        self.count += finite.numel()

    @property
    def mean(self) -> float:
        return self.total / self.count if self.count else math.nan

    @property
    def std(self) -> float:
        if not self.count:
            return math.nan
        return math.sqrt(max(self.total_sq / self.count - self.mean ** 2, 0.0))


@dataclass
class RangeStats:
    """Per record: the range seen over training batches; per module, the clamps its forward code ran.
    `save`/`load` as JSON."""

    records: dict[str, Range] = field(default_factory=dict)
    batches: int = 0
    model: str = ""
    clamps: dict[str, dict[str, Any]] = field(default_factory=dict)   # "module|op family|source" -> module, op, source

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        doc = {"format": FORMAT, "model": self.model, "batches": self.batches, "clamps": self.clamps,
               "records": {n: {**asdict(r), "mean": r.mean, "std": r.std} for n, r in self.records.items()}}
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(doc, indent=1))
        os.replace(tmp, path)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RangeStats":
        try:
            doc = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise InputError(f"{path}: not a training-ranges file ({e})") from None
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise InputError(f"{path}: not a training-ranges file (format {FORMAT!r}; write one with "
                             "tensorprobe.train.ranges.record_ranges(...).save(path))")
        keys = ("min", "max", "total", "total_sq", "count", "order")
        records = {n: Range(**{k: r[k] for k in keys}, integer=bool(r.get("integer", False)))
                   for n, r in doc["records"].items()}
        return cls(records, doc.get("batches", 0), doc.get("model", ""), dict(doc.get("clamps") or {}))

    def get(self, name: str) -> Range | None:
        return self.records.get(name)


@dataclass(frozen=True)
class RangeFinding:
    """One record whose inference values leave the training range."""

    name: str
    order: int
    train_min: float
    train_max: float
    infer_min: float
    infer_max: float
    above: float              # fraction of inference values above the training max
    below: float              # ... below the training min
    nonfinite: int = 0
    integer: bool = False

    @property
    def outside(self) -> float:
        return self.above + self.below

    def words(self) -> str:
        share = f"{self.outside:.0%}" if self.outside >= 0.005 or not self.outside else f"{self.outside:.2%}"
        parts = [f"inference range [{self.infer_min:.4g}, {self.infer_max:.4g}], training "
                 f"[{self.train_min:.4g}, {self.train_max:.4g}]: {share} of values outside"]
        if self.above and self.below:
            parts.append(f"({self.above:.0%} above, {self.below:.0%} below)")
        if self.nonfinite:
            parts.append(f"and {self.nonfinite} non-finite")
        if self.integer and self.outside:
            parts.append("(integer values never seen in training: an index past the trained rows, a count "
                         "no clamp bounds at inference)")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "outside": self.outside, "words": self.words()}


@dataclass(frozen=True)
class ModeDifference:
    """A clamp that a module's forward code runs in one mode and not in the other (told apart by module,
    op family and source line)."""

    module: str               # "" for the model's own forward
    op: str
    only_in: str              # "training" or "inference"
    source: str | None = None

    def words(self) -> str:
        where = f"{self.module}'s forward" if self.module else "the model's forward"
        other = "inference" if self.only_in == "training" else "training"
        at = f" at {self.source}" if self.source else ""
        fix = (" (a clamp missing at inference: what it bounds in training is unbounded there)"
               if self.only_in == "training" else "")
        return f"{where} runs {self.op}{at} in {self.only_in} and not at {other}{fix}" if other == "inference" else f"{where} runs {self.op}{at} at inference and not in training"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "words": self.words()}


@dataclass
class RangeReport:
    """Inference against training: the findings in execution order (the first is where it starts), and the
    clamps run in one mode only."""

    findings: list[RangeFinding]
    checked: int
    missing: list[str]        # records at inference with no training statistics
    mode_differences: list[ModeDifference] = field(default_factory=list)

    @property
    def first(self) -> RangeFinding | None:
        return self.findings[0] if self.findings else None

    @property
    def training_only(self) -> list[ModeDifference]:
        """Clamps run in training and not at inference: what inference lacks. (A clamp run at inference only,
        on predicted durations where training feeds the true ones, is the usual design: listed, not told.)"""
        return [d for d in self.mode_differences if d.only_in == "training"]

    def headline(self) -> str:
        clamps = "; ".join(d.words() for d in self.training_only)
        if not self.findings:
            if clamps:
                return f"Inference stays in the training range ({self.checked} records checked), but {clamps}."
            return (f"Inference stays in the training range: all {self.checked} records checked (every tensor "
                    "modules return, and values computed in forward code).")
        f = self.findings[0]
        text = (f"{len(self.findings)} of {self.checked} records leave the training range at inference; "
                f"first {f.name}: {f.words()}")
        return f"{text}. {clamps[0].upper()}{clamps[1:]}." if clamps else text

    def to_dict(self) -> dict[str, Any]:
        return {"headline": self.headline(), "checked": self.checked, "missing": self.missing,
                "findings": [f.to_dict() for f in self.findings],
                "mode_differences": [d.to_dict() for d in self.mode_differences]}


def _default_forward(model: torch.nn.Module, batch: Any) -> Any:
    return model(*batch) if isinstance(batch, (tuple, list)) else model(batch)


def _named(value: Any, prefix: str, depth: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every tensor in a module's output or inputs: `.1` for a tuple/list element,
    `["key"]` for a dict entry (ModelOutput is a dict), `.field` for a dataclass field."""
    if isinstance(value, torch.Tensor):
        yield prefix, value
    elif depth >= _MAX_DEPTH:
        return
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _named(v, f'{prefix}["{k}"]', depth + 1)
    elif isinstance(value, (tuple, list)):
        for i, v in enumerate(value):
            yield from _named(v, f"{prefix}.{i}", depth + 1)
    elif is_dataclass(value) and not isinstance(value, type):
        for f in fields(value):
            yield from _named(getattr(value, f.name, None), f"{prefix}.{f.name}", depth + 1)


def _wanted(t: torch.Tensor) -> bool:
    return t.numel() > 0 and t.dtype != torch.bool and not t.is_complex()


class _Tracer:
    """Hands `on_value(name, tensor)` every tensor a module returns, every module input no module returned
    (computed in forward code, or fed from outside), and with `ops` every op output; counts the clamps each
    module's own code runs."""

    def __init__(self, model: torch.nn.Module, on_value: Callable[[str, torch.Tensor], None], ops: bool,
                 expected: Iterable[str] = ()):
        self.model, self.on_value, self.ops = model, on_value, ops
        # inputs recorded in training are checked even where inference hands a module's output on unchanged
        # (the clamp between them missing): the training record is what the inference value must stay in
        self.expected = frozenset(expected)
        self.stack = ModuleStack()
        self.seen: dict[int, tuple[Any, int]] = {}       # id -> (weak ref, version): tensors already recorded
        self.clamps: dict[str, dict[str, Any]] = {}
        self.op_counts: dict[tuple[str, int, str], int] = {}
        self.paused = False
        self.handles: list[Any] = []

    def __enter__(self) -> "_Tracer":
        for path, module in self.model.named_modules():
            self.handles.append(module.register_forward_pre_hook(self._pre(path, module is self.model),
                                                                 with_kwargs=True))
            self.handles.append(module.register_forward_hook(self._post(path), always_call=True))
        self.mode = _OpWatch(self)
        self.mode.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)
        for h in self.handles:
            h.remove()

    def new_batch(self) -> None:
        self.seen.clear()
        self.op_counts.clear()

    def value(self, name: str, t: torch.Tensor, *, unless_seen: bool = False) -> None:
        if not _wanted(t):
            return
        known = self.seen.get(id(t))
        if (unless_seen and known is not None and known[0]() is t and known[1] == t._version
                and name not in self.expected):
            return
        self.seen[id(t)] = (weakref.ref(t), t._version)
        self.paused = True          # the statistics' own ops are not the model's
        try:
            self.on_value(name, t)
        finally:
            self.paused = False

    def clamp(self, op: str) -> None:
        module = self.stack.current[0]
        source = user_source_line()      # tells two clamps of one forward apart (a frame walk: clamps only)
        family = "hardtanh" if op.startswith("hardtanh") else "clamp"
        key = f"{module}|{family}|{source}"
        if key not in self.clamps:
            self.clamps[key] = {"module": module, "op": op.rstrip("_"), "source": source}

    def _pre(self, path: str, root: bool):
        label = path or "output"

        def hook(module, args, kwargs):
            self.stack.enter(path)
            if not root:            # the model's own inputs are checked where a module reads them
                for name, t in _named(args, f"{label}.input"):
                    self.value(name, t, unless_seen=True)
                for name, t in _named(kwargs, f"{label}.input"):
                    self.value(name, t, unless_seen=True)
        return hook

    def _post(self, path: str):
        label = path or "output"
        inner = "" if not path else ".output"

        def hook(module, args, output):
            try:
                if isinstance(output, torch.Tensor):
                    self.value(label, output)
                else:
                    for name, t in _named(output, f"{label}{inner}"):
                        self.value(name, t)
            finally:
                self.stack.exit(path)
        return hook


class _OpWatch(TorchDispatchMode):
    """Every aten op: clamps are counted per module; with `ops`, each op output is a record
    (`module/op.k`, as `capture(level="op")` names it)."""

    def __init__(self, tracer: _Tracer):
        super().__init__()
        self.tracer = tracer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tr = self.tracer
        if tr.paused:
            return out
        base = op_base_name(func)
        if base in CLAMP_OPS:
            tr.clamp(base)
        if tr.ops and base not in SKIP_OPS and base not in ALIAS_OPS:
            module, call = tr.stack.current
            key = (module, call, base)
            k = tr.op_counts.get(key, 0)
            tr.op_counts[key] = k + 1
            tensors = op_tensors(out)
            for i, t in enumerate(tensors):
                suffix = f":{i}" if len(tensors) > 1 else ""
                tr.value(f"{module}/{base}.{k}{suffix}", t)
        return out


def _run(model: torch.nn.Module, batches: Iterable[Any], forward: Callable, on_value: Callable, ops: bool,
         train_mode: bool, expected: Iterable[str] = ()) -> tuple[int, dict[str, dict[str, Any]]]:
    """Run every batch with the tracer on; the number of batches and the clamps seen."""
    was_training = model.training
    model.train(train_mode)
    n = 0
    try:
        with torch.no_grad(), _Tracer(model, on_value, ops, expected) as tracer:
            for batch in batches:
                tracer.new_batch()
                forward(model, batch)
                n += 1
    finally:
        model.train(was_training)
    return n, tracer.clamps


def record_ranges(model: torch.nn.Module, batches: Iterable[Any], *,
                  forward: Callable[[torch.nn.Module, Any], Any] | None = None, train_mode: bool = True,
                  ops: bool = False) -> RangeStats:
    """Run `forward(model, batch)` over training `batches` (train mode, no gradient) and keep the range of
    every tensor modules return and every value computed between them (see the module's docstring for the
    names; `ops=True`: of every op's output too). `forward` defaults to `model(*batch)`; pass the
    teacher-forced call your training uses."""
    stats = RangeStats(model=type(model).__name__)

    def add(name: str, t: torch.Tensor) -> None:
        r = stats.records.get(name)
        if r is None:
            r = stats.records[name] = Range(order=len(stats.records))
        r.add(t)

    stats.batches, stats.clamps = _run(model, batches, forward or _default_forward, add, ops, train_mode)
    if stats.batches == 0:
        raise InputError("record_ranges: no training batch was given")
    return stats


def check_ranges(model: torch.nn.Module, inputs: Iterable[Any], stats: RangeStats, *,
                 forward: Callable[[torch.nn.Module, Any], Any] | None = None,
                 outside: float = OUTSIDE_FRACTION, ops: bool | None = None) -> RangeReport:
    """Run `forward(model, x)` for each inference input (eval mode, no gradient) and report, in execution
    order, the records whose values leave the training range (floats: on more than `outside` of their
    elements; integers: on any), and the clamps run in one mode only. `ops` defaults to whether the training
    statistics have op records."""
    seen: dict[str, dict[str, Any]] = {}
    missing: list[str] = []

    def check(name: str, t: torch.Tensor) -> None:
        r = stats.get(name)
        if r is None or not r.count:
            if name not in missing:
                missing.append(name)
            return
        x = t.detach().float()
        finite = torch.isfinite(x)
        vals = x[finite]
        s = seen.setdefault(name, {"order": len(seen), "min": math.inf, "max": -math.inf, "above": 0, "below": 0,
                                   "n": 0, "nonfinite": 0})
        s["nonfinite"] += int((~finite).sum())
        if vals.numel():
            lo, hi, above, below = torch.stack([vals.min(), vals.max(), (vals > r.max).sum().float(),
                                                (vals < r.min).sum().float()]).tolist()
            s["min"], s["max"] = min(s["min"], lo), max(s["max"], hi)
            s["above"] += above
            s["below"] += below
            s["n"] += vals.numel()

    if ops is None:
        ops = any("/" in n for n in stats.records)
    _, clamps = _run(model, inputs, forward or _default_forward, check, ops, False, stats.records)
    findings = []
    for name, s in sorted(seen.items(), key=lambda kv: kv[1]["order"]):
        r = stats.records[name]
        n = max(s["n"], 1)
        f = RangeFinding(name, s["order"], r.min, r.max, s["min"], s["max"], s["above"] / n, s["below"] / n,
                         s["nonfinite"], r.integer)
        if f.outside > (0.0 if r.integer else outside) or f.nonfinite:
            findings.append(f)
    return RangeReport(findings, len(seen), missing, _mode_differences(stats.clamps, clamps))


def _mode_differences(train: dict[str, dict[str, Any]], infer: dict[str, dict[str, Any]]) -> list[ModeDifference]:
    out = [ModeDifference(c["module"], c["op"], "training", c.get("source")) for k, c in train.items()
           if k not in infer]
    return out + [ModeDifference(c["module"], c["op"], "inference", c.get("source")) for k, c in infer.items()
                  if k not in train]


MEL_RECORDS = ("mel", "mel_out", "output")


def stage_options(stats: RangeStats, mel: str | None = None, durations: str | None = None) -> dict[str, Any]:
    """`StageChecker` options taken from training statistics instead of the fixed defaults: `mel_range` from
    the mel record (`mel`, else the first of MEL_RECORDS present), `max_duration_frames` from a `durations`
    record. What `tensorprobe tts check --reference TRAIN_STATS` uses."""
    opts: dict[str, Any] = {}
    names = [mel] if mel else [n for n in MEL_RECORDS if n in stats.records]
    if mel and mel not in stats.records:
        raise InputError(f"training statistics have no record {mel!r}; they have: "
                         + ", ".join(list(stats.records)[:12]) + (" ..." if len(stats.records) > 12 else ""))
    if names:
        r = stats.records[names[0]]
        opts["mel_range"] = (r.min, r.max)
    dur = durations or ("durations" if "durations" in stats.records else None)
    if dur is not None:
        if dur not in stats.records:
            raise InputError(f"training statistics have no record {dur!r}")
        opts["max_duration_frames"] = stats.records[dur].max
    if not opts:
        raise InputError("training statistics name no mel record (mel, mel_out, output): say which with "
                         "--reference-mel NAME")
    return opts
