"""StageChecker: seed 002's red flags as findings with figures, and timings per stage."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tensorprobe.tts import StageChecker
from tensorprobe.tts.kokoro import KOKORO_VOCAB, N_TOKEN

ARPA = {"<pad>": 0, "<unk>": 1, "HH": 2, "AH0": 3, "L": 4, "OW1": 5, "W": 6, "ER1": 7, "D": 8}


def checks(findings):
    return [(f.stage, f.check, f.severity) for f in findings]


def good_mel(frames=60):
    rng = np.random.default_rng(0)
    return np.clip(rng.normal(-5.5, 2.3, (80, frames)), -11.5, 0.0)


def test_clean_pipeline_has_no_findings():
    c = StageChecker(vocab=ARPA, embedding_size=9, n_mels=80, sample_rate=22050)
    c.text("Hello world")
    c.phonemes("HH AH0 L OW1 W ER1 L D")
    c.ids([2, 3, 4, 5, 6, 7, 4, 8])
    c.durations([5, 7, 6, 9, 5, 8, 7, 6])
    c.mel(good_mel(53))
    tt = np.arange(22050) / 22050
    c.audio(0.3 * np.sin(2 * np.pi * 150 * tt) * np.sin(2 * np.pi * 2 * tt), 22050)
    r = c.report()
    assert r.findings == () and r.status == "ok"
    assert r.summaries["ids"]["max"] == 8 and r.summaries["durations"]["total_frames"] == 53


def test_out_of_vocabulary_id_is_flagged_with_its_position():
    c = StageChecker(vocab=ARPA, embedding_size=9)
    found = c.ids(torch.tensor([2, 3, 87, 4]))
    assert checks(found) == [("ids", "out_of_range", "error")]
    f = found[0].figures
    assert f["count"] == 1 and f["first"] == 2 and f["max"] == 87 and f["limit"] == 9


def test_ids_are_counted_against_the_phonemes_given_before():
    """A tokenizer that drops symbols it does not know (Kokoro's does) loses them without an error; with
    no vocabulary to check the symbols against, the count is what shows it."""
    c = StageChecker()
    c.phonemes("HH AH0 L OW1 W ER1 L D".split())
    assert c.ids([0, 2, 3, 4, 5, 6, 7, 4, 8, 0]) == []             # 8 phonemes + 2 pads
    lost = c.ids([0, 2, 3, 0])                                      # 6 of 8 symbols lost
    assert checks(lost) == [("ids", "count_mismatch", "warning")]
    assert lost[0].figures == {"ids": 4, "phonemes": 8}
    assert c.ids([0, 2, 3, 0], expected_count=4) == []              # an explicit count wins


def test_vocab_larger_than_embedding_is_a_mismatch():
    c = StageChecker(vocab=KOKORO_VOCAB, embedding_size=100)
    assert ("ids", "vocab_mismatch", "error") in checks(c.ids([0, 50, 83, 0]))


def test_constant_mel_is_flagged():
    c = StageChecker()
    found = c.mel(np.full((1, 80, 120), -4.0, dtype=np.float32))
    assert checks(found) == [("mel", "near_constant", "error")]
    assert found[0].figures["std"] == 0.0


def test_mel_out_of_range_like_seed_002():
    rng = np.random.default_rng(0)
    found = StageChecker().mel(rng.uniform(-15, 5, (80, 100)))
    assert checks(found) == [("mel", "out_of_range", "error")]
    assert found[0].figures["max"] > 4.5 and found[0].figures["share"] > 0.3


def test_mel_frames_must_match_durations():
    c = StageChecker(n_mels=80)
    c.durations([10, 10, 10, 10])
    assert checks(c.mel(good_mel(60))) == [("mel", "frames_mismatch", "warning")]


def test_unknown_phonemes_and_unk():
    c = StageChecker(vocab=ARPA)
    found = c.phonemes(["HH", "AH0", "<unk>", "L", "OW2"])
    assert checks(found) == [("phonemes", "unk_tokens", "error"), ("phonemes", "unknown_symbols", "error")]
    assert found[1].figures["distinct"] == ["OW2"]


def test_kokoro_style_phoneme_strings_are_per_character():
    c = StageChecker(vocab=KOKORO_VOCAB, embedding_size=N_TOKEN)
    assert c.phonemes("həlˈO wˈɜɹld") == []
    found = c.phonemes("həɫˈO")
    assert found[0].figures["distinct"] == ["ɫ"] and found[0].figures["first"] == 2


def test_extreme_clamped_and_uniform_durations():
    c = StageChecker(max_duration_frames=200)
    assert checks(c.durations([5, 1200, 7])) == [("durations", "extreme", "error")]
    assert checks(c.durations(np.log([4.0, 5, 6, 99.5, 99.5, 99.5]), log_durations=True)) == \
        [("durations", "clamped", "error")]
    assert checks(c.durations([4, 4, 4, 4, 4])) == [("durations", "uniform", "warning")]
    clamp = StageChecker(duration_clamp=(1, 50))
    assert checks(clamp.durations([1, 1, 3, 9, 12, 30])) == [("durations", "clamped", "warning")]


def test_nan_anywhere():
    c = StageChecker(sample_rate=24000)
    mel = good_mel()
    mel[3, 7] = np.nan
    assert ("mel", "non_finite", "error") in checks(c.mel(mel))
    assert checks(c.latents(np.array([[0.0, np.inf, 1.0]]))) == [("latents", "non_finite", "error")]
    assert checks(c.tensor("encoder_out", torch.tensor([1.0, float("nan")]))) == \
        [("encoder_out", "non_finite", "error")]
    audio = np.sin(np.arange(24000) / 10) * 0.3
    audio[0] = np.nan
    assert ("audio", "non_finite", "error") in checks(c.audio(audio))


def test_silent_audio_fails_the_health_check():
    found = StageChecker().audio(np.zeros(24000, np.float32), 24000)
    assert checks(found) == [("audio", "silence", "error")]


def test_latents_all_zero_and_exploding():
    c = StageChecker()
    assert checks(c.latents(np.zeros((1, 64, 20)))) == [("latents", "all_zero", "error")]
    assert checks(c.latents(np.full((4, 4), 1e6) * np.arange(16).reshape(4, 4))) == \
        [("latents", "exploding", "error")]


def test_run_times_each_stage_and_records_failures():
    c = StageChecker(sample_rate=16000, track_python_memory=True)
    mel = c.run("mel", lambda: np.stack([np.linspace(-11, -1, 50)] * 80))
    assert mel.shape == (80, 50)
    c.run("vocoder", lambda m: np.zeros(16000), mel, check_as="audio")
    with pytest.raises(ZeroDivisionError):
        c.run("postnet", lambda: 1 / 0)
    r = c.report()
    assert [t.stage for t in r.timings] == ["mel", "vocoder", "postnet"]
    assert all(t.wall_s >= 0 for t in r.timings)
    assert r.timings[0].py_peak_bytes >= 80 * 50 * 8  # the mel array itself was allocated in the stage
    assert r.timings[2].error.startswith("ZeroDivisionError")
    assert checks(r.findings) == [("audio", "silence", "error"), ("postnet", "raised", "error")]
    assert r.first_bad_stage == "audio"
    assert r.to_dict()["timings"][0]["stage"] == "mel"
