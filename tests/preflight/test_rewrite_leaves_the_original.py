"""A rewrite never touches the caller's model: after `rewrite` with every rule, and after `preflight --fix`, the
original's outputs, state_dict, module classes (and what those classes hold), parametrizations, hooks and
training flags are what they were. Both weight-norm APIs are in the model: `torch.nn.utils.weight_norm`
(old style, a pre-hook) and `torch.nn.utils.parametrizations.weight_norm` (a class made per module)."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

from tensorprobe.preflight import preflight
from tensorprobe.preflight.rewrite import RULES, rewrite, seeded


class TorchSTFT(nn.Module):
    """The iSTFTNet `TorchSTFT` interface (filter_length, hop_length, win_length, window, transform,
    inverse) over torch.stft/istft, as StyleTTS2 and Kokoro write it."""

    def __init__(self, filter_length=16, hop_length=4, win_length=16):
        super().__init__()
        self.filter_length, self.hop_length, self.win_length = filter_length, hop_length, win_length
        self.window = torch.hann_window(win_length)

    def transform(self, x):
        spec = torch.stft(x, self.filter_length, self.hop_length, self.win_length, window=self.window,
                          return_complex=True)
        return torch.abs(spec), torch.angle(spec)

    def inverse(self, magnitude, phase):
        spec = magnitude * torch.exp(phase * 1j)
        return torch.istft(spec, self.filter_length, self.hop_length, self.win_length, window=self.window).unsqueeze(-2)


class EveryRule(nn.Module):
    """Something for every rule: a complex STFT (conv_stft), atan2 (guard_atan2), both weight norms
    (fold_weight_norm), a random dither (record_random) and an instance norm (stable_norm)."""

    def __init__(self):
        super().__init__()
        self.stft = TorchSTFT()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)      # the old API is deprecated, and still common
            self.old_wn = nn.utils.weight_norm(nn.Conv1d(18, 18, 3, padding=1))
        self.new_wn = nn.utils.parametrizations.weight_norm(nn.Conv1d(18, 18, 3, padding=1))
        self.norm = nn.InstanceNorm1d(18, affine=True)

    def forward(self, x):
        mag, _ = self.stft.transform(x)      # the phase of rounding-level bins is arbitrary: not used
        h = torch.cat([mag, torch.atan2(mag - mag.mean(), 1 + mag)], dim=1)
        h = self.new_wn(self.old_wn(h))
        h = self.norm(h + 1e-3 * torch.randn_like(h))
        return self.stft.inverse(torch.exp(0.1 * h[:, :9]), math.pi * torch.tanh(h[:, 9:]))


def _snapshot(model: nn.Module, x: torch.Tensor) -> dict:
    with torch.no_grad(), seeded():
        out = model(x)
    modules = list(model.named_modules())
    return {
        "out": out,
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "tensor_ids": {k: id(v) for k, v in model.state_dict(keep_vars=True).items()},
        "classes": [(path, type(m)) for path, m in modules],
        # what each class holds (the parametrized weight's property lives there); `__slotnames__` is the
        # cache copyreg adds to any class an instance of which is copied
        "class_dicts": [(path, {k: v for k, v in vars(type(m)).items() if k != "__slotnames__"}) for path, m in modules],
        "parametrizations": [(path, {k: (id(v), [id(p) for p in v]) for k, v in m.parametrizations.items()})
                             for path, m in modules if parametrize.is_parametrized(m)],
        "hooks": [(path, list(m._forward_pre_hooks.values()), list(m._forward_hooks.values())) for path, m in modules],
        "attributes": [(path, sorted(m.__dict__), sorted(m._buffers), sorted(m._parameters)) for path, m in modules],
        "training": [(path, m.training) for path, m in modules],
    }


def _assert_untouched(before: dict, model: nn.Module, x: torch.Tensor) -> None:
    after = _snapshot(model, x)
    assert torch.equal(after["out"], before["out"])
    assert after["state"].keys() == before["state"].keys()
    assert all(torch.equal(after["state"][k], v) for k, v in before["state"].items())
    for key in ("tensor_ids", "classes", "class_dicts", "parametrizations", "hooks", "attributes", "training"):
        assert after[key] == before[key], key


def _model_and_input():
    torch.manual_seed(0)
    return EveryRule().train(), torch.randn(1, 2000)     # left in training mode: that flag must survive too


@pytest.mark.parametrize("rules", [[r] for r in RULES] + [list(RULES)], ids=lambda r: "+".join(r))
def test_rewrite_leaves_the_callers_model_as_it_was(rules):
    model, x = _model_and_input()
    model(x)       # old-style weight norm now holds a computed, non-leaf weight: the copy must cope
    before = _snapshot(model, x)
    result = rewrite(model, x, rules=rules)
    assert all(r.applied for r in result.rules), result.summary()      # each rule really changed its copy
    _assert_untouched(before, model, x)
    # the rewritten model is a model of its own: running and rewriting it again does not reach back either
    result.model(x)
    rewrite(result.model, x, rules=rules)
    _assert_untouched(before, model, x)


def test_fold_weight_norm_on_the_parametrizations_api_keeps_the_original_usable():
    """The reported case: the original's ParametrizedConv1d lost its `weight` once the copy was folded."""
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.utils.parametrizations.weight_norm(nn.Conv1d(4, 4, 3))), torch.randn(1, 4, 50)
    expected = model(x)
    result = rewrite(model, x, rules=["fold_weight_norm"])
    assert result.rules[0].applied and not parametrize.is_parametrized(result.model[0])
    assert parametrize.is_parametrized(model[0]) and torch.equal(model(x), expected)
    assert type(model[0]) is not type(result.model[0]) and "weight" in vars(type(model[0]))


def test_preflight_fix_leaves_the_callers_model_as_it_was():
    model, x = _model_and_input()
    before = _snapshot(model, x)
    r = preflight(model, x, target="executorch", fix=True, importer=False)
    applied = {rule.rule for rule in r.rewrite.rules if rule.applied}
    assert {"conv_stft", "fold_weight_norm", "record_random"} <= applied
    _assert_untouched(before, model, x)
