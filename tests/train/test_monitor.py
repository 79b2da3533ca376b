"""The training monitor on a small mel predictor trained for a few hundred steps on synthetic data, with planted
faults, each found at the right step and layer; the clean run reported clean; a resumed run continues."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from tensorprobe.examples.training import N_MELS, Energy, MelPredictor, batch
from tensorprobe.train import Monitor, TrainingStopped, summarize

STEPS = 240


def _data(step: int, silent_from: int = 40):
    """A learnable task: the target mel is a fixed function of the phonemes; a batch from `silent_from` on
    has silent frames (frames 25.. of row 1)."""
    (x, voiced), _ = batch(seed=step % 16, silent_from=25 if step >= silent_from else 40)
    torch.manual_seed(99)
    proj = torch.randn(N_MELS, x.shape[1]) / 3
    target = torch.einsum("mc,bct->bmt", proj, x) * voiced
    return (x, voiced), target


def _train(tmp_path, model, opt, steps=STEPS, *, data=_data, monitor_kw=None, on_step=None, target_fn=None):
    mon = Monitor(model, opt, run_dir=tmp_path / "run", **(monitor_kw or {}))
    for k in range(steps):
        inputs, target = data(k)
        target = target_fn(target) if target_fn else target
        loss = F.mse_loss(model(*inputs), target)
        opt.zero_grad()
        loss.backward()
        mon.step(loss)
        if on_step:
            on_step(k, opt)
        opt.step()
    mon.close()
    return mon


def test_clean_run_has_no_finding_and_rows_read_with_pandas(tmp_path):
    model = MelPredictor()
    mon = _train(tmp_path, model, torch.optim.Adam(model.parameters(), lr=3e-3), monitor_kw={"watch": ["decoder"]})
    assert mon.findings == []
    pd = pytest.importorskip("pandas")
    rows = pd.read_json(tmp_path / "run" / "steps.jsonl", lines=True)
    assert len(rows) == STEPS and rows["step"].tolist() == list(range(STEPS))
    assert rows["loss"].iloc[-1] < 0.5 * rows["loss"].iloc[0]                       # it did learn
    assert (rows["update_ratio/decoder.weight"] > 0).all() and "out_std/decoder" in rows
    assert not summarize(tmp_path / "run").finding


def test_nan_gradient_at_the_first_silent_batch_is_found_at_its_step_and_origin(tmp_path):
    model = MelPredictor(energy=Energy())
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    state = {}

    def data(k):
        state["batch"] = _data(k, silent_from=130)
        return state["batch"]

    def diagnose():
        inputs, target = state["batch"]
        return inputs, lambda mel: F.mse_loss(mel, target)

    mon = _train(tmp_path, model, opt, 140, data=data, monitor_kw={"diagnose": diagnose})
    nan = [f for f in mon.findings if f["kind"] == "nonfinite_gradient"]
    assert nan[0]["step"] == 130 and nan[0]["layer"] == "encoder"
    assert set(nan[0]["params"]) == {"encoder.weight", "encoder.bias"}     # upstream of the energy branch only
    assert nan[0]["origin_record"] == "energy/sqrt.0" and "SqrtBackward0" in nan[0]["origin_headline"]
    assert all(f["step"] >= 130 for f in mon.findings)                    # nothing before it
    assert len(nan) == 1                                                   # the NaN steps after it: one episode


def test_the_readme_worked_example_prints_the_step_and_the_origin(tmp_path):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "tensorprobe.examples.training", str(tmp_path / "run")],
                       capture_output=True, text=True)
    lines = p.stdout.splitlines()
    assert p.returncode == 0 and lines[0].startswith("step 130: nonfinite_gradient in encoder")
    assert "SqrtBackward0" in lines[1] and "energy/sqrt.0" in lines[1]


def test_stop_on_nonfinite_raises_with_the_finding(tmp_path):
    model = MelPredictor(energy=Energy())
    with pytest.raises(TrainingStopped, match="step 130"):
        _train(tmp_path, model, torch.optim.Adam(model.parameters(), lr=3e-3), 200,
               data=lambda k: _data(k, silent_from=130), monitor_kw={"stop_on": ("nonfinite_gradient",)})
    rows = (tmp_path / "run" / "steps.jsonl").read_text().splitlines()
    assert json.loads(rows[-1])["step"] == 130                           # the finding's row is on disk


def test_a_learning_rate_that_explodes_one_layer_is_found_at_that_layer(tmp_path):
    model = MelPredictor()
    opt = torch.optim.SGD([{"params": model.encoder.parameters()}, {"params": model.decoder.parameters()}], lr=0.05)

    def raise_decoder_lr(k, opt):
        if k == 150:
            opt.param_groups[1]["lr"] = 30.0

    mon = _train(tmp_path, model, opt, 200, on_step=raise_decoder_lr)
    first = mon.findings[0]
    # the step whose update used the new rate, at the layer it was raised for (the encoder's update is normal)
    assert (first["step"], first["kind"], first["layer"]) == (150, "exploding_update", "decoder")
    assert not [f for f in mon.findings if f["step"] == 150 and f["layer"] == "encoder"]
    # the gradients explode after it: the encoder's through the decoder's grown weights
    assert {f["layer"] for f in mon.findings if f["kind"] == "exploding_gradient"} >= {"decoder", "encoder"}
    assert min(f["step"] for f in mon.findings if f["kind"] == "exploding_gradient") > 150


def test_a_target_normalisation_that_collapses_the_output_is_found_on_the_watched_module(tmp_path):
    model = MelPredictor()
    mon = _train(tmp_path, model, torch.optim.Adam(model.parameters(), lr=1e-2), STEPS,
                 target_fn=lambda t: t / t.abs().sum(),          # normalised by the sum, not the std: ~1e-5
                 monitor_kw={"watch": ["decoder"]})
    collapse = [f for f in mon.findings if f["kind"] == "output_collapse"]
    assert collapse and collapse[0]["layer"] == "decoder" and collapse[0]["step"] > 10


def test_frozen_layer_and_stuck_loss(tmp_path):
    model = MelPredictor()
    opt = torch.optim.SGD([{"params": model.encoder.parameters(), "lr": 0.0},
                           {"params": list(model.decoder.parameters()) + list(model.energy.parameters())}], lr=0.05)
    mon = _train(tmp_path, model, opt, 60)
    frozen = [f for f in mon.findings if f["kind"] == "frozen_weights"]
    assert [f["layer"] for f in frozen] == ["encoder"] and frozen[0]["step"] == 9
    assert not [f for f in mon.findings if f["kind"] == "loss_plateau"]

    model2 = MelPredictor()
    fixed = _data(0)
    mon2 = _train(tmp_path / "b", model2, torch.optim.SGD(model2.parameters(), lr=0.0), 60, data=lambda k: fixed)
    plateau = [f for f in mon2.findings if f["kind"] == "loss_plateau"]
    assert plateau and plateau[0]["step"] == 49 and plateau[0]["layer"] == "loss"


def test_a_resumed_run_continues_its_step_count_and_history(tmp_path):
    model = MelPredictor()
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    _train(tmp_path, model, opt, 30)
    mon = _train(tmp_path, model, opt, 20)
    assert mon.step_index == 50
    steps = [json.loads(r)["step"] for r in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    assert steps == list(range(50)) and mon.findings == []


def test_bad_settings_are_clear_errors(tmp_path):
    from tensorprobe.errors import InputError

    with pytest.raises(InputError, match="no module"):
        Monitor(MelPredictor(), run_dir=tmp_path, watch=["nosuch"])
    with pytest.raises(InputError, match="torch.nn.Module"):
        Monitor("model", run_dir=tmp_path)


def test_train_report_cli_prints_the_findings_and_writes_the_page(tmp_path):
    import subprocess
    import sys

    model = MelPredictor()
    opt = torch.optim.SGD([{"params": model.encoder.parameters()}, {"params": model.decoder.parameters()}], lr=0.05)
    _train(tmp_path, model, opt, 160,
           on_step=lambda k, o: o.param_groups[1].__setitem__("lr", 30.0) if k == 150 else None,
           monitor_kw={"watch": ["decoder"]})
    run = tmp_path / "run"
    p = subprocess.run([sys.executable, "-m", "tensorprobe", "train", "report", str(run), "--json"],
                       capture_output=True, text=True)
    doc = json.loads(p.stdout)
    assert p.returncode == 1 and doc["steps"] == 160 and doc["findings"][0]["kind"] == "exploding_update"
    page = (run / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4 and "exploding_update" in page
    text = subprocess.run([sys.executable, "-m", "tensorprobe", "train", "report", str(run)], capture_output=True,
                          text=True).stdout
    assert "exploding_update" in text and "decoder" in text
    bad = subprocess.run([sys.executable, "-m", "tensorprobe", "train", "report", str(tmp_path)], capture_output=True,
                         text=True)
    assert bad.returncode == 2 and "not a training run directory" in bad.stderr and "Traceback" not in bad.stderr


def test_grad_scaler_skips_are_recorded_and_flagged(tmp_path):
    """A real torch.amp.GradScaler: ten batches whose gradients overflow make it skip ten optimizer steps (and
    halve its scale each time); the loss curve shows nothing of it. The monitor marks the rows skipped, unscales
    the statistics, and flags the skips."""
    model = MelPredictor()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    mon = Monitor(model, opt, run_dir=tmp_path / "run", scaler=scaler)
    for k in range(40):
        inputs, target = _data(k)
        loss = F.mse_loss(model(*inputs), target)
        if 20 <= k < 30:                            # a batch with no valid frame: the mean divides by 0
            loss = loss * (1.0 / torch.tensor(0.0))
        opt.zero_grad()
        scaler.scale(loss).backward()
        mon.step(loss)
        scaler.step(opt)
        scaler.update()
    mon.close()
    rows = [json.loads(r) for r in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["skipped"]] == list(range(20, 30))
    assert rows[19]["scale"] == 2.0 ** 10 and rows[30]["scale"] == 2.0 ** 0
    kinds = [(f["step"], f["kind"]) for f in mon.findings]
    # the scaler skipped the overflow (info), and skips far beyond its normal rate are the error
    assert (20, "scaler_backoff") in kinds and "nonfinite_gradient" not in {k for _, k in kinds}
    skipped = next(f for f in mon.findings if f["kind"] == "skipped_steps")
    assert 20 <= skipped["step"] < 30 and skipped["severity"] == "error"
    # unscaled: the norms at step 10 are the model's own, not 1024 times them
    assert rows[10]["grad_norm/decoder.weight"] < 10
