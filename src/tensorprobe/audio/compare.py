"""Compare a candidate audio with its reference the way ears would: magnitude first, phase second.

`diff(ref, cand, sample_rate)` aligns the two (bounded FFT cross-correlation), then measures waveform
correlation before and after alignment, SNR, level and length differences, the log-mel spectrogram
difference in dB (mean, median, max, worst band, worst time-frequency region) and a multi-resolution STFT
distance. STFTs come from `scipy.signal.stft`, mel filterbanks from `librosa.filters.mel`.

Three things make a difference whatever the figures say: non-finite samples (NaN/Inf) on either side (the
figures are then taken with them set to 0, the SNR is -inf and the correlations are not given), a length
difference above `length_tolerance_s` (20 ms; both durations are reported), and a side with no samples.

Short events are judged a few milliseconds at a time as well (`tensorprobe.audio.events`): a 5 ms burst, a pulse
or a one-sample dropout in otherwise matching audio is `differs`, with its time, whatever the whole-file figures
say. Channel layouts are compared too: a stereo file is never `identical` to a mono one.

The verdict is not fooled by phase. A vocoder whose sine source drifts in phase can give a waveform
correlation near zero while its spectrogram matches and it sounds the same: that is "magnitude matches,
phase differs" (status ok). Waveforms that correlate while one band of the spectrogram is off is a real
difference (status finding).

    >>> import numpy as np
    >>> from tensorprobe.audio import diff
    >>> t = np.arange(24000) / 24000
    >>> ref = 0.5 * np.sin(2 * np.pi * 220 * t)
    >>> d = diff(ref, 0.5 * np.sin(2 * np.pi * 220 * t + 2 * np.pi * 3 * t), 24000)
    >>> d.verdict
    'phase_differs'
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError
from .check import _jsonable, to_frames, to_unit_scale
from .events import LocalDifference, local_differences, merge_events, spectral_frame_events

VERDICT_LABELS = {
    "identical": "identical",
    "match": "match: waveform and spectrogram agree",
    "phase_differs": "magnitude matches, phase differs",
    "differs": "differs",
}
MRSTFT_RESOLUTIONS = ((512, 128), (1024, 256), (2048, 512))
TOP_DB = 80.0  # the log-mel floor sits this far below the reference's loudest bin


@dataclass(frozen=True)
class DiffThresholds:
    """Limits of the diff verdict (docs/guide-audio-tts.md, "audio diff").

    Example:
        >>> DiffThresholds(wave_corr=0.9).wave_corr
        0.9
    """

    wave_corr: float = 0.95       # waveforms match when the aligned correlation is at least this
    mel_mean_db: float = 1.0      # magnitudes match when the mean |log-mel difference| is at most this ...
    mel_band_db: float = 3.0      # ... and no band (8 mel groups) has its energy off by more than this on average ...
    mel_region_db: float = 12.0   # ... and no time-frequency region is off by more than this on average
    length_tolerance_s: float = 0.02  # lengths differing by more than this (seconds) differ, whatever the overlap
    align_min_corr: float = 0.5   # a lag is used only if the aligned |correlation| reaches this (else lag 0)
    # Local differences, judged 5 ms at a time (tensorprobe.audio.events): the difference peaks no more than
    # event_snr_db below the reference's RMS there, event_margin_db below how closely the two agree elsewhere
    # (median over the file), and no lower than event_level_db under the reference's loud level.
    event_snr_db: float = 10.0
    event_margin_db: float = 20.0
    event_level_db: float = -40.0
    mel_frame_db: float = 10.0    # ... or one log-mel frame differs by more than this on average over its bands


@dataclass(frozen=True)
class _Arrays:
    """Data behind the figures, kept for the HTML page (not part of `to_dict`)."""

    ref: np.ndarray
    cand: np.ndarray
    ref_db: np.ndarray
    cand_db: np.ndarray
    hop: int
    mel_hz: np.ndarray


@dataclass(frozen=True)
class AudioDiff:
    """Result of `diff`. `verdict` is identical | match | phase_differs | differs; `status` ok | finding."""

    sample_rate: float
    ref_frames: int
    cand_frames: int
    lag_frames: int
    corr_before: float | None
    corr_after: float | None
    snr_db: float | None
    level_db: float | None
    mel: dict[str, Any]
    mrstft: dict[str, Any]
    verdict: str
    reasons: tuple[str, ...]
    notes: tuple[str, ...] = ()
    names: tuple[str, str] = ("reference", "candidate")
    non_finite: tuple["NonFinite | None", "NonFinite | None"] = (None, None)
    events: tuple[LocalDifference, ...] = ()
    channels: tuple[int, int] = (1, 1)
    arrays: _Arrays | None = field(default=None, repr=False, compare=False)

    @property
    def label(self) -> str:
        return VERDICT_LABELS[self.verdict]

    @property
    def status(self) -> str:
        return "finding" if self.verdict == "differs" else "ok"

    @property
    def lag_s(self) -> float:
        return self.lag_frames / self.sample_rate

    @property
    def length_diff_frames(self) -> int:
        return self.cand_frames - self.ref_frames

    def summary(self) -> str:
        return f"{self.label}" + "".join(f"\n  {r}" for r in self.reasons)

    def to_dict(self) -> dict[str, Any]:
        return {"reference": self.names[0], "candidate": self.names[1], "verdict": self.verdict,
                "label": self.label, "status": self.status, "reasons": list(self.reasons),
                "sample_rate": _jsonable(self.sample_rate), "ref_frames": self.ref_frames,
                "cand_frames": self.cand_frames, "length_diff_frames": self.length_diff_frames,
                "length_diff_s": _jsonable(self.length_diff_frames / self.sample_rate),
                "lag_frames": self.lag_frames, "lag_s": _jsonable(self.lag_s),
                "corr_before": _jsonable(self.corr_before), "corr_after": _jsonable(self.corr_after),
                "snr_db": _jsonable(self.snr_db), "level_db": _jsonable(self.level_db),
                "mel": _deep_json(self.mel), "mrstft": _deep_json(self.mrstft), "notes": list(self.notes),
                "non_finite": {side: (None if nf is None else nf.to_dict())
                               for side, nf in zip(("reference", "candidate"), self.non_finite)},
                "events": [e.to_dict() for e in self.events],
                "channels": {"reference": self.channels[0], "candidate": self.channels[1]}}


@dataclass(frozen=True)
class NonFinite:
    """The non-finite samples of one side (after the mix-down to mono), in that file's own time."""

    count: int
    nan: int
    first_frame: int
    sample_rate: float

    @classmethod
    def of(cls, x: np.ndarray, sample_rate: float) -> "NonFinite | None":
        bad = ~np.isfinite(x)
        if not bad.any():
            return None
        return cls(int(bad.sum()), int(np.isnan(x).sum()), int(np.argmax(bad)), float(sample_rate))

    @property
    def first_s(self) -> float:
        return self.first_frame / self.sample_rate

    def describe(self) -> str:
        plural = "s" if self.count != 1 else ""
        return (f"{self.count} non-finite sample{plural} ({self.nan} NaN, {self.count - self.nan} Inf; "
                f"first at t = {self.first_s:.4g} s, sample {self.first_frame})")

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "nan": self.nan, "inf": self.count - self.nan,
                "first_frame": self.first_frame, "first_s": _jsonable(self.first_s)}


