"""Generated test signals (no audio files checked in)."""

from __future__ import annotations

import numpy as np

SR = 16_000


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
