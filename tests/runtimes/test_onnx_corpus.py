"""Trained ONNX models as they ship in PyPI packages, and the ports users make of them.

Five models none of this project's code was written for: Silero VAD (`silero-vad`: an `If` on the sample
rate, an opset-15 file), and Microsoft's speech-quality estimators from `speechmos` — DNSMOS P.835 (raw
audio in, a keras2onnx graph), DNSMOS P.808 (mel in), PLCMOS v2 (two GRUs, two inputs, an opset-11
PyTorch export whose nodes carry no scope) and AECMOS (an opset-9 PyTorch export with a GRU state
input). Each is fed a speech-like signal through the front end its package uses.

For each: the capture matches itself and returns what plain ONNX Runtime returns; onnxruntime's
`quantize_dynamic` port diverges first at the first op whose weights it quantized, for that reason; its
`convert_float_to_float16` port matches within float16 rounding, record for record (the Casts the
converter inserts are not records of their own).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import tensorprobe as tp

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from tensorprobe.runtimes import get_runtime  # noqa: E402

from ..diff.ports import assert_nothing_incomparable_ranked  # noqa: E402

pytestmark = pytest.mark.onnx
SR = 16000


def speech(n: int, seed: int = 0) -> np.ndarray:
    """A voiced, gliding, amplitude-modulated harmonic signal with a little noise (float32, 16 kHz)."""
    t = np.arange(n) / SR
    f0 = 140 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / SR
    x = sum(np.sin(k * phase) / k for k in range(1, 12)) * (0.5 + 0.5 * np.sin(2 * np.pi * 3 * t)) ** 2
    noise = 0.003 * np.random.default_rng(seed).standard_normal(n)
    return (0.2 * x / np.abs(x).max() + noise).astype(np.float32)


def _p808_mel(x: np.ndarray) -> np.ndarray:
    """DNSMOS P.808's input: 120-band mel in dB, scaled as `speechmos.dnsmos.audio_melspec` does."""
    import librosa

    mel = librosa.feature.melspectrogram(y=x, sr=SR, n_fft=321, hop_length=160, n_mels=120)
    return ((librosa.power_to_db(mel, ref=np.max) + 40) / 40).T[:900][None].astype(np.float32)


def _log_power(x: np.ndarray, nfft: int = 512, hop: int = 256) -> np.ndarray:
    """PLCMOS's input: the log power spectrum under a sqrt-Hann window (as `speechmos.plcmos.logpow_dns`)."""
    frames = np.lib.stride_tricks.sliding_window_view(np.pad(x, (0, nfft)), nfft)[::hop]
    spec = np.fft.rfft(frames * np.sqrt(np.hanning(nfft + 1)[:-1]))
    return np.log(np.maximum(spec.real ** 2 + spec.imag ** 2, 1e-12)).astype(np.float32)[None, None]


def _aec_mel(seed: int) -> np.ndarray:
    import librosa

    mel = librosa.feature.melspectrogram(y=speech(32000, seed), sr=SR, n_fft=512, hop_length=256, n_mels=160)
    return np.log(1e-6 + mel).T.astype(np.float32)


@dataclass
class Shipped:
    package: str
    path: str                                  # inside the installed package
    feeds: Callable[[], dict[str, np.ndarray]]

    def file(self) -> Path:
        spec = importlib.util.find_spec(self.package)   # finds the files without importing the package
        if spec is None or not spec.submodule_search_locations:
            pytest.skip(f"{self.package} is not installed (the [test] extra installs it)")
        path = Path(spec.submodule_search_locations[0]) / self.path
        if not path.is_file():
            pytest.skip(f"{self.package} ships no {self.path}")
        return path


CORPUS = {
    "silero-vad": Shipped("silero_vad", "data/silero_vad_16k_op15.onnx", lambda: {
        "input": speech(512)[None], "state": np.zeros((2, 1, 128), np.float32), "sr": np.array(SR, np.int64)}),
    "dnsmos-p835": Shipped("speechmos", "dnsmos_models/sig_bak_ovr.onnx", lambda: {"input_1": speech(144160)[None]}),
    "dnsmos-p808": Shipped("speechmos", "dnsmos_models/model_v8.onnx", lambda: {"input_1": _p808_mel(speech(144160))}),
    "plcmos-v2": Shipped("speechmos", "plcmos_models/plcmos_v2.onnx", lambda: {
        "degraded_audio": _log_power(speech(48000)),
        "rater_embed": np.random.default_rng(1).standard_normal((1, 64)).astype(np.float32)}),
    "aecmos": Shipped("speechmos", "aecmos_models/Run_1668423760_Stage_0.onnx", lambda: {
        "input": np.stack([_aec_mel(s) for s in range(3)])[None], "h0": np.zeros((4, 1, 96), np.float32)}),
}


