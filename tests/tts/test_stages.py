"""StageChecker: seed 002's red flags as findings with figures, and timings per stage."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorprobe.tts import StageChecker
from tensorprobe.tts.kokoro import DURATION_CLAMP as KOKORO_CLAMP
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
    assert checks(c.durations(np.log([4.0, 5, 6, 7.5, 9.0, 99.5, 99.5]), log_durations=True)) == \
        [("durations", "clamped", "warning")]   # 2 of 7 continuous values tied at the top
    assert checks(c.durations([4, 4, 4, 4, 4])) == [("durations", "uniform", "warning")]
    clamp = StageChecker(duration_clamp=(1, 50))
    assert checks(clamp.durations([1, 1, 3, 9, 12, 30])) == []   # short tokens reach the minimum: not pinned
    assert checks(clamp.durations([50, 50, 3, 9, 12, 50])) == [("durations", "clamped", "error")]
    assert checks(clamp.durations([50, 4, 3, 9, 12, 50, 7, 6])) == [("durations", "clamped", "warning")]


def kokoro_like_durations(rng, tokens, speed):
    """Durations shaped like a healthy Kokoro run (an assumption: no real weights here): a quarter of the
    tokens short (stress marks, spaces, ~1.2 frames), phones log-normal around 3.3 frames (80 ms at 25 ms a
    frame), longer pads at both ends; then Kokoro's own `round(d / speed).clamp(min=1)`."""
    short = rng.random(tokens) < 0.25
    d = np.where(short, rng.lognormal(np.log(1.2), 0.4, tokens), rng.lognormal(np.log(3.3) - 0.125, 0.5, tokens))
    d[0], d[-1] = rng.uniform(3, 10), rng.uniform(3, 20)
    return np.maximum(np.round(d / speed), 1).astype(np.int64)


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), tokens=st.integers(6, 80), speed=st.floats(0.5, 2.0))
def test_healthy_kokoro_durations_are_not_pinned(seed, tokens, speed):
    durations = kokoro_like_durations(np.random.default_rng(seed), tokens, speed)
    assert StageChecker(duration_clamp=KOKORO_CLAMP).durations(durations) == []


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), tokens=st.integers(6, 80), escaped=st.floats(0, 0.1))
def test_durations_pinned_at_kokoros_clamp_are_an_error(seed, tokens, escaped):
    """A collapsed duration head: every token at Kokoro's 1 frame but for up to 10% (pads, a long vowel)."""
    rng = np.random.default_rng(seed)
    durations = np.ones(tokens, dtype=np.int64)
    free = rng.choice(tokens, size=int(escaped * tokens), replace=False)
    durations[free] = rng.integers(2, 9, size=free.size)
    found = StageChecker(duration_clamp=KOKORO_CLAMP).durations(durations)
    assert checks(found) == [("durations", "clamped", "error")]
    assert found[0].figures["bound"] == 1 and found[0].figures["side"] == "lower"
    without = checks(StageChecker().durations(durations))   # no clamp known: suspicious, not proven
    assert without in ([("durations", "clamped", "warning")], [("durations", "uniform", "warning")])


def test_whole_frame_ties_are_not_a_clamp_without_a_known_bound():
    """Integer durations tie by themselves; only continuous ones tie at a clamp."""
    c = StageChecker()
    assert c.durations([3, 3, 3, 3, 4, 5, 3, 6]) == []
    assert checks(c.durations([3.7, 3.7, 3.7, 3.7, 4.2, 5.1])) == [("durations", "clamped", "error")]


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
    # a stage of its own name is one of the model's intermediates: it comes before the audio, whenever it ran
    assert checks(r.findings) == [("postnet", "raised", "error"), ("audio", "silence", "error")]
    assert r.first_bad_stage == "postnet"
    assert r.to_dict()["timings"][0]["stage"] == "mel"


# ------------------------------------------------------------------------------------------ pipeline order

