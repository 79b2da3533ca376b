"""`MonitorCallback` for transformers' `Trainer`: a `Monitor` on the model it trains.

    trainer = Trainer(model, args, train_dataset=ds, callbacks=[MonitorCallback("runs/a")])

The gradients are read in `on_pre_optimizer_step` (after backward and the Trainer's gradient clipping,
before the update). The Trainer hands the loss only to its logs: each logged loss (every `logging_steps`,
averaged over them; set `logging_steps=1` for every step) is added to the step it is logged at.
A watched prediction and its target reach the monitor through `callback.record(outputs=..., targets=...)`,
called from the Trainer's `compute_loss` (they are judged for collapse against the data at that step).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import RuntimeUnavailable

try:
    from transformers import TrainerCallback
except ImportError:
    raise RuntimeUnavailable.missing("transformers", "train") from None

from .monitor import Monitor  # noqa: E402


class MonitorCallback(TrainerCallback):
    """Record a `Trainer` run with `tensorprobe.train.Monitor` (keyword arguments go to it)."""

    def __init__(self, run_dir: str | Path = "tensorprobe-run", **monitor_kw: Any):
        self.run_dir, self.monitor_kw = run_dir, monitor_kw
        self.monitor: Monitor | None = None
        self._data: dict[str, Any] = {}

    def record(self, *, outputs: Any, targets: Any = None) -> None:
        """A watched prediction and its target for the step being computed (call from `compute_loss`)."""
        self._data = {"outputs": outputs, "targets": targets}

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                              **kwargs: Any) -> None:
        if self.monitor is None:
            # accelerate wraps the optimizer: the hooks go on the torch optimizer inside
            self.monitor = Monitor(model, getattr(optimizer, "optimizer", optimizer), self.run_dir, **self.monitor_kw)
        data, self._data = self._data, {}
        self.monitor.step(**data)

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self.monitor is not None and logs and "loss" in logs:
            self.monitor.add_loss(logs["loss"])

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.monitor is not None:
            self.monitor.close()

    @property
    def findings(self) -> list[dict[str, Any]]:
        return self.monitor.findings if self.monitor is not None else []
