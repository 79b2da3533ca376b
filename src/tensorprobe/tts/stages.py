"""`StageChecker`: hand in what each stage of a TTS pipeline produced, get seed 002's red flags as findings,
plus the wall time and peak memory of every stage it ran.

    >>> import numpy as np
    >>> from tensorprobe.tts import StageChecker
    >>> c = StageChecker(vocab={"h": 1, "ə": 2, "l": 3, "O": 4}, embedding_size=5)
    >>> _ = c.phonemes("həlO")
    >>> _ = c.ids([0, 1, 2, 3, 4, 9, 0])
    >>> _ = c.mel(np.full((80, 40), -4.0))
    >>> [(f.stage, f.check) for f in c.report().findings]
    [('ids', 'out_of_range'), ('mel', 'near_constant')]

Running a stage through the checker times it and checks its output:

    >>> audio = c.run("audio", vocoder, mel, sample_rate=24000)     # doctest: +SKIP

Memory per stage: `py_peak_bytes` is the peak of Python-level allocations (tracemalloc: Python objects and
NumPy arrays) during the stage; `rss_peak_growth_bytes` is how much the stage raised the process's peak
resident memory (`resource.getrusage().ru_maxrss`), which also sees native allocations such as torch CPU
tensors, but only when they exceed the process's earlier peak (0 otherwise; None where `resource` is
missing, e.g. Windows).
"""

from __future__ import annotations

import sys
import time
import tracemalloc
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Sequence

from ..audio.check import Thresholds, _jsonable
from . import checks
from .checks import ERROR, WARNING, StageFinding


@dataclass(frozen=True)
class StageTiming:
    """Wall time and peak memory of one stage run through `StageChecker.run` / `timed`."""

    stage: str
    wall_s: float
    py_peak_bytes: int | None
    rss_peak_growth_bytes: int | None
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "wall_s": self.wall_s, "py_peak_bytes": self.py_peak_bytes,
                "rss_peak_growth_bytes": self.rss_peak_growth_bytes, "error": self.error}


# Where each kind of stage sits in a TTS pipeline. Reports list stages in this order whatever the order the
# checks were called in; a stage of another name takes the place of the check it was run as, a plain
# intermediate (`tensor`) sits among the model's intermediates, just before the audio.
PIPELINE_ORDER = ("text", "phonemes", "ids", "durations", "latents", "mel", "tensor", "audio")


@dataclass(frozen=True)
class StageReport:
    """Findings and per-stage summaries (figures printed for every stage) in pipeline order, and timings in
    the order the stages ran. `first_bad_stage` is the earliest stage of the pipeline with an error."""

    findings: tuple[StageFinding, ...]
    summaries: dict[str, dict[str, Any]]
    timings: tuple[StageTiming, ...]
    stopped_after: str | None = None
    source: str | None = None

    @property
    def errors(self) -> list[StageFinding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def warnings(self) -> list[StageFinding]:
        return [f for f in self.findings if f.severity == WARNING]

    @property
    def status(self) -> str:
        return ERROR if self.errors else WARNING if self.warnings else "ok"

    @property
    def first_bad_stage(self) -> str | None:
        return self.errors[0].stage if self.errors else None

    def stage_findings(self, stage: str) -> list[StageFinding]:
        return [f for f in self.findings if f.stage == stage]

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "status": self.status, "first_bad_stage": self.first_bad_stage,
                "stopped_after": self.stopped_after, "findings": [f.to_dict() for f in self.findings],
                "stages": {k: {kk: _deep(vv) for kk, vv in v.items()} for k, v in self.summaries.items()},
                "timings": [t.to_dict() for t in self.timings]}


