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

Statistics are kept per module output (the first floating tensor a module returns), aggregated over calls
and batches in constant memory: min, max, mean, std, count.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from ..errors import InputError
from ..hooks import module_tensors

FORMAT = "tensorprobe-train-ranges/1"
OUTSIDE_FRACTION = 0.01      # a record is reported when more than 1% of its inference values leave the range


@dataclass
class Range:
    """Running statistics of one module output over training batches."""

    min: float = math.inf
    max: float = -math.inf
    total: float = 0.0
    total_sq: float = 0.0
    count: int = 0
    order: int = 0            # first call's position in execution order

    def add(self, t: torch.Tensor) -> None:
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
    """Per module output: the range seen over training batches. `save`/`load` as JSON."""

    records: dict[str, Range] = field(default_factory=dict)
    batches: int = 0
    model: str = ""

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        doc = {"format": FORMAT, "model": self.model, "batches": self.batches,
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
        records = {n: Range(**{k: r[k] for k in keys}) for n, r in doc["records"].items()}
        return cls(records, doc.get("batches", 0), doc.get("model", ""))

    def get(self, name: str) -> Range | None:
        return self.records.get(name)


@dataclass(frozen=True)
class RangeFinding:
    """One module output whose inference values leave the training range."""

    name: str
    order: int
    train_min: float
    train_max: float
    infer_min: float
    infer_max: float
    above: float              # fraction of inference values above the training max
    below: float              # ... below the training min
    nonfinite: int = 0

    @property
    def outside(self) -> float:
        return self.above + self.below

    def words(self) -> str:
        parts = [f"inference range [{self.infer_min:.4g}, {self.infer_max:.4g}], training "
                 f"[{self.train_min:.4g}, {self.train_max:.4g}]: {self.outside:.0%} of values outside"]
        if self.above and self.below:
            parts.append(f"({self.above:.0%} above, {self.below:.0%} below)")
        if self.nonfinite:
            parts.append(f"and {self.nonfinite} non-finite")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "outside": self.outside, "words": self.words()}


@dataclass
class RangeReport:
    """Inference against training: the findings in execution order (the first is where it starts)."""

    findings: list[RangeFinding]
    checked: int
    missing: list[str]        # module outputs at inference with no training statistics

    @property
    def first(self) -> RangeFinding | None:
        return self.findings[0] if self.findings else None

    def headline(self) -> str:
        if not self.findings:
            return f"Inference stays in the training range: all {self.checked} module outputs checked."
        f = self.findings[0]
        return (f"{len(self.findings)} of {self.checked} module outputs leave the training range at inference; "
                f"first {f.name}: {f.words()}")

    def to_dict(self) -> dict[str, Any]:
        return {"headline": self.headline(), "checked": self.checked, "missing": self.missing,
                "findings": [f.to_dict() for f in self.findings]}


def _default_forward(model: torch.nn.Module, batch: Any) -> Any:
    return model(*batch) if isinstance(batch, (tuple, list)) else model(batch)


def _hooked(model: torch.nn.Module, on_output: Callable[[str, torch.Tensor], None]) -> list[Any]:
    handles = []
    for name, module in model.named_modules():
        name = name or "output"          # the model's own output: what the audio is made from

        def hook(mod, args, output, name=name):
            t = next((x for x in module_tensors(output) if x.is_floating_point()), None)
            if t is not None and t.numel():
                on_output(name, t)
        handles.append(module.register_forward_hook(hook))
    return handles


def record_ranges(model: torch.nn.Module, batches: Iterable[Any], *,
                  forward: Callable[[torch.nn.Module, Any], Any] | None = None, train_mode: bool = True) -> RangeStats:
    """Run `forward(model, batch)` over training `batches` (train mode, no gradient) and keep each module
    output's range. `forward` defaults to `model(*batch)`; pass the teacher-forced call your training uses."""
    forward = forward or _default_forward
    stats = RangeStats(model=type(model).__name__)
    was_training = model.training
    model.train(train_mode)

    def add(name: str, t: torch.Tensor) -> None:
        r = stats.records.get(name)
        if r is None:
            r = stats.records[name] = Range(order=len(stats.records))
        r.add(t)

    handles = _hooked(model, add)
    try:
        with torch.no_grad():
            for batch in batches:
                forward(model, batch)
                stats.batches += 1
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    if stats.batches == 0:
        raise InputError("record_ranges: no training batch was given")
    return stats


def check_ranges(model: torch.nn.Module, inputs: Iterable[Any], stats: RangeStats, *,
                 forward: Callable[[torch.nn.Module, Any], Any] | None = None,
                 outside: float = OUTSIDE_FRACTION) -> RangeReport:
    """Run `forward(model, x)` for each inference input (eval mode, no gradient) and report the module
    outputs whose values leave the training range on more than `outside` of their elements, in execution
    order."""
    forward = forward or _default_forward
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

    was_training = model.training
    model.eval()
    handles = _hooked(model, check)
    try:
        with torch.no_grad():
            for x in inputs:
                forward(model, x)
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    findings = []
    for name, s in sorted(seen.items(), key=lambda kv: kv[1]["order"]):
        r = stats.records[name]
        n = max(s["n"], 1)
        f = RangeFinding(name, s["order"], r.min, r.max, s["min"], s["max"], s["above"] / n, s["below"] / n,
                         s["nonfinite"])
        if f.outside > outside or f.nonfinite:
            findings.append(f)
    return RangeReport(findings, len(seen), missing)


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
