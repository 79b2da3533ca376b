"""`MonitorCallback` for PyTorch Lightning (`pip install lightning`): a `Monitor` on the LightningModule.

    trainer = lightning.Trainer(callbacks=[MonitorCallback("runs/a", watch=["decoder"])])

The gradients are read by the monitor's hooks as the backward makes them; the step is recorded in
`on_before_optimizer_step` and the loss `training_step` returned is added at the batch's end; when
`training_step` returns a dict with `"outputs"` and `"targets"` (a watched prediction and its target, tensors
or dicts of them), they are judged for collapse against the data. With
`diagnose=True`, the first step whose gradients go non-finite is run again (`training_step` on the same
batch) under `find_first_nonfinite_backward`, and the finding names the op where the NaN is born.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import RuntimeUnavailable

try:
    from lightning.pytorch import Callback
except ImportError:
    try:                                 # the older package name
        from pytorch_lightning import Callback  # type: ignore[no-redef]
    except ImportError:
        raise RuntimeUnavailable.missing("lightning", "train") from None

from .monitor import Monitor  # noqa: E402


class MonitorCallback(Callback):
    """Record a Lightning fit with `tensorprobe.train.Monitor` (keyword arguments go to it)."""

    def __init__(self, run_dir: str | Path = "tensorprobe-run", *, diagnose: bool = False, **monitor_kw: Any):
        super().__init__()
        self.run_dir, self.monitor_kw, self.diagnose = run_dir, monitor_kw, diagnose
        self.monitor: Monitor | None = None
        self._batch: tuple[Any, int] | None = None

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self._batch = (batch, batch_idx)

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.monitor is None:
            # created at the first step: only then is the optimizer Lightning built known
            self.monitor = Monitor(pl_module, getattr(optimizer, "optimizer", optimizer), self.run_dir,
                                   diagnose=self._rerun(pl_module) if self.diagnose else None, **self.monitor_kw)
        self.monitor.step()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.monitor is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        pred = outputs.get("outputs") if isinstance(outputs, dict) else None
        target = outputs.get("targets") if isinstance(outputs, dict) else None
        if loss is not None or pred is not None:
            self.monitor.add_loss(loss, outputs=pred, targets=target)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is not None:
            self.monitor.close()

    def _rerun(self, pl_module: Any):
        """What `Monitor(diagnose=)` runs: this batch through `training_step`, its loss picked out."""
        def step():
            batch, idx = self._batch
            return (batch,), _loss_of, lambda module, b: module.training_step(b, idx)
        return step

    @property
    def findings(self) -> list[dict[str, Any]]:
        return self.monitor.findings if self.monitor is not None else []


def _loss_of(out: Any) -> Any:
    return out["loss"] if isinstance(out, dict) else out
