"""`tensorprobe audio check|diff` as a user runs them: exit codes 0/1/2, JSON, HTML."""

from __future__ import annotations

import json

import numpy as np
import soundfile as sf
from typer.testing import CliRunner

from .audio_signals import SR, sine, speechlike
from tensorprobe.cli import app

runner = CliRunner()


def text(res):
    return " ".join(res.output.split())  # rich wraps long lines at the terminal width


def write(path, x, subtype="PCM_16"):
    sf.write(path, x, SR, subtype=subtype)
    return str(path)


def test_check_clean_file_exits_0(tmp_path):
    res = runner.invoke(app, ["audio", "check", write(tmp_path / "ok.wav", sine())])
    assert res.exit_code == 0, res.output
    assert "OK" in res.output


def test_check_error_verdict_exits_1_with_json(tmp_path):
    ok = write(tmp_path / "ok.wav", sine())
    silent = write(tmp_path / "silent.flac", np.zeros(SR))
    big = write(tmp_path / "big.wav", 1e9 * sine(), subtype="FLOAT")
    res = runner.invoke(app, ["audio", "check", ok, silent, big, "--json"])
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert doc["command"] == "audio check" and doc["status"] == "finding"
    status = {f["source"]: f["status"] for f in doc["files"]}
    assert status == {ok: "ok", silent: "error", big: "error"}
    big_scale = next(v for v in doc["files"][2]["verdicts"] if v["check"] == "scale")
    assert big_scale["status"] == "error" and big_scale["figure"] > 4e8


def test_warning_only_exits_0(tmp_path):
    res = runner.invoke(app, ["audio", "check", write(tmp_path / "dc.wav", 0.3 * sine() + 0.2)])
    assert res.exit_code == 0 and "DC offset" in text(res)


def test_threshold_override_changes_the_verdict(tmp_path):
    quiet = write(tmp_path / "quiet.wav", sine(amp=0.01))
    assert runner.invoke(app, ["audio", "check", quiet]).exit_code == 0
    assert runner.invoke(app, ["audio", "check", quiet, "--threshold", "silence_peak_dbfs=-30"]).exit_code == 1


def test_bad_input_exits_2_with_one_line(tmp_path):
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    for args, msg in ([str(tmp_path / "missing.wav")], "no such file"), ([str(empty)], "empty file"), \
                     ([str(empty), "-t", "bogus=1"], "unknown threshold"), \
                     ([str(empty), "-t", "silence_peak_dbfs"], "NAME=VALUE"):
        res = runner.invoke(app, ["audio", "check", *args])
        assert res.exit_code == 2, (args, res.output)
        assert msg in text(res) and "Traceback" not in res.output


def test_diff_match_and_phase_only_exit_0_real_difference_exits_1(tmp_path):
    x = speechlike()
    ref = write(tmp_path / "ref.wav", x, "FLOAT")
    lagged = write(tmp_path / "lag.wav", np.concatenate([np.zeros(80), x])[:SR], "FLOAT")
    res = runner.invoke(app, ["audio", "diff", ref, lagged, "--json"])
    assert res.exit_code == 0
    d = json.loads(res.stdout)["diff"]
    assert d["lag_frames"] == 80 and d["verdict"] == "match"
    noisy = write(tmp_path / "noisy.wav", x + np.random.default_rng(0).normal(0, 0.02, SR), "FLOAT")
    res = runner.invoke(app, ["audio", "diff", ref, noisy])
    assert res.exit_code == 1 and "differs" in res.output


def test_diff_html(tmp_path):
    x = speechlike(0.5)
    ref, cand = write(tmp_path / "a.wav", x), write(tmp_path / "b.wav", 0.8 * x)
    out = tmp_path / "report.html"
    res = runner.invoke(app, ["audio", "diff", ref, cand, "--html", str(out)])
    assert res.exit_code == 1, res.output  # -1.9 dB in every band is a real difference
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_diff_bad_input_exits_2(tmp_path):
    ref = write(tmp_path / "a.wav", sine())
    res = runner.invoke(app, ["audio", "diff", ref, str(tmp_path / "nope.wav")])
    assert res.exit_code == 2 and "no such file" in text(res)


