"""An eval-mode BatchNorm is a fixed affine map per channel: the gain it may apply to its input's error is
bounded by its running variance and weight (`explain._frozen_batchnorm_gain`), not by max|x|/sqrt(eps) as a
norm that computes its statistics from its input. An error far beyond that bound is the norm's own (or the
folded conv's), not amplified rounding."""

from __future__ import annotations

import math

import torch
import torch.nn as nn

import tensorprobe as tp
from tensorprobe.diff.explain import HUGE_GAIN, gain_inputs, predicted_gain


def _captured(tmp_path, name: str, bn: nn.BatchNorm1d):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), bn).eval()
    return tp.capture(model, torch.randn(1, 4, 64), keep="stats", out=tmp_path / name)


def test_an_eval_batchnorm_gain_is_its_largest_channel_scale_times_rms_in_over_rms_out(tmp_path):
    bn = nn.BatchNorm1d(8)
    with torch.no_grad():
        bn.running_var.copy_(torch.linspace(0.25, 4.0, 8))
        bn.weight.copy_(torch.linspace(0.5, 2.0, 8))
    bundle = _captured(tmp_path, "ref", bn)
    rec = bundle.get("1")
    gain = predicted_gain(rec, gain_inputs(rec, bundle.get))
    x, y = bundle.get("0").stats, rec.stats

    def rms(s):
        return math.sqrt(float(s.std) ** 2 + float(s.mean) ** 2)

    bound = 2.0 / math.sqrt(0.25 + 1e-5) * rms(x) / rms(y)
    assert math.isclose(gain, max(1.0, bound), rel_tol=1e-3)
    assert gain < 100 < HUGE_GAIN


def test_without_its_running_statistics_a_norm_keeps_the_unbounded_conditioning(tmp_path):
    bundle = _captured(tmp_path, "ref", nn.BatchNorm1d(8))
    rec = bundle.get("1")
    bounded = predicted_gain(rec, gain_inputs(rec, bundle.get))
    unbounded = predicted_gain(rec, [bundle.get("0")])       # the data input alone: no running variance
    assert bounded < 10 and unbounded > 100 * bounded
