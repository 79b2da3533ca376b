"""Reading and safely writing audio files (WAV, FLAC, OGG/Vorbis) through soundfile (libsndfile).

`load` keeps the file's native scale: PCM is read as float in [-1, 1), float files are read as stored, so
a float WAV written at 1e9 reads back as 1e9 and the `scale` check sees it.

`save` is what a pipeline should call instead of its own `x / max(abs(x))` (seed 003, DiffRhythm):

    >>> import numpy as np
    >>> from tensorprobe.audio import save
    >>> report = save("out.wav", np.zeros(24000), 24000, normalize=True)     # doctest: +SKIP
    >>> report.notes                                                          # doctest: +SKIP
    ('not normalized: the audio is silent (peak -240.0 dBFS); written as silence',)
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import InputError
from .check import AudioReport, Thresholds, check, dbfs, to_frames

FORMATS = {".wav": "WAV", ".flac": "FLAC", ".ogg": "OGG", ".oga": "OGG"}
DEFAULT_SUBTYPES = {"WAV": "PCM_16", "FLAC": "PCM_16", "OGG": "VORBIS"}
FLOAT_SUBTYPES = {"FLOAT", "DOUBLE", "VORBIS", "OPUS"}
DEFAULT_PEAK = 0.95  # normalize=True target: -0.45 dBFS, a little headroom below full scale


@dataclass(frozen=True)
class AudioFile:
    """Samples of a file as (frames, channels) float64 at the file's native scale, plus its format."""

    path: str
    data: np.ndarray
    sample_rate: int
    format: str
    subtype: str

    @property
    def is_float(self) -> bool:
        return self.subtype in FLOAT_SUBTYPES


def _soundfile():
    import soundfile

    return soundfile


def load(path: str | os.PathLike) -> AudioFile:
    """Read an audio file without rescaling it.

    Args:
        path: a WAV, FLAC or OGG file (any format libsndfile reads).

    Returns:
        `AudioFile` with `data` shaped (frames, channels).

    Raises:
        InputError: the file is missing, empty, or not readable audio (one sentence naming the file).

    Example:
        >>> f = load("speech.wav")            # doctest: +SKIP
        >>> f.data.shape, f.sample_rate, f.subtype   # doctest: +SKIP
        ((48000, 1), 24000, 'PCM_16')
    """
    sf = _soundfile()
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file")
    if p.is_dir():
        raise InputError(f"{p}: is a directory, not an audio file")
    if p.stat().st_size == 0:
        raise InputError(f"{p}: empty file (0 bytes), not audio")
    try:
        with sf.SoundFile(str(p)) as f:
            data = f.read(dtype="float64", always_2d=True)
            return AudioFile(path=str(p), data=data, sample_rate=int(f.samplerate), format=f.format,
                             subtype=f.subtype)
    except (sf.SoundFileError, RuntimeError, OSError) as e:
        raise InputError(f"{p}: not readable audio ({_short(e)})") from None


def _short(e: Exception) -> str:
    return str(e).replace("\n", " ").strip() or type(e).__name__


def check_file(path: str | os.PathLike, thresholds: Thresholds | None = None) -> AudioReport:
    """`load` + `check`: the health report of an audio file (the figures are the file's own scale).

    Example:
        >>> check_file("speech.wav").status      # doctest: +SKIP
        'ok'
    """
    f = load(path)
    report = check(f.data, f.sample_rate, thresholds, source=str(path), is_float=f.is_float, encoding=f.subtype)
    return dataclasses.replace(report, dtype=f"{f.format} {f.subtype}")