def _bad_calls():
    """One call per stage, each with a red flag: (stage, call)."""
    return [("text", lambda c: c.text("")),
            ("phonemes", lambda c: c.phonemes("HH <unk> L")),
            ("ids", lambda c: c.ids([2, 3, 87, 4])),
            ("durations", lambda c: c.durations([5, 1200, 7])),
            ("features", lambda c: c.latents(np.zeros((1, 64, 20)), stage="features")),
            ("mel", lambda c: c.mel(np.full((80, 30), -4.0))),
            ("audio", lambda c: c.audio(np.zeros(24000), 24000))]


def test_ids_are_blamed_even_when_the_audio_was_checked_first():
    """The issue's case: first_bad_stage followed the calls, so out-of-range ids were blamed on the audio."""
    c = StageChecker(vocab=ARPA, embedding_size=9)
    c.audio(np.zeros(24000), 24000)
    c.ids([2, 3, 87, 4])
    r = c.report()
    assert r.first_bad_stage == "ids"
    assert checks(r.findings) == [("ids", "out_of_range", "error"), ("audio", "silence", "error")]
    assert list(r.summaries) == ["ids", "audio"]


@settings(max_examples=60, deadline=None)
@given(st.permutations(range(7)), st.sets(st.integers(0, 6), min_size=1))
def test_the_report_follows_the_pipeline_whatever_the_order_of_calls(calls, bad):
    """Any subset of bad stages, checked in any order: findings, summaries and first_bad_stage are those of the
    pipeline's order."""
    stages = _bad_calls()
    in_order, shuffled = StageChecker(vocab=ARPA, embedding_size=9), StageChecker(vocab=ARPA, embedding_size=9)
    for i in sorted(bad):
        stages[i][1](in_order)
    for i in calls:
        if i in bad:
            stages[i][1](shuffled)
    want, got = in_order.report(), shuffled.report()
    assert got.first_bad_stage == stages[min(bad)][0]
    assert checks(got.findings) == checks(want.findings)
    assert list(got.summaries) == list(want.summaries) == [stages[i][0] for i in sorted(bad)]


def test_a_declared_order_places_stages_of_other_names():
    c = StageChecker(order=("text", "phonemes", "ids", "encoder_out", "durations", "mel", "audio"))
    c.mel(np.full((80, 30), -4.0))
    c.tensor("encoder_out", np.array([1.0, np.nan]))
    c.durations([5, 1200, 7])
    assert [f.stage for f in c.report().findings] == ["encoder_out", "durations", "mel"]
    default = StageChecker()   # a plain intermediate sits just before the audio
    default.tensor("encoder_out", np.array([1.0, np.nan]))
    default.mel(np.full((80, 30), -4.0))
    assert [f.stage for f in default.report().findings] == ["mel", "encoder_out"]


# ------------------------------------------------------------------------------------------ levels

def log_mel(audio, sr=22050):
    """HiFi-GAN/Kokoro-style log-mel: log(clamp(mel magnitude, 1e-5)), 80 bands, n_fft 1024, hop 256."""
    import librosa

    fb = librosa.filters.mel(sr=sr, n_fft=1024, n_mels=80, fmin=0, fmax=8000)
    return np.log(np.clip(fb @ np.abs(librosa.stft(audio, n_fft=1024, hop_length=256)), 1e-5, None))


def speech(sr=22050, seconds=1.5):
    tt = np.arange(int(sr * seconds)) / sr
    f0 = 140 * (1 + 0.05 * np.sin(2 * np.pi * 5 * tt))
    phase = 2 * np.pi * np.cumsum(f0) / sr
    x = sum(np.sin(k * phase) / k for k in range(1, 30)) * np.sin(np.pi * 4 * tt) ** 2
    return x / np.abs(x).max()


@pytest.mark.parametrize("level_dbfs", [-12, -30, -45, -60])
def test_a_quiet_but_healthy_mel_is_not_constant(level_dbfs):
    """Gain is an offset in a log mel: speech 48 dB quieter keeps a std of ~1.5 (threshold 0.115). (At -12
    dBFS this speech's mel peaks near 0, the top of the default range.)"""
    mel = log_mel(speech() * 10 ** (level_dbfs / 20))
    assert np.std(mel) > 1.0
    assert StageChecker(n_mels=80).mel(mel) == []


