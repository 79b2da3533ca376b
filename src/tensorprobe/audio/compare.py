"""Compare a candidate audio with its reference the way ears would: magnitude first, phase second.

`diff(ref, cand, sample_rate)` aligns the two (bounded FFT cross-correlation), then measures waveform
correlation before and after alignment, SNR, level and length differences, the log-mel spectrogram
difference in dB (mean, median, max, worst band, worst time-frequency region) and a multi-resolution STFT
distance. STFTs come from `scipy.signal.stft`, mel filterbanks from `librosa.filters.mel`.

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
    length_share: float = 0.05    # a length difference above this share of the reference is reported
    align_min_corr: float = 0.5   # a lag is used only if the aligned |correlation| reaches this (else lag 0)


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
                "mel": _deep_json(self.mel), "mrstft": _deep_json(self.mrstft), "notes": list(self.notes)}


def _deep_json(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _deep_json(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_deep_json(x) for x in v]
    return _jsonable(v)


# --------------------------------------------------------------------------------------------- helpers

def _mono(x: Any, what: str) -> tuple[np.ndarray, list[str]]:
    frames, _ = to_frames(x)
    data, _ = to_unit_scale(frames)
    notes = [f"{what}: {data.shape[1]} channels mixed down to mono"] if data.shape[1] > 1 else []
    mono = data.mean(axis=1)
    if mono.size == 0:
        raise InputError(f"{what} is empty: nothing to compare")
    bad = int((~np.isfinite(mono)).sum())
    if bad:
        raise InputError(f"{what} has {bad} non-finite samples: run `tensorprobe audio check` on it first")
    return mono, notes


def pearson(a: np.ndarray, b: np.ndarray) -> float | None:
    """Pearson correlation, or None when either side is constant or empty."""
    if a.size < 2 or b.size < 2:
        return None
    a, b = a - a.mean(), b - b.mean()
    den = math.sqrt(float(np.dot(a, a)) * float(np.dot(b, b)))
    return float(np.dot(a, b) / den) if den > 0 else None


def best_lag(ref: np.ndarray, cand: np.ndarray, max_lag: int) -> int:
    """Lag (in samples) by which `cand` is delayed against `ref`, from the FFT cross-correlation peak
    (absolute value, so an inverted polarity still aligns), searched within ±`max_lag`."""
    from scipy.signal import correlate, correlation_lags

    c = correlate(cand, ref, mode="full", method="fft")
    lags = correlation_lags(cand.size, ref.size, mode="full")
    keep = np.abs(lags) <= max_lag
    if not keep.any():
        return 0
    c, lags = np.abs(c[keep]), lags[keep]
    return int(lags[int(np.argmax(c))]) if c.max() > 0 else 0


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
    """Log-mel power spectrograms (dB) of both signals, floored TOP_DB below the reference's peak.

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
    floor = max(float(pr.max()), 1e-20) * 10 ** (-TOP_DB / 10)
    hz = librosa.mel_frequencies(n_mels=n_mels + 2, fmax=sr / 2)
    return (10 * np.log10(np.maximum(pr, floor)), 10 * np.log10(np.maximum(pc, floor)), hz, hop)


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

    Raises:
        InputError: empty or non-finite input, or a non-positive sample rate.

    Example:
        >>> import numpy as np
        >>> x = np.random.default_rng(0).normal(0, 0.1, 24000)
        >>> diff(x, np.concatenate([np.zeros(120), x]), 24000).lag_frames
        120
    """
    t = thresholds or DiffThresholds()
    if not sample_rate or sample_rate <= 0:
        raise InputError(f"sample rate must be positive, got {sample_rate!r}")
    r, notes = _mono(ref, names[0])
    c, more = _mono(cand, names[1])
    notes += more
    if cand_sample_rate and cand_sample_rate != sample_rate:
        c = _resample(c, cand_sample_rate, sample_rate)
        notes.append(f"{names[1]} resampled from {cand_sample_rate:g} Hz to {sample_rate:g} Hz")
    lag, more = _reliable_lag(r, c, int(max_lag_s * sample_rate), t)
    notes += more
    ra, ca = align(r, c, lag)
    if ra.size < 64:
        raise InputError(f"after alignment only {ra.size} samples overlap: too short to compare")
    m = min(r.size, c.size)
    identical = lag == 0 and r.size == c.size and bool(np.array_equal(r, c))
    ref_db, cand_db, hz, hop = log_mel_pair(ra, ca, sample_rate, n_mels)
    mel = mel_difference(ref_db, cand_db, hz, hop, sample_rate)
    corr = pearson(ra, ca)
    verdict, reasons = _verdict(corr, mel, identical, t)
    reasons += _extra_reasons(r, c, lag, corr, sample_rate, t)
    rms_r, rms_c = float(np.sqrt(np.mean(ra ** 2))), float(np.sqrt(np.mean(ca ** 2)))
    level = 20 * math.log10(rms_c / rms_r) if rms_r > 0 and rms_c > 0 else None
    return AudioDiff(sample_rate=float(sample_rate), ref_frames=int(r.size), cand_frames=int(c.size),
                     lag_frames=lag, corr_before=pearson(r[:m], c[:m]), corr_after=corr, snr_db=snr_db(ra, ca),
                     level_db=level, mel=mel, mrstft=mrstft_distance(ra, ca, sample_rate), verdict=verdict,
                     reasons=tuple(reasons), notes=tuple(notes), names=names,
                     arrays=_Arrays(ra, ca, ref_db, cand_db, hop, hz))


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
    if abs(c.size - r.size) > t.length_share * r.size:
        out.append(f"lengths differ by {c.size - r.size:+d} samples ({(c.size - r.size) / sr:+.3f} s)")
    return out


def _resample(x: np.ndarray, from_sr: float, to_sr: float) -> np.ndarray:
    from fractions import Fraction

    from scipy.signal import resample_poly

    frac = Fraction(int(round(to_sr)), int(round(from_sr))).limit_denominator(1000)
    return resample_poly(x, frac.numerator, frac.denominator)
