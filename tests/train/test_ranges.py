"""Training versus inference ranges on a FastSpeech-shaped model: teacher-forced durations in training,
predicted ones at inference; a clamp of the mel output applied on the training path only is found at the
model's output, with the figures; the same model with the clamp on both paths is clean."""

from __future__ import annotations

import pytest
import torch

from tensorprobe.errors import InputError
from tensorprobe.train.ranges import RangeStats, check_ranges, record_ranges

# the guide's model (docs/guide-training.md, 'Training versus inference'), its batches and inference inputs
from examples.tiny_tts import TinyTTS, inference_inputs as _inference_inputs, train_batches as _train_batches


def test_a_clamp_on_the_training_path_only_is_found_at_the_output_with_the_figures(tmp_path):
    model = TinyTTS(clamp_at_inference=False)
    stats = record_ranges(model, _train_batches())
    path = stats.save(tmp_path / "train_stats.json")
    report = check_ranges(model, _inference_inputs(), RangeStats.load(path))
    assert [f.name for f in report.findings] == ["output"]                  # the decoder itself is in range
    f = report.first
    assert (f.train_min, f.train_max) == (-11.5, 0.0)
    assert f.infer_min < -11.5 and f.infer_max > 0.0 and 0.05 < f.outside < 0.95
    assert "inference range" in report.headline() and "training [-11.5, 0]" in f.words()
    assert model.training                                                     # the mode is put back


def test_the_same_model_with_the_clamp_on_both_paths_is_clean():
    model = TinyTTS(clamp_at_inference=True)
    report = check_ranges(model, _inference_inputs(), record_ranges(model, _train_batches()))
    assert report.findings == [] and report.training_only == [] and report.checked == 9 and "stays in the training range" in report.headline()


def test_bad_input_is_a_clear_error(tmp_path):
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(InputError, match="not a training-ranges file"):
        RangeStats.load(tmp_path / "x.json")
    with pytest.raises(InputError, match="no training batch"):
        record_ranges(TinyTTS(False), [])


def test_tts_check_takes_its_mel_range_from_the_training_statistics(tmp_path):
    import json
    import subprocess
    import sys

    import numpy as np
    from safetensors.numpy import save_file

    model = TinyTTS(clamp_at_inference=False)
    record_ranges(model, _train_batches()).save(tmp_path / "train_stats.json")
    model.eval()
    with torch.no_grad():
        mel = model(*_inference_inputs(1)[0])[0].numpy()
    save_file({"mel": np.ascontiguousarray(mel)}, str(tmp_path / "run.safetensors"))
    base = [sys.executable, "-m", "tensorprobe", "tts", "check", str(tmp_path / "run.safetensors"), "--json"]
    # a model whose training mel lives in [-20, 10] is fine by the training statistics' own range...
    wide = subprocess.run(base + ["--mel-min", "-30", "--mel-max", "20"], capture_output=True, text=True)
    assert wide.returncode == 0
    # ...and out of range by the range it was trained on: the clamp inference lacks
    ref = subprocess.run(base + ["--reference", str(tmp_path / "train_stats.json")], capture_output=True, text=True)
    doc = json.loads(ref.stdout)
    assert ref.returncode == 1
    assert any(f["check"] == "out_of_range" and "[-11.5, 0]" in f["message"] for f in doc["report"]["findings"])
    bad = subprocess.run(base + ["--reference", str(tmp_path / "train_stats.json"), "--reference-mel", "nosuch"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "no record 'nosuch'" in bad.stderr