def test_seed_002s_collapsed_mel_is_still_caught():
    mel = np.random.default_rng(0).normal(-5.678, 0.0001, (80, 123))   # "Mel std: 0.0001  # WRONG!"
    found = StageChecker().mel(mel)
    assert checks(found) == [("mel", "near_constant", "error")]
    assert found[0].figures["limit"] == pytest.approx(0.115) and "collapsed" in found[0].message


def test_a_silent_mel_says_so_and_a_quiet_one_gets_a_note():
    c = StageChecker()
    found = c.mel(log_mel(np.zeros(22050)))
    assert checks(found) == [("mel", "near_constant", "error")] and "silence" in found[0].message
    quiet = StageChecker()
    assert quiet.mel(log_mel(speech() * 10 ** (-90 / 20))) == []
    assert quiet.report().summaries["mel"]["notes"][0].startswith("quiet: the mel peaks at")


def test_the_mel_threshold_follows_the_expected_range():
    """A mel normalised to [0, 1] is judged at 1% of that range, not at a log-mel's 0.1."""
    rng = np.random.default_rng(0)
    normalised = np.clip(rng.normal(0.2, 0.05, (80, 100)), 0, 1)   # a quiet take: values near the floor
    assert StageChecker(mel_range=(0.0, 1.0)).mel(normalised) == []
    assert checks(StageChecker(mel_range=(0.0, 1.0)).mel(np.full((80, 100), 0.2) + rng.normal(0, 1e-4, (80, 100)))) \
        == [("mel", "near_constant", "error")]


def test_latents_stuck_at_any_scale_and_near_zero_latents():
    rng = np.random.default_rng(0)
    c = StageChecker()
    stuck = c.latents(5.0 + rng.normal(0, 0.002, (1, 64, 50)))   # std 0.002 passed the old absolute 1e-3
    assert checks(stuck) == [("latents", "near_constant", "error")] and "stuck near 5" in stuck[0].message
    near_zero = c.latents(rng.normal(0, 1e-5, (1, 64, 50)))        # seed 003: the ODE returned near-zero latents
    assert checks(near_zero) == [("latents", "near_constant", "error")]
    assert c.latents(rng.normal(0, 0.05, (1, 64, 50))) == []


@pytest.mark.parametrize("level_dbfs", [-10, -30, -50])
def test_quiet_audio_is_not_an_error_and_its_level_is_noted(level_dbfs):
    c = StageChecker(sample_rate=24000)
    audio = speech(24000) * 10 ** (level_dbfs / 20)
    assert c.audio(audio.astype(np.float32)) == []
    summary = c.report().summaries["audio"]
    assert summary["peak_dbfs"] == pytest.approx(level_dbfs, abs=0.01)
    assert ("notes" in summary) == (level_dbfs < -40)


def test_a_40_sample_output_is_an_error_of_the_audio_stage():
    # Under 2 ms of audio is no utterance: an error, so the run's status is error (it was a warning).
    tt = np.arange(24000) / 24000
    speech = (0.3 * np.sin(2 * np.pi * 150 * tt) * np.sin(2 * np.pi * 2 * tt)).astype(np.float32)
    c = StageChecker(sample_rate=24000)
    assert ("audio", "length", "error") in checks(c.audio(speech[6000:6040]))
    assert c.report().status == "error" and c.report().first_bad_stage == "audio"
    # the whole utterance passes, and 10 ms of it (240 samples) is short but no longer an error
    assert checks(StageChecker().audio(speech, 24000)) == []
    assert ("audio", "length", "warning") in checks(StageChecker().audio(speech[6000:6240], 24000))
    from tensorprobe.audio.check import Thresholds
    relaxed = StageChecker(audio_thresholds=Thresholds(min_speech_s=0.001))
    assert ("audio", "length", "warning") in checks(relaxed.audio(speech[6000:6040], 24000))
