"""Audio health check: is this waveform actually audio, or a silent failure?

`check(array, sample_rate)` measures a waveform and returns an `AudioReport` with one `Verdict` per check.
Every verdict carries its measured figure, the threshold it was compared with, and a severity used when it
fires (error or warning). Thresholds live in the frozen `Thresholds` dataclass; change any of them with
`dataclasses.replace` or `Thresholds.with_overrides({"silence_peak_dbfs": -50})`.

    >>> import numpy as np
    >>> from tensorprobe.audio import check
    >>> t = np.arange(16000) / 16000
    >>> check(0.5 * np.sin(2 * np.pi * 440 * t), 16000).status
    'ok'
    >>> check(np.zeros(16000), 16000).verdict("silence").message
    'silent: peak -240.0 dBFS is below -60 dBFS (digital zero)'

Checks, in report order (figure → verdict):

    length        samples / seconds       error when empty or shorter than min_speech_s (10 ms: too short to be
                                          speech), warning when shorter than min_duration_s
    sample_rate   Hz                      error when not a positive integer, warning outside [min, max]
    channels      channel count           error when the layout can't be read as audio, warning above max_channels
    non_finite    count of NaN/Inf        error above max_nonfinite (first index in details)
    scale         peak (float audio)      warning above 1.0 (full scale), error above absurd_peak (e.g. 1e9)
    silence       peak dBFS               error below silence_peak_dbfs; warning when only RMS is below silence_rms_dbfs
                                          (a peak below quiet_peak_dbfs is not an error: the report gets a `quiet` note)
    near_constant std / RMS, dB           error below near_constant_db (variation negligible against the channel's own
                                          level: a stuck value or a DC offset at any level), or when a channel's
                                          variation alone is below silence_peak_dbfs while the signal is not silent
    stuck         seconds                 error when a value is held for stuck_min_s or longer (at least
                                          stuck_level_db from the channel's peak: pauses at zero and clipping excluded)
    dc_offset     |mean| / peak (worst ch) warning above dc_offset (a share of the channel's own peak)
    clipping      share of clipped samples warning / error above clip_share_warning / clip_share_error
    clicks        count of clicks/pops    error above max_clicks: a sample jumps click_ratio times further from what
                                          the signal's recent course predicts than any sample nearby (times in details)
    noise_like    spectral flatness       error above noise_flatness (long-term spectrum flat like white noise)

Figures are computed on the finite samples; dBFS is relative to full scale 1.0 (integer PCM is scaled by
its type's maximum first) and floored at -240 dBFS, which means digital zero. Only `silence`, `scale` and
`clipping` look at absolute levels; the rules for a stuck, near-constant or offset signal compare a channel
with its own level, so the same audio played 40 dB quieter gets the same verdicts (and a `quiet` note).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from ..numbers import json_number
from ..errors import InputError

ERROR = "error"
WARNING = "warning"
OK = "ok"
SKIPPED = "skipped"
DB_FLOOR = -240.0

CHECK_NAMES = ("length", "sample_rate", "channels", "non_finite", "scale", "silence", "near_constant", "stuck",
               "dc_offset", "clipping", "clicks", "noise_like")
# Thresholds that no longer exist, and what replaced them (named in the error when one is overridden).
RETIRED_THRESHOLDS = {"near_constant_std": "near_constant_db (near-constant is judged against the signal's own "
                                           "level, in dB)"}


@dataclass(frozen=True)
class Thresholds:
    """Limits of the audio checks. All are documented in docs/guide-audio-tts.md; override any by name.

    Example:
        >>> Thresholds().with_overrides({"absurd_peak": 100}).absurd_peak
        100.0
    """

    min_duration_s: float = 0.05       # warning: shorter than this (empty is always an error)
    min_speech_s: float = 0.01         # error: shorter than this is too short to be speech (a phone lasts 30+ ms)
    min_sample_rate: float = 8000.0    # warning: sample rate outside [min_sample_rate, max_sample_rate]
    max_sample_rate: float = 192000.0
    max_channels: float = 2            # warning: more channels than this
    layout_max_channels: float = 16    # error: neither axis of a 2-D array is <= this (not a waveform)
    max_nonfinite: float = 0           # error: more NaN/Inf samples than this
    absurd_peak: float = 10.0          # error: float audio peak above this (seed 000 saw 1e9)
    full_scale: float = 1.0            # warning: float audio peak above this (it will clip when written)
    silence_peak_dbfs: float = -60.0   # error: peak below this is silence (0.001, seed 002)
    silence_rms_dbfs: float = -70.0    # warning: RMS below this while the peak is not (mostly silent)
    quiet_peak_dbfs: float = -40.0     # note (not an error): peak below this but above silence_peak_dbfs
    near_constant_db: float = -60.0    # error: a channel's std this far below its RMS (a stuck value or DC, any level)
    stuck_min_s: float = 0.01          # error: a value held this long (seconds) ...
    stuck_level_db: float = -20.0      # ... at a level of at least this, in dB of the channel's peak
    dc_offset: float = 0.05            # warning: |mean| of a channel above this share of its peak
    clip_level: float = 0.99           # a sample at or above this fraction of full scale may be clipped
    clip_min_run: float = 3            # ... and is counted when it sits in a flat run at least this long
    clip_share_warning: float = 0.001  # warning: share of clipped samples above this
    clip_share_error: float = 0.05     # error: share of clipped samples above this
    click_ratio: float = 4.0           # a click: a sample this many times further from its prediction than any nearby
    click_level_db: float = -40.0      # ... and at least this close to the channel's peak (dB)
    max_clicks: float = 0              # error: more clicks than this
    noise_flatness: float = 0.6        # error: spectral flatness of the long-term spectrum above this

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def with_overrides(self, overrides: Mapping[str, Any]) -> "Thresholds":
        """A copy with some thresholds changed; values may be strings ("-50", "1e9"). Unknown names raise."""
        changes = {}
        for name, value in overrides.items():
            if name in RETIRED_THRESHOLDS:
                raise InputError(f"threshold {name!r} was replaced by {RETIRED_THRESHOLDS[name]}")
            if name not in self.names():
                raise InputError(f"unknown threshold {name!r}; known thresholds: {', '.join(self.names())}")
            try:
                changes[name] = float(value)
            except (TypeError, ValueError):
                raise InputError(f"threshold {name}={value!r} is not a number") from None
            if math.isnan(changes[name]):
                raise InputError(f"threshold {name} can't be NaN")
        return dataclasses.replace(self, **changes)


def parse_threshold_options(options: list[str] | tuple[str, ...] | None) -> dict[str, str]:
    """Turn CLI `NAME=VALUE` strings into a dict (bad syntax raises `InputError`)."""
    out = {}
    for opt in options or ():
        name, sep, value = opt.partition("=")
        if not sep or not name.strip():
            raise InputError(f"--threshold expects NAME=VALUE, got {opt!r}")
        out[name.strip()] = value.strip()
    return out


@dataclass(frozen=True)
class Verdict:
    """One check's outcome: `status` is "ok", "skipped", or the check's severity when it fired."""

    check: str
    status: str
    figure: float | int | None
    unit: str
    threshold: float | None
    severity: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def fired(self) -> bool:
        return self.status in (ERROR, WARNING)

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "status": self.status, "severity": self.severity,
                "figure": _jsonable(self.figure), "unit": self.unit, "threshold": _jsonable(self.threshold),
                "message": self.message, "details": {k: _jsonable(v) for k, v in self.details.items()}}


@dataclass(frozen=True)
class AudioReport:
    """Health of one waveform: verdicts plus the basic figures. `status` is the worst verdict."""

    source: str
    sample_rate: float
    frames: int
    channels: int
    layout: str
    dtype: str
    is_float: bool
    verdicts: tuple[Verdict, ...]
    figures: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def duration_s(self) -> float:
        return self.frames / self.sample_rate if self.sample_rate > 0 else 0.0

    @property
    def errors(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.status == ERROR]

    @property
    def warnings(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.status == WARNING]

    @property
    def status(self) -> str:
        return ERROR if self.errors else WARNING if self.warnings else OK

    @property
    def ok(self) -> bool:
        return not self.errors

    def verdict(self, check: str) -> Verdict:
        for v in self.verdicts:
            if v.check == check:
                return v
        raise KeyError(check)

    def summary(self) -> str:
        fired = [f"{v.status}: {v.message}" for v in self.verdicts if v.fired]
        head = f"{self.source}: {self.status} ({self.frames} frames, {self.channels} ch, {self.sample_rate:g} Hz)"
        return "\n".join([head, *("  " + f for f in fired)])

    def with_notes(self, *notes: str) -> "AudioReport":
        return dataclasses.replace(self, notes=self.notes + tuple(notes))

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "status": self.status, "sample_rate": _jsonable(self.sample_rate),
                "frames": self.frames, "channels": self.channels, "duration_s": _jsonable(self.duration_s),
                "layout": self.layout, "dtype": self.dtype, "is_float": self.is_float,
                "figures": {k: _jsonable(v) for k, v in self.figures.items()},
                "verdicts": [v.to_dict() for v in self.verdicts], "notes": list(self.notes)}


_jsonable = json_number   # one JSON rule for numbers (tensorprobe.numbers)


def dbfs(x: float) -> float:
    """Amplitude (fraction of full scale) in dBFS, floored at -240 dBFS (digital zero)."""
    return max(DB_FLOOR, 20.0 * math.log10(x)) if x > 0 else DB_FLOOR


# ---------------------------------------------------------------------------------------------- layout

def to_frames(array: Any, layout_max_channels: float = 16) -> tuple[np.ndarray, str]:
    """Any waveform-like array (numpy, torch, list) as `(frames, channels)` plus a description of the layout.

    Leading/trailing singleton axes are dropped ([1, 1, N] from a decoder is mono). For 2-D input the short
    axis is the channel axis when it has at most `layout_max_channels` entries. Raises `InputError` when the
    array can't be read as a waveform.
    """
    x = _as_numpy(array)
    shape = x.shape
    squeezed = x.reshape([d for d in shape if d != 1]) if x.size > 0 else x.reshape(-1)
    if squeezed.ndim == 0:
        squeezed = squeezed.reshape(1)
    if squeezed.ndim == 1:
        return squeezed.reshape(-1, 1), f"mono, shape {list(shape)}"
    if squeezed.ndim != 2:
        raise InputError(f"audio must be 1-D (samples) or 2-D (frames × channels), got shape {list(shape)}")
    a, b = squeezed.shape
    if b <= layout_max_channels and b <= a:
        return squeezed, f"{b} channels as (frames, channels), shape {list(shape)}"
    if a <= layout_max_channels:
        return squeezed.T, f"{a} channels as (channels, frames), shape {list(shape)}"
    raise InputError(f"shape {list(shape)} is not a waveform: neither axis has <= {layout_max_channels:g} "
                     f"channels (a spectrogram or a batch?)")


def as_numeric_array(array: Any, what: str = "audio") -> np.ndarray:
    """NumPy view of a NumPy/torch/list value (torch converted at the edge); `InputError` unless numeric."""
    if hasattr(array, "detach") and hasattr(array, "cpu"):
        array = array.detach().cpu()
        if str(array.dtype) in ("torch.bfloat16", "torch.float16"):
            array = array.float()
        array = array.numpy()
    x = np.asarray(array)
    if x.dtype == object or not (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
        raise InputError(f"{what} must be a numeric array, got dtype {x.dtype}")
    return x


def _as_numpy(array: Any) -> np.ndarray:
    x = as_numeric_array(array, "audio")
    if np.iscomplexobj(x):
        raise InputError("audio must be real-valued, got a complex array")
    return x


def to_unit_scale(x: np.ndarray) -> tuple[np.ndarray, bool]:
    """Float64 samples where full scale is 1.0: integer PCM is divided by its type's maximum magnitude."""
    if np.issubdtype(x.dtype, np.floating):
        return x.astype(np.float64, copy=False), True
    if x.dtype == np.bool_:
        return x.astype(np.float64), False
    info = np.iinfo(x.dtype)
    if info.min == 0:  # unsigned PCM (8-bit WAV): midpoint is zero
        mid = (info.max + 1) / 2
        return (x.astype(np.float64) - mid) / mid, False
    return x.astype(np.float64) / float(-info.min), False


