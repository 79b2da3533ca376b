"""isolate looks above the isolated modules: error that enters in a module's own code (a parent using a
child's parameters functionally) is localised to that module, with defaults."""

from __future__ import annotations

import copy
import json
import textwrap

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from tensorprobe.cli import app
from tensorprobe.isolate import LOCAL, OK, isolate
from tensorprobe.isolate.ascend import direct_params

from . import models as M


@pytest.mark.parametrize("layer", [2, 0])
def test_transposed_out_proj_in_torch_transformer_is_found_in_self_attn(layer):
    ref = M.transformer()
    r = isolate(ref, M.transposed_out_proj(ref, layer), M.transformer_inputs())
    # No leaf is wrong on its own: MultiheadAttention reads out_proj.weight itself, never calling out_proj.
    assert r.first_local is None
    assert r.first_accumulated == f"encoder.layers.{layer}.dropout1"
    a = r.ascent
    assert r.found and r.culprit == a.found == f"encoder.layers.{layer}.self_attn"
    assert a.module_type == "MultiheadAttention" and a.uncalled == ("out_proj",) and a.children == ()
    assert set(a.direct_params) == {"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"}
    assert [n for n, _ in a.differing_params] == ["out_proj.weight"]
    assert a.layer.verdict == LOCAL and a.layer.local["rel_l2_err"] > 0.1
    # Its enclosing layer was not needed: the smallest failing call is reported, and run first.
    assert f"encoder.layers.{layer}" not in [x.name for x in a.tested]
    text = r.summary()
    assert f"inside encoder.layers.{layer}.self_attn" in text and "out_proj is never called" in text
    assert "out_proj.weight" in text


def test_identical_and_lower_precision_transformers_send_isolate_nowhere():
    ref = M.transformer()
    x = M.transformer_inputs()
    same = isolate(ref, copy.deepcopy(ref), x)
    assert not same.found and same.ascent is None and same.first_accumulated is None
    half = isolate(ref, copy.deepcopy(ref).half(), x)
    assert not half.found  # float16 rounding, within the noise floor of every call


def test_flipped_kernel_in_a_weight_norm_the_parent_computes():
    ref = M.vocoder()
    r = isolate(ref, M.flipped_kernel(ref, block=1), M.vocoder_inputs())
    assert r.first_local is None and r.first_accumulated == "blocks.1.act"
    a = r.ascent
    assert r.culprit == "blocks.1" and a.module_type == "WeightNormedBlock"
    assert a.children == (("blocks.1.act", OK),) and a.uncalled == ("conv",)
    assert set(a.direct_params) == {"g", "conv.weight", "conv.bias"}
    assert [n for n, _ in a.differing_params] == ["conv.weight"]


def test_hand_written_cell_called_twice_is_found_at_its_first_call_also_at_a_depth():
    ref = M.tagger()
    port = M.scaled_recurrent_row(ref)
    x = M.tagger_inputs()
    for kwargs in ({}, {"depth": 2}):
        r = isolate(ref, port, x, **kwargs)
        assert r.first_local is None and r.first_accumulated == "head", kwargs
        assert r.culprit == "cell" and r.ascent.call == 0, kwargs   # the first of its two calls
        assert r.ascent.uncalled == ("inp", "rec")
        assert [n for n, _ in r.ascent.differing_params] == ["rec.weight"]


def test_modules_selection_ascends_from_what_was_selected():
    ref = M.transformer()
    r = isolate(ref, M.transposed_out_proj(ref), M.transformer_inputs(), modules=r"dropout1$")
    assert [x.module for x in r.layers][:3] == [f"encoder.layers.{i}.dropout1" for i in range(3)]
    assert r.first_local is None and r.culprit == "encoder.layers.2.self_attn"