@pytest.fixture(scope="module")
def ports(tmp_path_factory):
    """name -> (reference bundle, int8 bundle, fp16 bundle, int8 graph), each built once."""
    built: dict = {}

    def get(name: str):
        if name not in built:
            from onnxruntime.quantization import QuantType, quantize_dynamic
            from onnxruntime.transformers.float16 import convert_float_to_float16

            model = CORPUS[name]
            path, feeds, root = model.file(), model.feeds(), tmp_path_factory.mktemp(name)
            quantize_dynamic(str(path), str(root / "int8.onnx"), weight_type=QuantType.QInt8)
            onnx.save(convert_float_to_float16(onnx.load(str(path)), keep_io_types=True), str(root / "fp16.onnx"))
            rt = get_runtime("onnxruntime")
            built[name] = (rt.capture_artifact(path, feeds, root / "ref"),
                           rt.capture_artifact(root / "int8.onnx", feeds, root / "q"),
                           rt.capture_artifact(root / "fp16.onnx", feeds, root / "h"),
                           onnx.load(str(root / "int8.onnx")))
        return built[name]
    return get


@pytest.mark.parametrize("name", CORPUS)
def test_shipped_model_captures_what_onnx_runtime_computes_and_matches_itself(tmp_path, name):
    model = CORPUS[name]
    path, feeds = model.file(), model.feeds()
    sess = ort.InferenceSession(str(path))
    expected = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    rt = get_runtime("onnxruntime")
    a = rt.capture_artifact(path, feeds, tmp_path / "a")
    b = rt.capture_artifact(path, feeds, tmp_path / "b")
    assert sum(r.kind == "output" for r in a.records) >= 25
    outputs = [r for r in a.records if r.kind == "model_output"]
    assert len(outputs) == len(expected)
    for rec, want in zip(outputs, expected.values()):
        np.testing.assert_array_equal(a.numpy(rec.name), want)
    r = tp.diff(a, b)
    assert r.verdict == "match" and not r.ref_only and not r.cand_only


def _first_quantized(ref: tp.Bundle, int8: "onnx.ModelProto") -> str:
    """The first reference record computed from a weight `quantize_dynamic` quantized."""
    quantized = {i.name[: -len("_quantized")] for i in int8.graph.initializer if i.name.endswith("_quantized")}
    return next(r.name for r in ref.records if r.kind == "output" and quantized & set(r.inputs))


@pytest.mark.parametrize("name", CORPUS)
def test_int8_dynamic_port_of_a_shipped_model_diverges_where_it_was_quantized(ports, name):
    ref, int8, _, graph = ports(name)
    r = tp.diff(ref, int8)
    # judged by its outputs: a match exactly when every output meets SNR >= 20 dB and correlation >= 0.99 (none
    # for a single score) and nothing but int8's error fails (DNSMOS P.835's log is 'own': it stays diverged)
    outs = [r.get(n) for n in r.outputs]
    meets = all(o.method == "elementwise" and o.metric("snr_db") >= 20 and (o.metric("pearson") or 1.0) >= 0.99
                for o in outs)
    int8_only = all(p.cause in ("quantized", "inherited", "amplified") for p in r.pairs if p.failed)
    assert r.verdict == ("match" if meets and int8_only else "diverged"), r.summary
    first = r.get(r.first_divergence)
    assert first.name == _first_quantized(ref, graph) and first.cause == "quantized", r.summary
    assert not r.ref_only   # every reference value has its int8 counterpart; the quantizer's own ops are extra
    assert all(p.cand_name.startswith("input.") == p.name.startswith("input.") for p in r.pairs)
    assert_nothing_incomparable_ranked(r)


@pytest.mark.parametrize("name", CORPUS)
def test_float16_port_of_a_shipped_model_matches_record_for_record(ports, name):
    ref, _, fp16, _ = ports(name)
    r = tp.diff(ref, fp16)
    assert r.verdict == "match", r.summary
    assert not r.ref_only and not r.cand_only   # a Cast to float16 and back is one value, not three
    assert sum(p.cand_dtype == "float16" for p in r.pairs if p.kind == "output") >= 10
    worst = r.get(r.worst)
    assert worst is not None and 1e-5 < worst.rel_err < 2e-2   # float16 rounding shows, judged as such
    assert_nothing_incomparable_ranked(r)