def save(path: str | os.PathLike, array: Any, sample_rate: int, *, normalize: bool | float = False,
         repair_nonfinite: bool = False, subtype: str | None = None,
         thresholds: Thresholds | None = None) -> AudioReport:
    """Write audio safely and return the health report of what was written.

    Args:
        path: destination; the format comes from the extension (.wav, .flac, .ogg).
        array: samples, 1-D or 2-D (either layout; the short axis is channels), numpy or torch.
        sample_rate: in Hz.
        normalize: False keeps the samples; True scales the peak to 0.95; a number scales the peak to it.
            Silent audio (peak below `thresholds.silence_peak_dbfs`) is never scaled up: it is written as
            silence and the report says so.
        repair_nonfinite: replace NaN/Inf samples with 0 (the report says how many) instead of refusing.
        subtype: libsndfile subtype (PCM_16, PCM_24, FLOAT, ...); default PCM_16 (VORBIS for OGG).
        thresholds: limits for the returned health report.

    Raises:
        InputError: non-finite audio without `repair_nonfinite`, an unknown extension, or a bad subtype.
            Nothing is written then, and an existing file at `path` is left exactly as it was.

    Example:
        >>> import numpy as np
        >>> save("x.wav", np.array([0.0, np.nan]), 16000)          # doctest: +SKIP
        Traceback (most recent call last):
        tensorprobe.errors.InputError: refusing to write x.wav: 1 of 2 samples are non-finite ...
    """
    t = thresholds or Thresholds()
    p = Path(path)
    fmt = _format_for(p)
    subtype = (subtype or DEFAULT_SUBTYPES[fmt]).upper()
    frames, _ = to_frames(array, t.layout_max_channels)
    x = np.array(frames, dtype=np.float64)
    notes = []
    x, note = _handle_nonfinite(x, p, repair_nonfinite)
    notes += note
    x, note = _normalize(x, normalize, t)
    notes += note
    if subtype not in FLOAT_SUBTYPES:
        over = int((np.abs(x) > 1.0).sum())
        if over:
            x = np.clip(x, -1.0, 1.0)
            notes.append(f"{over} samples above full scale were clipped to ±1.0 for {subtype}")
    _write_atomic(p, x, int(sample_rate), fmt, subtype)
    report = check(x, sample_rate, t, source=str(p), is_float=subtype in FLOAT_SUBTYPES, encoding=subtype)
    return report.with_notes(*notes, f"written as {fmt} {subtype}")


def _format_for(p: Path) -> str:
    fmt = FORMATS.get(p.suffix.lower())
    if fmt is None:
        raise InputError(f"{p}: unknown audio extension {p.suffix!r}; use one of {', '.join(sorted(FORMATS))}")
    return fmt


def _handle_nonfinite(x: np.ndarray, p: Path, repair: bool) -> tuple[np.ndarray, list[str]]:
    bad = ~np.isfinite(x)
    count = int(bad.sum())
    if not count:
        return x, []
    first = int(np.argwhere(bad)[0][0])
    if not repair:
        raise InputError(f"refusing to write {p}: {count} of {x.size} samples are non-finite (first at frame "
                         f"{first}); find where they come from (tensorprobe nan), or pass repair_nonfinite=True "
                         f"to write them as 0")
    x = np.where(bad, 0.0, x)
    return x, [f"repaired {count} non-finite samples (set to 0; first at frame {first})"]


def _normalize(x: np.ndarray, normalize: bool | float, t: Thresholds) -> tuple[np.ndarray, list[str]]:
    if normalize is False or normalize is None:
        return x, []
    target = DEFAULT_PEAK if normalize is True else float(normalize)
    if not 0 < target <= 1.0:
        raise InputError(f"normalize target peak must be in (0, 1], got {normalize!r}")
    peak = float(np.abs(x).max()) if x.size else 0.0
    if dbfs(peak) < t.silence_peak_dbfs:
        return x, [f"not normalized: the audio is silent (peak {dbfs(peak):.1f} dBFS); written as silence"]
    return x * (target / peak), [f"normalized: peak {peak:.4g} scaled to {target:g} (gain {target / peak:.4g})"]


def _write_atomic(p: Path, x: np.ndarray, sample_rate: int, fmt: str, subtype: str) -> None:
    sf = _soundfile()
    if not sf.check_format(fmt, subtype):
        raise InputError(f"{p}: {fmt} can't hold subtype {subtype}; known: {', '.join(sf.available_subtypes(fmt))}")
    if sample_rate <= 0:
        raise InputError(f"{p}: sample rate must be positive, got {sample_rate}")
    directory = p.parent if str(p.parent) else Path(".")
    if not directory.is_dir():
        raise InputError(f"{p}: directory {directory} does not exist")
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            sf.write(fh, x, sample_rate, subtype=subtype, format=fmt)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