# ---------------------------------------------------------------------------------------------- checks

@dataclass(frozen=True)
class Encoding:
    """Full scale of a sample encoding at unit scale, on each polarity, and its step near full scale.

    Two's-complement PCM is asymmetric: 16-bit holds -32768 but only +32767, so its positive full scale is
    1 - 2⁻¹⁵ and +0.99 is written as 0.98999. Clipping is judged against each polarity's own full scale, less
    one step (the rounding of the write), so a signal clipped at ±0.99 counts the same as float or as PCM.
    """

    name: str
    positive: float
    negative: float
    step: float

    @classmethod
    def pcm(cls, bits: int, name: str | None = None) -> "Encoding":
        step = 2.0 ** -(bits - 1)
        return cls(name or f"PCM_{bits}", 1.0 - step, 1.0, step)

    @classmethod
    def of(cls, subtype: str | None, dtype: np.dtype | None = None) -> "Encoding | None":
        """The encoding of a libsndfile subtype (PCM_16, ULAW, ...) or of an integer dtype; None for float."""
        if subtype is not None and subtype.upper() in _COMPANDED:
            return _COMPANDED[subtype.upper()]
        bits = _PCM_BITS.get((subtype or "").upper())
        if bits:
            return cls.pcm(bits, subtype.upper())
        if dtype is not None and np.issubdtype(dtype, np.integer):
            return cls.pcm(np.iinfo(dtype).bits, str(dtype))
        return None

    def clip_levels(self, clip_level: float) -> tuple[float, float]:
        """(positive, negative) magnitudes from which a sample may be clipped."""
        return clip_level * self.positive - self.step, clip_level * self.negative - self.step


