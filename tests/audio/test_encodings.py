"""Clipping is counted at the encoding's full scale on each polarity, so the verdict does not change with the
file's subtype.

Two's-complement PCM holds -32768 but only +32767: a signal hard-clipped at ±0.99 and written as PCM_16 reads
back as +0.98999 / -0.99002, and only its negative half was counted (the issue's case: float WAV 5.5% ERROR,
PCM_16 2.76% WARNING). Varied both ways: the same clipped signal in every subtype gives the same count (truth
kept); the same signal left unclipped, or clipped on one polarity only, follows (truth changed).
"""

from __future__ import annotations

import numpy as np
import pytest
import soundfile as sf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .audio_signals import healthy_signal, t
from tensorprobe.audio import check, check_file
from tensorprobe.audio.check import Encoding

SR = 16_000
EXACT = [("wav", "FLOAT"), ("wav", "DOUBLE"), ("wav", "PCM_16"), ("wav", "PCM_24"), ("wav", "PCM_32"),
         ("flac", "PCM_16"), ("flac", "PCM_24")]


def clipped_voice(gain: float = 1.3, at: float = 0.99, seed: int = 0) -> np.ndarray:
    x = healthy_signal(seed, kind="voice", level_dbfs=0).data.astype(np.float64)[:, 0]
    x = np.concatenate([x, x, x])[: 2 * SR]
    return np.clip(gain * x, -at, at)


def clipping_of(tmp_path, x: np.ndarray, ext: str, subtype: str):
    path = tmp_path / f"x_{subtype}.{ext}"
    sf.write(path, x, SR, subtype=subtype)
    return check_file(path).verdict("clipping")


def test_the_same_clipped_signal_gives_the_same_verdict_in_every_subtype(tmp_path):
    x = clipped_voice()
    reference = check(x, SR).verdict("clipping")
    assert reference.status == "error" and reference.details["clipped_samples"] > 0
    for ext, subtype in EXACT:
        v = clipping_of(tmp_path, x, ext, subtype)
        assert (v.status, v.details["clipped_samples"]) == (reference.status,
                                                            reference.details["clipped_samples"]), (subtype, v.message)


def test_both_polarities_count_in_pcm_16(tmp_path):
    """The issue's case: the positive half of a ±0.99 clip is stored as 0.98999 and was not counted."""
    tt = t(1.0, SR)
    x = np.clip(1.3 * np.sin(2 * np.pi * 220 * tt), -0.99, 0.99)
    float_v = clipping_of(tmp_path, x, "wav", "FLOAT")
    pcm_v = clipping_of(tmp_path, x, "wav", "PCM_16")
    assert pcm_v.figure == pytest.approx(float_v.figure) and pcm_v.status == float_v.status == "error"
    s = np.sin(2 * np.pi * 220 * tt)
    positive_only = np.where(s > 0, np.minimum(1.3 * s, 0.99), 0.9 * s)   # clipped on one polarity
    half = clipping_of(tmp_path, positive_only, "wav", "PCM_16")
    assert half.figure == pytest.approx(float_v.figure / 2, rel=0.01) and half.status == "error"


def test_an_unclipped_signal_near_full_scale_is_not_clipping_in_any_subtype(tmp_path):
    """Truth kept: peaks at 0.98 of full scale (just under the clip level) are never a flat run at full scale."""
    x = healthy_signal(1, kind="voice", level_dbfs=0).data.astype(np.float64)[:, 0]
    x = 0.98 * x / np.abs(x).max()
    for ext, subtype in EXACT + [("wav", "PCM_U8")]:
        assert clipping_of(tmp_path, x, ext, subtype).status == "ok", subtype


def test_a_clip_at_full_scale_in_pcm_is_not_a_stuck_value(tmp_path):
    """The positive clip level of PCM_16 (0.98999) is below 0.99: it used to count as a held value."""
    path = tmp_path / "c.wav"
    sf.write(path, clipped_voice(gain=2.0), SR, subtype="PCM_16")
    r = check_file(path)
    assert r.verdict("clipping").status == "error" and r.verdict("stuck").status == "ok"


@pytest.mark.parametrize("subtype", ["PCM_U8", "ULAW", "ALAW"])
def test_coarse_encodings_count_both_polarities(tmp_path, subtype):
    """8-bit PCM and G.711 (µ-law tops out at 0.980, A-law at 0.984 of full scale) clip at their own top."""
    tt = t(1.0, SR)
    x = np.clip(1.3 * np.sin(2 * np.pi * 220 * tt), -0.99, 0.99)
    data, _ = sf.read(_write(tmp_path, x, subtype))
    r = check_file(tmp_path / f"x_{subtype}.wav").verdict("clipping")
    top = data >= data.max() - 1e-9
    bottom = data <= data.min() + 1e-9
    assert r.status == "error" and top.sum() > 0.1 * data.size and bottom.sum() > 0.1 * data.size
    assert r.details["clipped_samples"] >= 0.9 * (top.sum() + bottom.sum())


def _write(tmp_path, x, subtype):
    path = tmp_path / f"x_{subtype}.wav"
    sf.write(path, x, SR, subtype=subtype)
    return path


def test_integer_arrays_carry_their_encoding():
    x = clipped_voice()
    as_int16 = np.round(x * 32768).clip(-32768, 32767).astype(np.int16)
    assert check(as_int16, SR).verdict("clipping").details["clipped_samples"] == \
        check(x, SR).verdict("clipping").details["clipped_samples"]
    assert Encoding.of(None, np.dtype(np.int16)).positive == 1 - 2 ** -15
    assert Encoding.of("PCM_24").step == 2 ** -23 and Encoding.of("FLOAT") is None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(gain=st.floats(1.05, 4.0), at=st.floats(0.99, 1.0), seed=st.integers(0, 1000),
       subtype=st.sampled_from(["PCM_16", "PCM_24", "PCM_32"]))
def test_any_hard_clip_counts_the_same_as_float_and_as_pcm(tmp_path, gain, at, seed, subtype):
    x = clipped_voice(gain, at, seed)
    float_v = clipping_of(tmp_path, x, "wav", "FLOAT")
    pcm_v = clipping_of(tmp_path, x, "wav", subtype)
    assert pcm_v.details["clipped_samples"] == float_v.details["clipped_samples"]
    assert pcm_v.status == float_v.status
