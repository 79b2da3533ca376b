"""audio check finds clicks and pops: a sample far from what the signal's recent course predicts, with its time.

Caught at every level from -50 to 0 dBFS, float or 16-bit: a one-sample dropout to 0, a 5 ms pulse, a seam where
a streaming vocoder joins two chunks out of step. Not clicks: onsets out of digital-zero padding (a pluck, a
tone starting at any phase), a plosive-like burst opening a vowel, a sound cut off into silence, a band-limited
sawtooth whose edges repeat. Varied both ways: a gain change, 16-bit rounding or a shift of the whole file keeps
the click (at the shifted time); the same file without it has none. Judged over many healthy signals in
tests/audio/test_levels.py (every check, clicks included: no finding).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from .audio_signals import RATES, as_stored, at_level, healthy_signal, speechlike, t
from tensorprobe.audio import Thresholds, check
from tensorprobe.audio.check import to_frames, to_unit_scale
from tensorprobe.audio.events import prediction_residual, sliding_max

SR = 24_000
AT = int(0.4 * SR)
LEVELS = (-50.0, -30.0, -10.0, 0.0)


def clicks_of(x, sr=SR, **kw):
    v = check(x, sr, **kw).verdict("clicks")
    return v, [c["frame"] for c in v.details.get("clicks", [])]


def voice(level_dbfs: float = -6.0, sr: int = SR, seconds: float = 1.0) -> np.ndarray:
    return at_level(speechlike(seconds, sr), level_dbfs)


def dropout(x, at=AT):
    y = x.copy()
    y[at] = 0.0
    return y


def pulse(x, at=AT, sr=SR, level=None):
    y = x.copy()
    y[at:at + int(0.005 * sr)] = 0.9 * np.abs(x).max() if level is None else level
    return y


def seam(x, at=AT, sr=SR):
    """The second chunk comes 1.3 ms out of step: the waveform jumps where the two meet."""
    y = x.copy()
    y[at:] = np.roll(x, int(0.0013 * sr))[at:]
    return y


def quiet_sample(x, sr, rng):
    """A sample whose surroundings (±30 ms) stay under 0.3 of the peak: a quiet moment, not a noisy one, nor
    the silence just before a sound starts (a pulse there is taken into the onset)."""
    from tensorprobe.audio.events import sliding_max

    half = int(0.03 * sr)
    around = sliding_max(np.abs(x), -half, half + 1)
    where = np.flatnonzero(around < 0.3 * np.abs(x).max())
    where = where[(where > sr // 20) & (where < x.size - sr // 20)]
    assume(where.size > 0)
    return int(rng.choice(where))


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("dtype", ["float32", "int16"])
@pytest.mark.parametrize("make", [dropout, pulse, seam], ids=["dropout", "pulse", "seam"])
def test_a_click_is_found_with_its_time_at_every_level(make, dtype, level):
    x = voice(level)
    at = AT + int(np.argmax(np.abs(x[AT:AT + 120])))    # a loud sample: a dropout there is heard
    v, frames = clicks_of(as_stored(make(x, at), dtype))
    assert v.status == "error" and v.figure >= 1, v.message
    assert any(abs(f - at) <= 2 for f in frames) or (make is pulse and any(abs(f - at - 120) <= 2 for f in frames))
    assert v.message.startswith(f"{v.figure} click") and f"t = {frames[0] / SR:.4f} s" in v.message


def test_the_same_audio_without_the_click_has_none():
    for level in LEVELS:
        for dtype in ("float32", "int16"):
            v, _ = clicks_of(as_stored(voice(level), dtype))
            assert v.status == "ok" and v.figure == 0


def test_truth_kept_a_shift_moves_the_click_by_the_shift():
    x = dropout(voice(-20))
    _, frames = clicks_of(x)
    _, shifted = clicks_of(np.concatenate([np.zeros(SR // 10), x]))   # 100 ms of digital zero in front
    assert shifted == [f + SR // 10 for f in frames]


def test_stereo_clicks_name_their_channel():
    x = voice(-12)
    v = check(np.stack([x, dropout(x)], axis=1), SR).verdict("clicks")
    assert v.status == "error" and [c["channel"] for c in v.details["clicks"]] == [1]


def test_a_pulse_in_silence_is_a_click_and_a_sound_starting_is_not():
    x = np.zeros(SR)
    x[AT:AT + 120] = 0.5                                         # 5 ms of DC between two silences
    v, frames = clicks_of(np.concatenate([voice(-6, seconds=0.3), x, voice(-6, seconds=0.3)]))
    assert v.status == "error" and any(abs(f - (int(0.3 * SR) + AT)) <= 2 for f in frames)


@pytest.mark.parametrize("sr", RATES)
def test_onsets_offsets_and_repeating_edges_are_not_clicks(sr):
    tt = t(0.5, sr)
    rng = np.random.default_rng(sr)
    pad = np.zeros(sr // 10)
    tone = 0.5 * np.sin(2 * np.pi * 110 * tt + 1.3)             # starts at 0.48 and stops mid-cycle
    pluck = sum(np.sin(2 * np.pi * 196 * k * tt + rng.uniform(0, 6)) / k for k in range(1, 30) if 196 * k < sr / 2.2)
    pluck = 0.6 * pluck * np.exp(-tt / 0.3) / np.abs(pluck).max()
    burst = np.convolve(rng.standard_normal(int(0.008 * sr)), [0.5, 0.5], mode="same") * 0.3
    vowel = voice(-6, sr, 0.4)
    plosive = np.concatenate([pad, burst, vowel[: sr // 5] * np.linspace(0.2, 1, sr // 5), vowel[sr // 5:]])
    saw = sum((-1) ** k * np.sin(2 * np.pi * 100 * k * tt) / k for k in range(1, 200) if 100 * k < sr / 2.2)
    for name, x in (("tone", tone), ("pluck", pluck), ("plosive", plosive), ("sawtooth", 0.3 * saw)):
        v, _ = clicks_of(np.concatenate([pad, x, pad]), sr)
        assert v.status == "ok", (name, v.message)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), level=st.floats(-50, 0), dtype=st.sampled_from(["float32", "int16"]),
       kind=st.sampled_from(["chirp", "tremolo", "sine"]), make=st.sampled_from(["pulse", "dropout"]))
def test_a_click_is_found_in_any_tone_at_any_level(seed, level, dtype, kind, make):
    """A 5 ms pulse at 0.9 of the peak at a quiet moment, or a dropout at a loud sample, in a chirp, a tremolo
    or a sine of the healthy corpus (8-48 kHz), at -50 to 0 dBFS, float or 16-bit. (In voices and chords whose
    harmonics fill the band a dropout can sit within the signal's own residual: measured rates in the guide.)"""
    rng = np.random.default_rng(seed)
    h = healthy_signal(seed, kind=kind, level_dbfs=0.0)
    x, sr = at_level(to_unit_scale(to_frames(h.data)[0])[0][:, 0], level), h.sample_rate
    if make == "pulse":
        at = quiet_sample(x, sr, rng)
        y, where = pulse(x, at, sr), (at, at + int(0.005 * sr))
    else:
        at = loud_sample(x, sr, rng)
        y, where = dropout(x, at), (at,)
    v, frames = clicks_of(as_stored(y, dtype), sr)
    assert v.status == "error" and any(abs(f - w) <= 2 for f in frames for w in where), v.message


def loud_sample(x, sr, rng):
    """A sample above half the peak, 30 ms or more from digital silence (the first and last 20 ms of a sound
    are its onset and offset, which no click rule judges)."""
    from tensorprobe.audio.events import sliding_max

    half = int(0.03 * sr)
    silent_near = sliding_max((x == 0).astype(float), -half, half + 1) > 0
    where = np.flatnonzero((np.abs(x) > 0.5 * np.abs(x).max()) & ~silent_near)
    where = where[(where > sr // 20) & (where < x.size - sr // 20)]
    assume(where.size > 0)
    return int(rng.choice(where))


def test_thresholds_change_the_verdict():
    x = dropout(voice(-12))
    assert check(x, SR, Thresholds(max_clicks=1)).verdict("clicks").status == "ok"
    assert check(x, SR, Thresholds(click_ratio=1e6)).verdict("clicks").status == "ok"
    assert check(x, SR, Thresholds(click_level_db=0.0)).verdict("clicks").status == "ok"   # jump under the peak


def test_the_prediction_of_a_tone_is_exact_and_sliding_max_is_brute_force():
    x = 0.5 * np.sin(2 * np.pi * 440 * t(0.2, SR) + 0.3)
    e = prediction_residual(x, SR)
    assert np.abs(e).max() < 1e-4 * 0.5    # -80 dB: the white-noise correction (1e-9 of the power) sets the floor
    a = np.random.default_rng(0).random(300)
    for lo, hi in ((-30, -3), (4, 40), (0, 1)):
        want = [max((a[j] for j in range(i + lo, i + hi) if 0 <= j < a.size), default=0.0) for i in range(a.size)]
        np.testing.assert_array_equal(sliding_max(a, lo, hi), want)


def test_non_finite_audio_leaves_clicks_to_the_non_finite_check():
    x = dropout(voice(-12))
    x[100] = np.nan
    r = check(x, SR)
    assert r.verdict("non_finite").status == "error"
    assert r.verdict("clicks").status == "skipped" and "non_finite" in r.verdict("clicks").message