_PCM_BITS = {"PCM_S8": 8, "PCM_U8": 8, "PCM_16": 16, "PCM_24": 24, "PCM_32": 32}
# µ-law and A-law (G.711) decode to at most 32124/32768 and 32256/32768, in steps of 1024/32768 there.
_COMPANDED = {"ULAW": Encoding("ULAW", 32124 / 32768, 32124 / 32768, 1024 / 32768),
              "ALAW": Encoding("ALAW", 32256 / 32768, 32256 / 32768, 1024 / 32768)}


@dataclass(frozen=True)
class _Signal:
    """What the checks share: samples at unit scale as (frames, channels), a finite mask, and the encoding
    (None for float audio, or integer-valued audio whose encoding is not known)."""

    x: np.ndarray
    finite: np.ndarray
    sample_rate: float
    is_float: bool
    encoding: Encoding | None = None

    def clip_levels(self, t: "Thresholds") -> tuple[float, float]:
        """(positive, negative) magnitudes at or beyond which a sample may be clipped."""
        if self.encoding is None or self.is_float:
            level = t.clip_level * t.full_scale if self.is_float else t.clip_level
            return level, level
        return self.encoding.clip_levels(t.clip_level)

    @property
    def frames(self) -> int:
        return int(self.x.shape[0])

    def finite_values(self) -> np.ndarray:
        return self.x[self.finite]

    def channel_values(self) -> list[np.ndarray]:
        return [self.x[self.finite[:, c], c] for c in range(self.x.shape[1])]


def _verdict(check: str, fired_as: str | None, figure: Any, unit: str, threshold: Any, severity: str,
             message: str, **details: Any) -> Verdict:
    return Verdict(check=check, status=fired_as or OK, figure=figure, unit=unit, threshold=threshold,
                   severity=severity, message=message, details=details)