def _deep(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _deep(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_deep(x) for x in v]
    return _jsonable(v)


def _maxrss_bytes() -> int | None:
    try:
        import resource
    except ImportError:
        return None
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # bytes on macOS, KiB on Linux


class StageChecker:
    """Collects findings stage by stage. Every method returns the new findings of that stage.

    Args:
        vocab: symbol → id mapping of the model (phoneme and id checks use it).
        embedding_size: rows of the model's token embedding (a vocabulary needing more ids is a mismatch).
        unk_token / unk_id: the unknown symbol and its id, if the pipeline has one.
        mel_range: expected log-mel range (default about [-11.5, 0], seed 002); `mel_min_std` the least std
            (default: 1% of the range's width, `checks.MEL_MIN_STD_SHARE`).
        n_mels: expected mel bands (checked when given).
        max_duration_frames: a token longer than this is extreme; `duration_clamp` the predictor's bounds.
        sample_rate: of the audio stage; `audio_thresholds` the audio check's limits.
        track_python_memory: measure the Python-level peak with tracemalloc (slows Python-heavy stages a bit).
        order: the pipeline's stages in order, when it has stages other than `PIPELINE_ORDER`'s (say
            `("text", "phonemes", "ids", "encoder_out", "durations", ...)`); stage names and check names
            (`latents`, `tensor`, ...) both count. Reports follow this order, not the order of the calls.
    """

    def __init__(self, *, vocab: Mapping[str, int] | None = None, embedding_size: int | None = None,
                 unk_token: str = "<unk>", unk_id: int | None = None,
                 mel_range: tuple[float, float] = (-11.5, 0.0), mel_min_std: float | None = None,
                 n_mels: int | None = None,
                 max_duration_frames: float = 200, duration_clamp: tuple[float | None, float | None] | None = None,
                 sample_rate: float | None = None, audio_thresholds: Thresholds | None = None,
                 track_python_memory: bool = True, order: Sequence[str] = PIPELINE_ORDER):
        self.vocab = dict(vocab) if vocab is not None else None
        self.embedding_size = embedding_size
        self.unk_token, self.unk_id = unk_token, unk_id
        self.mel_range, self.mel_min_std, self.n_mels = mel_range, mel_min_std, n_mels
        self.max_duration_frames, self.duration_clamp = max_duration_frames, duration_clamp
        self.sample_rate, self.audio_thresholds = sample_rate, audio_thresholds
        self.track_python_memory = track_python_memory
        self.order = tuple(order)
        self._rank: dict[str, int] = {}
        self._findings: list[StageFinding] = []
        self._summaries: dict[str, dict[str, Any]] = {}
        self._timings: list[StageTiming] = []
        self._text: str | None = None
        self._symbols: int | None = None
        self._total_frames: float | None = None
        self.stopped_after: str | None = None

    # ---------------------------------------------------------------- recording
    def _place(self, stage: str, kind: str) -> None:
        """Give `stage` its place in the pipeline: its own name's, else its check's, else a plain tensor's."""
        if stage not in self._rank:
            self._rank[stage] = next((self.order.index(k) for k in (stage, kind, "tensor") if k in self.order),
                                     len(self.order))

    def _add(self, stage: str, result: tuple[list[StageFinding], dict[str, Any]], kind: str | None = None
             ) -> list[StageFinding]:
        findings, summary = result
        self._place(stage, kind or stage)
        for f in findings:
            self._place(f.stage, kind or f.stage)
        self._findings.extend(findings)
        self._summaries[stage] = {**self._summaries.get(stage, {}), **summary}
        return findings

    def add(self, stage: str, findings: Sequence[StageFinding], summary: Mapping[str, Any] | None = None, *,
            kind: str = "tensor") -> list[StageFinding]:
        """Record findings made elsewhere (e.g. from a recorded run's statistics) as stage `stage`, placed in
        the pipeline like a check of `kind`."""
        return self._add(stage, (list(findings), dict(summary or {})), kind)

    # ---------------------------------------------------------------- stages
    def text(self, text: str) -> list[StageFinding]:
        """Stage 0: the input text (empty text is an error)."""
        self._text = text
        return self._add("text", checks.check_text(text))

    def phonemes(self, phonemes: str | Sequence[str]) -> list[StageFinding]:
        """Stage 1: phoneme string or list; unknown symbols against `vocab`, `<unk>`, too few for the text."""
        self._symbols = len(checks.split_symbols(phonemes, self.vocab))
        return self._add("phonemes", checks.check_phonemes(phonemes, self.vocab, text=self._text,
                                                            unk_token=self.unk_token))

    def ids(self, ids: Any, *, expected_count: int | None = None) -> list[StageFinding]:
        """Stage 2: token ids; outside the vocabulary, vocabulary/embedding mismatch, `<unk>` ids.

        `expected_count` (ids expected for the phonemes; default: the number of phoneme symbols given to
        `phonemes()`, give or take two pad ids) flags symbols lost on the way."""
        if expected_count is None:
            expected_count = self._symbols
        return self._add("ids", checks.check_ids(ids, vocab=self.vocab, embedding_size=self.embedding_size,
                                                  unk_id=self.unk_id, expected_count=expected_count))

    def durations(self, durations: Any, *, log_durations: bool = False) -> list[StageFinding]:
        """Stage 3: frames per token; extreme, negative/zero, clamped or uniform durations."""
        result = checks.check_durations(durations, max_frames=self.max_duration_frames, clamp=self.duration_clamp,
                                        log_durations=log_durations)
        self._total_frames = result[1].get("total_frames")
        return self._add("durations", result)

    def mel(self, mel: Any) -> list[StageFinding]:
        """Stage 4: log-mel; NaN, out of `mel_range`, near-constant, band count, frames vs durations."""
        return self._add("mel", checks.check_mel(mel, mel_range=self.mel_range, min_std=self.mel_min_std,
                                                  n_mels=self.n_mels, expected_frames=self._total_frames))

    def latents(self, latents: Any, stage: str = "latents") -> list[StageFinding]:
        """Stage 4 (latent models): NaN, all zero, near-constant, exploding values."""
        return self._add(stage, checks.check_latents(latents, stage=stage), "latents")

    def audio(self, audio: Any, sample_rate: float | None = None) -> list[StageFinding]:
        """Stage 5: the audio health check (silence, NaN, absurd scale, clipping, noise, ...)."""
        sr = sample_rate or self.sample_rate
        if not sr:
            from ..errors import InputError

            raise InputError("the audio stage needs a sample rate (StageChecker(sample_rate=...) or audio(x, sr))")
        return self._add("audio", checks.check_audio(audio, sr, self.audio_thresholds))

    def tensor(self, name: str, value: Any) -> list[StageFinding]:
        """Any other intermediate: NaN/Inf is flagged, the range summarised."""
        return self._add(name, checks.check_tensor(name, value), "tensor")

    CHECKS = ("text", "phonemes", "ids", "durations", "mel", "latents", "audio")

    def check(self, stage: str, value: Any, **kwargs: Any) -> list[StageFinding]:
        """Dispatch to the check of a known stage name, else `tensor(stage, value)`."""
        if stage in self.CHECKS:
            return getattr(self, stage)(value, **kwargs)
        return self.tensor(stage, value)

    # ---------------------------------------------------------------- running stages
    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Measure wall time and peak memory of the block as `stage` (recorded even if the block raises)."""
        started_tracing = False
        if self.track_python_memory:
            started_tracing = not tracemalloc.is_tracing()
            if started_tracing:
                tracemalloc.start()
            tracemalloc.reset_peak()
        rss0, t0, err = _maxrss_bytes(), time.perf_counter(), None
        try:
            yield
        except BaseException as e:
            err = f"{type(e).__name__}: {e}"
            raise
        finally:
            wall = time.perf_counter() - t0
            py_peak = tracemalloc.get_traced_memory()[1] if self.track_python_memory else None
            if started_tracing:
                tracemalloc.stop()
            rss1 = _maxrss_bytes()
            growth = rss1 - rss0 if rss0 is not None and rss1 is not None else None
            self._timings.append(StageTiming(stage, wall, py_peak, growth, err))

    def run(self, stage: str, fn: Callable[..., Any], *args: Any, check_as: str | None = None,
            sample_rate: float | None = None, **kwargs: Any) -> Any:
        """Run `fn(*args, **kwargs)` as `stage`: time it, then check its output as `check_as` (default: the
        stage name when it is a known stage, else a generic tensor). An exception becomes an error finding
        and is re-raised."""
        try:
            with self.timed(stage):
                out = fn(*args, **kwargs)
        except Exception as e:
            self._add(stage, ([StageFinding(stage, "raised", ERROR, f"{stage} raised {type(e).__name__}: {e}")], {}),
                      check_as or stage)
            raise
        kind = check_as or stage
        if kind == "audio":
            self.audio(out, sample_rate)
        elif kind == "latents":
            self.latents(out, stage=stage)
        elif kind != "none":
            self.check(kind, out)
        return out

    def has_errors(self) -> bool:
        return any(f.severity == ERROR for f in self._findings)

    def stop(self, after: str) -> None:
        """Note that the pipeline stopped after `after` (later stages were not run)."""
        self.stopped_after = after

    def report(self, source: str | None = None) -> StageReport:
        """Findings and summaries in pipeline order (`order`); among stages of one place, the order of calls."""
        rank = {stage: (r, i) for i, (stage, r) in enumerate(self._rank.items())}
        findings = sorted(self._findings, key=lambda f: rank[f.stage])   # stable: a stage keeps its own order
        summaries = dict(sorted(self._summaries.items(), key=lambda kv: rank[kv[0]]))
        return StageReport(findings=tuple(findings), summaries=summaries, timings=tuple(self._timings),
                           stopped_after=self.stopped_after, source=source)