def test_tanh_gelu_is_found_with_defaults_as_a_module_and_inside_functional_code():
    ref = M.flow_decoder()
    x = M.flow_inputs()
    r = isolate(ref, M.tanh_gelu(ref), x)
    layer = r.layer("blocks.2.act")
    assert r.first_local == "blocks.2.act" and r.ascent is None
    assert 5e-5 < layer.local["rel_l2_err"] < 1e-3 < 10 ** (-60 / 20) * 10   # passes a 60 dB threshold
    assert layer.local["rel_l2_err"] > 10 * layer.local["noise_floor"]
    assert not isolate(ref, M.tanh_gelu(ref), x, min_snr=60).found   # what the old default said

    class FunctionalTanh(M.FlowBlock):   # the port calls F.gelu itself: `act` is never called
        def forward(self, h):
            return h + self.down(F.gelu(self.up(self.norm(h)), approximate="tanh"))

    port = copy.deepcopy(ref)
    port.blocks[2].__class__ = FunctionalTanh
    r = isolate(ref, port, x)
    assert r.first_local is None and r.first_accumulated == "blocks.2.down"
    assert r.culprit == "blocks.2" and r.ascent.differing_params == ()
    assert dict(r.ascent.children) == {f"blocks.2.{c}": OK for c in ("norm", "up", "act", "down")}


class SideBranch(torch.nn.Module):
    """Computed first, used last: its error shows only at the head, long after it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.sigmoid(x @ self.proj.weight.T)


class Gated(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.side = SideBranch()
        self.main = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8))
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x):
        gate = self.side(x)
        return self.head(self.main(x) * gate)


def test_error_from_a_branch_that_ran_before_the_window_is_found_by_descending():
    ref = Gated()
    port = copy.deepcopy(ref)
    with torch.no_grad():
        port.side.proj.weight[:, 0] *= -1
    r = isolate(ref, port, torch.randn(4, 8))
    assert r.first_accumulated == "head"
    # Around head only the whole model encloses the start; it fails alone, and the side branch inside it,
    # which ran before the window, is run alone too: it is the answer.
    assert r.culprit == "side" and r.ascent.passes == 2
    assert r.ascent.uncalled == ("proj",) and r.ascent.direct_params == ("proj.weight",)


def test_direct_params_counts_a_childs_parametrization_as_the_parents_code():
    class Parent(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(2, 2, 3))
            self.act = torch.nn.ReLU()

        def forward(self, x):
            return self.act(F.conv1d(x, self.conv.weight))

    names = direct_params(Parent(), (torch.randn(1, 2, 8),), {})
    assert set(names) == {"conv.parametrizations.weight.original0", "conv.parametrizations.weight.original1"}


@pytest.fixture()
def transformer_targets(tmp_path):
    f = tmp_path / "tf.py"
    f.write_text(textwrap.dedent("""
        import copy, torch

        def _model():
            torch.manual_seed(0)
            layer = torch.nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, batch_first=True)
            return torch.nn.TransformerEncoder(layer, num_layers=3, enable_nested_tensor=False).eval()

        def _x():
            torch.manual_seed(1)
            return (torch.randn(2, 5, 16),)

        def ref():
            return _model(), _x()

        def port():
            m = _model()
            w = m.layers[1].self_attn.out_proj.weight
            with torch.no_grad():
                w.copy_(w.t().clone())
            return m, _x()
    """))
    return f


def test_cli_reports_the_module_above_with_exit_1(transformer_targets):
    runner = CliRunner()
    f = transformer_targets
    res = runner.invoke(app, ["isolate", f"{f}:ref", f"{f}:port", "--json"])
    assert res.exit_code == 1, res.output
    doc = json.loads(res.stdout)
    rep = doc["report"]
    assert doc["status"] == "finding" and rep["first_local"] is None and rep["culprit"] == "layers.1.self_attn"
    assert rep["ascent"]["differing_params"][0]["name"] == "out_proj.weight"
    assert rep["criteria"]["rule"] == "noise"
    res = runner.invoke(app, ["isolate", f"{f}:ref", f"{f}:port"])
    assert res.exit_code == 1
    text = " ".join(res.stdout.split())
    assert "Error enters inside layers.1.self_attn" in text and "out_proj.weight" in text
