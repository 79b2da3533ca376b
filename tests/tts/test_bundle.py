"""A recorded run (stage names as tensor names) checked from .npz and .safetensors, and via the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
import safetensors.numpy
from typer.testing import CliRunner

from tensorprobe.cli import app
from tensorprobe.errors import BundleError, InputError
from tensorprobe.tts import check_stages, load_stages, save_stages
from tensorprobe.tts.kokoro import KOKORO_VOCAB

runner = CliRunner()


def good_audio():
    tt = np.arange(24000) / 24000
    return (0.3 * np.sin(2 * np.pi * 150 * tt) * np.sin(2 * np.pi * 2 * tt)).astype(np.float32)


def test_save_and_check_npz(tmp_path):
    p = save_stages(tmp_path / "run.npz", text="Hello", phonemes="həlˈO", vocab=KOKORO_VOCAB,
                    ids=np.array([0, 50, 83, 54, 156, 31, 0]), embedding_size=178,
                    durations=np.array([3, 5, 6, 4, 1, 7, 3]), audio=good_audio(), sample_rate=24000)
    stages, _ = load_stages(p)
    assert stages["phonemes"] == "həlˈO" and stages["vocab"]["ɹ"] == 123
    r = check_stages(p)
    assert r.status == "ok", r.findings
    assert list(r.summaries) == ["text", "phonemes", "ids", "durations", "audio"]


def test_bad_run_names_the_first_bad_stage(tmp_path):
    p = save_stages(tmp_path / "bad.npz", phonemes="həlˈO", vocab=KOKORO_VOCAB, embedding_size=178,
                    ids=np.array([0, 50, 183, 54, 0]), mel=np.full((80, 30), -4.0, np.float32),
                    audio=np.zeros(24000, np.float32), sample_rate=24000)
    r = check_stages(p)
    assert r.first_bad_stage == "ids"
    assert [(f.stage, f.check) for f in r.errors] == [("ids", "out_of_range"), ("mel", "near_constant"),
                                                      ("audio", "silence")]


def test_safetensors_with_aliases_and_other_tensors(tmp_path):
    p = tmp_path / "run.safetensors"
    safetensors.numpy.save_file({"input_ids": np.array([0, 5, 7, 0], dtype=np.int64),
                                 "pred_dur": np.array([2, 9000, 3, 2], dtype=np.int64),
                                 "encoder_out": np.array([[1.0, np.nan]], dtype=np.float32)}, str(p))
    r = check_stages(p, embedding_size=178)
    assert {(f.stage, f.check) for f in r.errors} == {("durations", "extreme"), ("encoder_out", "non_finite")}


def test_audio_without_sample_rate_is_bad_input(tmp_path):
    p = save_stages(tmp_path / "x.npz", audio=good_audio())
    with pytest.raises(InputError, match="sample_rate"):
        check_stages(p)


def test_broken_vocab_is_a_bundle_error(tmp_path):
    p = save_stages(tmp_path / "x.npz", vocab="not json")
    with pytest.raises(BundleError, match="vocab"):
        check_stages(p)


def test_cli_tts_check_exit_codes(tmp_path):
    good = save_stages(tmp_path / "good.npz", phonemes="həlˈO", ids=np.array([0, 50, 83, 54, 156, 31, 0]),
                       audio=good_audio(), sample_rate=24000)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"n_token": 178, "vocab": KOKORO_VOCAB}, ensure_ascii=False), encoding="utf-8")
    res = runner.invoke(app, ["tts", "check", str(good), "--vocab", str(cfg), "--embedding-size", "178"])
    assert res.exit_code == 0, res.output
    bad = save_stages(tmp_path / "bad.npz", ids=np.array([0, 500, 0]))
    res = runner.invoke(app, ["tts", "check", str(bad), "--embedding-size", "178", "--json"])
    assert res.exit_code == 1
    doc = json.loads(res.stdout)
    assert doc["command"] == "tts check" and doc["report"]["first_bad_stage"] == "ids"
    res = runner.invoke(app, ["tts", "check", str(tmp_path / "missing.npz")])
    assert res.exit_code == 2 and "no such file" in " ".join(res.output.split())
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    res = runner.invoke(app, ["tts", "check", str(tmp_path / "junk.npz")])
    assert res.exit_code == 2 and "Traceback" not in res.output


def test_tensorprobe_bundle_directory(tmp_path):
    import torch

    from tensorprobe.bundle import BundleWriter
    from tensorprobe.record import Record
    from tensorprobe.stats import compute_stats

    with BundleWriter(tmp_path / "run") as w:
        for i, (name, t) in enumerate([("ids", torch.tensor([0, 5, 300, 0])), ("mel", torch.full((80, 20), -4.0))]):
            w.add(Record(name=name, module=name, op="tensor", order=i, shape=tuple(t.shape),
                         dtype=str(t.dtype).replace("torch.", ""), stats=compute_stats(t)), t)
    r = check_stages(tmp_path / "run", embedding_size=178)
    assert [(f.stage, f.check) for f in r.findings] == [("ids", "out_of_range"), ("mel", "near_constant")]


def test_statistics_only_records_take_their_stage_name_and_place(tmp_path):
    """A record stored without its tensor (keep=stats) is checked through its statistics, under its stage's
    name (pred_dur is the durations), and placed in the pipeline, not after everything else."""
    import torch

    from tensorprobe.bundle import BundleWriter
    from tensorprobe.record import Record
    from tensorprobe.stats import compute_stats

    with BundleWriter(tmp_path / "run") as w:
        mel = torch.full((80, 20), -4.0)
        w.add(Record(name="mel", module="mel", op="tensor", order=0, shape=(80, 20), dtype="float32",
                     stats=compute_stats(mel)), mel)
        dur = torch.tensor([3.0, float("nan"), 4.0])
        w.add(Record(name="pred_dur", module="pred_dur", op="tensor", order=1, shape=(3,), dtype="float32",
                     stats=compute_stats(dur)))   # statistics only
    r = check_stages(tmp_path / "run")
    assert [(f.stage, f.check) for f in r.findings] == [("durations", "non_finite"), ("mel", "near_constant")]
    assert r.first_bad_stage == "durations"


def test_cli_duration_clamp(tmp_path):
    pinned = save_stages(tmp_path / "pinned.npz", durations=np.array([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2]))
    res = runner.invoke(app, ["tts", "check", str(pinned), "--json"])
    assert res.exit_code == 0   # 91% at 1 frame without a known clamp: a warning
    assert json.loads(res.stdout)["report"]["findings"][0]["severity"] == "warning"
    res = runner.invoke(app, ["tts", "check", str(pinned), "--duration-clamp", "1", "--json"])
    assert res.exit_code == 1
    finding = json.loads(res.stdout)["report"]["findings"][0]
    assert (finding["check"], finding["severity"], finding["figures"]["bound"]) == ("clamped", "error", 1)
    res = runner.invoke(app, ["tts", "check", str(pinned), "--duration-clamp", "a:b"])
    assert res.exit_code == 2 and "--duration-clamp expects" in res.output


def test_cli_tts_check_a_40_sample_output_exits_1_unless_the_threshold_is_lowered(tmp_path):
    p = save_stages(tmp_path / "short.npz", phonemes="həlˈO", ids=np.array([0, 50, 83, 54, 156, 31, 0]),
                    audio=good_audio()[6000:6040], sample_rate=24000)
    res = runner.invoke(app, ["tts", "check", str(p), "--json"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    assert doc["report"]["first_bad_stage"] == "audio"
    assert any(f["check"] == "length" and f["severity"] == "error" and "too short to be speech" in f["message"]
               for f in doc["report"]["findings"])
    res = runner.invoke(app, ["tts", "check", str(p), "-t", "min_speech_s=0.001"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["tts", "check", str(p), "-t", "no_such=1"])
    assert res.exit_code == 2 and "unknown threshold" in res.output
