"""A PyTorch port against the ONNX file a package ships, paired by a rules file (Silero VAD).

`silero-vad` ships its network as ONNX, TorchScript and a safetensors state dict with a tinygrad reference;
`tensorprobe.examples.silero` ports that reference to PyTorch. None of it was written for tensorprobe.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime", reason="needs the onnx extra")
pytest.importorskip("silero_vad", reason="silero-vad is not installed (the [test] extra installs it)")

from tensorprobe.capture import capture  # noqa: E402
from tensorprobe.diff import diff  # noqa: E402
from tensorprobe.diff.align import parse_rules  # noqa: E402
from tensorprobe.examples import silero  # noqa: E402
from tensorprobe.runtimes import get_runtime  # noqa: E402

MAPPED = ["model.stft/Conv.0", "model.encoder.0.reparam_conv", "model.encoder.1.reparam_conv",
          "model.encoder.2.reparam_conv", "model.encoder.3.reparam_conv",
          "model.decoder.If.then.model.decoder.rnn/Squeeze.0", "model.decoder.If.then.model.decoder.rnn/Squeeze.1",
          "model.decoder.decoder.2", "output.output", "output.stateN"]


@pytest.fixture(scope="module")
def onnx_ref(tmp_path_factory):
    root = tmp_path_factory.mktemp("silero")
    return {seed: get_runtime("onnxruntime").capture_artifact(silero.onnx_file(), silero.onnx_feeds(seed),
                                                              root / f"onnx{seed}", keep="full")
            for seed in (0, 1)}


def _port_capture(state: dict, seed: int, out):
    model = silero.SileroVAD()
    model.load_state_dict(state)
    _, inputs = silero.pytorch_port(seed)
    return capture(model.eval(), *inputs, keep="full", out=out)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_port_matches_the_shipped_onnx_record_for_record(onnx_ref, tmp_path, seed):
    model, inputs = silero.pytorch_port(seed)
    with torch.no_grad():
        prob, state = model(*inputs)
    import onnxruntime as ort

    expected = ort.InferenceSession(str(silero.onnx_file())).run(None, silero.onnx_feeds(seed))
    np.testing.assert_allclose(prob.numpy(), expected[0], rtol=1e-4, atol=1e-6)   # an independent check
    report = diff(onnx_ref[seed], capture(model, *inputs, keep="full", out=tmp_path / "port"),
                  rules=silero.RULES)
    assert report.passed, report.summary
    assert set(MAPPED) <= {p.name for p in report.pairs}        # each rule landed on its record
    # every weight has its counterpart, the mono output conv's one-element bias included
    assert not report.cand_only and not report.weights_cand_only and not report.weights_ref_only
    assert len(report.weights) == 15 and not any(w.failed for w in report.weights)
    assert report.pair("model.decoder.decoder.2.bias").passed


def test_the_package_safetensors_are_other_weights_and_diff_says_where(onnx_ref, tmp_path):
    # silero_vad_16k.safetensors is not the network of the package's ONNX or TorchScript files: only the STFT
    # basis is the same. The port built from it parts from the ONNX file at the first learned layer.
    model, inputs = silero.safetensors_port()
    report = diff(onnx_ref[0], capture(model, *inputs, keep="full", out=tmp_path / "st"), rules=silero.RULES)
    assert not report.passed
    assert report.first_divergence == "model.encoder.0.reparam_conv"
    assert report.pair("model.stft/Conv.0").passed
    differing = {w.name for w in report.weights if w.failed}
    assert "model.stft.forward_basis_buffer" not in differing
    assert "model.encoder.0.reparam_conv.weight" in differing and len(differing) == 14   # all but the basis


def test_a_weight_conversion_bug_in_the_lstm_is_named_at_the_lstm(onnx_ref, tmp_path):
    # A converter that takes ONNX's LSTM gate order (i, o, f, c) for PyTorch's (i, f, g, o) would swap the
    # forget and output gates' rows; here the swap is done on the PyTorch-layout weights, the same mistake.
    state = silero.weights_from_onnx()
    for name in ("lstm_cell.weight_ih", "lstm_cell.weight_hh", "lstm_cell.bias_ih", "lstm_cell.bias_hh"):
        w = state[name].clone()
        state[name] = torch.cat([w[:128], w[384:], w[256:384], w[128:256]])
    report = diff(onnx_ref[0], _port_capture(state, 0, tmp_path / "bug"), rules=silero.RULES)
    assert not report.passed
    assert report.first_divergence == "model.decoder.If.then.model.decoder.rnn/Squeeze.0"
    for name in MAPPED[:5]:                                      # everything before the LSTM still matches
        assert report.pair(name).passed, name
    differing = {w.name for w in report.weights if w.failed}
    assert differing == {"model.decoder.rnn.weight_ih", "model.decoder.rnn.weight_hh", "model.decoder.rnn.bias_ih",
                         "model.decoder.rnn.bias_hh"}
    assert report.pair(report.first_divergence).cause == "weights"


@pytest.mark.parametrize("convert,wrong", [
    (lambda b: b.double().float(), False),           # through float64 and back, as a JSON converter does: exact
    (lambda b: b + 0.05, True),                      # shifted
    (lambda b: torch.zeros_like(b), True),           # dropped: a converter that ignores conv biases
])
def test_a_wrong_one_element_bias_of_the_mono_output_conv_is_named(onnx_ref, tmp_path, convert, wrong):
    # final_conv (128 -> 1 channel) has a bias of one element: a converter that drops or shifts it must be
    # named as the weight, not as "own" error of the layer.
    state = silero.weights_from_onnx()
    state["final_conv.bias"] = convert(state["final_conv.bias"])
    report = diff(onnx_ref[0], _port_capture(state, 0, tmp_path / "bias"), rules=silero.RULES)
    bias = report.pair("model.decoder.decoder.2.bias")
    assert bias.cand_name == "final_conv.bias" and bias.shape == (1,) and not report.weights_cand_only
    assert bias.failed == wrong and report.passed == (not wrong), report.summary
    if wrong:
        assert {w.name for w in report.weights if w.failed} == {"model.decoder.decoder.2.bias"}
        assert report.first_divergence == "model.decoder.decoder.2"
        assert report.pair("model.decoder.decoder.2").cause == "weights"
        for name in MAPPED[:7]:                                  # everything before the output conv matches
            assert report.pair(name).passed, name


def test_every_rule_maps_a_port_record_onto_a_record_of_the_onnx_capture(onnx_ref, tmp_path):
    model, inputs = silero.pytorch_port()
    port = capture(model, *inputs, out=tmp_path / "port")
    onnx_names = {r.name for r in onnx_ref[0]}
    for rule in parse_rules(silero.RULES.splitlines()):
        mapped = [rule.apply(r.name) for r in port if rule.apply(r.name) is not None]
        assert mapped and set(mapped) <= onnx_names, rule


def test_example_command_writes_its_files_and_commands(tmp_path, capsys):
    assert silero.main([str(tmp_path)]) == 0
    commands = capsys.readouterr().out.splitlines()
    assert len(commands) == 3 and commands[2].startswith("tensorprobe diff ")
    assert set(np.load(tmp_path / "frame.npz")) == {"input", "state", "sr"}
    assert (tmp_path / "rules.txt").read_text() == silero.RULES
    assert silero.main([]) == 2
