"""An output too short to be speech (under 10 ms at its own sample rate) is an error, not a warning."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import soundfile as sf
from typer.testing import CliRunner

from .audio_signals import RATES, speechlike
from tensorprobe.audio import check
from tensorprobe.audio.check import Thresholds
from tensorprobe.cli import app

runner = CliRunner()


def test_a_40_sample_decoder_output_is_an_error():
    # 40 samples at 24 kHz (1.7 ms): the length a decoder gives when its durations collapsed.
    r = check(speechlike(1.0, 24000)[:40], 24000)
    v = r.verdict("length")
    assert r.status == "error" and v.status == "error"
    assert v.figure == 40 and v.threshold == 0.01
    assert "too short to be speech" in v.message and "1.67 ms" in v.message and "24000 Hz" in v.message


@pytest.mark.parametrize("sr", RATES)
def test_the_limit_is_10_ms_at_the_audio_own_rate(sr):
    n = math.ceil(sr / 100)          # the fewest frames that last 10 ms at this rate (221 at 22050 Hz)
    x = speechlike(1.0, sr)
    assert check(x[: n - 1], sr).verdict("length").status == "error"
    assert check(x[:n], sr).verdict("length").status == "warning"   # 10 ms: short (under 50 ms), not an error
    assert check(x[: math.ceil(sr / 20)], sr).verdict("length").status == "ok"


@pytest.mark.parametrize("make", [lambda n: np.zeros(n), lambda n: speechlike(1.0, 24000)[:n],
                                  lambda n: np.full(n, np.nan), lambda n: (0.3 * np.ones(n)).astype(np.float32)])
def test_the_length_verdict_does_not_depend_on_the_content(make):
    # Same 40 samples, whatever they hold (silent, speech-like, NaN, a held value): too short is its own error.
    assert check(make(40), 24000).verdict("length").status == "error"
    # the same 40 samples read as 4 kHz audio last 10 ms: no longer too short to be speech
    assert check(make(40), 4000).verdict("length").status == "warning"


def test_the_limit_is_a_threshold():
    x = speechlike(1.0, 24000)[:40]
    assert check(x, 24000, Thresholds(min_speech_s=0.001)).verdict("length").status == "warning"
    assert check(speechlike(1.0, 24000)[:480], 24000,
                 dataclasses.replace(Thresholds(), min_speech_s=0.03)).verdict("length").status == "error"
    assert Thresholds().with_overrides({"min_speech_s": "0.005"}).min_speech_s == 0.005


def test_cli_exit_codes_and_override(tmp_path):
    p = tmp_path / "short.wav"
    sf.write(p, speechlike(1.0, 24000)[:40], 24000, subtype="PCM_16")
    res = runner.invoke(app, ["audio", "check", str(p)])
    assert res.exit_code == 1 and "too short to be speech" in " ".join(res.output.split())
    res = runner.invoke(app, ["audio", "check", str(p), "-t", "min_speech_s=0.001", "--json"])
    doc = json.loads(res.stdout)
    assert res.exit_code == 0, res.output
    assert [v["status"] for v in doc["files"][0]["verdicts"] if v["check"] == "length"] == ["warning"]