def _deep_json(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _deep_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_deep_json(x) for x in v]
    return _jsonable(v)


# --------------------------------------------------------------------------------------------- helpers

def _channels(x: Any, what: str) -> tuple[np.ndarray, list[str]]:
    """Samples at unit scale as (frames, channels), and the note of a mix-down."""
    frames, _ = to_frames(x)
    data, _ = to_unit_scale(frames)
    return data, [f"{what}: {data.shape[1]} channels mixed down to mono"] if data.shape[1] > 1 else []


def _mix(data: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", over="ignore"):
        return data.mean(axis=1)


def pearson(a: np.ndarray, b: np.ndarray) -> float | None:
    """Pearson correlation, or None when either side is constant or empty."""
    if a.size < 2 or b.size < 2:
        return None
    a, b = a - a.mean(), b - b.mean()
    den = math.sqrt(float(np.dot(a, a)) * float(np.dot(b, b)))
    return float(np.dot(a, b) / den) if den > 0 else None


def best_lag(ref: np.ndarray, cand: np.ndarray, max_lag: int) -> int:
    """Lag (in samples) by which `cand` is delayed against `ref`, searched within ±`max_lag`.

    Two measures of each lag, both from one FFT cross-correlation (absolute value, so an inverted polarity
    still aligns): the correlation over the whole energy of both signals, which weighs how much of the audio
    a lag keeps (a lag that overlaps half the audio needs twice the fit; leading zeros cost nothing), and the
    correlation of the overlapping parts alone, which says how well they fit there. The first shortlists the
    lags within `SHORTLIST` of its best; the second chooses among them, since the first also grows with the
    energy of whatever part of the audio a lag happens to overlap (a cut of five periods of a tone was put one
    sample off). Among the fits as good as the best, the smallest |lag| wins: a periodic signal fits equally
    well at every period of lag, and which of those rounding makes highest says nothing (a 220 Hz tone
    against its first half was put 450 ms late). "As good" is `_tie_tolerance`."""
    lags, whole, rho, overlap = _correlations(ref, cand, max_lag)
    if whole.size == 0 or not whole.max() > 0:
        return 0
    fit = np.where(whole >= (1 - SHORTLIST) * whole.max(), rho, 0.0)
    best = int(np.argmax(fit))
    peaks = _local_maxima(fit)
    ties = peaks[fit[peaks] >= fit[best] - _tie_tolerance(float(fit[best]), int(overlap[best]))]
    return int(lags[ties[np.argmin(np.abs(lags[ties]))]]) if ties.size else int(lags[best])


SHORTLIST = 0.01   # lags whose whole-signal correlation is within 1% of the best are judged by their fit


def _correlations(ref: np.ndarray, cand: np.ndarray, max_lag: int
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For the lags within ±max_lag: (lags, |correlation| over both signals' whole energy, |correlation| of
    the overlapping parts (cosine similarity; 0 where a part is all zeros), overlap length)."""
    from scipy.signal import correlate, correlation_lags

    c = np.abs(correlate(cand, ref, mode="full", method="fft"))
    lags = correlation_lags(cand.size, ref.size, mode="full")
    keep = np.abs(lags) <= max_lag
    lags, c = lags[keep], c[keep]
    lo = np.maximum(0, -lags)                            # ref[lo:hi] meets cand[lo + lag: hi + lag]
    hi = np.maximum(lo, np.minimum(ref.size, cand.size - lags))
    er = np.concatenate(([0.0], np.cumsum(np.square(ref))))
    ec = np.concatenate(([0.0], np.cumsum(np.square(cand))))
    total = math.sqrt(er[-1] * ec[-1])
    energy = np.maximum((er[hi] - er[lo]) * (ec[hi + lags] - ec[lo + lags]), 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        rho = np.where(energy > 0, np.minimum(c / np.sqrt(energy), 1.0), 0.0)
    return lags, (c / total if total > 0 else np.zeros_like(c)), rho, hi - lo


def _local_maxima(x: np.ndarray) -> np.ndarray:
    """Indices of the peaks of `x` (not their neighbours: a low tone's peak is wide, and the lag one sample
    beside the best would otherwise tie with it)."""
    left = np.concatenate(([True], x[1:] >= x[:-1]))
    right = np.concatenate((x[:-1] >= x[1:], [True]))
    return np.flatnonzero(left & right)


def _tie_tolerance(rho: float, n: int) -> float:
    """How far below the best correlation a peak still counts as equally good. Noise on the candidate moves
    each peak's correlation by about sqrt(2 (1 − ρ) / n) (ρ the best correlation, n its overlap): peaks closer
    than 5 of those are told apart by the noise, not by the signal."""
    return 1e-4 + 5 * math.sqrt(2 * max(0.0, 1 - min(rho, 1.0)) / max(n, 1))


def align(ref: np.ndarray, cand: np.ndarray, lag: int) -> tuple[np.ndarray, np.ndarray]:
    """The overlapping parts of `ref` and `cand` once `cand` is shifted back by `lag`."""
    r, c = (ref, cand[lag:]) if lag >= 0 else (ref[-lag:], cand)
    n = min(r.size, c.size)
    return r[:n], c[:n]


def snr_db(ref: np.ndarray, cand: np.ndarray) -> float:
    """10·log10(Σref² / Σ(ref−cand)²); +inf when identical."""
    noise = float(np.sum(np.square(ref - cand)))
    signal = float(np.sum(np.square(ref)))
    if noise == 0:
        return math.inf
    return 10 * math.log10(signal / noise) if signal > 0 else -math.inf


def _stft_mag(x: np.ndarray, sr: float, n_fft: int, hop: int) -> np.ndarray:
    from scipy.signal import stft

    _, _, z = stft(x, fs=sr, window="hann", nperseg=n_fft, noverlap=n_fft - hop, boundary="even", padded=True)
    return np.abs(z)


def mel_frame(sr: float) -> tuple[int, int]:
    """(n_fft, hop) for the log-mel comparison: ~46 ms windows (1024 at 22.05/24 kHz), 75% overlap."""
    n_fft = int(2 ** round(math.log2(max(sr * 0.046, 64))))
    return n_fft, n_fft // 4


def log_mel_pair(ref: np.ndarray, cand: np.ndarray, sr: float, n_mels: int = 80
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Log-mel power spectrograms (dB) of both signals, floored TOP_DB below the reference's peak, and in each
    band no lower than `PCM16_FLOOR_DB` above the rounding noise of 16-bit PCM (`pcm16_noise_floor`).

    Returns (ref_db, cand_db, mel band centre frequencies in Hz, hop)."""
    import librosa  # slow to import: only when a diff is made

    n_fft, hop = mel_frame(sr)
    while n_fft > ref.size and n_fft > 64:
        n_fft //= 2
    hop = n_fft // 4
    n_mels = min(n_mels, n_fft // 4)
    fb = librosa.filters.mel(sr=sr, n_fft=n_fft, n_mels=n_mels)
    pr = fb @ np.square(_stft_mag(ref, sr, n_fft, hop))
    pc = fb @ np.square(_stft_mag(cand, sr, n_fft, hop))
    floor = np.maximum(max(float(pr.max()), 1e-20) * 10 ** (-TOP_DB / 10), pcm16_noise_floor(fb, n_fft))
    hz = librosa.mel_frequencies(n_mels=n_mels + 2, fmax=sr / 2)
    return (10 * np.log10(np.maximum(pr, floor)), 10 * np.log10(np.maximum(pc, floor)), hz, hop)


PCM16_FLOOR_DB = 6.0   # the floor sits this far above the white rounding noise: a quiet periodic signal's rounding
                       # error is not white; it gathers at its harmonics (a -38 dBFS tremolo at 8 kHz: 1.8 dB)


def pcm16_noise_floor(fb: np.ndarray, n_fft: int) -> np.ndarray:
    """Per mel band (a column), the power 16-bit PCM's rounding noise (white, σ = 2⁻¹⁵/√12 of full scale)
    has in these spectrograms, raised by `PCM16_FLOOR_DB`. A difference below it can't survive writing the
    audio to a 16-bit file: a quiet float output against its own 16-bit copy is not a difference (at -50 dBFS
    the rounding noise sits 48 dB under the peak, above the TOP_DB floor, and made 10 of 100 healthy pairs
    'differ')."""
    from scipy.signal import get_window

    w = get_window("hann", n_fft)
    per_bin = (2.0 ** -15) ** 2 / 12 * float(np.sum(w * w)) / float(np.sum(w)) ** 2   # E|STFT|² of white noise
    return (per_bin * fb.sum(axis=1) * 10 ** (PCM16_FLOOR_DB / 10))[:, None]


def mel_difference(ref_db: np.ndarray, cand_db: np.ndarray, hz: np.ndarray, hop: int, sr: float,
                   n_bands: int = 8) -> dict[str, Any]:
    """Figures of |cand_db − ref_db|: mean/median/max, signed mean, correlation, worst band, worst region."""
    from scipy.ndimage import uniform_filter

    d = cand_db - ref_db
    a = np.abs(d)
    n_mels, n_frames = a.shape
    edges = np.linspace(0, n_mels, min(n_bands, n_mels) + 1).astype(int)
    bands = [{"mel_bins": [int(lo), int(hi)], "hz": [float(hz[lo]), float(hz[hi + 1])],
              "mean_db": _band_energy_db(ref_db[lo:hi], cand_db[lo:hi])}
             for lo, hi in zip(edges[:-1], edges[1:]) if hi > lo]
    worst_band = max(bands, key=lambda b: b["mean_db"])
    fb, ft = max(1, n_mels // 10), max(1, min(n_frames, int(round(0.2 * sr / hop))))
    smooth = uniform_filter(a, size=(fb, ft), mode="nearest")
    b, f = np.unravel_index(int(np.argmax(smooth)), smooth.shape)
    b0, f0 = max(0, b - fb // 2), max(0, f - ft // 2)
    b1, f1 = min(n_mels, b0 + fb), min(n_frames, f0 + ft)
    region = {"time_s": [f0 * hop / sr, f1 * hop / sr], "hz": [float(hz[b0]), float(hz[b1 + 1])],
              "mel_bins": [int(b0), int(b1)], "mean_db": float(smooth[b, f])}
    return {"mean_db": float(a.mean()), "median_db": float(np.median(a)), "max_db": float(a.max()),
            "signed_mean_db": float(d.mean()), "corr": pearson(ref_db.ravel(), cand_db.ravel()),
            "worst_band": worst_band, "worst_region": region, "bands": bands, "frames": int(n_frames),
            "n_mels": int(n_mels)}


def _band_energy_db(ref_db: np.ndarray, cand_db: np.ndarray) -> float:
    """Mean over frames of |band energy difference| in dB: a tone moving inside the band does not count,
    a band turned up or down does."""
    er = np.sum(10 ** (ref_db / 10), axis=0)
    ec = np.sum(10 ** (cand_db / 10), axis=0)
    return float(np.mean(np.abs(10 * np.log10(ec / er))))


def mrstft_distance(ref: np.ndarray, cand: np.ndarray, sr: float) -> dict[str, Any]:
    """Multi-resolution STFT distance (as in Parallel WaveGAN's loss): spectral convergence
    ‖|R|−|C|‖/‖|R|‖ and mean |log|R| − log|C||, per resolution and averaged."""
    per = []
    for n_fft, hop in MRSTFT_RESOLUTIONS:
        if n_fft > ref.size:
            continue
        mr, mc = _stft_mag(ref, sr, n_fft, hop), _stft_mag(cand, sr, n_fft, hop)
        eps = max(float(mr.max()), 1e-20) * 1e-5
        norm = float(np.linalg.norm(mr))
        sc = float(np.linalg.norm(mr - mc) / norm) if norm > 0 else math.inf
        logmag = float(np.mean(np.abs(np.log(mr + eps) - np.log(mc + eps))))
        per.append({"n_fft": n_fft, "hop": hop, "spectral_convergence": sc, "log_magnitude": logmag})
    if not per:
        return {"spectral_convergence": None, "log_magnitude": None, "resolutions": []}
    return {"spectral_convergence": float(np.mean([p["spectral_convergence"] for p in per])),
            "log_magnitude": float(np.mean([p["log_magnitude"] for p in per])), "resolutions": per}


def _verdict(corr: float | None, mel: dict[str, Any], identical: bool, t: DiffThresholds
             ) -> tuple[str, list[str]]:
    if identical:
        return "identical", ["the two signals are sample-for-sample identical"]
    wb, wr = mel["worst_band"], mel["worst_region"]
    mag_problems = []
    if mel["mean_db"] > t.mel_mean_db:
        mag_problems.append(f"log-mel differs by {mel['mean_db']:.2f} dB on average (> {t.mel_mean_db:g} dB)")
    if wb["mean_db"] > t.mel_band_db:
        mag_problems.append(f"band {wb['hz'][0]:.0f}–{wb['hz'][1]:.0f} Hz is off by {wb['mean_db']:.2f} dB "
                            f"on average (> {t.mel_band_db:g} dB)")
    if wr["mean_db"] > t.mel_region_db:
        mag_problems.append(f"region {wr['time_s'][0]:.2f}–{wr['time_s'][1]:.2f} s × {wr['hz'][0]:.0f}–"
                            f"{wr['hz'][1]:.0f} Hz is off by {wr['mean_db']:.1f} dB (> {t.mel_region_db:g} dB)")
    corr_txt = "n/a" if corr is None else f"{corr:.3f}"
    wave_ok = corr is not None and corr >= t.wave_corr
    if not mag_problems:
        if wave_ok:
            return "match", [f"waveform correlation {corr_txt}, log-mel mean difference {mel['mean_db']:.2f} dB"]
        return "phase_differs", [f"waveform correlation is only {corr_txt} (< {t.wave_corr:g}) but the log-mel "
                                 f"spectrograms agree (mean {mel['mean_db']:.2f} dB, correlation "
                                 f"{mel['corr'] or 0:.3f}): the phase differs, the sound does not"]
    if wave_ok:
        return "differs", [f"waveforms correlate ({corr_txt}) but the spectrogram does not match:", *mag_problems]
    return "differs", mag_problems


def diff(ref: Any, cand: Any, sample_rate: float, *, cand_sample_rate: float | None = None,
         max_lag_s: float = 1.0, n_mels: int = 80, thresholds: DiffThresholds | None = None,
         names: tuple[str, str] = ("reference", "candidate")) -> AudioDiff:
    """Compare `cand` with `ref` (waveforms, numpy or torch; multichannel is mixed down to mono).

    Args:
        ref, cand: the two waveforms.
        sample_rate: of `ref` (and of `cand` unless `cand_sample_rate` differs; then `cand` is resampled).
        max_lag_s: alignment searches lags within ±this many seconds.
        n_mels: mel bands of the log-mel comparison.
        thresholds: limits of the verdict (`DiffThresholds()`).

    Returns:
        `AudioDiff`: `verdict`, `label`, `reasons`, and every figure (`to_dict()` for JSON).

    Non-finite samples on either side, a side with no samples, and lengths differing by more than
    `thresholds.length_tolerance_s` make the verdict `differs` (their sentences come first in `reasons`).

    Raises:
        InputError: a non-positive sample rate, or two signals too short to measure (under 64 samples)
            that differ in nothing else.

    Example:
        >>> import numpy as np
        >>> x = np.random.default_rng(0).normal(0, 0.1, 24000)
        >>> diff(x, np.concatenate([np.zeros(120), x]), 24000).lag_frames
        120
    """
    t = thresholds or DiffThresholds()
    if not sample_rate or sample_rate <= 0:
        raise InputError(f"sample rate must be positive, got {sample_rate!r}")
    rch, notes = _channels(ref, names[0])
    cch, more = _channels(cand, names[1])
    notes += more
    r, c = _mix(rch), _mix(cch)
    bad = (NonFinite.of(r, sample_rate), NonFinite.of(c, cand_sample_rate or sample_rate))
    r, c = _finite_or_zero(r), _finite_or_zero(c)   # the figures are taken with them at 0; the verdict says so
    resampled = bool(cand_sample_rate and cand_sample_rate != sample_rate and c.size)
    if resampled:
        cch = _resample(_finite_or_zero(cch), cand_sample_rate, sample_rate)
        c = _mix(cch)
        notes.append(f"{names[1]} resampled from {cand_sample_rate:g} Hz to {sample_rate:g} Hz")
    if min(r.size, c.size) < MIN_OVERLAP:
        return _unmeasured(r, c, float(sample_rate), bad, notes, names, t, (int(rch.shape[1]), int(cch.shape[1])))
    lag, more = _reliable_lag(r, c, int(max_lag_s * sample_rate), t)
    notes += more
    ra, ca = align(r, c, lag)
    if ra.size < MIN_OVERLAP:
        raise InputError(f"after alignment only {ra.size} samples overlap: too short to compare")
    m = min(r.size, c.size)
    finite = bad == (None, None)
    identical = finite and lag == 0 and r.size == c.size and bool(np.array_equal(r, c))   # the mix-downs
    ref_db, cand_db, hz, hop = log_mel_pair(ra, ca, sample_rate, n_mels)
    mel = mel_difference(ref_db, cand_db, hz, hop, sample_rate)
    events, mel["worst_frame"] = _local_events(ra, ca, ref_db, cand_db, hop, sample_rate, lag, resampled, t)
    corr = pearson(ra, ca)
    verdict, reasons = _verdict(corr, mel, identical, t)
    verdict, reasons = _local_rule(verdict, reasons, events, ra, ca, sample_rate, max(0, -lag), t)
    verdict, reasons = _channel_rules(verdict, reasons, rch, _finite_or_zero(cch), lag, t)
    verdict, reasons = _whole_signal_rules(verdict, reasons, r.size, c.size, ra.size, bad, mel["mean_db"],
                                           sample_rate, t)
    reasons += _extra_reasons(r, c, lag, corr, sample_rate, t)
    rms_r, rms_c = float(np.sqrt(np.mean(ra ** 2))), float(np.sqrt(np.mean(ca ** 2)))
    level = 20 * math.log10(rms_c / rms_r) if rms_r > 0 and rms_c > 0 else None
    return AudioDiff(sample_rate=float(sample_rate), ref_frames=int(r.size), cand_frames=int(c.size),
                     lag_frames=lag, corr_before=pearson(r[:m], c[:m]) if finite else None,
                     corr_after=corr if finite else None, snr_db=snr_db(ra, ca) if finite else -math.inf,
                     level_db=level, mel=mel, mrstft=mrstft_distance(ra, ca, sample_rate), verdict=verdict,
                     reasons=tuple(reasons), notes=tuple(notes), names=names, non_finite=bad, events=tuple(events),
                     channels=(int(rch.shape[1]), int(cch.shape[1])), arrays=_Arrays(ra, ca, ref_db, cand_db, hop, hz))


MIN_OVERLAP = 64   # samples: below this no spectrogram or correlation is worth giving


def _finite_or_zero(x: np.ndarray) -> np.ndarray:
    return x if np.isfinite(x).all() else np.where(np.isfinite(x), x, 0.0)


# ------------------------------------------------------------------------------------- local events

RESAMPLER_EDGE_S = 0.005   # a resampled candidate's first and last 5 ms hold its filter's settling


def _local_events(ra: np.ndarray, ca: np.ndarray, ref_db: np.ndarray, cand_db: np.ndarray, hop: int, sr: float,
                  lag: int, resampled: bool, t: DiffThresholds) -> tuple[list[LocalDifference], dict[str, Any]]:
    """Short events in the aligned overlap (waveform and spectrogram rules, tensorprobe.audio.events), in the
    reference's time; and the log-mel frame that differs most."""
    offset_s = max(0, -lag) / sr
    wave = local_differences(ra, ca, sr, snr_db=t.event_snr_db, margin_db=t.event_margin_db,
                             level_db=t.event_level_db, offset_s=offset_s,
                             edge_s=RESAMPLER_EDGE_S if resampled else 0.0)
    spectral, worst = spectral_frame_events(ref_db, cand_db, hop, sr, limit_db=t.mel_frame_db, offset_s=offset_s)
    return merge_events(wave, spectral), worst


def _local_rule(verdict: str, reasons: list[str], events: list[LocalDifference], ra: np.ndarray, ca: np.ndarray,
                sr: float, ref_start: int, t: DiffThresholds) -> tuple[str, list[str]]:
    """Any local event makes the verdict `differs`, said first with its time; the overall figures follow as
    what holds elsewhere. A waveform correlation lowered by the events alone is not a phase difference."""
    if not events:
        return verdict, reasons
    n = len(events)
    first = (f"a local difference {events[0].describe()}" if n == 1 else
             f"{n} local differences; the first {events[0].describe()}")
    others = [f"{e.at_s:.3f} s" for e in events[1:6]]
    if others:
        first += f"; the others at t = {', '.join(others)}" + (" ..." if n > 6 else "")
    if verdict == "differs":
        return verdict, [first, *reasons]
    outside = _corr_outside(ra, ca, events, sr, ref_start)
    if verdict == "phase_differs" and outside is not None and outside >= t.wave_corr:
        reasons = [f"outside the local difference{'s' if n > 1 else ''} the waveforms correlate ({outside:.3f}) "
                   f"and the log-mel spectrograms agree on average: they match there"]
    return "differs", [first, *(f"overall: {r}" for r in reasons[:1]), *reasons[1:]]


def _corr_outside(ra: np.ndarray, ca: np.ndarray, events: list[LocalDifference], sr: float,
                  ref_start: int) -> float | None:
    keep = np.ones(ra.size, dtype=bool)
    for e in events:
        lo, hi = int(e.start_s * sr) - ref_start, int(math.ceil(e.end_s * sr)) - ref_start
        keep[max(0, lo):max(0, hi)] = False
    return pearson(ra[keep], ca[keep]) if keep.sum() >= MIN_OVERLAP else None


# ----------------------------------------------------------------------------------------- channels

def _channel_rules(verdict: str, reasons: list[str], rch: np.ndarray, cch: np.ndarray, lag: int,
                   t: DiffThresholds) -> tuple[str, list[str]]:
    """A layout difference is said (mono against stereo is never `identical`); with the same channel count,
    a channel that departs from its counterpart while the mix-down matches (swapped, one altered) differs."""
    nr, nc = rch.shape[1], cch.shape[1]
    if nr != nc:
        said = (f"channel layout differs: the reference has {_layout(rch)}, the candidate {_layout(cch)}; "
                f"compared mixed down to mono")
        if verdict == "identical":
            return "match", [said, "the mono mix-downs are sample-for-sample identical"]
        return verdict, [said, *reasons]
    if verdict == "identical":
        if np.array_equal(rch, cch):
            return verdict, reasons
        verdict, reasons = "match", ["the mix-downs are sample-for-sample identical, the channels are not"]
    if nr == 1 or verdict != "match":
        return verdict, reasons
    corr = np.array([[pearson(*align(rch[:, j], cch[:, k], lag)) or 0.0 for k in range(nc)] for j in range(nr)])
    own = np.diag(corr)
    if (own >= t.wave_corr).all():
        return verdict, reasons
    best = np.argmax(corr, axis=0)   # for each candidate channel, the reference channel it matches best
    if sorted(best.tolist()) == list(range(nr)) and (corr[best, np.arange(nc)] >= t.wave_corr).all():
        moved = ", ".join(f"the candidate's channel {k} is the reference's channel {j}" for k, j in enumerate(best)
                          if j != k)
        return "differs", [f"channels are in another order: {moved} (the mix-down matches)", *reasons]
    k = int(np.argmin(own))
    return "differs", [f"channel {k} departs from the reference's channel {k} (waveform correlation {own[k]:.3f} "
                       f"< {t.wave_corr:g}) while the mix-down matches", *reasons]


def _layout(x: np.ndarray) -> str:
    n = x.shape[1]
    if n == 1:
        return "1 channel (mono)"
    same = all(np.array_equal(x[:, 0], x[:, k]) for k in range(1, n))
    return f"{n} channels" + (" (all equal)" if same else "")


def _whole_signal_rules(verdict: str, reasons: list[str], n_ref: int, n_cand: int, n_overlap: int,
                        bad: tuple[NonFinite | None, NonFinite | None], mel_mean_db: float, sr: float,
                        t: DiffThresholds) -> tuple[str, list[str]]:
    """What differs whatever the aligned figures say: non-finite samples, then a length difference beyond
    the tolerance. Their sentences go first; the figures' own reasons follow, said of the overlap."""
    first = [s for s in (_non_finite_reason(bad), _length_finding(n_ref, n_cand, sr, t)) if s]
    if not first:
        return verdict, reasons
    if bad != (None, None):   # the correlations the figures' reasons quote are not given
        reasons = [f"with the non-finite samples set to 0, the log-mel spectrograms differ by {mel_mean_db:.2f} "
                   f"dB on average; the SNR is -inf and no correlation is given"]
    if abs(n_cand - n_ref) > t.length_tolerance_s * sr:
        reasons = [f"where both have audio ({n_overlap / sr:.3f} s): {reasons[0]}", *reasons[1:]]
    return "differs", first + reasons


def _non_finite_reason(bad: tuple[NonFinite | None, NonFinite | None]) -> str | None:
    ref, cand = bad
    if ref is None and cand is None:
        return None
    if ref is None:
        return f"the candidate has {cand.describe()}"
    tail = f" and the candidate has {cand.describe()}" if cand is not None else "; the candidate has none"
    return f"the reference has {ref.describe()}{tail}"


def _length_finding(n_ref: int, n_cand: int, sr: float, t: DiffThresholds) -> str | None:
    """A length difference beyond `length_tolerance_s`: the differences a faithful port makes (a frame of
    padding, a resampler's rounding) are a few ms whatever the length, and audio missing from a long file is
    as much a fault as from a short one, so the tolerance is absolute."""
    delta = n_cand - n_ref
    if abs(delta) <= t.length_tolerance_s * sr:
        return None
    what = "shorter than the reference" if delta < 0 else "longer than the reference"
    why = "audio is missing" if delta < 0 else "it holds audio the reference does not"
    return (f"the candidate is {abs(delta) / sr:.3f} s {what} ({n_cand / sr:.3f} s against {n_ref / sr:.3f} s; "
            f"tolerance {t.length_tolerance_s:g} s): {why}")


def _unmeasured(r: np.ndarray, c: np.ndarray, sr: float, bad: tuple[NonFinite | None, NonFinite | None],
                notes: list[str], names: tuple[str, str], t: DiffThresholds,
                channels: tuple[int, int] = (1, 1)) -> AudioDiff:
    """A side too short for any figure: a finding when a side is empty, holds non-finite samples or the
    lengths differ beyond the tolerance; otherwise there is nothing to judge (bad input)."""
    sides = [(side, x.size) for side, x in (("reference", r), ("candidate", c)) if x.size < MIN_OVERLAP]
    short = [f"the {side} holds no samples" if n == 0 else
             f"the {side} has only {n} samples ({n / sr * 1000:.1f} ms): too short to measure" for side, n in sides]
    findings = [s for s in (_non_finite_reason(bad), _length_finding(r.size, c.size, sr, t)) if s]
    if not findings and min(r.size, c.size) > 0:
        side, n = sides[0]
        raise InputError(f"the {side} has only {n} samples: too short to compare (at least {MIN_OVERLAP} needed)")
    return AudioDiff(sample_rate=sr, ref_frames=int(r.size), cand_frames=int(c.size), lag_frames=0,
                     corr_before=None, corr_after=None, snr_db=-math.inf if bad != (None, None) else None,
                     level_db=None, mel={}, mrstft={}, verdict="differs", reasons=tuple(short + findings),
                     notes=tuple(notes), names=names, non_finite=bad, channels=channels)


def _reliable_lag(r: np.ndarray, c: np.ndarray, max_lag: int, t: DiffThresholds) -> tuple[int, list[str]]:
    """The cross-correlation lag, or 0 when aligning there does not give a clear correlation (a signal whose
    phase drifts has no true lag; its correlation peak lands anywhere)."""
    lag = best_lag(r, c, max_lag)
    if lag == 0:
        return 0, []
    corr = pearson(*align(r, c, lag))
    if corr is None or abs(corr) < t.align_min_corr:
        return 0, [f"no reliable alignment: the best lag ({lag} samples) only reaches correlation "
                   f"{0 if corr is None else corr:.2f}; compared without shifting"]
    return lag, []


def _extra_reasons(r: np.ndarray, c: np.ndarray, lag: int, corr: float | None, sr: float,
                   t: DiffThresholds) -> list[str]:
    out = []
    if lag:
        out.append(f"{'candidate' if lag > 0 else 'reference'} starts {abs(lag)} samples "
                   f"({abs(lag) / sr * 1000:.1f} ms) later; figures are after alignment")
    if corr is not None and corr < 0 and abs(corr) >= t.wave_corr:
        out.append("polarity is inverted (aligned correlation is negative)")
    if 0 < abs(c.size - r.size) <= t.length_tolerance_s * sr:
        out.append(f"lengths differ by {c.size - r.size:+d} samples ({(c.size - r.size) / sr:+.3f} s), within "
                   f"the {t.length_tolerance_s:g} s tolerance")
    return out


def _resample(x: np.ndarray, from_sr: float, to_sr: float) -> np.ndarray:
    """`x` (samples along axis 0) at `to_sr`."""
    from fractions import Fraction

    from scipy.signal import resample_poly

    frac = Fraction(int(round(to_sr)), int(round(from_sr))).limit_denominator(1000)
    return resample_poly(x, frac.numerator, frac.denominator, axis=0)
