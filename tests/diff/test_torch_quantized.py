"""PyTorch's own int8 modules against their float originals (issue 29): `torch.ao.quantization.quantize_dynamic`
of the conv + LSTM stack of `ports.py` (its LSTM and Linear become int8 kernels with packed weights).

The quantized modules' weights are recorded dequantized under the float names and judged within a quantization
step; their outputs are quantization error (cause `quantized`), at module level and at op level, where
torch.ao's `quantized::linear_dynamic` meets the float `addmm` as the op that ends the same module's call. Varied:
a weight re-packed with twice its scale is named at its module, cause `weights`.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

import tensorprobe as tp

from . import ports


def _dynamic_int8(model: torch.nn.Module) -> torch.nn.Module:
    with warnings.catch_warnings():      # torch.ao.quantization is deprecated, and still what users ship with
        warnings.simplefilter("ignore")
        return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear, torch.nn.LSTM},
                                                      dtype=torch.qint8)


def _doubled_scale(q: torch.nn.Module, path: str) -> torch.nn.Module:
    """The classic broken conversion: one Linear's int8 weight re-packed with twice its scale."""
    lin = dict(q.named_modules())[path]
    w = lin.weight()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lin.set_weight_bias(torch._make_per_tensor_quantized_tensor(w.int_repr(), 2 * w.q_scale(), w.q_zero_point()),
                            lin.bias())
    return q


@pytest.fixture(scope="module")
def captures(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch_int8")
    model, (x,) = ports.convlstm()
    made = {}
    for name, m in (("float", model), ("int8", _dynamic_int8(model)), ("wrong", _doubled_scale(_dynamic_int8(model), "proj"))):
        for level in ("module", "op"):
            made[name, level] = tp.capture(m, x, out=root / f"{name}_{level}", level=level, keep="full")
    return made


@pytest.mark.parametrize("level", ["module", "op"])
def test_torch_int8_modules_are_quantization_error_and_their_weights_within_a_step(captures, level):
    r = tp.diff(captures["float", level], captures["int8", level])
    deq = [w for w in r.weights if any(t.startswith("dequantized:qint8") for t in w.tags)]
    assert {w.name for w in deq} >= {"proj.weight", "lstm.weight_ih_l0", "lstm.weight_hh_l1"} and not r.weights_differ
    first = r.get(r.first_divergence)
    assert first.cause == "quantized" and first.rel_err < 0.05, r.summary
    assert first.name == ("lstm:0" if level == "module" else "proj/addmm.0")
    if level == "op":
        assert first.cand_name == "proj/linear_dynamic.0"    # the int8 kernel meets the float op it replaces
    assert all(p.cause in (None, "quantized", "inherited") for p in r.pairs), r.summary


@pytest.mark.parametrize("level", ["module", "op"])
def test_a_doubled_weight_scale_in_a_torch_int8_module_is_named_there(captures, level):
    r = tp.diff(captures["float", level], captures["wrong", level])
    assert [w.name for w in r.weights_differ] == ["proj.weight"]
    first = r.get(r.first_divergence)
    assert first.module == "proj" and first.cause == "weights" and first.origin == "proj.weight", r.summary
