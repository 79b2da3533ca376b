"""`MonitorCallback` for PyTorch Lightning (`pip install lightning`): a `Monitor` on the LightningModule.

    trainer = lightning.Trainer(callbacks=[MonitorCallback("runs/a", watch=["decoder"])])

The gradients are read in `on_before_optimizer_step` (after backward, after Lightning's gradient clipping
when it clips there, before the update); the loss `training_step` returned is added at the batch's end.
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

    def __init__(self, run_dir: str | Path = "tensorprobe-run", **monitor_kw: Any):
        super().__init__()
        self.run_dir, self.monitor_kw = run_dir, monitor_kw
        self.monitor: Monitor | None = None

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        if self.monitor is None:
            # created at the first step: only then is the optimizer Lightning built known
            self.monitor = Monitor(pl_module, getattr(optimizer, "optimizer", optimizer), self.run_dir,
                                   **self.monitor_kw)
        self.monitor.step()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.monitor is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if loss is not None:
            self.monitor.add_loss(loss)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        if self.monitor is not None:
            self.monitor.close()

    @property
    def findings(self) -> list[dict[str, Any]]:
        return self.monitor.findings if self.monitor is not None else []
