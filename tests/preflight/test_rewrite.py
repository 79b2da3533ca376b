"""`rewrite`'s acceptance: a rule is proven only when its outputs stay within float32 rounding of the model's,
and a rewritten model that `tensorprobe diff` calls DIVERGED from the original at its outputs is never called
proven. The truths: the model's own float32 error and the rule's move, computed here in float64, and `diff`
itself, run on captures of both models. Also the rule contract: anything but `(model, changed)` is bad input."""

from __future__ import annotations

import copy
import pathlib
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import tensorprobe as tp
from tensorprobe.errors import InputError
from tensorprobe.preflight.rewrite import rewrite

from ..runtimes._export_models import NormConv, mean100_input

ROOT = pathlib.Path(__file__).resolve().parents[2]


class WeightNormed(nn.Module):
    """Two weight-normed convs around an instance norm (the parametrizations API, as vocoders use it)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        wn = nn.utils.parametrizations.weight_norm
        self.c1, self.c2 = wn(nn.Conv1d(4, 8, 3, padding=1)), wn(nn.Conv1d(8, 1, 1))
        self.norm = nn.InstanceNorm1d(8)

    def forward(self, x):
        return self.c2(torch.tanh(self.norm(self.c1(x))))


def _weight_normed():
    return WeightNormed().eval(), (torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(0)),), \
        "c2.parametrizations.weight.original0"          # the gain g: scaling it scales the weight


def _silero():
    from tensorprobe.examples import silero

    model, inputs = silero.pytorch_port()           # the real Silero VAD weights, read from its ONNX file
    return model, inputs, "conv2.weight"


def _mel_predictor():
    from tensorprobe.examples import training

    return training.MelPredictor().eval(), training.batch()[0], "decoder.weight"


MODELS = {"weight_normed": _weight_normed, "silero": _silero, "mel_predictor": _mel_predictor}


def scale_weight(path: str, eps: float):
    """A rule that multiplies one weight by 1 + eps: a port's conversion error of relative size eps."""
    def scale(model):
        with torch.no_grad():
            model.get_parameter(path).mul_(1 + eps)
        return model, [path.rsplit(".", 1)[0]]
    return scale


def _relative(ref: list[torch.Tensor], other: list[torch.Tensor]) -> float:
    """The larger of max |Δ| / max |ref| and ‖Δ‖ / ‖ref‖ over the outputs (the measure the guide states)."""
    return max(max(float((o - r).abs().max() / r.abs().max()), float((o - r).norm() / r.norm()))
               for r, o in zip(ref, other))


def _outputs(model, inputs, dtype=torch.float32) -> list[torch.Tensor]:
    model = copy.deepcopy(model).to(dtype)
    with torch.no_grad():
        out = model(*[t.to(dtype) if t.is_floating_point() else t for t in inputs])
    return [t.double() for t in (out if isinstance(out, tuple) else (out,))]


def _diff_outputs_pass(model, rewritten, inputs) -> bool:
    report = tp.diff(tp.capture(model, *inputs, keep="full"), tp.capture(rewritten, *inputs, keep="full"))
    return all(report.get(name).passed for name in report.outputs or (report.output,))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.sampled_from(sorted(MODELS)), log_eps=st.one_of(st.just(None), st.floats(-9, -2)))
def test_a_proven_rule_is_a_diff_match_and_a_real_change_is_refused(which, log_eps):
    """Three architectures (weight-normed convs and an instance norm; Silero VAD's conv STFT, LSTM and
    sigmoid; a mel predictor's convs and energy), a weight scaled by 1 + eps. eps = 0 keeps the truth: proven.
    eps >= 1e-3 changes it: refused. In between, whatever rewrite says, `diff` never calls a proven rule's
    outputs DIVERGED."""
    model, inputs, path = MODELS[which]()
    eps = 0.0 if log_eps is None else 10.0 ** log_eps
    rule = scale_weight(path, eps)
    (result,) = rewrite(model, *inputs, rules=[rule]).rules
    if result.proven:
        assert _diff_outputs_pass(model, rule(copy.deepcopy(model))[0], inputs)
    if eps == 0.0:
        assert result.proven and result.moved_rel_err == 0.0
    if eps >= 1e-3:
        assert not result.applied and "outputs move" in result.reason


