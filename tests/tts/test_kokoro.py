"""The Kokoro-shaped pipeline (real Kokoro-82M decoder code, random weights) through the stage checker."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from ..audio.audio_signals import as_stored, at_level, statuses

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
    ("pinned-durations", ("durations", "clamped", "error")),   # caught because the checker knows Kokoro's clamp
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
    res = CliRunner().invoke(app, ["tts", "demo", SHORT, "--fault", "pinned-durations", "--json"])
    assert res.exit_code == 1 and json.loads(res.stdout)["report"]["first_bad_stage"] == "durations"
    res = CliRunner().invoke(app, ["tts", "demo", "--fault", "bogus"])
    assert res.exit_code == 2 and "unknown fault" in res.output


def test_cli_demo_does_not_write_nan_audio_and_says_so_with_the_report(tmp_path):
    """--fault nan --out x.wav was exit 2, "refusing to write", and no stage report: the NaN is the finding."""
    pytest.importorskip("kokoro")
    from tensorprobe.cli import app

    out = tmp_path / "x.wav"
    res = CliRunner().invoke(app, ["tts", "demo", SHORT, "--fault", "nan", "--out", str(out)])
    text = " ".join(res.output.split())
    assert res.exit_code == 1, res.output
    assert "first bad stage: audio" in text and "non-finite samples" in text
    assert f"{out} was not written: 12600 of 12600 samples are non-finite (first at sample 0)" in text
    assert not out.exists()
    res = CliRunner().invoke(app, ["tts", "demo", SHORT, "--out", str(out), "--json"])
    doc = json.loads(res.stdout)
    assert res.exit_code == 0 and doc["out"] == str(out) and doc["not_written"] is None and out.exists()


def test_the_checker_knows_kokoros_clamp_and_faster_speech_is_not_pinned(pipeline):
    assert pipeline.checker().duration_clamp == (1, None)
    _, report = pipeline.run(SHORT, fault="pinned-durations")
    assert report.findings[0].figures["share"] == 1.0 and report.summaries["durations"]["max"] == 1
    pipeline.speed = 1.8   # faster speech: durations ~2 frames, shorter but not pinned
    try:
        durations = pipeline.predict_durations(pipeline.to_ids(DEMO))
    finally:
        pipeline.speed = 1.0
    assert pipeline.checker().durations(durations) == [] and int(durations.min()) >= 2


# ------------------------------------------------------------------------------------------ levels

DEMO = "həlˈO wˈɜɹld"
TEXTS = (SHORT, DEMO, "ðɪs ɪz ə tˈɛst.")


@pytest.fixture(scope="module")
def decoder_outputs(pipeline):
    """The real decoder's audio for three phoneme strings (clean runs)."""
    outputs = []
    for text in TEXTS:
        audio, report = pipeline.run(text)
        assert not report.errors, findings(report)
        outputs.append(audio.astype(np.float64))
    return outputs


def _at(x, level_dbfs, dtype):
    return as_stored(at_level(x, level_dbfs), dtype)


def test_kokoro_audio_keeps_its_verdict_from_minus_50_to_0_dbfs(decoder_outputs):
    """Gain changes of the decoder's output, as float32, float16 (a half-precision port) and 16-bit PCM: every
    verdict of `audio check` stays what it is at -20 dBFS, and the stage checker finds nothing at any level
    (before: a near_constant ERROR from -50 dBFS down)."""
    from tensorprobe.audio import check
    from tensorprobe.tts import StageChecker

    checked = 0
    for x in decoder_outputs:
        for dtype in ("float32", "float16", "int16"):
            reference = statuses(check(_at(x, -20, dtype), 24000))
            assert "error" not in reference.values()
            for level in np.linspace(-50, 0, 11):
                r = check(_at(x, level, dtype), 24000)
                assert statuses(r) == reference, (level, dtype, r.summary())
                checked += 1
            c = StageChecker(sample_rate=24000)
            assert c.audio(_at(x, -50, dtype)) == []
            assert c.report().summaries["audio"]["notes"][0].startswith("quiet: peak -50.0 dBFS")
    assert checked == 99


def test_kokoro_audio_made_stuck_is_caught_at_every_level(decoder_outputs):
    from tensorprobe.audio import check

    x = decoder_outputs[1]
    rng = np.random.default_rng(0)
    held = x.copy()
    peak_at = int(np.argmax(np.abs(x)))   # hold below the peak: a value held at full scale is clipping
    after = np.abs(x[peak_at:]) / np.abs(x).max()
    i = peak_at + int(np.flatnonzero((after > 0.3) & (after < 0.6))[0])
    held[i:] = x[i]                                       # the decoder's output froze for the rest of the take
    dc = np.abs(x).max() * (1 + 1e-4 * rng.standard_normal(x.size))
    for level in np.linspace(-50, 0, 6):
        for broken, check_name in ((held, "stuck"), (dc, "near_constant"), (np.full_like(x, 0.5), "near_constant")):
            for dtype in ("float32", "int16"):
                r = check(_at(broken, level, dtype), 24000)
                assert r.verdict(check_name).status == "error", (level, dtype, r.summary())