def _skipped(check: str, severity: str, unit: str, why: str) -> Verdict:
    return Verdict(check=check, status=SKIPPED, figure=None, unit=unit, threshold=None, severity=severity,
                   message=f"skipped: {why}")


def check_length(s: _Signal, t: Thresholds) -> Verdict:
    n = s.frames
    seconds = n / s.sample_rate if s.sample_rate > 0 else 0.0
    if n == 0:
        return _verdict("length", ERROR, 0, "frames", 0, ERROR, "empty: the audio has no samples", seconds=0.0)
    if 0 < s.sample_rate < math.inf and seconds < t.min_speech_s:
        # A decoder that returns a handful of samples (a 40-sample output at 24 kHz, 1.7 ms) has failed, not
        # spoken briefly: the shortest phone lasts tens of milliseconds. (An invalid rate is its own error.)
        return _verdict("length", ERROR, n, "frames", t.min_speech_s, ERROR,
                        f"too short to be speech: {n} frames, {seconds * 1000:.2f} ms at {s.sample_rate:g} Hz, "
                        f"is under {t.min_speech_s * 1000:g} ms", seconds=seconds)
    if s.sample_rate > 0 and seconds < t.min_duration_s:
        return _verdict("length", WARNING, n, "frames", t.min_duration_s, ERROR,
                        f"too short: {seconds * 1000:.1f} ms is under {t.min_duration_s * 1000:.0f} ms",
                        seconds=seconds)
    return _verdict("length", None, n, "frames", t.min_duration_s, ERROR, f"{n} frames ({seconds:.3f} s)",
                    seconds=seconds)


def check_sample_rate(s: _Signal, t: Thresholds) -> Verdict:
    sr = s.sample_rate
    if not math.isfinite(sr) or sr <= 0 or sr != int(sr):
        return _verdict("sample_rate", ERROR, sr, "Hz", None, ERROR, f"invalid sample rate {sr!r}")
    if not t.min_sample_rate <= sr <= t.max_sample_rate:
        return _verdict("sample_rate", WARNING, sr, "Hz", t.min_sample_rate, WARNING,
                        f"unusual sample rate {sr:g} Hz (expected {t.min_sample_rate:g}–{t.max_sample_rate:g} Hz)")
    return _verdict("sample_rate", None, sr, "Hz", t.min_sample_rate, WARNING, f"{sr:g} Hz")


def check_channels(s: _Signal, t: Thresholds, layout: str) -> Verdict:
    c = int(s.x.shape[1])
    if c > t.max_channels:
        return _verdict("channels", WARNING, c, "channels", t.max_channels, WARNING,
                        f"{c} channels (more than {t.max_channels:g}): is the layout transposed? {layout}",
                        layout=layout)
    return _verdict("channels", None, c, "channels", t.max_channels, WARNING, layout, layout=layout)


def check_non_finite(s: _Signal, t: Thresholds) -> Verdict:
    bad = ~s.finite
    count = int(bad.sum())
    if count > t.max_nonfinite:
        frame, channel = (int(i) for i in np.argwhere(bad)[0])
        nan = int(np.isnan(s.x).sum())
        return _verdict("non_finite", ERROR, count, "samples", t.max_nonfinite, ERROR,
                        f"{count} non-finite samples ({nan} NaN, {count - nan} Inf) of {s.x.size}; "
                        f"first at frame {frame}, channel {channel}",
                        first_frame=frame, first_channel=channel, nan=nan, inf=count - nan,
                        share=count / s.x.size)
    return _verdict("non_finite", None, count, "samples", t.max_nonfinite, ERROR, "all samples finite")


def check_scale(s: _Signal, t: Thresholds) -> Verdict:
    if not s.is_float:
        return _skipped("scale", ERROR, "peak", "integer PCM can't exceed full scale")
    peak = float(np.abs(s.finite_values()).max())
    if peak > t.absurd_peak:
        return _verdict("scale", ERROR, peak, "peak", t.absurd_peak, ERROR,
                        f"absurd scale: float peak {peak:.4g} is above {t.absurd_peak:g} (full scale is 1.0)")
    if peak > t.full_scale:
        return _verdict("scale", WARNING, peak, "peak", t.full_scale, ERROR,
                        f"float peak {peak:.4g} is above full scale {t.full_scale:g}: it clips when written as PCM")
    return _verdict("scale", None, peak, "peak", t.absurd_peak, ERROR, f"peak {peak:.4g}")


def _levels(s: _Signal) -> tuple[float, float]:
    v = s.finite_values()
    return float(np.abs(v).max()), float(np.sqrt(np.mean(np.square(v))))


