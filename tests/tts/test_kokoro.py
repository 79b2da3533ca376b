"""The Kokoro-shaped pipeline (real Kokoro-82M decoder code, random weights) through the stage checker."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

pytestmark = pytest.mark.slow
SHORT = "hˈI"  # 3 symbols + 2 pads: ~0.5 s of audio


@pytest.fixture(scope="module")
def pipeline():
    pytest.importorskip("kokoro", reason="needs the kokoro extra: pip install 'tensorprobe[kokoro]'")
    from tensorprobe.tts.kokoro import KokoroPipeline

    return KokoroPipeline(seed=0)


def findings(report):
    return [(f.stage, f.check, f.severity) for f in report.findings]


def test_clean_run_produces_audio_and_times_every_stage(pipeline):
    audio, report = pipeline.run(SHORT)
    assert audio is not None and audio.ndim == 1 and np.isfinite(audio).all()
    assert report.summaries["ids"]["count"] == 5 and report.summaries["ids"]["max"] == 156
    frames = report.summaries["durations"]["total_frames"]
    assert audio.size == frames * 600  # Kokoro: 600 samples (25 ms) per frame at 24 kHz
    assert [t.stage for t in report.timings] == ["phonemes", "ids", "durations", "features", "decoder"]
    assert report.timings[-1].wall_s > 0 and report.timings[-1].rss_peak_growth_bytes is not None
    assert not report.errors, findings(report)


@pytest.mark.parametrize("fault,expected", [
    ("unknown-symbols", ("phonemes", "unknown_symbols", "error")),
    ("oov-id", ("ids", "out_of_range", "error")),
    ("long-durations", ("durations", "extreme", "error")),
])
def test_faults_stop_at_the_stage_that_broke(pipeline, fault, expected):
    audio, report = pipeline.run(SHORT, fault=fault)
    assert audio is None
    assert findings(report) == [expected]
    assert report.stopped_after == expected[0] and report.first_bad_stage == expected[0]


def test_nan_decoder_gives_all_nan_audio_then_recovers(pipeline):
    audio, report = pipeline.run(SHORT, fault="nan")
    assert findings(report) == [("audio", "non_finite", "error")]
    assert report.findings[0].figures["figure"] == audio.size  # every sample is NaN
    clean, again = pipeline.run(SHORT)  # the broken norm is swapped out again after the run
    assert np.isfinite(clean).all()


def test_unvoiced_decoder_explodes_in_scale(pipeline):
    audio, report = pipeline.run(SHORT, fault="unvoiced")
    assert ("audio", "scale", "error") in findings(report)
    assert np.abs(audio).max() > 10


def test_cli_demo_with_a_fault_exits_1():
    pytest.importorskip("kokoro")
    from tensorprobe.cli import app

    res = CliRunner().invoke(app, ["tts", "demo", SHORT, "--fault", "oov-id", "--json"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    assert doc["report"]["first_bad_stage"] == "ids"
    res = CliRunner().invoke(app, ["tts", "demo", "--fault", "bogus"])
    assert res.exit_code == 2 and "unknown fault" in res.output
