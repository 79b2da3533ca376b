"""The red flags of a TTS pipeline, stage by stage (seed 002), as plain functions returning findings.

Each `check_<stage>` takes what the stage produced and returns `(findings, summary)`: a list of
`StageFinding` and a dict of figures that is printed for every stage, flagged or not (the debug print-out
a TTS engineer would otherwise write by hand: "Mel range: [-11.2, -0.1], std 2.3").

    >>> import numpy as np
    >>> findings, summary = check_mel(np.full((80, 50), -4.0))
    >>> [f.check for f in findings], summary["std"]
    (['near_constant'], 0.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from ..audio.check import Thresholds, _jsonable, as_numeric_array
from ..audio.check import check as check_audio_array
from ..errors import InputError

ERROR = "error"
WARNING = "warning"
SPECIAL_TOKENS = ("<unk>", "<pad>", "<s>", "</s>", "<bos>", "<eos>", "<blank>")


@dataclass(frozen=True)
class StageFinding:
    """A red flag at one stage, with the figures that show it."""

    stage: str
    check: str
    severity: str
    message: str
    figures: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "check": self.check, "severity": self.severity, "message": self.message,
                "figures": {k: _jsonable(v) for k, v in self.figures.items()}}


def _f(stage: str, check: str, severity: str, message: str, **figures: Any) -> StageFinding:
    return StageFinding(stage, check, severity, message, figures)


def as_array(x: Any, what: str) -> np.ndarray:
    """numpy view of a numpy/torch/list value (torch converted at the edge)."""
    return as_numeric_array(x, what)


def _nonfinite(stage: str, a: np.ndarray) -> list[StageFinding]:
    if not np.issubdtype(a.dtype, np.floating):
        return []
    bad = ~np.isfinite(a)
    n = int(bad.sum())
    if not n:
        return []
    first = [int(i) for i in np.argwhere(bad)[0]]
    nan = int(np.isnan(a).sum())
    return [_f(stage, "non_finite", ERROR, f"{n} of {a.size} values are non-finite ({nan} NaN, {n - nan} Inf); "
               f"first at index {first}", count=n, nan=nan, inf=n - nan, first_index=first, share=n / a.size)]


def _range_summary(a: np.ndarray) -> dict[str, Any]:
    fin = a[np.isfinite(a)] if np.issubdtype(a.dtype, np.floating) else a
    out: dict[str, Any] = {"shape": list(a.shape), "dtype": str(a.dtype)}
    if fin.size:
        fin = fin.astype(np.float64)
        out.update(min=float(fin.min()), max=float(fin.max()), mean=float(fin.mean()), std=float(fin.std()))
    return out


# ------------------------------------------------------------------------------------------ text, symbols

def check_text(text: str) -> tuple[list[StageFinding], dict[str, Any]]:
    if not isinstance(text, str):
        raise InputError(f"text must be a string, got {type(text).__name__}")
    findings = [] if text.strip() else [_f("text", "empty", ERROR, "the text is empty")]
    return findings, {"chars": len(text), "preview": text[:60]}


def split_symbols(phonemes: str | Sequence[str], vocab: Mapping[str, int] | None) -> list[str]:
    """Phoneme symbols: a list as given; a string per character (Kokoro/IPA), or per whitespace-separated
    token when the vocabulary has multi-character symbols (ARPAbet: "HH AH0 L OW1")."""
    if not isinstance(phonemes, str):
        return [str(p) for p in phonemes]
    multi = vocab is not None and any(len(k) > 1 and k not in SPECIAL_TOKENS for k in vocab)
    return phonemes.split() if multi else list(phonemes)


def check_phonemes(phonemes: str | Sequence[str], vocab: Mapping[str, int] | None = None, *,
                   text: str | None = None, unk_token: str = "<unk>", min_per_char: float = 0.3
                   ) -> tuple[list[StageFinding], dict[str, Any]]:
    """Unknown symbols (not in `vocab`: a pipeline like Kokoro's drops them silently), `<unk>` tokens, and
    too few phonemes for the text."""
    symbols = split_symbols(phonemes, vocab)
    summary: dict[str, Any] = {"symbols": len(symbols), "preview": "".join(symbols[:40]) if isinstance(phonemes, str)
                               else " ".join(symbols[:20])}
    findings = []
    if not symbols:
        findings.append(_f("phonemes", "empty", ERROR, "no phonemes"))
    unk = [i for i, s in enumerate(symbols) if s == unk_token]
    if unk:
        findings.append(_f("phonemes", "unk_tokens", ERROR, f"{len(unk)} {unk_token} symbols (first at position "
                           f"{unk[0]}): the phonemizer and the vocabulary disagree", count=len(unk), first=unk[0]))
    if vocab is not None:
        unknown = [(i, s) for i, s in enumerate(symbols) if s not in vocab and s != unk_token]
        summary["unknown"] = len(unknown)
        if unknown:
            distinct = sorted({s for _, s in unknown})
            findings.append(_f("phonemes", "unknown_symbols", ERROR,
                               f"{len(unknown)} symbols are not in the vocabulary and will be dropped or mapped to "
                               f"<unk>: {', '.join(repr(s) for s in distinct[:10])} (first at position {unknown[0][0]})",
                               count=len(unknown), distinct=distinct, first=unknown[0][0]))
    if text and symbols and len(symbols) < min_per_char * len(text.strip()):
        findings.append(_f("phonemes", "too_few", WARNING, f"only {len(symbols)} phonemes for {len(text.strip())} "
                           f"characters of text", ratio=len(symbols) / len(text.strip())))
    return findings, summary


def vocab_size_of(vocab: Mapping[str, int]) -> int:
    return (max(vocab.values()) + 1) if vocab else 0


def check_ids(ids: Any, *, vocab: Mapping[str, int] | None = None, vocab_size: int | None = None,
              embedding_size: int | None = None, unk_id: int | None = None,
              expected_count: int | None = None) -> tuple[list[StageFinding], dict[str, Any]]:
    """Ids outside [0, vocab size), a vocabulary larger than the model's embedding, all-`<unk>` ids, and
    phonemes lost between the phoneme string and the ids (`expected_count`)."""
    a = as_array(ids, "ids").ravel()
    size = vocab_size or (vocab_size_of(vocab) if vocab else None) or embedding_size
    summary: dict[str, Any] = {"count": int(a.size), "vocab_size": size, "embedding_size": embedding_size}
    findings = _nonfinite("ids", a)
    if a.size == 0:
        return findings + [_f("ids", "empty", ERROR, "no token ids")], summary
    if findings:
        return findings, summary
    if np.issubdtype(a.dtype, np.floating) and not np.all(a == np.round(a)):
        findings.append(_f("ids", "not_integer", ERROR, "token ids are not whole numbers"))
    a = a.astype(np.int64)
    summary.update(min=int(a.min()), max=int(a.max()))
    if vocab and embedding_size is not None and vocab_size_of(vocab) > embedding_size:
        findings.append(_f("ids", "vocab_mismatch", ERROR,
                           f"the vocabulary needs {vocab_size_of(vocab)} ids but the model's embedding has "
                           f"{embedding_size} rows: vocabulary and model come from different trainings",
                           vocab_size=vocab_size_of(vocab), embedding_size=embedding_size))
    limit = min(x for x in (size, embedding_size) if x is not None) if (size or embedding_size) else None
    if limit is not None:
        bad = np.flatnonzero((a < 0) | (a >= limit))
        if bad.size:
            findings.append(_f("ids", "out_of_range", ERROR,
                               f"{bad.size} of {a.size} ids are outside [0, {limit}) (range [{a.min()}, {a.max()}]; "
                               f"first at position {int(bad[0])}, id {int(a[bad[0]])})",
                               count=int(bad.size), first=int(bad[0]), min=int(a.min()), max=int(a.max()), limit=limit))
    if unk_id is not None and a.size and np.mean(a == unk_id) > 0:
        share = float(np.mean(a == unk_id))
        findings.append(_f("ids", "unk_ids", ERROR if share > 0.5 else WARNING,
                           f"{share:.0%} of ids are <unk> ({unk_id})", share=share))
    if expected_count is not None and abs(int(a.size) - expected_count) > 2:
        findings.append(_f("ids", "count_mismatch", WARNING, f"{a.size} ids for {expected_count} phonemes: "
                           f"{expected_count - a.size:+d} symbols lost or added on the way", ids=int(a.size),
                           phonemes=expected_count))
    return findings, summary


# ------------------------------------------------------------------------------------------ durations

def check_durations(durations: Any, *, max_frames: float = 200,
                    clamp: tuple[float | None, float | None] | None = None,
                    log_durations: bool = False) -> tuple[list[StageFinding], dict[str, Any]]:
    """Durations (frames per token): extreme values (seed 002: 1000+ frames per phoneme), negative or zero
    durations, values pinned at a clamp bound and uniform durations (a duration predictor that is not working).

    `clamp` is the predictor's (lower, upper) bound, either may be None (Kokoro: `(1, None)`, it rounds then
    clamps at 1 frame). See `_clamp_findings` for what counts as pinned with and without a known bound."""
    a = as_array(durations, "durations").astype(np.float64).ravel()
    findings = _nonfinite("durations", a)
    if log_durations:
        with np.errstate(over="ignore"):
            a = np.exp(a)
    fin = a[np.isfinite(a)]
    summary: dict[str, Any] = {"tokens": int(a.size)}
    if fin.size == 0:
        return findings + ([] if a.size else [_f("durations", "empty", ERROR, "no durations")]), summary
    summary.update(total_frames=float(fin.sum()), min=float(fin.min()), max=float(fin.max()), mean=float(fin.mean()))
    big = np.flatnonzero(a > max_frames)
    if big.size:
        findings.append(_f("durations", "extreme", ERROR,
                           f"{big.size} tokens last more than {max_frames:g} frames (max {fin.max():.4g} at token "
                           f"{int(np.argmax(np.where(np.isfinite(a), a, -np.inf)))}): is the duration predictor clamped?",
                           count=int(big.size), max=float(fin.max()), limit=max_frames))
    if (fin < 0).any():
        findings.append(_f("durations", "negative", ERROR, f"{int((fin < 0).sum())} negative durations",
                           count=int((fin < 0).sum())))
    zeros = int((fin == 0).sum())
    if zeros:
        findings.append(_f("durations", "zero", WARNING, f"{zeros} tokens get 0 frames (they are skipped)",
                           count=zeros))
    findings += _clamp_findings(fin, clamp)
    return findings, summary


# Share of tokens at a known bound that is (an error, a warning). Many tokens legitimately get the shortest
# duration a rounding head gives (stress marks, spaces, short phones: about a quarter of Kokoro's tokens at
# speed 1, over half at speed 2, up to 3 in 4 in a short utterance), so only nearly all tokens at the lower
# bound say "pinned": the predictor then decides nothing. Reaching the upper bound is rare in healthy speech.
PINNED_SHARE = {"lower": (0.9, 0.9), "upper": (0.5, 0.2)}
TIED_SHARE = (0.5, 0.2)   # continuous durations tied at an extreme: only a clamp makes real numbers tie


def _clamp_findings(a: np.ndarray, clamp: tuple[float | None, float | None] | None) -> list[StageFinding]:
    """Durations pinned at a clamp bound, or all equal.

    With a known bound: the share of tokens sitting exactly at it (`PINNED_SHARE`). Without one, an identical
    extreme is suspicious only where ties can't happen by themselves: continuous durations tied at their min
    or max (`TIED_SHARE`); for whole-frame durations ties are normal, so only most tokens at 1 frame (the
    lower bound of a round-then-clamp head) is a warning, which a known clamp turns into an error."""
    if a.size < 4:
        return []
    lo, hi = clamp if clamp else (None, None)
    for side, bound in (("lower", lo), ("upper", hi)):
        if bound is not None and (found := _pinned(a, side, bound, PINNED_SHARE[side], "the clamp bound")):
            return [found]
    if np.all(a == a[0]):
        hint = " (1 frame: the lower bound of a round-then-clamp duration head)" if a[0] == 1 else ""
        return [_f("durations", "uniform", WARNING, f"all {a.size} durations are {a[0]:g}{hint}: the duration "
                   f"predictor is not predicting (uniform durations)", value=float(a[0]))]
    whole = bool(np.all(a == np.round(a)))
    for side, bound, value in (("lower", lo, float(a.min())), ("upper", hi, float(a.max()))):
        if bound is not None:
            continue
        if not whole:
            found = _pinned(a, side, value, TIED_SHARE, "one identical value (continuous durations tie only "
                                                        "at a clamp)")
        elif side == "lower" and value == 1:
            found = _pinned(a, side, value, (math.inf, PINNED_SHARE["lower"][0]),
                            "1 frame, the lower bound of a round-then-clamp head (pass the model's clamp to "
                            "make this an error)")
        else:
            found = None
        if found:
            return [found]
    return []


def _pinned(a: np.ndarray, side: str, bound: float, shares: tuple[float, float], what: str) -> StageFinding | None:
    at_bound = int(np.sum(a == bound))
    share = at_bound / a.size
    error, warning = shares
    if share < warning or at_bound < 2:   # one token is the extreme; it takes two to tie
        return None
    verb = "is" if share >= error else "may be"
    return _f("durations", "clamped", ERROR if share >= error else WARNING,
              f"{share:.0%} of durations sit exactly at {bound:g}, {what}: the duration predictor {verb} pinned "
              f"at its {side} bound", bound=bound, share=share, side=side)


# ------------------------------------------------------------------------------------------ mel, latents

MEL_MIN_STD_SHARE = 0.01   # a mel whose std is under 1% of the expected range's width is nearly constant


def check_mel(mel: Any, *, mel_range: tuple[float, float] = (-11.5, 0.0), tolerance: float = 0.5,
              max_out_share: float = 0.01, min_std: float | None = None, n_mels: int | None = None,
              expected_frames: float | None = None) -> tuple[list[StageFinding], dict[str, Any]]:
    """A log-mel spectrogram: NaN/Inf, values outside `mel_range` (seed 002: [-15, 5] instead of about
    [-11.5, 0]), nearly constant, wrong mel-band count, frames not matching the durations.

    Nearly constant means a std below `min_std`, by default `MEL_MIN_STD_SHARE` of the range's width (0.115
    for [-11.5, 0]; seed 002's collapsed model had 0.0001, healthy speech 1-4). Gain is an offset in a log
    mel, so a quiet but healthy mel keeps its std (speech 60 dB quieter still has ~1.5); it gets a `quiet`
    note when even its maximum sits in the lower half of the range."""
    raw = as_array(mel, "mel")
    a = raw.astype(np.float64)
    findings = _nonfinite("mel", a)
    summary = {**_range_summary(a), "dtype": str(raw.dtype)}
    fin = a[np.isfinite(a)]
    if fin.size == 0:
        return findings + ([] if a.size else [_f("mel", "empty", ERROR, "the mel spectrogram is empty")]), summary
    lo, hi = mel_range
    out = float(np.mean((fin < lo - tolerance) | (fin > hi + tolerance)))
    summary["out_of_range_share"] = out
    if out > 0:
        findings.append(_f("mel", "out_of_range", ERROR if out > max_out_share else WARNING,
                           f"mel range [{fin.min():.3g}, {fin.max():.3g}] leaves the expected [{lo:g}, {hi:g}] "
                           f"({out:.1%} of values outside)", min=float(fin.min()), max=float(fin.max()),
                           share=out, expected=[lo, hi]))
    limit = MEL_MIN_STD_SHARE * (hi - lo) if min_std is None else min_std
    if fin.std() < limit:
        what = (f"silence: every value sits at the floor {lo:g}" if fin.max() <= lo + tolerance
                else "a collapsed model")
        findings.append(_f("mel", "near_constant", ERROR, f"mel is nearly constant: std {fin.std():.3g} "
                           f"(< {limit:.3g}) around {fin.mean():.3g} — {what}", std=float(fin.std()),
                           mean=float(fin.mean()), limit=limit))
    elif fin.max() < lo + 0.5 * (hi - lo):
        summary["notes"] = [f"quiet: the mel peaks at {fin.max():.3g}, in the lower half of the expected range "
                            f"[{lo:g}, {hi:g}]; the level alone is not an error"]
    findings += _mel_shape_findings(a.shape, n_mels, expected_frames)
    return findings, summary


def _mel_shape_findings(shape: tuple[int, ...], n_mels: int | None, expected_frames: float | None
                        ) -> list[StageFinding]:
    dims = [d for d in shape if d != 1]
    if n_mels is None or len(dims) != 2:
        return []
    if n_mels not in dims:
        return [_f("mel", "n_mels", WARNING, f"shape {list(shape)} has no axis of {n_mels} mel bands",
                   shape=list(shape))]
    frames = dims[1] if dims[0] == n_mels else dims[0]
    if expected_frames is not None and abs(frames - expected_frames) > 2:
        return [_f("mel", "frames_mismatch", WARNING, f"mel has {frames} frames but the durations add up to "
                   f"{expected_frames:g}", frames=frames, expected=expected_frames)]
    return []


def _std_rms(a: np.ndarray) -> tuple[float, float]:
    """std and RMS of finite values, measured on values divided by their peak (no overflow at 1e300)."""
    peak = float(np.abs(a).max()) if a.size else 0.0
    if peak == 0:
        return 0.0, 0.0
    u = a / peak
    return float(u.std()) * peak, float(np.sqrt(np.mean(u * u))) * peak


LATENT_STUCK_RATIO = 1e-3   # std below this share of the RMS: stuck at one value, whatever the scale


def check_latents(latents: Any, *, min_std: float = 1e-3, max_abs: float = 1e4, stage: str = "latents"
                  ) -> tuple[list[StageFinding], dict[str, Any]]:
    """Latents / features between stages (seed 003: CFM latents): NaN/Inf, all zero, exploding, and nearly
    constant: stuck at a value (std under `LATENT_STUCK_RATIO` of the RMS, at any scale) or a std under
    `min_std` (latents live at a scale the model sets, so near-zero latents are a collapse, not a quiet take)."""
    raw = as_array(latents, stage)
    a = raw.astype(np.float64)
    findings = _nonfinite(stage, a)
    summary = {**_range_summary(a), "dtype": str(raw.dtype)}
    fin = a[np.isfinite(a)]
    if fin.size == 0:
        return findings + ([] if a.size else [_f(stage, "empty", ERROR, f"{stage} is empty")]), summary
    std, rms = _std_rms(fin)
    if not fin.any():
        findings.append(_f(stage, "all_zero", ERROR, f"{stage} is all zeros"))
    elif std < LATENT_STUCK_RATIO * rms:
        findings.append(_f(stage, "near_constant", ERROR, f"{stage} is stuck near {fin.mean():.4g}: std {std:.3g} "
                           f"is {-20 * math.log10(max(std / rms, 1e-12)):.0f} dB below its level (RMS {rms:.3g})",
                           std=std, rms=rms, mean=float(fin.mean())))
    elif std < min_std:
        findings.append(_f(stage, "near_constant", ERROR, f"{stage} is nearly constant: std {std:.3g} "
                           f"(< {min_std:g}) around {fin.mean():.3g}: collapsed toward a value (seed 003's "
                           f"near-zero latents)", std=std, rms=rms, mean=float(fin.mean())))
    peak = float(np.abs(fin).max())
    if peak > max_abs:
        findings.append(_f(stage, "exploding", ERROR, f"{stage} reaches {peak:.4g} (> {max_abs:g})", max_abs=peak))
    return findings, summary


def check_tensor(name: str, x: Any) -> tuple[list[StageFinding], dict[str, Any]]:
    """Any other intermediate: only NaN/Inf is a red flag; the range is summarised."""
    a = as_array(x, name)
    return _nonfinite(name, a), _range_summary(a)


def check_audio(audio: Any, sample_rate: float, thresholds: Thresholds | None = None
                ) -> tuple[list[StageFinding], dict[str, Any]]:
    """The audio health check (`tensorprobe.audio.check`); each fired verdict becomes a finding."""
    r = check_audio_array(audio, sample_rate, thresholds, source="audio")
    findings = [_f("audio", v.check, v.status, v.message, figure=v.figure, threshold=v.threshold)
                for v in r.verdicts if v.fired]
    f = r.figures
    summary = {"duration_s": r.duration_s, "sample_rate": sample_rate, "peak": f.get("peak"),
               "peak_dbfs": f.get("peak_dbfs"), "rms_dbfs": f.get("rms_dbfs"), "std": f.get("std"),
               "health": r.status}
    if r.notes:
        summary["notes"] = list(r.notes)
    return findings, summary
