"""A recorded TTS pipeline: one file (or tensorprobe bundle) whose tensor names are the stage names.

    name             content                                                        aliases
    text             UTF-8 bytes of the input text (uint8, 1-D)
    phonemes         UTF-8 bytes of the phoneme string (ARPAbet tokens separated by spaces)
    vocab            UTF-8 bytes of a JSON object {symbol: id}
    ids              token ids (int)                                                input_ids, token_ids, tokens
    embedding_size   scalar: rows of the model's token embedding                    n_token
    durations        frames per token                                               pred_dur, duration
    log_durations    log frames per token (exp'd before checking)
    mel              log-mel spectrogram                                            mel_spec, mels
    latents          latents / decoder features                                     latent
    audio            waveform (float, full scale 1.0)                               wav, waveform
    sample_rate      scalar, Hz of `audio`                                          sr

Any other tensor is checked for NaN/Inf under its own name. The file may be a `.npz`, a `.safetensors` or
a tensorprobe bundle directory (records without stored tensors are checked through their statistics).

    >>> import numpy as np
    >>> from tensorprobe.tts import save_stages, check_stages
    >>> save_stages("run.npz", phonemes="həlˈO", ids=np.array([0, 50, 83, 54, 156, 31, 0]),
    ...             audio=np.zeros(24000, np.float32), sample_rate=24000)           # doctest: +SKIP
    >>> check_stages("run.npz").first_bad_stage                                     # doctest: +SKIP
    'audio'
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..bundle import Bundle, atomic_write_bytes
from ..errors import BundleError, InputError
from .checks import ERROR, StageFinding
from .stages import StageChecker, StageReport

TEXT_STAGES = ("text", "phonemes", "vocab")
ALIASES = {"input_ids": "ids", "token_ids": "ids", "tokens": "ids", "n_token": "embedding_size",
           "pred_dur": "durations", "duration": "durations", "mel_spec": "mel", "mels": "mel", "latent": "latents",
           "wav": "audio", "waveform": "audio", "sr": "sample_rate"}
ORDER = ("text", "phonemes", "ids", "durations", "log_durations", "mel", "latents", "audio")


def _encode(name: str, value: Any) -> np.ndarray:
    if name == "vocab" and isinstance(value, dict):
        value = json.dumps(value, ensure_ascii=False)
    if name == "phonemes" and isinstance(value, (list, tuple)):
        value = " ".join(value)
    if isinstance(value, str):
        return np.frombuffer(value.encode("utf-8"), dtype=np.uint8).copy()
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def save_stages(path: str | os.PathLike, **stages: Any) -> Path:
    """Write the stages of one pipeline run to a `.npz` file (atomically) under the documented names.

    Strings (text, phonemes) and the vocab dict are stored as UTF-8 bytes; arrays as they are."""
    p = Path(path)
    if p.suffix != ".npz":
        raise InputError(f"{p}: save_stages writes a .npz file")
    buf = io.BytesIO()
    np.savez(buf, **{k: _encode(k, v) for k, v in stages.items()})
    atomic_write_bytes(p, buf.getvalue())
    return p


def _decode_text(a: np.ndarray, name: str, path: Path) -> str:
    if a.dtype not in (np.uint8, np.int8):
        raise BundleError(f"{path}: stage {name!r} must be UTF-8 bytes (uint8), got {a.dtype}")
    try:
        return a.astype(np.uint8).tobytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise BundleError(f"{path}: stage {name!r} is not valid UTF-8 ({e})") from None


def load_stages(path: str | os.PathLike) -> tuple[dict[str, Any], list[StageFinding]]:
    """Read a recorded pipeline: (stage name → value, findings from records that carry only statistics)."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"{p}: no such file or directory")
    stages: dict[str, Any] = {}
    stats_findings: list[StageFinding] = []
    with Bundle.open(p) as b:
        for rec in b:
            name = ALIASES.get(rec.name, rec.name)
            if not rec.has_tensor:
                if not rec.stats.all_finite:
                    stats_findings.append(StageFinding(name, "non_finite", ERROR,
                                                       f"{rec.stats.nonfinite} non-finite values (from the "
                                                       f"recorded statistics)", {"count": rec.stats.nonfinite}))
                continue
            a = b.numpy(rec.name)
            stages[name] = _decode_text(a, name, p) if name in TEXT_STAGES else a
    if "vocab" in stages:
        try:
            vocab = json.loads(stages["vocab"])
            if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
                raise ValueError("not an object of integer ids")
            stages["vocab"] = vocab
        except ValueError as e:
            raise BundleError(f"{p}: stage 'vocab' is not a JSON object {{symbol: id}} ({e})") from None
    return stages, stats_findings


def check_stages(path: str | os.PathLike, **checker_options: Any) -> StageReport:
    """Check every stage of a recorded pipeline (see the naming table above).

    Args:
        path: `.npz`, `.safetensors` or a tensorprobe bundle directory.
        checker_options: passed to `StageChecker` (mel_range=..., max_duration_frames=..., ...); a `vocab`,
            `embedding_size` or `sample_rate` stored in the file is used unless given here.
    """
    stages, extra = load_stages(path)
    opts = dict(checker_options)
    if "vocab" in stages:
        opts.setdefault("vocab", stages.pop("vocab"))
    for scalar in ("embedding_size", "sample_rate"):
        if scalar in stages:
            value = np.asarray(stages.pop(scalar)).ravel()
            if value.size != 1:
                raise BundleError(f"{path}: stage {scalar!r} must be a single number")
            opts.setdefault(scalar, int(value[0]) if scalar == "embedding_size" else float(value[0]))
    if "audio" in stages and not opts.get("sample_rate"):
        raise InputError(f"{path}: has an 'audio' stage but no 'sample_rate'; store one or pass --sample-rate")
    checker = StageChecker(**opts)
    for name in ORDER:
        if name in stages:
            value = stages.pop(name)
            if name == "log_durations":
                checker.durations(value, log_durations=True)
            else:
                checker.check(name, value)
    for name, value in stages.items():
        checker.tensor(name, value)
    for finding in extra:
        checker.add(finding.stage, [finding], kind="durations" if finding.stage == "log_durations" else finding.stage)
    return checker.report(source=str(path))
