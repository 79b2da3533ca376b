"""audio diff: alignment, SNR, log-mel figures, and a verdict that tells phase from magnitude."""

from __future__ import annotations

import numpy as np
import pytest

from .audio_signals import SR, sine, speechlike, t
from tensorprobe.audio import diff
from tensorprobe.errors import InputError


def test_identical_signals_are_zero_db_apart():
    x = speechlike()
    d = diff(x, x.copy(), SR)
    assert d.verdict == "identical" and d.status == "ok"
    assert d.mel["mean_db"] == 0.0 and d.mel["max_db"] == 0.0
    assert d.snr_db == float("inf") and d.to_dict()["snr_db"] == "inf"   # JSON's rule (tensorprobe.numbers)
    assert d.corr_after == pytest.approx(1.0)


@pytest.mark.parametrize("lag", [160, -37, 0])
def test_recovers_a_known_lag(lag):
    x = np.random.default_rng(1).normal(0, 0.1, SR)
    cand = np.concatenate([np.zeros(lag), x])[:SR] if lag >= 0 else x[-lag:]
    d = diff(x, cand, SR)
    assert d.lag_frames == lag
    assert d.corr_after == pytest.approx(1.0, abs=1e-9)
    assert d.snr_db == float("inf")  # aligned overlap is sample-identical


@pytest.mark.parametrize("snr", [10.0, 20.0, 30.0])
def test_snr_of_known_added_noise(snr):
    x = speechlike()
    rng = np.random.default_rng(2)
    noise = rng.normal(0, 1, x.size)
    noise *= np.sqrt(np.sum(x ** 2) / np.sum(noise ** 2) / 10 ** (snr / 10))  # exactly `snr` dB
    d = diff(x, x + noise, SR)
    assert d.lag_frames == 0
    assert d.snr_db == pytest.approx(snr, abs=0.01)
    assert d.verdict == "differs"  # broadband noise fills the quiet bins: a real, audible difference


def test_phase_drifting_sine_is_magnitude_matches_phase_differs():
    tt = t()
    ref = 0.5 * np.sin(2 * np.pi * 220 * tt)
    cand = 0.5 * np.sin(2 * np.pi * 220 * tt + 2 * np.pi * 0.5 * np.sin(2 * np.pi * tt))  # slow phase wander
    d = diff(ref, cand, SR)
    assert abs(d.corr_after) < 0.5
    assert d.mel["corr"] > 0.99
    assert d.verdict == "phase_differs" and d.label == "magnitude matches, phase differs"
    assert d.status == "ok"


def test_negative_correlation_with_matching_spectrogram_is_phase_only():
    tt = t()
    ref = speechlike()
    # the same harmonics with every phase rotated: waveform correlation far from 1, spectrum the same
    cand = sum((0.4 / k) * np.sin(2 * np.pi * 140 * k * tt + k + np.pi * (k % 3 + 0.5))
               for k in range(1, 25) if 140 * k < SR / 2)
    cand = 0.5 * cand * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * tt) ** 2)
    cand /= np.abs(sum((0.4 / k) * np.sin(2 * np.pi * 140 * k * tt + k) for k in range(1, 25))).max()
    d = diff(ref, cand, SR)
    assert d.corr_after is not None and d.corr_after < 0.9
    assert d.verdict == "phase_differs", d.reasons


def test_correlated_waveforms_with_a_band_off_is_a_real_difference():
    tt = t()
    ref = speechlike()
    boost = sum((0.4 / k) * np.sin(2 * np.pi * 140 * k * tt + k) for k in range(15, 25))
    scale = 0.5 / np.abs(sum((0.4 / k) * np.sin(2 * np.pi * 140 * k * tt + k) for k in range(1, 25))).max()
    cand = ref + scale * boost * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * tt) ** 2)  # +6 dB above 2.1 kHz
    d = diff(ref, cand, SR)
    assert d.corr_after > 0.95
    assert d.verdict == "differs" and d.status == "finding"
    assert d.reasons[0].startswith("waveforms correlate")
    lo, hi = d.mel["worst_band"]["hz"]
    assert lo > 2000 and d.mel["worst_band"]["mean_db"] == pytest.approx(6.0, abs=0.5)


def test_scaled_candidate_reports_the_level():
    x = speechlike()
    d = diff(x, x * 1e9, SR)
    assert d.verdict == "differs"
    assert d.level_db == pytest.approx(180.0, abs=1e-6)
    assert d.mel["signed_mean_db"] > 100


def test_different_sample_rates_are_resampled():
    d = diff(sine(seconds=0.5), sine(seconds=0.5, sr=32000), SR, cand_sample_rate=32000)
    assert d.verdict in ("match", "identical") and any("resampled" in n for n in d.notes)


def test_length_difference_is_a_finding():
    x = speechlike()
    d = diff(x, x[: SR // 2], SR)
    assert d.length_diff_frames == -SR // 2 and d.status == "finding"
    assert "0.500 s shorter than the reference" in d.reasons[0]


def test_bad_input():
    """NaN and empty audio are findings (tests/audio/test_compare_rules.py); what is left is bad input."""
    with pytest.raises(InputError, match="sample rate must be positive"):
        diff(sine(), sine(), 0)
    with pytest.raises(InputError, match="too short to compare"):
        diff(sine()[:10], sine()[:10], SR)


def test_html_page_is_self_contained_and_escaped(tmp_path):
    from tensorprobe.report.audio import write_diff_html

    x = speechlike(0.5)
    d = diff(x, np.roll(x, 5), SR, names=("<script>alert(1)</script>.wav", "cand & co.wav"))
    page = write_diff_html(d, tmp_path / "d.html").read_text()
    assert "<script>alert(1)" not in page and "&lt;script&gt;" in page and "cand &amp; co.wav" in page
    assert page.count("data:image/png;base64,") == 4  # 2 spectrograms, their difference, the waveforms
    assert "http://" not in page and "https://" not in page
