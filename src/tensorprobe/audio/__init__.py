"""Audio health: check a waveform (`check`, `check_file`), write it safely (`save`), compare two (`diff`).

    >>> import numpy as np
    >>> import tensorprobe.audio as ta
    >>> report = ta.check(np.zeros(16000), 16000)
    >>> report.status, [v.check for v in report.errors]
    ('error', ['silence'])
"""

from .check import AudioReport, Thresholds, Verdict, check
from .compare import AudioDiff, DiffThresholds, diff
from .io import AudioFile, check_file, load, save

__all__ = ["AudioDiff", "AudioFile", "AudioReport", "DiffThresholds", "Thresholds", "Verdict", "check",
           "check_file", "diff", "load", "save"]
