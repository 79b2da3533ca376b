"""The level rules on real ports: the Kokoro-82M decoder exported by torch.onnx (dynamo) and run by ONNX Runtime,
and the float16 port onnxruntime's own converter makes of that file.

A gain change keeps every verdict of each port's output from -50 to 0 dBFS (float32 and 16-bit PCM); a
streaming port whose buffer underruns and repeats its last sample is caught as stuck at every level.
"""

from __future__ import annotations

import numpy as np
import pytest

from .audio_signals import as_stored, at_level, statuses
from tensorprobe.audio import Thresholds, check

pytestmark = pytest.mark.slow
SR = 24_000
LEVELS = np.linspace(-50, 0, 11)


@pytest.fixture(scope="module")
def port_outputs(tmp_path_factory):
    pytest.importorskip("kokoro", reason="needs the kokoro extra")
    pytest.importorskip("onnxruntime", reason="needs the onnx extra")
    import onnx
    import onnxruntime as ort
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from tensorprobe.examples import kokoro
    from tensorprobe.runtimes.onnxruntime import export_onnx

    root = tmp_path_factory.mktemp("ports")
    model, inputs = kokoro.exportable_decoder(), kokoro.decoder_inputs(0.5, voiced=True)
    fp32 = export_onnx(model, inputs, root / "decoder.onnx", exporter="dynamo")
    fp16 = root / "decoder_fp16.onnx"
    onnx.save(convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True), str(fp16))
    outputs = {}
    for name, path in (("onnxruntime fp32", fp32), ("onnxruntime fp16", fp16)):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)}
        outputs[name] = session.run(None, feeds)[0].astype(np.float64).ravel()
    return outputs


def stored(x, level_dbfs, dtype):
    return as_stored(at_level(x, level_dbfs), dtype)


@pytest.mark.parametrize("port", ["onnxruntime fp32", "onnxruntime fp16"])
@pytest.mark.parametrize("dtype", ["float32", "int16"])
def test_a_ports_output_keeps_its_verdicts_at_every_level(port_outputs, port, dtype):
    """(Random weights and a silenced source make this decoder's output noise-like: flatness ~0.68, an error
    that stays an error at every level, as it must; its noise source is drawn anew each run, and some draws
    leave a mean of ~5% of the peak: a dc_offset warning, at every level too; and some a crest factor above 20 dB,
    whose RMS at a -50 dBFS peak is below the mostly-silent line.)"""
    x = port_outputs[port]
    reference = check(stored(x, -20, dtype), SR)
    assert {v.check for v in reference.verdicts if v.fired} <= {"noise_like", "dc_offset"}, reference.summary()
    for level in LEVELS:
        r = check(stored(x, level, dtype), SR)
        got, want = statuses(r), statuses(reference)
        # The one absolute rule: an RMS below silence_rms_dbfs is "mostly silent" whatever the peak. Some draws
        # of the fp16 port's noise have a crest factor above 20 dB, so at a -50 dBFS peak their RMS is below -70.
        mostly_silent = r.figures["rms_dbfs"] < Thresholds().silence_rms_dbfs
        assert got.pop("silence") == ("warning" if mostly_silent else want["silence"]), (level, r.summary())
        want.pop("silence")
        # a mean within 10% of the dc_offset line moves across it by 16-bit rounding at a -50 dBFS peak
        # (~100 steps): the verdict follows its figure there, not the level
        dc = r.verdict("dc_offset")
        if dc.figure is not None and abs(dc.figure - dc.threshold) < 0.1 * dc.threshold:
            assert got.pop("dc_offset") == ("warning" if dc.figure > dc.threshold else "ok")
            want.pop("dc_offset")
        assert got == want, (level, r.summary())
        assert bool(r.notes) == (r.figures["peak_dbfs"] < -40)


@pytest.mark.parametrize("port", ["onnxruntime fp32", "onnxruntime fp16"])
def test_a_buffer_underrun_is_stuck_at_every_level(port_outputs, port):
    """The port's stream stalls for 40 ms and its player repeats the last sample it had."""
    x = port_outputs[port].copy()
    share = np.abs(x[: x.size - int(0.05 * SR)]) / np.abs(x).max()   # room for the whole 40 ms hold
    i = int(np.flatnonzero((share > 0.3) & (share < 0.9))[0])            # below the clip level
    x[i:i + int(0.04 * SR)] = x[i]
    for level in LEVELS:
        for dtype in ("float32", "int16"):
            v = check(stored(x, level, dtype), SR).verdict("stuck")
            assert v.status == "error" and v.details["start_frame"] == i, (level, dtype, v.message)
            assert v.figure == pytest.approx(0.04, abs=2 / SR)


@pytest.mark.parametrize("port", ["onnxruntime fp32", "onnxruntime fp16"])
def test_a_ports_output_has_no_click_at_any_level(port_outputs, port):
    """No click in either port's output at any level, float32 or 16-bit. This decoder's output (random weights,
    noise source on) is noise-like: a dropped sample or a 5 ms pulse in it jumps no further than the noise does,
    so `audio check` can't tell it, as it can't in a fricative; `audio diff` finds it against the reference
    (tests/audio/test_ports_diff.py)."""
    x = port_outputs[port]
    for level in LEVELS:
        for dtype in ("float32", "int16"):
            v = check(stored(x, level, dtype), SR).verdict("clicks")
            assert v.status == "ok" and v.figure == 0, (level, dtype, v.message)