def check_silence(s: _Signal, t: Thresholds) -> Verdict:
    peak, rms = _levels(s)
    peak_db, rms_db = dbfs(peak), dbfs(rms)
    quiet = t.silence_peak_dbfs <= peak_db < t.quiet_peak_dbfs
    details = {"peak": peak, "rms": rms, "rms_dbfs": rms_db, "quiet": quiet}
    if peak_db < t.silence_peak_dbfs:
        zero = " (digital zero)" if peak == 0 else ""
        return _verdict("silence", ERROR, peak_db, "dBFS", t.silence_peak_dbfs, ERROR,
                        f"silent: peak {peak_db:.1f} dBFS is below {t.silence_peak_dbfs:g} dBFS{zero}", **details)
    if rms_db < t.silence_rms_dbfs:
        return _verdict("silence", WARNING, peak_db, "dBFS", t.silence_rms_dbfs, ERROR,
                        f"mostly silent: RMS {rms_db:.1f} dBFS is below {t.silence_rms_dbfs:g} dBFS "
                        f"(peak {peak_db:.1f} dBFS)", **details)
    level = f"peak {peak_db:.1f} dBFS, RMS {rms_db:.1f} dBFS"
    return _verdict("silence", None, peak_db, "dBFS", t.silence_peak_dbfs, ERROR,
                    f"quiet: {level} (below {t.quiet_peak_dbfs:g} dBFS, not silent)" if quiet else level, **details)


def quiet_note(s: _Signal, t: Thresholds, beside_errors: bool = False) -> str | None:
    """The `quiet` note of a signal whose peak is below `quiet_peak_dbfs` but not silent, else None.

    Beside error verdicts it says that they are not about the level (a quiet signal fails no check for being
    quiet: the same audio louder gets the same errors), rather than "not an error" under an ERROR headline."""
    peak, rms = _levels(s)
    if not t.silence_peak_dbfs <= dbfs(peak) < t.quiet_peak_dbfs:
        return None
    level = f"quiet: peak {dbfs(peak):.1f} dBFS, RMS {dbfs(rms):.1f} dBFS (below {t.quiet_peak_dbfs:g} dBFS)"
    if beside_errors:
        return f"{level}; the level alone is not an error, and the errors above do not come from it: the same " \
               f"audio louder gets them too"
    return f"{level}; not an error: the stuck and near-constant checks judge it against its own level"


def is_silent(s: _Signal, t: Thresholds) -> bool:
    return dbfs(_levels(s)[0]) < t.silence_peak_dbfs


@dataclass(frozen=True)
class _ChannelLevel:
    """One channel's level and variation, measured on samples divided by their peak (no overflow at 1e300)."""

    channel: int
    peak: float
    mean: float
    std: float
    rms: float
    ac_peak: float   # largest |x - mean|: the level of the channel's variation

    @property
    def dc_share(self) -> float:
        """|mean| as a share of the peak: 0 for audio centred on zero, 1 for a constant."""
        return abs(self.mean) / self.peak if self.peak > 0 else 0.0

    @property
    def variation_db(self) -> float:
        """std against RMS in dB: 0 dB for audio centred on zero, -inf (floored) for a constant."""
        return dbfs(self.std / self.rms) if self.rms > 0 else DB_FLOOR


def _channel_levels(s: _Signal) -> list[_ChannelLevel]:
    out = []
    for c, v in enumerate(s.channel_values()):
        if not v.size:   # a channel with no finite sample: the non_finite check reports it
            continue
        peak = float(np.abs(v).max())
        if peak == 0:
            out.append(_ChannelLevel(c, 0.0, 0.0, 0.0, 0.0, 0.0))
            continue
        u = v / peak
        mean = float(np.mean(u))
        out.append(_ChannelLevel(c, peak, mean * peak, float(np.std(u)) * peak,
                                 float(np.sqrt(np.mean(u * u))) * peak, float(np.abs(u - mean).max()) * peak))
    return out


def _near_constant_reason(ch: _ChannelLevel, t: Thresholds) -> str | None:
    """Why this channel is near-constant, or None. Relative: its variation is negligible against its own level
    (a stuck value or a DC offset, at any level). Absolute only where silence is: a channel whose variation
    alone would be silent while the signal is not (a dead channel, or silence riding on a larger DC offset)."""
    if ch.rms == 0:
        return f"channel {ch.channel} is digital zero while the signal is not silent (a dead channel)"
    if ch.variation_db < t.near_constant_db:
        return (f"channel {ch.channel} is stuck near {ch.mean:.4g}: its std {ch.std:.3g} is "
                f"{-ch.variation_db:.0f} dB below its level (RMS {ch.rms:.3g}; limit {-t.near_constant_db:g} dB)")
    if dbfs(ch.ac_peak) < t.silence_peak_dbfs and abs(ch.mean) > ch.ac_peak:
        return (f"channel {ch.channel} is silent apart from a constant {ch.mean:.4g}: its variation peaks at "
                f"{dbfs(ch.ac_peak):.1f} dBFS (below {t.silence_peak_dbfs:g} dBFS)")
    return None


def _near_constant_channels(s: _Signal, t: Thresholds) -> list[tuple[_ChannelLevel, str]]:
    return [(ch, why) for ch in _channel_levels(s) if (why := _near_constant_reason(ch, t))]


def check_near_constant(s: _Signal, t: Thresholds) -> Verdict:
    bad = _near_constant_channels(s, t)
    worst = bad[0][0] if bad else min(_channel_levels(s), key=lambda ch: ch.variation_db)
    details = {"channel": worst.channel, "value": worst.mean, "std": worst.std, "rms": worst.rms,
               "variation_peak": worst.ac_peak, "variation_peak_dbfs": dbfs(worst.ac_peak)}
    figure = worst.variation_db
    if is_silent(s, t):
        return _verdict("near_constant", None, figure, "dB", t.near_constant_db, ERROR,
                        "silent (reported by the silence check)", **details)
    if bad:
        more = f" (and {len(bad) - 1} more channels)" if len(bad) > 1 else ""
        return _verdict("near_constant", ERROR, figure, "dB", t.near_constant_db, ERROR,
                        f"near-constant: {bad[0][1]}{more}", **details)
    return _verdict("near_constant", None, figure, "dB", t.near_constant_db, ERROR,
                    f"std {abs(figure):.1f} dB below RMS (channel {worst.channel})", **details)