def test_the_walkthrough_rule_moving_outputs_860x_the_models_rounding_is_refused_then_kept_within_rtol():
    """The new-user walk-through: a rule scaling a weight-norm gain by 1.0001 was kept ("within --rtol 1e-4")
    though it moves the outputs by ~1e-4, hundreds of times the model's own float32 rounding."""
    model, inputs, path = _weight_normed()
    rule = scale_weight(path, 1e-4)
    exact, before = _outputs(model, inputs, torch.float64), _outputs(model, inputs)
    after = _outputs(rule(copy.deepcopy(model))[0], inputs)
    own, moved = _relative(exact, before), _relative(before, after)
    assert moved > 100 * own                       # the premise: far beyond the model's rounding
    (refused,) = rewrite(model, *inputs, rules=[rule]).rules
    assert not refused.applied and not refused.proven
    assert refused.model_rel_err == pytest.approx(own, rel=1e-6) and refused.moved_rel_err == pytest.approx(moved, rel=1e-6)
    assert f"{moved / own:,.0f}x the model's own float32 error" in refused.reason
    assert not _diff_outputs_pass(model, rule(copy.deepcopy(model))[0], inputs)      # diff agrees: diverged
    (kept,) = rewrite(model, *inputs, rules=[rule], rtol=1e-3).rules
    assert kept.applied and kept.basis == "rtol" and not kept.proven
    summary = rewrite(model, *inputs, rules=[rule], rtol=1e-3).summary()
    assert "within --rtol 0.001, not proven" in summary and f"outputs moved {moved:.1e}" in summary


def test_a_norm_rewrite_on_an_ill_conditioned_model_is_kept_as_accurate_but_not_called_proven():
    """Instance norm over channels of mean 100 and spread down to 1e-3: float32's own error is ~5e-4. The
    two-pass norm lands 1000x closer to float64, so its outputs move by the original's own error: `diff`
    calls that DIVERGED, and rewrite keeps the rule as accurate, not as proven. On well-spread channels the
    same rule is proven and a diff match."""
    torch.manual_seed(0)
    model, x = NormConv().eval(), mean100_input()
    (rule,) = rewrite(model, x, rules=["stable_norm"]).rules
    own = _relative(_outputs(model, (x,), torch.float64), _outputs(model, (x,)))
    assert rule.applied and rule.basis == "accuracy" and not rule.proven
    assert rule.model_rel_err == pytest.approx(own, rel=1e-6) and rule.max_rel_err < own / 100
    fixed = rewrite(model, x, rules=["stable_norm"]).model
    assert not _diff_outputs_pass(model, fixed, (x,))
    spread = torch.randn(1, 16, 400, generator=torch.Generator().manual_seed(0))
    (rule,) = rewrite(model, spread, rules=["stable_norm"]).rules
    assert rule.proven and _diff_outputs_pass(model, rewrite(model, spread, rules=["stable_norm"]).model, (spread,))


@pytest.mark.parametrize("returns,shown", [(lambda m: (m, True), "(WeightNormed, True)"),
                                           (lambda m: m, "WeightNormed"),
                                           (lambda m: None, "None"),
                                           (lambda m: (m, "c2"), "(WeightNormed, 'c2')"),
                                           (lambda m: (m, [1]), "(WeightNormed, [1])")])
def test_a_rule_that_does_not_return_model_and_changed_paths_is_named_with_the_contract(returns, shown):
    model, inputs, _ = _weight_normed()

    def my_rule(model):
        return returns(model)

    with pytest.raises(InputError) as e:
        rewrite(model, *inputs, rules=[my_rule])
    assert str(e.value).startswith(f"rewrite rule 'my_rule' returned {shown}; a rule must return (model, changed)")


def test_a_rule_that_raises_is_named_and_one_that_breaks_the_model_is_refused():
    model, inputs, _ = _weight_normed()

    def explode(model):
        raise KeyError("c3")

    with pytest.raises(InputError, match=r"^rewrite rule 'explode' raised KeyError: 'c3'$"):
        rewrite(model, *inputs, rules=[explode])

    def wrong_width(model):
        model.c2 = nn.Conv1d(7, 1, 1)
        return model, ["c2"]

    (r,) = rewrite(model, *inputs, rules=[wrong_width]).rules
    assert not r.applied and r.reason.startswith("the rewritten model raised RuntimeError")


def test_a_forward_that_raises_is_bad_input_in_one_line(tmp_path):
    model, (x,), _ = _weight_normed()
    with pytest.raises(InputError, match=r"^the model's forward raised RuntimeError: .*channels"):
        rewrite(model, x[:, :3], rules=["stable_norm"])
    (tmp_path / "m.py").write_text("import torch\nfrom tests.preflight.test_rewrite import WeightNormed\n"
                                   "def build():\n    return WeightNormed(), (torch.randn(1, 3, 64),)\n")
    p = subprocess.run([sys.executable, "-m", "tensorprobe", "rewrite", f"{tmp_path / 'm.py'}:build", "--rules",
                        "stable_norm"], capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "forward raised RuntimeError" in p.stderr
