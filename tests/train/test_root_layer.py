"""The top-level module's own parameters are one layer, named by the model's class (issue 32 item 2).

A bare `nn.Linear` has two parameters, `weight` and `bias`, and one layer: the Monitor names it `Linear` (not
`weight`) and counts "1 layer" (not 2). Twins: the same Linear inside a Sequential is the layer `0`; two Linears
going NaN are 2 layers. A Silero VAD (tensorprobe.examples.silero) fed a silent frame makes its NaN gradient in
its own forward's STFT magnitude: the Monitor's diagnosis says so, and does not call it the loss.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from tensorprobe.examples.silero import SileroVAD
from tensorprobe.train import Monitor, summarize


def _run(tmp_path, model, steps=6, nan_at=3, lr=0.05, **kw):
    torch.manual_seed(0)
    x, y = torch.randn(16, 4), torch.randn(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    mon = Monitor(model, opt, run_dir=tmp_path / "run", **kw)
    for k in range(steps):
        out = model(x)
        loss = F.mse_loss(out, y.expand_as(out))
        if k == nan_at:
            loss = loss * float("nan")          # every gradient of this step is NaN
        opt.zero_grad()
        loss.backward()
        mon.step(loss)
        if k != nan_at:
            opt.step()
    mon.close()
    return mon


def _nan_finding(mon):
    return next(f for f in mon.findings if f["kind"] == "nonfinite_gradient")


def test_a_bare_linear_is_one_layer_named_by_its_class(tmp_path):
    mon = _run(tmp_path, nn.Linear(4, 1))
    f = _nan_finding(mon)
    assert f["step"] == 3 and f["layer"] == "Linear" and f["layers"] == ["Linear"]
    assert set(f["params"]) == {"weight", "bias"}
    assert "in 2 parameters of 1 layer " in f["message"], f["message"]
    # the run's page reads the same layer from the rows
    s = summarize(tmp_path / "run")
    assert set(s.grad_norm) == {"Linear"} and set(s.update_ratio) <= {"Linear"}


def test_its_twin_inside_a_sequential_is_named_by_its_path(tmp_path):
    f = _nan_finding(_run(tmp_path, nn.Sequential(nn.Linear(4, 1))))
    assert f["layer"] == "0" and f["layers"] == ["0"] and "of 1 layer " in f["message"]


def test_two_linears_are_two_layers(tmp_path):
    f = _nan_finding(_run(tmp_path, nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 1))))
    assert f["layers"] == ["0", "1"] and "in 4 parameters of 2 layers " in f["message"]


def test_a_frozen_bare_linear_is_the_layer_linear(tmp_path):
    mon = _run(tmp_path, nn.Linear(4, 1), steps=14, nan_at=-1, lr=0.0)   # patience: 10 steps
    frozen = [f for f in mon.findings if f["kind"] == "frozen_weights"]
    assert frozen and frozen[0]["layer"] == "Linear" and "the weights of Linear stopped moving" in frozen[0]["message"]


def test_a_nan_gradient_born_in_the_vads_own_forward_is_not_the_loss(tmp_path):
    torch.manual_seed(0)
    model = SileroVAD()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    state = torch.zeros(2, 2, 128)
    batch = {}

    def diagnose():
        return (batch["x"], state), lambda out: out[0].mean()

    mon = Monitor(model, opt, run_dir=tmp_path / "run", diagnose=diagnose)
    for k in range(3):
        batch["x"] = torch.zeros(2, 512) if k == 2 else 0.1 * torch.randn(2, 512)   # a silent frame at step 2
        loss = model(batch["x"], state)[0].mean()
        opt.zero_grad()
        loss.backward()
        mon.step(loss)
        opt.step()
    mon.close()
    f = _nan_finding(mon)
    assert f["step"] == 2 and f["origin_record"] == "<root>/sqrt.0"
    assert "in the model's own forward (SileroVAD.forward, " in f["origin_headline"], f["origin_headline"]
    assert "in the loss" not in f["origin_headline"]
    # the root's own parameters: none here (every weight is in a child), so no layer is named `SileroVAD`
    assert "SileroVAD" not in f["layers"] and "stft_conv" in f["layers"]



def test_a_nan_born_in_the_loss_function_is_the_loss_by_its_name(tmp_path):
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    x = torch.randn(8, 4)
    with torch.no_grad():
        fitted = model(x).clone()                            # a batch already fitted: the RMSE is sqrt(0)

    def rmse_loss(out):
        return (out - fitted).pow(2).mean().sqrt()

    mon = Monitor(model, opt, run_dir=tmp_path / "run", diagnose=lambda: ((x,), rmse_loss))
    loss = rmse_loss(model(x))
    opt.zero_grad()
    loss.backward()
    mon.step(loss)
    mon.close()
    f = _nan_finding(mon)
    assert f["layer"] == "Linear" and f["layers"] == ["Linear"] and f["origin_record"] == "loss/sqrt.0", f
    assert "of aten.sqrt.default in the loss (rmse_loss) (loss/sqrt.0)" in f["origin_headline"], f["origin_headline"]
    assert "model's own forward" not in f["origin_headline"]
