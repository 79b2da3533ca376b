"""Metamorphic tests on Silero VAD: the PyTorch port (`tensorprobe.examples.silero`) against the ONNX file the
`silero-vad` package ships, paired by the example's rules file. Variations that keep the truth keep the verdict,
variations that change it change it.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorprobe as tp

from .variants import Renamed, capture_in, first_cause, output_pair, renamed_rules, with_scaled_output

pytest.importorskip("onnxruntime", reason="needs the onnx extra")
pytest.importorskip("silero_vad", reason="silero-vad is not installed (the [test] extra installs it)")

from tensorprobe.examples import silero  # noqa: E402
from tensorprobe.runtimes import get_runtime  # noqa: E402

SLOW_EXAMPLES = settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LEVELS = {"op": dict(level="op", keep="full"), "module": dict(level="module", keep="full")}
LSTM = "model.decoder.If.then.model.decoder.rnn/Squeeze.0"
CONV2 = "model.encoder.1.reparam_conv"


class RootConv2(silero.SileroVAD):
    """The port with its second conv written in the root's forward (`F.conv1d` on conv2's weights)."""

    def forward(self, x, state):
        x = F.pad(x, (0, self.pad), mode="reflect").unsqueeze(1)
        x = self.stft_conv(x)
        x = (x[:, :self.cutoff] ** 2 + x[:, self.cutoff:] ** 2).sqrt()
        x = self.conv1(x).relu()
        x = F.conv1d(x, self.conv2.weight, self.conv2.bias, stride=2, padding=1).relu()
        x = self.conv3(x).relu()
        x = self.conv4(x).relu().squeeze(-1)
        h, c = self.lstm_cell(x, (state[0], state[1]))
        x = self.final_conv(h.unsqueeze(-1).relu()).sigmoid()
        return x.squeeze(1).mean(dim=1, keepdim=True), torch.stack([h, c])


def port(cls=silero.SileroVAD, bug=None) -> torch.nn.Module:
    """The port with the shipped ONNX file's weights, `bug(state)` applied to them first."""
    state = silero.weights_from_onnx()
    model = cls()
    model.load_state_dict(bug(state) if bug else state)
    return model.eval()


def swapped_lstm_gates(state):
    """A converter that takes ONNX's LSTM gate order (i, o, f, c) for PyTorch's (i, f, g, o)."""
    for name in ("lstm_cell.weight_ih", "lstm_cell.weight_hh", "lstm_cell.bias_ih", "lstm_cell.bias_hh"):
        w = state[name].clone()
        state[name] = torch.cat([w[:128], w[384:], w[256:384], w[128:256]])
    return state


def scaled_conv2(state, factor=1.01):
    state["conv2.weight"] = state["conv2.weight"] * factor
    return state


def overflowing_conv2(state):
    """One output channel of conv2 scaled past float32's range by a bad conversion: its output overflows."""
    w = state["conv2.weight"].clone()
    w[5] *= 1e38
    state["conv2.weight"] = w
    return state


def feeds(gain: float = 1.0) -> dict:
    f = silero.onnx_feeds(0)
    f["input"] = f["input"] * gain
    return f


def inputs(f: dict) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.from_numpy(f["input"]), torch.from_numpy(f["state"])


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("silero")


@pytest.fixture(scope="module")
def onnx_ref(workdir):
    return get_runtime("onnxruntime").capture_artifact(silero.onnx_file(), feeds(), workdir / "onnx", keep="full")


def against_onnx(ref, workdir, name, model, level="module", f=None, rules=silero.RULES) -> tp.DiffReport:
    return tp.diff(ref, capture_in(workdir / name, level, model, inputs(f or feeds()), **LEVELS[level]), rules=rules)


# ---- variations that keep the truth -----------------------------------------------------------------------------
def test_a_second_run_is_a_match_on_both_sides(onnx_ref, workdir):
    again = get_runtime("onnxruntime").capture_artifact(silero.onnx_file(), feeds(), workdir / "onnx-again")
    report = tp.diff(onnx_ref, again)
    assert report.verdict == "match" and not any(p.failed for p in report.pairs), report.summary
    first = capture_in(workdir / "twice", "port", port(), inputs(feeds()), **LEVELS["module"])
    report = tp.diff(first, capture_in(workdir / "twice", "port", port(), inputs(feeds()), **LEVELS["module"]))
    assert report.verdict == "match" and not any(p.failed for p in report.pairs + report.weights)


