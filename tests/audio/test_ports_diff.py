"""audio diff on real ports of the Kokoro-82M decoder: the dynamo ONNX export run by ONNX Runtime, onnxruntime's own
float16 conversion of it, and the decoder with its InstanceNorm lowered as a broken backend does (a one-pass
variance in float16: NaN, seed 000).

Unvoiced inputs, so the decoder draws no noise and a faithful port gives the same audio. Truth kept (the port
itself, the port 3 ms late) keeps the match; truth changed (the port's last quarter dropped, the broken norm's
NaN) is a finding that names what changed.
"""

from __future__ import annotations

import numpy as np
import pytest

from tensorprobe.audio import diff

pytestmark = pytest.mark.slow
SR = 24_000
PORTS = ["onnxruntime fp32", "onnxruntime fp16"]


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    pytest.importorskip("kokoro", reason="needs the kokoro extra")
    pytest.importorskip("onnxruntime", reason="needs the onnx extra")
    import onnx
    import onnxruntime as ort
    import torch
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from tensorprobe.examples import kokoro
    from tensorprobe.runtimes.onnxruntime import export_onnx

    root = tmp_path_factory.mktemp("ports")
    model, inputs = kokoro.exportable_decoder(), kokoro.decoder_inputs(0.5, voiced=False)
    fp32 = export_onnx(model, inputs, root / "decoder.onnx", exporter="dynamo")
    fp16 = root / "decoder_fp16.onnx"
    onnx.save(convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True), str(fp16))
    with torch.no_grad():
        out = {"pytorch": model(*inputs).numpy().astype(np.float64).ravel()}
        faulty = kokoro.exportable_decoder()
        kokoro.inject_faulty_instance_norm(faulty)
        out["faulty norm"] = faulty(*inputs).numpy().astype(np.float64).ravel()
    for name, path in zip(PORTS, (fp32, fp16)):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)}
        out[name] = session.run(None, feeds)[0].astype(np.float64).ravel()
    return out


@pytest.mark.parametrize("port", PORTS)
def test_a_faithful_port_matches_and_stays_matched_when_it_is_late(outputs, port):
    ref, cand = outputs["pytorch"], outputs[port]
    d = diff(ref, cand, SR)
    assert d.verdict == "match" and d.lag_frames == 0 and d.events == (), d.reasons
    k = int(0.003 * SR)
    for late in (np.concatenate([np.zeros(k), cand]), np.concatenate([np.zeros(k), cand])[: cand.size]):
        d = diff(ref, late, SR)
        assert d.verdict == "match" and d.lag_frames == k and d.events == (), d.reasons


@pytest.mark.parametrize("port", PORTS)
@pytest.mark.parametrize("click", ["burst", "pulse", "dropout"])
def test_a_click_in_a_ports_output_differs_at_its_time(outputs, port, click):
    """The faithful port with one 5 ms burst, 5 ms pulse or dropped sample in its stream, sized by the audio
    around it (this decoder's random weights put spikes 70 dB louder at its ends): `differs`, the first reason
    names the time; late by 3 ms it still does (truth kept)."""
    ref, cand = outputs["pytorch"], outputs[port].copy()
    middle = slice(cand.size // 4, 3 * cand.size // 4)
    peak = np.abs(cand[middle]).max()
    i = middle.start + int(np.argmax(np.abs(cand[middle])))
    n = int(0.005 * SR)
    if click == "burst":
        cand[i:i + n] += np.random.default_rng(0).normal(0, 0.3 * peak, n)
    elif click == "pulse":
        cand[i:i + n] = -0.9 * peak * np.sign(cand[i])
    else:
        cand[i] = 0.0
    for late in (0, int(0.003 * SR)):
        d = diff(ref, np.concatenate([np.zeros(late), cand]), SR)
        assert d.verdict == "differs" and any(abs(e.at_s - i / SR) < 0.006 for e in d.events), d.reasons
        assert d.reasons[0].startswith("a local difference at t = "), d.reasons


@pytest.mark.parametrize("port", PORTS)
def test_a_port_that_drops_its_last_quarter_is_a_finding_with_both_durations(outputs, port):
    ref, cand = outputs["pytorch"], outputs[port]
    cut = cand[: 3 * cand.size // 4]
    d = diff(ref, cut, SR)
    assert d.status == "finding" and d.lag_frames == 0
    assert f"({cut.size / SR:.3f} s against {ref.size / SR:.3f} s; tolerance 0.02 s): audio is missing" in d.reasons[0]
    assert d.reasons[1].startswith(f"where both have audio ({cut.size / SR:.3f} s): waveform correlation 1.000")


def test_the_broken_norms_nan_is_a_finding_with_its_count(outputs):
    ref, cand = outputs["pytorch"], outputs["faulty norm"]
    bad = ~np.isfinite(cand)
    assert bad.any()
    d = diff(ref, cand, SR)
    assert d.status == "finding" and d.snr_db == float("-inf") and d.corr_after is None
    nf = d.non_finite[1]
    assert nf.count == int(bad.sum()) and nf.first_frame == int(np.argmax(bad)) and d.non_finite[0] is None
    assert d.reasons[0].startswith(f"the candidate has {nf.count} non-finite samples")
