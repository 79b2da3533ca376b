"""The Monitor inside real trainers: a short PyTorch Lightning fit and a short transformers Trainer run of the
mel predictor, one with the NaN-gradient energy, found at the first batch with silent frames."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from tensorprobe.examples.training import Energy, MelPredictor
from tests.train.test_monitor import _data

SILENT_FROM = 12


class _Batches(torch.utils.data.Dataset):
    """The n-th item fetched is step n's batch, whatever index a shuffling sampler asks for: silent frames
    from step SILENT_FROM on (batch size 1 of pre-made batches)."""

    def __init__(self):
        self.fetched = 0

    def __len__(self):
        return 20

    def __getitem__(self, k):
        (x, voiced), target = _data(self.fetched, silent_from=SILENT_FROM)
        self.fetched += 1
        return {"phonemes": x, "voiced": voiced, "labels": target}


def _unbatch(b):
    return b["phonemes"][0], b["voiced"][0], b["labels"][0]


def test_lightning_fit_is_recorded_and_the_nan_step_found(tmp_path):
    L = pytest.importorskip("lightning")
    from tensorprobe.train.lightning import MonitorCallback

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = MelPredictor(energy=Energy())

        def forward(self, x, voiced):
            return self.net(x, voiced)

        def training_step(self, batch, batch_idx):
            x, voiced, target = _unbatch(batch)
            return F.mse_loss(self(x, voiced), target)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    cb = MonitorCallback(tmp_path / "run", watch=["net.decoder"], diagnose=True)
    trainer = L.Trainer(max_epochs=1, callbacks=[cb], logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", num_sanity_val_steps=0)
    trainer.fit(Module(), torch.utils.data.DataLoader(_Batches(), batch_size=1))
    rows = [json.loads(r) for r in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(20))
    assert all(isinstance(r["loss"], float) for r in rows[:SILENT_FROM])              # the loss training_step returned
    assert "update_ratio/net.decoder.weight" in rows[1] and "out_std/net.decoder" in rows[1]
    nan = [f for f in cb.findings if f["kind"] == "nonfinite_gradient"]
    assert nan[0]["step"] == SILENT_FROM and nan[0]["layers"] == ["net.encoder"]
    # re-run through training_step on that batch: the op where the NaN is born
    assert nan[0]["origin_record"] == "net.energy/sqrt.0" and "SqrtBackward0" in nan[0]["origin_headline"]
    assert all(f["step"] >= SILENT_FROM for f in cb.findings)


def test_transformers_trainer_run_is_recorded_and_the_nan_step_found(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from transformers import Trainer, TrainingArguments

    from tensorprobe.train.hf import MonitorCallback

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = MelPredictor(energy=Energy())

        def forward(self, phonemes, voiced, labels):
            return {"loss": F.mse_loss(self.net(phonemes[0], voiced[0]), labels[0])}

    cb = MonitorCallback(tmp_path / "run")
    args = TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=1, num_train_epochs=1,
                             learning_rate=0.05, optim="sgd", lr_scheduler_type="constant", logging_steps=1,
                             report_to=[], save_strategy="no", use_cpu=True,
                             dataloader_num_workers=0, disable_tqdm=True, seed=0)
    Trainer(model=Model(), args=args, train_dataset=_Batches(), callbacks=[cb]).train()
    rows = [json.loads(r) for r in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(20))
    assert isinstance(rows[0]["loss"], float) and "update_ratio/net.decoder.weight" in rows[1]
    nan = [f for f in cb.findings if f["kind"] == "nonfinite_gradient"]
    # the Trainer clips by the global norm, which would make every gradient NaN: read before it, only the
    # encoder's are (what the backward made)
    assert nan[0]["step"] == SILENT_FROM and nan[0]["layers"] == ["net.encoder"]
