"""load keeps the native scale; save refuses NaN, never divides by zero, and writes atomically."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import soundfile as sf

from .audio_signals import SR, sine
from tensorprobe.audio import check_file, load, save
from tensorprobe.errors import InputError


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("ext,subtype", [(".wav", "PCM_16"), (".wav", "FLOAT"), (".flac", "PCM_24"),
                                         (".ogg", "VORBIS")])
def test_roundtrip_formats(tmp_path, ext, subtype):
    p = tmp_path / f"x{ext}"
    report = save(p, sine(), SR, subtype=subtype)
    assert report.status == "ok"
    f = load(p)
    assert f.sample_rate == SR and f.subtype == subtype and f.data.shape[1] == 1
    assert np.abs(f.data).max() == pytest.approx(0.5, abs=0.02)


def test_float_wav_keeps_its_scale(tmp_path):
    p = tmp_path / "big.wav"
    sf.write(p, 1e9 * sine(), SR, subtype="FLOAT")
    r = check_file(p)
    assert r.verdict("scale").status == "error"
    assert r.verdict("scale").figure == pytest.approx(5e8, rel=1e-3)
    assert "FLOAT" in r.dtype


def test_wav_with_no_frames_is_an_empty_finding(tmp_path):
    p = tmp_path / "empty.wav"
    sf.write(p, np.zeros(0), SR)
    assert check_file(p).verdict("length").status == "error"


@pytest.mark.parametrize("content,match", [(None, "no such file"), (b"", "empty file"),
                                           (b"RIFF not really a wav", "not readable audio")])
def test_bad_files_raise_one_clear_input_error(tmp_path, content, match):
    p = tmp_path / "bad.wav"
    if content is not None:
        p.write_bytes(content)
    with pytest.raises(InputError, match=match):
        load(p)


def test_save_refuses_nan_and_leaves_existing_file_untouched(tmp_path):
    p = tmp_path / "out.wav"
    save(p, sine(), SR)
    before = sha(p)
    bad = sine()
    bad[100:103] = np.nan
    with pytest.raises(InputError, match=r"refusing to write .*3 of 16000 samples are non-finite \(first at frame 100\)"):
        save(p, bad, SR)
    assert sha(p) == before
    assert [q.name for q in tmp_path.iterdir()] == ["out.wav"]  # no temporary file left behind


def test_save_repairs_nonfinite_when_asked(tmp_path):
    bad = sine()
    bad[:5] = np.inf
    r = save(tmp_path / "r.wav", bad, SR, repair_nonfinite=True)
    assert any("repaired 5 non-finite samples" in n for n in r.notes)
    assert np.isfinite(load(tmp_path / "r.wav").data).all()


def test_normalizing_silence_stays_silence_and_is_reported(tmp_path):
    p = tmp_path / "silent.wav"
    r = save(p, np.zeros(SR, dtype=np.float32), SR, normalize=True)
    assert any("not normalized: the audio is silent" in n for n in r.notes)
    assert r.verdict("silence").status == "error"
    data = load(p).data
    assert np.isfinite(data).all() and not data.any()


def test_normalize_scales_the_peak(tmp_path):
    r = save(tmp_path / "n.wav", sine(amp=0.1), SR, normalize=0.9)
    assert r.figures["peak"] == pytest.approx(0.9, rel=1e-6)
    assert load(tmp_path / "n.wav").data.max() == pytest.approx(0.9, abs=1e-3)


def test_pcm_clips_over_full_scale_and_says_so(tmp_path):
    r = save(tmp_path / "c.wav", sine(amp=2.0), SR)
    assert any("clipped to ±1.0" in n for n in r.notes)
    assert r.verdict("clipping").status == "error"


def test_failed_write_does_not_touch_the_destination(tmp_path, monkeypatch):
    p = tmp_path / "keep.wav"
    save(p, sine(), SR)
    before = sha(p)

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(sf, "write", boom)
    with pytest.raises(OSError, match="disk full"):
        save(p, sine(220), SR)
    assert sha(p) == before and [q.name for q in tmp_path.iterdir()] == ["keep.wav"]


def test_unknown_extension(tmp_path):
    with pytest.raises(InputError, match="unknown audio extension"):
        save(tmp_path / "x.mp4", sine(), SR)
