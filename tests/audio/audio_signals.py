"""Generated test signals (no audio files checked in), and a corpus of healthy ones for judging many at once."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SR = 16_000
RATES = (8000, 16000, 22050, 24000, 44100, 48000)


def t(seconds: float = 1.0, sr: int = SR) -> np.ndarray:
    return np.arange(int(seconds * sr)) / sr


def sine(freq: float = 440.0, amp: float = 0.5, seconds: float = 1.0, sr: int = SR) -> np.ndarray:
    return amp * np.sin(2 * np.pi * freq * t(seconds, sr))


def speechlike(seconds: float = 1.0, sr: int = SR, seed: int = 0) -> np.ndarray:
    """Harmonics of a 140 Hz voice with a falling spectral envelope and an amplitude envelope."""
    tt = t(seconds, sr)
    x = sum((0.4 / k) * np.sin(2 * np.pi * 140 * k * tt + k) for k in range(1, 25) if 140 * k < sr / 2)
    env = 0.5 + 0.5 * np.sin(2 * np.pi * 3 * tt) ** 2
    return 0.5 * x * env / np.abs(x).max()


# ------------------------------------------------------------------------------------------ healthy corpus

def _harmonic(tt: np.ndarray, f0: np.ndarray | float, sr: int, rng: np.random.Generator, tilt: float) -> np.ndarray:
    phase = 2 * np.pi * np.cumsum(np.broadcast_to(f0, tt.shape)) / sr
    top = float(np.max(f0))
    return sum(k ** -tilt * np.sin(k * phase + rng.uniform(0, 6.3)) for k in range(1, 40) if k * top < 0.45 * sr)


def _voice(tt, sr, rng):
    """A voice: f0 with vibrato and drift, harmonics, a syllable envelope, fricative noise between syllables."""
    f0 = rng.uniform(90, 280) * (1 + 0.03 * np.sin(2 * np.pi * rng.uniform(4, 7) * tt) + 0.1 * tt / tt[-1])
    voiced = _harmonic(tt, f0, sr, rng, rng.uniform(0.8, 1.6))
    syllables = np.sin(np.pi * rng.uniform(3, 5) * tt) ** 2
    noise = np.convolve(rng.standard_normal(tt.size), np.ones(4) / 4, mode="same")   # a fricative's hiss
    return voiced * syllables + 0.3 * noise * (1 - syllables) ** 4 * np.abs(voiced).max()


def _chirp(tt, sr, rng):
    f1 = rng.uniform(100, 300)
    f2 = rng.uniform(1000, min(6000, 0.4 * sr))
    return np.sin(2 * np.pi * (f1 * tt + (f2 - f1) * tt ** 2 / (2 * tt[-1])))


def _chord(tt, sr, rng):
    root = rng.uniform(110, 330)
    return sum(_harmonic(tt, root * r, sr, rng, 1.5) for r in (1, 1.26, 1.5)) * (1 - 0.5 * tt / tt[-1])


def _tremolo(tt, sr, rng):
    return np.sin(2 * np.pi * rng.uniform(200, 1500) * tt) * (1 + 0.6 * np.sin(2 * np.pi * rng.uniform(2, 8) * tt))


def _pluck(tt, sr, rng):
    return _harmonic(tt, rng.uniform(100, 500), sr, rng, 1.0) * np.exp(-tt / rng.uniform(0.4, 1.5))


HEALTHY_KINDS = {"voice": _voice, "chirp": _chirp, "chord": _chord, "tremolo": _tremolo, "pluck": _pluck,
                 "harmonic": lambda tt, sr, rng: _harmonic(tt, rng.uniform(60, 600), sr, rng, rng.uniform(0.7, 2)),
                 "sine": lambda tt, sr, rng: np.sin(2 * np.pi * rng.uniform(50, 0.4 * sr) * tt)}


@dataclass(frozen=True)
class Healthy:
    """One healthy signal of the corpus: samples as stored (float or int PCM) and how it was made."""

    kind: str
    sample_rate: int
    level_dbfs: float
    dtype: str
    channels: int
    data: np.ndarray

    def __str__(self) -> str:
        return (f"{self.kind} {self.data.shape[0] / self.sample_rate:.2f} s at {self.sample_rate} Hz, "
                f"{self.level_dbfs:.1f} dBFS, {self.dtype}, {self.channels} ch")


def at_level(x: np.ndarray, level_dbfs: float) -> np.ndarray:
    """`x` scaled so that its peak is `level_dbfs` (float64)."""
    return x * (10 ** (level_dbfs / 20) / np.abs(x).max())


def as_stored(x: np.ndarray, dtype: str) -> np.ndarray:
    """Samples as a file or a model would hand them over: float as is, integer PCM rounded."""
    if dtype.startswith("float"):
        return x.astype(dtype)
    scale = float(-np.iinfo(dtype).min)
    return np.clip(np.round(x * scale), np.iinfo(dtype).min, np.iinfo(dtype).max).astype(dtype)


def statuses(report) -> dict[str, str]:
    """check name -> status of an `AudioReport`: what a gain change must keep."""
    return {v.check: v.status for v in report.verdicts}


def healthy_signal(seed: int, kind: str | None = None, level_dbfs: float | None = None) -> Healthy:
    """A healthy signal drawn from `seed`: kind, sample rate, length (0.1–2 s), level (-50–0 dBFS peak),
    storage type, mono or stereo, and TTS-style digital-zero padding at either end."""
    rng = np.random.default_rng(seed)
    kind = kind or str(rng.choice(sorted(HEALTHY_KINDS)))
    sr = int(rng.choice(RATES))
    level = float(rng.uniform(-50, 0)) if level_dbfs is None else level_dbfs
    tt = t(float(rng.uniform(0.1, 2.0)), sr)
    chans = [HEALTHY_KINDS[kind](tt, sr, rng) for _ in range(int(rng.choice([1, 1, 1, 2])))]
    x = np.stack(chans, axis=1)
    pad = [(int(rng.uniform(0, 0.2) * sr), int(rng.uniform(0, 0.2) * sr)), (0, 0)]
    x = np.pad(x, pad) if rng.random() < 0.5 else x
    dtype = str(rng.choice(["float32", "float64", "int16", "int32"]))
    return Healthy(kind, sr, level, dtype, x.shape[1], as_stored(at_level(x, level), dtype))