def _held_runs(v: np.ndarray, t: Thresholds, clip_levels: tuple[float, float]) -> tuple[int, int]:
    """(longest run of one held value, its start) among samples at least `stuck_level_db` from the channel's
    peak: a run of zeros (or near-zeros) is a pause, not a stuck output, and samples at the clip level are left to
    the clipping check. Not measured from the mean: an output frozen for most of its length drags the mean
    to the held value."""
    peak = float(np.abs(v).max()) if v.size else 0.0
    if v.size < 2 or peak == 0:
        return 0, 0
    tolerance = 1e-6 * peak   # below one LSB of 16-bit PCM: integer audio must repeat exactly
    away = (np.abs(v) >= 10 ** (t.stuck_level_db / 20) * peak) & ~_at_clip_level(v, clip_levels)
    held = away[1:] & away[:-1] & (np.abs(np.diff(v)) <= tolerance)
    if not held.any():
        return 0, 0
    edges = np.diff(np.concatenate(([0], held.astype(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    k = int(np.argmax(ends - starts))
    return int(ends[k] - starts[k] + 1), int(starts[k])   # k held pairs span k + 1 samples


def check_stuck(s: _Signal, t: Thresholds) -> Verdict:
    if is_silent(s, t):
        return _skipped("stuck", ERROR, "s", "silent")
    if _near_constant_channels(s, t):
        return _verdict("stuck", None, None, "s", t.stuck_min_s, ERROR,
                        "near-constant (reported by the near_constant check)")
    if s.sample_rate <= 0 or not math.isfinite(s.sample_rate):
        return _skipped("stuck", ERROR, "s", "no valid sample rate")
    levels = s.clip_levels(t)
    values = s.channel_values()
    runs = [(*_held_runs(v, t, levels), c) for c, v in enumerate(values)]
    frames, start, channel = max(runs, key=lambda r: r[0])
    seconds = frames / s.sample_rate
    value = float(values[channel][start]) if frames else None
    details = {"channel": channel, "frames": frames, "start_frame": start, "value": value}
    if seconds >= t.stuck_min_s:
        return _verdict("stuck", ERROR, seconds, "s", t.stuck_min_s, ERROR,
                        f"stuck: channel {channel} holds {value:.6g} for {frames} samples ({seconds * 1000:.1f} ms) "
                        f"from frame {start}", **details)
    return _verdict("stuck", None, seconds, "s", t.stuck_min_s, ERROR,
                    f"longest held value {frames} samples ({seconds * 1000:.2f} ms)", **details)


def check_dc_offset(s: _Signal, t: Thresholds) -> Verdict:
    ch = max(_channel_levels(s), key=lambda c: c.dc_share)
    share = ch.dc_share
    details = {"channel": ch.channel, "mean": ch.mean}
    if is_silent(s, t):
        return _verdict("dc_offset", None, share, "|mean|/peak", t.dc_offset, WARNING,
                        "silent (reported by the silence check)", **details)
    if share > t.dc_offset:
        return _verdict("dc_offset", WARNING, share, "|mean|/peak", t.dc_offset, WARNING,
                        f"DC offset: channel {ch.channel} has mean {ch.mean:+.4g}, {share:.1%} of its peak "
                        f"(> {t.dc_offset:.0%})", **details)
    return _verdict("dc_offset", None, share, "|mean|/peak", t.dc_offset, WARNING,
                    f"|mean| {abs(ch.mean):.3g}, {share:.2%} of the peak", **details)


def _at_clip_level(v: np.ndarray, levels: tuple[float, float]) -> np.ndarray:
    positive, negative = levels
    return (v >= positive) | (v <= -negative)


def _clipped_runs(v: np.ndarray, levels: tuple[float, float], min_run: int) -> tuple[int, int, int]:
    """(clipped samples, longest flat run, samples at/above the clip level) for one channel's samples."""
    over = _at_clip_level(v, levels)
    if v.size == 0 or not over.any():
        return 0, 0, 0
    flat = over[1:] & over[:-1] & (np.abs(np.diff(v)) <= 1e-6)
    edges = np.diff(np.concatenate(([0], flat.astype(np.int8), [0])))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    runs = ends - starts + 1  # a run of k flat pairs spans k + 1 samples
    longest = int(runs.max()) if runs.size else 1
    clipped = int(runs[runs >= min_run].sum())
    return clipped, longest, int(over.sum())


def check_clipping(s: _Signal, t: Thresholds) -> Verdict:
    levels = s.clip_levels(t)
    per_channel = [_clipped_runs(v, levels, max(1, int(t.clip_min_run))) for v in s.channel_values()]
    clipped = sum(p[0] for p in per_channel)
    longest = max(p[1] for p in per_channel)
    near = sum(p[2] for p in per_channel)
    total = max(1, int(s.finite.sum()))
    share = clipped / total
    details = {"clipped_samples": clipped, "longest_run": longest, "near_full_scale_share": near / total,
               "levels": list(levels), "encoding": s.encoding.name if s.encoding and not s.is_float else
               ("float" if s.is_float else None)}
    msg = (f"{share:.2%} of samples clipped ({clipped} in flat runs at full scale, longest run {longest})")
    if share > t.clip_share_error:
        return _verdict("clipping", ERROR, share, "share", t.clip_share_error, ERROR, "clipped: " + msg, **details)
    if share > t.clip_share_warning:
        return _verdict("clipping", WARNING, share, "share", t.clip_share_warning, ERROR, "clipping: " + msg,
                        **details)
    return _verdict("clipping", None, share, "share", t.clip_share_warning, ERROR, msg, **details)


def check_clicks(s: _Signal, t: Thresholds) -> Verdict:
    if is_silent(s, t):
        return _skipped("clicks", ERROR, "clicks", "silent")
    if _near_constant_channels(s, t):
        return _skipped("clicks", ERROR, "clicks", "near-constant (reported by the near_constant check)")
    if s.sample_rate <= 0 or not math.isfinite(s.sample_rate):
        return _skipped("clicks", ERROR, "clicks", "no valid sample rate")
    if not s.finite.all():   # leaving them out would join samples that were apart: a jump of our own making
        return _skipped("clicks", ERROR, "clicks", "non-finite samples (reported by the non_finite check)")
    from .events import clicks

    step = s.encoding.step if s.encoding is not None and not s.is_float else 0.0
    found = sorted((k for c, v in enumerate(s.channel_values())
                    for k in clicks(v, s.sample_rate, ratio=t.click_ratio, level_db=t.click_level_db, step=step,
                                    channel=c)), key=lambda k: (k.frame, k.channel))
    details = {"clicks": [k.to_dict() for k in found[:MAX_LISTED_CLICKS]]}
    if len(found) > t.max_clicks:
        more = f"; then at t = {', '.join(f'{k.time_s:.3f}' for k in found[1:6])} s" if len(found) > 1 else ""
        return _verdict("clicks", ERROR, len(found), "clicks", t.max_clicks, ERROR,
                        f"{len(found)} click{'s' if len(found) > 1 else ''}/pop{'s' if len(found) > 1 else ''}: "
                        f"the first at {found[0].describe()}{more}", **details)
    return _verdict("clicks", None, 0, "clicks", t.max_clicks, ERROR, "no clicks", **details)


MAX_LISTED_CLICKS = 20   # the details list the first clicks; the figure counts them all


def spectral_flatness(mono: np.ndarray, sample_rate: float) -> float:
    """Flatness (geometric / arithmetic mean, DC excluded) of the Welch long-term power spectrum: ~1 for white noise."""
    n = mono.size
    nperseg = int(min(1024, max(64, 2 ** int(math.floor(math.log2(max(n // 8, 1)))))))
    p = welch_psd(mono, sample_rate if sample_rate > 0 else 1.0, min(nperseg, n))[1:]
    if p.size == 0 or not np.isfinite(p).all() or p.max() <= 0:
        return 0.0
    p = p + p.max() * 1e-12
    return float(np.exp(np.mean(np.log(p))) / np.mean(p))


def welch_psd(x: np.ndarray, fs: float, nperseg: int) -> np.ndarray:
    """Welch's one-sided power spectral density, exactly as `scipy.signal.welch(x, fs, nperseg=nperseg)` gives it
    (periodic Hann window, half overlap, per-segment mean removed, density scaling).

    Written with NumPy's FFT because `import scipy.signal` alone takes ~1.6 s on a 2-core machine, and
    `audio check` runs in CI loops; `tests/audio` checks it against SciPy.
    """
    step = nperseg - nperseg // 2
    win = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(nperseg) / nperseg)
    segs = np.lib.stride_tricks.sliding_window_view(np.asarray(x, dtype=np.float64), nperseg)[::step]
    segs = segs - segs.mean(axis=1, keepdims=True)
    p = np.abs(np.fft.rfft(segs * win, axis=1)) ** 2
    p[:, 1:] *= 2.0
    if nperseg % 2 == 0:
        p[:, -1] /= 2.0   # the Nyquist bin has no negative-frequency twin
    return p.mean(axis=0) / (fs * float((win * win).sum()))


def check_noise_like(s: _Signal, t: Thresholds) -> Verdict:
    if s.frames < 256:
        return _skipped("noise_like", ERROR, "flatness", "fewer than 256 frames")
    if is_silent(s, t):
        return _skipped("noise_like", ERROR, "flatness", "silent")
    if len(_near_constant_channels(s, t)) == s.x.shape[1]:   # the spectrum of a stuck value's residue says nothing
        return _skipped("noise_like", ERROR, "flatness", "near-constant (reported by the near_constant check)")
    mono = np.where(s.finite, s.x, 0.0).mean(axis=1)
    mono = mono / max(float(np.abs(mono).max()), 1e-300)  # scale-free, and safe for 1e300 audio
    flat = spectral_flatness(mono, s.sample_rate)
    if flat > t.noise_flatness:
        return _verdict("noise_like", ERROR, flat, "flatness", t.noise_flatness, ERROR,
                        f"noise-like: spectral flatness {flat:.2f} (> {t.noise_flatness:g}) — a flat spectrum "
                        f"like white noise, not speech or music")
    return _verdict("noise_like", None, flat, "flatness", t.noise_flatness, ERROR, f"spectral flatness {flat:.2f}")


_SIGNAL_CHECKS = (check_scale, check_silence, check_near_constant, check_stuck, check_dc_offset, check_clipping,
                  check_clicks, check_noise_like)
_SEVERITY = {"scale": ERROR, "silence": ERROR, "near_constant": ERROR, "stuck": ERROR, "dc_offset": WARNING,
             "clipping": ERROR, "clicks": ERROR, "noise_like": ERROR}
_UNITS = {"scale": "peak", "silence": "dBFS", "near_constant": "dB", "stuck": "s", "dc_offset": "|mean|/peak",
          "clipping": "share", "clicks": "clicks", "noise_like": "flatness"}


def check(array: Any, sample_rate: float, thresholds: Thresholds | None = None, *, source: str = "<array>",
          is_float: bool | None = None, encoding: str | None = None) -> AudioReport:
    """Check one waveform and return an `AudioReport` (never raises on odd values; only on non-numeric input).

    Args:
        array: samples, 1-D or 2-D ((frames, channels) or (channels, frames); the short axis is channels),
            numpy or torch. Integer arrays are PCM (scaled by their type's maximum); float arrays are
            taken at face value, so a decoder output at 1e9 is reported as 1e9.
        sample_rate: in Hz.
        thresholds: limits of the checks (`Thresholds()` by default).
        source: a name for the report (a file path).
        is_float: override whether the data is float audio (the `scale` check runs only on float audio).
        encoding: the libsndfile subtype the samples were read from or will be written as ("PCM_16", "ULAW",
            ...): clipping is judged at that encoding's full scale on each polarity. Integer arrays carry it
            in their dtype.

    Returns:
        `AudioReport`; `.status` is "error", "warning" or "ok", `.verdict(name)` gives one check.

    Example:
        >>> import numpy as np
        >>> r = check(np.full(8000, np.nan), 16000)
        >>> r.status, r.verdict("non_finite").figure
        ('error', 8000)
    """
    t = thresholds or Thresholds()
    raw = _as_numpy(array)
    try:
        sr = float(sample_rate)
    except (TypeError, ValueError):
        raise InputError(f"sample rate must be a number, got {sample_rate!r}") from None
    try:
        frames, layout = to_frames(raw, t.layout_max_channels)
    except InputError as e:
        return _layout_failure(raw, sr, str(e), source, t)
    x, float_data = to_unit_scale(frames)
    s = _Signal(x=x, finite=np.isfinite(x), sample_rate=sr, is_float=float_data if is_float is None else is_float,
                encoding=Encoding.of(encoding, raw.dtype))
    verdicts = [check_length(s, t), check_sample_rate(s, t), check_channels(s, t, layout)]
    verdicts += _signal_verdicts(s, t)
    note = quiet_note(s, t, any(v.status == ERROR for v in verdicts)) if s.finite.any() else None
    return AudioReport(source=source, sample_rate=sr, frames=s.frames, channels=int(x.shape[1]), layout=layout,
                       dtype=str(raw.dtype), is_float=s.is_float, verdicts=tuple(verdicts), figures=_figures(s),
                       notes=(note,) if note else ())


def _signal_verdicts(s: _Signal, t: Thresholds) -> list[Verdict]:
    if s.frames == 0:
        return [_skipped("non_finite", ERROR, "samples", "empty")] + [
            _skipped(f.__name__[6:], _SEVERITY[f.__name__[6:]], _UNITS[f.__name__[6:]], "empty")
            for f in _SIGNAL_CHECKS]
    out = [check_non_finite(s, t)]
    if not s.finite.any():
        return out + [_skipped(f.__name__[6:], _SEVERITY[f.__name__[6:]], _UNITS[f.__name__[6:]],
                               "no finite samples") for f in _SIGNAL_CHECKS]
    with np.errstate(over="ignore", invalid="ignore"):
        return out + [f(s, t) for f in _SIGNAL_CHECKS]


def _figures(s: _Signal) -> dict[str, Any]:
    v = s.finite_values()
    if v.size == 0:
        return {"finite_samples": 0}
    with np.errstate(over="ignore", invalid="ignore"):
        peak = float(np.abs(v).max())
        rms = float(np.sqrt(np.mean(np.square(v))))
        return {"finite_samples": int(v.size), "min": float(v.min()), "max": float(v.max()),
                "mean": float(np.mean(v)), "std": float(np.std(v)), "peak": peak, "rms": rms,
                "peak_dbfs": dbfs(peak), "rms_dbfs": dbfs(rms)}


def _layout_failure(raw: np.ndarray, sr: float, why: str, source: str, t: Thresholds) -> AudioReport:
    v = Verdict(check="channels", status=ERROR, figure=None, unit="channels", threshold=t.layout_max_channels,
                severity=ERROR, message=why, details={"shape": list(raw.shape)})
    verdicts = tuple(v if name == "channels" else _skipped(name, ERROR, "", "the array is not a waveform")
                     for name in CHECK_NAMES)
    return AudioReport(source=source, sample_rate=sr, frames=0, channels=0, layout=f"shape {list(raw.shape)}",
                       dtype=str(raw.dtype), is_float=bool(np.issubdtype(raw.dtype, np.floating)),
                       verdicts=verdicts)