@pytest.mark.parametrize("level", LEVELS)
def test_the_port_renamed_and_mapped_back_by_rules_keeps_the_verdict(onnx_ref, workdir, level):
    plain = against_onnx(onnx_ref, workdir, "plain", port(), level)
    renamed = against_onnx(onnx_ref, workdir, "renamed", Renamed(port()), level, rules=renamed_rules(silero.RULES))
    assert plain.verdict == renamed.verdict == "match", renamed.summary
    named = {p.name for p in renamed.pairs if p.compared}
    assert named >= {"input.input", "input.state", "output.output", "output.stateN"}
    if level == "module":      # at op level the plain port also pairs an ONNX Cast with a sigmoid by order
        assert named == {p.name for p in plain.pairs if p.compared}


def test_a_renamed_port_with_a_gate_order_bug_is_still_named_at_the_lstm(onnx_ref, workdir):
    plain = against_onnx(onnx_ref, workdir, "gates", port(bug=swapped_lstm_gates))
    renamed = against_onnx(onnx_ref, workdir, "gates-renamed", Renamed(port(bug=swapped_lstm_gates)),
                           rules=renamed_rules(silero.RULES))
    assert first_cause(plain)[:2] == first_cause(renamed)[:2] == (LSTM, "weights"), renamed.summary
    assert {w.name for w in renamed.weights_differ} == {w.name for w in plain.weights_differ}


@SLOW_EXAMPLES
@given(st.floats(min_value=-2, max_value=0.5))
def test_the_input_level_keeps_the_verdict(workdir, log_gain):
    # the VAD's output depends on the level, the port's faithfulness does not
    f = feeds(10 ** log_gain)
    ref = get_runtime("onnxruntime").capture_artifact(silero.onnx_file(), f, workdir / f"onnx-{log_gain}")
    assert against_onnx(ref, workdir, "gain", port(), f=f).verdict == "match"
    bug = against_onnx(ref, workdir, "gain-bug", port(bug=swapped_lstm_gates), f=f)
    assert first_cause(bug)[:2] == (LSTM, "weights"), bug.summary


def test_conv2_moved_into_the_roots_forward_keeps_the_verdict(onnx_ref, workdir):
    assert against_onnx(onnx_ref, workdir, "moved", port(RootConv2)).verdict == "match"
    inside = against_onnx(onnx_ref, workdir, "conv2-bug", port(bug=scaled_conv2))
    moved = against_onnx(onnx_ref, workdir, "moved-bug", port(RootConv2, bug=scaled_conv2))
    assert first_cause(inside) == (CONV2, "weights", f"{CONV2}.weight"), inside.summary
    # conv2 has no record of its own any more: the first record after it carries the blame, for the same weight
    name, cause, origin = first_cause(moved)
    assert (name, cause, origin) == ("model.encoder.2.reparam_conv", "weights", f"{CONV2}.weight"), moved.summary


# ---- variations that change the truth ----------------------------------------------------------------------------
@SLOW_EXAMPLES
@given(st.floats(min_value=1e-3, max_value=0.5), st.sampled_from([1, -1]))
def test_the_port_with_its_output_scaled_by_1_plus_eps_is_not_a_match_for_the_port(workdir, eps, sign):
    ref = capture_in(workdir / "self", "ref", port(), inputs(feeds()), **LEVELS["module"])
    cand = capture_in(workdir / "self", "scaled", with_scaled_output(port(), 1 + sign * eps), inputs(feeds()),
                      **LEVELS["module"])
    report = tp.diff(ref, cand)
    assert report.verdict == "diverged" and output_pair(report).failed, report.summary


def test_an_overflow_is_found_in_conv2_and_in_the_root_when_moved_there(onnx_ref, workdir):
    x = inputs(feeds())
    inside = tp.find_first_nonfinite(port(bug=overflowing_conv2), *x)
    assert inside.found and (inside.module, inside.record) == ("conv2", "conv2/convolution.0"), inside.summary()
    assert "overflow" in " ".join(inside.diagnosis)
    moved = tp.find_first_nonfinite(port(RootConv2, bug=overflowing_conv2), *x)
    assert moved.found and (moved.module, moved.record) == ("", "<root>/convolution.0"), moved.summary()
    assert "overflow" in " ".join(moved.diagnosis)
    assert inside.output.stats.posinf + inside.output.stats.neginf == moved.output.stats.posinf + \
        moved.output.stats.neginf > 0
    report = against_onnx(onnx_ref, workdir, "overflow", port(bug=overflowing_conv2))
    assert first_cause(report)[:2] == (CONV2, "weights"), report.summary