def test_quiet_file_exits_0_with_a_quiet_note_and_a_held_one_exits_1(tmp_path):
    """The issue's case through the command line: a harmonic tone at -58 dBFS was exit 1 (near_constant)."""
    tt = np.arange(SR) / SR
    tone = sum(np.sin(2 * np.pi * 220 * k * tt) / k for k in range(1, 6))
    quiet = write(tmp_path / "quiet.wav", tone / np.abs(tone).max() * 10 ** (-58 / 20), subtype="FLOAT")
    res = runner.invoke(app, ["audio", "check", quiet, "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)["files"][0]
    assert doc["status"] == "ok" and doc["notes"][0].startswith("quiet: peak -58.0 dBFS")
    near = next(v for v in doc["verdicts"] if v["check"] == "near_constant")
    assert near["unit"] == "dB" and near["status"] == "ok"
    held = 0.5 * tone / np.abs(tone).max()
    held[4100:4500] = held[4100]   # 25 ms held at 0.095 (-20.4 dBFS)
    res = runner.invoke(app, ["audio", "check", write(tmp_path / "held.wav", held)])
    assert res.exit_code == 1 and "stuck: channel 0 holds" in text(res)
    res = runner.invoke(app, ["audio", "check", quiet, "-t", "near_constant_std=0.001"])
    assert res.exit_code == 2 and "replaced by near_constant_db" in text(res)


def test_diff_names_the_files_in_argument_order(tmp_path):
    x = speechlike()
    ref, cand = write(tmp_path / "ref.wav", x, "FLOAT"), write(tmp_path / "cand.wav", x, "FLOAT")
    res = runner.invoke(app, ["audio", "diff", ref, cand])
    assert res.exit_code == 0 and text(res).startswith(f"{ref} vs {cand}: identical")


def test_diff_of_a_candidate_holding_nan_is_a_finding_not_bad_input(tmp_path):
    """The validation's case: exit 2 ("run audio check on it first") for the very finding the tool exists for."""
    x = speechlike()
    y = x.copy()
    y[100] = np.nan
    ref, nan = write(tmp_path / "ref.wav", x, "FLOAT"), write(tmp_path / "nan.wav", y, "FLOAT")
    res = runner.invoke(app, ["audio", "diff", ref, nan])
    assert res.exit_code == 1, res.output
    assert "the candidate has 1 non-finite sample (1 NaN, 0 Inf; first at t = 0.00625 s, sample 100)" in text(res)
    res = runner.invoke(app, ["audio", "diff", nan, nan, "--json"])
    doc = json.loads(res.stdout)
    assert res.exit_code == 1 and doc["status"] == "finding" and doc["diff"]["snr_db"] == "-inf"
    assert doc["diff"]["non_finite"]["reference"]["count"] == doc["diff"]["non_finite"]["candidate"]["count"] == 1
    assert doc["diff"]["reasons"][0].startswith("the reference has 1 non-finite sample")


def test_diff_of_a_candidate_missing_half_the_audio_exits_1(tmp_path):
    x = speechlike()
    ref, half = write(tmp_path / "ref.wav", x, "FLOAT"), write(tmp_path / "half.wav", x[: SR // 2], "FLOAT")
    res = runner.invoke(app, ["audio", "diff", ref, half])
    assert res.exit_code == 1 and "(0.500 s against 1.000 s; tolerance 0.02 s): audio is missing" in text(res)
    assert runner.invoke(app, ["audio", "diff", ref, half, "--length-tolerance", "0.6"]).exit_code == 0
    res = runner.invoke(app, ["audio", "diff", ref, half, "--length-tolerance", "-1"])
    assert res.exit_code == 2 and "--length-tolerance must be >= 0" in text(res)


def test_audio_with_no_samples_is_a_finding_and_a_0_byte_file_bad_input(tmp_path):
    """A WAV header with no audio is what a TTS run that wrote nothing leaves: exit 1, one line; a 0-byte file is
    not audio at all: exit 2 (test_bad_input_exits_2_with_one_line)."""
    empty = write(tmp_path / "empty.wav", np.zeros(0), "FLOAT")
    res = runner.invoke(app, ["audio", "check", empty])
    assert res.exit_code == 1, res.output
    assert "error: empty: the audio has no samples" in text(res) and "skipped" not in res.output
    res = runner.invoke(app, ["audio", "diff", write(tmp_path / "ref.wav", sine(), "FLOAT"), empty])
    assert res.exit_code == 1 and "the candidate holds no samples" in text(res)


def test_the_quiet_note_beside_an_error_does_not_say_not_an_error(tmp_path):
    """dc_58.wav from the validation: a DC value at -58 dBFS with 1e-9 noise is near-constant (an error); its quiet
    note said "not an error" under the ERROR headline."""
    x = 10 ** (-58 / 20) + 1e-9 * np.random.default_rng(0).standard_normal(SR)
    res = runner.invoke(app, ["audio", "check", write(tmp_path / "dc.wav", x, "FLOAT"), "--json"])
    doc = json.loads(res.stdout)["files"][0]
    assert res.exit_code == 1 and doc["status"] == "error"
    assert "not an error:" not in doc["notes"][0]
    assert doc["notes"][0].startswith("quiet: peak -58.0 dBFS") and "the errors above do not come from it" in doc["notes"][0]
