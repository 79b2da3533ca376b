"""Each failure mode gives its own verdict with the right figure; a clean sine passes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from .audio_signals import SR, sine
from tensorprobe.audio import Thresholds, check
from tensorprobe.errors import InputError


def fired(report):
    return {v.check: v.status for v in report.verdicts if v.fired}


def test_sine_passes_every_check():
    r = check(sine(), SR)
    assert r.status == "ok" and fired(r) == {}
    assert r.figures["peak"] == pytest.approx(0.5, rel=1e-3)
    assert r.verdict("silence").figure == pytest.approx(-6.02, abs=0.01)


def test_silence_is_an_error_with_its_level():
    r = check(np.zeros(SR), SR)
    assert fired(r) == {"silence": "error"}
    assert r.verdict("silence").figure == -240.0  # digital zero
    quiet = check(sine(amp=1e-4), SR)
    assert fired(quiet) == {"silence": "error"}
    assert quiet.verdict("silence").figure == pytest.approx(-80.0, abs=0.01)


def test_nan_samples_are_counted_with_first_index():
    x = sine()
    x[1234] = np.nan
    x[5000:5010] = np.inf
    r = check(x, SR)
    v = r.verdict("non_finite")
    assert v.status == "error" and v.figure == 11
    assert v.details["first_frame"] == 1234 and v.details["nan"] == 1 and v.details["inf"] == 10
    assert r.verdict("silence").status == "ok"  # other checks still run on the finite samples


def test_all_nan_skips_signal_checks():
    r = check(np.full(SR, np.nan, dtype=np.float32), SR)
    assert fired(r) == {"non_finite": "error"}
    assert r.verdict("silence").status == "skipped"


def test_float_audio_at_1e9_is_absurd_scale():
    r = check((sine() * 2e9).astype(np.float32), SR)
    assert fired(r) == {"scale": "error"}
    assert r.verdict("scale").figure == pytest.approx(1e9, rel=1e-3)


def test_slightly_over_full_scale_is_a_warning():
    r = check(sine(amp=1.3), SR)
    assert r.verdict("scale").status == "warning"


def test_integer_pcm_is_scaled_and_never_absurd():
    r = check((sine() * 32767).astype(np.int16), SR)
    assert r.status == "ok" and r.verdict("scale").status == "skipped"
    assert r.figures["peak"] == pytest.approx(0.5, rel=1e-3)


def test_clipped_signal():
    r = check(np.clip(sine(amp=3.0), -1, 1), SR)
    v = r.verdict("clipping")
    assert v.status == "error" and v.figure > 0.5
    assert v.details["longest_run"] >= 10
    mild = np.clip(sine(amp=1.02), -1, 1)  # only the crests are flattened
    assert check(mild, SR).verdict("clipping").status in ("warning", "error")


def test_full_scale_sine_is_not_clipping():
    assert check(sine(amp=1.0), SR).verdict("clipping").status == "ok"
    assert check(sine(100, amp=1.0, sr=48000), 48000).verdict("clipping").status == "ok"


def test_dc_offset():
    r = check(sine(amp=0.3) + 0.25, SR)
    assert fired(r) == {"dc_offset": "warning"}
    v = r.verdict("dc_offset")
    assert v.details["mean"] == pytest.approx(0.25, abs=1e-3)
    assert v.figure == pytest.approx(0.25 / 0.55, abs=1e-3)   # a share of the channel's peak
    assert r.status == "warning" and r.ok  # a warning does not fail the check
    quiet = check((sine(amp=0.3) + 0.25) * 1e-2, SR)   # the same offset 40 dB down is the same offset
    assert fired(quiet) == {"dc_offset": "warning"}
    assert check(sine(amp=0.3) + 0.01, SR).verdict("dc_offset").status == "ok"   # 3% of the peak


def test_stuck_value_is_near_constant():
    r = check(np.full(SR, 0.3), SR)
    assert r.verdict("near_constant").status == "error"


def test_white_noise_is_noise_like():
    x = np.random.default_rng(0).normal(0, 0.1, SR)
    r = check(x, SR)
    assert fired(r) == {"noise_like": "error"}
    assert r.verdict("noise_like").figure > 0.9


def test_empty_and_too_short():
    r = check(np.zeros(0, dtype=np.float32), SR)
    assert fired(r) == {"length": "error"}
    assert check(sine(seconds=0.01), SR).verdict("length").status == "warning"


def test_sample_rate_and_layout():
    assert check(sine(), 0).verdict("sample_rate").status == "error"
    assert check(sine(), 4000).verdict("sample_rate").status == "warning"
    stereo = np.stack([sine(), sine(330)])  # (channels, frames), torch-style
    r = check(torch.from_numpy(stereo), SR)
    assert r.channels == 2 and r.frames == SR and "(channels, frames)" in r.layout
    spectrogram = check(np.zeros((80, 200)), SR)
    assert spectrogram.verdict("channels").status == "error"
    assert check(np.zeros((1, 1, SR)), SR).channels == 1  # decoder output [1, 1, N]


def test_thresholds_can_be_overridden():
    quiet = sine(amp=0.01)  # -40 dBFS
    assert check(quiet, SR).verdict("silence").status == "ok"
    t = Thresholds().with_overrides({"silence_peak_dbfs": "-30"})
    assert check(quiet, SR, t).verdict("silence").status == "error"
    assert dataclasses.replace(Thresholds(), absurd_peak=1e12).absurd_peak == 1e12
    with pytest.raises(InputError, match="unknown threshold 'nope'"):
        Thresholds().with_overrides({"nope": 1})
    with pytest.raises(InputError, match="not a number"):
        Thresholds().with_overrides({"dc_offset": "abc"})


def test_non_numeric_input_is_an_input_error():
    with pytest.raises(InputError, match="numeric"):
        check(np.array(["a", "b"]), SR)


@pytest.mark.parametrize("n,nperseg", [(24000, 1024), (1001, 128), (300, 300), (777, 64)])
def test_welch_psd_is_scipys_welch(n, nperseg):
    from scipy.signal import welch

    from tensorprobe.audio.check import welch_psd

    x = np.random.default_rng(n).standard_normal(n) + 0.3
    _, want = welch(x, fs=24000.0, nperseg=nperseg)
    np.testing.assert_allclose(welch_psd(x, 24000.0, nperseg), want, rtol=1e-10, atol=0)
