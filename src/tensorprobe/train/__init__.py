"""Training forensics: watch a run step by step, and find where a NaN is born in the backward pass.

- `monitor`  `Monitor(model, optimizer, run_dir=...)`: per-step loss terms, gradient statistics, update
             ratios and watched outputs, streamed to RUN; findings with the step and the layer
- `detect`   the detectors: non-finite, exploding and vanishing gradients (against the layer's own history
             and across layers from step 0), exploding update ratios (absolute bound and cross-layer),
             dead layers (gradients exactly zero), loss plateaus and trends, output collapse (against
             its own history and against the targets' spread, loss at the targets' mean), frozen
             weights, skipped optimizer steps (judged against a GradScaler's normal back-off rate)
- `updates`  the weights around `optimizer.step()` in reused buffers, and step sampling (`Sampling`) for
             update ratios (`monitor.updates.every`) and watched outputs (`monitor.output_stats.every`)
- `run`      the run directory's files (`steps.jsonl`, `findings.jsonl`, `meta.json`)
- `report`   `summarize(RUN)`: what `tensorprobe train report RUN` prints and draws
- `ranges`   `record_ranges` over training batches, `check_ranges` of inference runs against them: the
             module outputs whose inference values leave the training range (`tts check --reference`)

The backward-NaN search itself is `tensorprobe.nan.backward.find_first_nonfinite_backward`
(`tensorprobe nan TARGET --backward`); `Monitor(diagnose=...)` runs it on the first step whose gradients go
non-finite.

    >>> from tensorprobe.train import Monitor                                    # doctest: +SKIP
    >>> mon = Monitor(model, opt, run_dir="runs/a", watch=["decoder"])           # doctest: +SKIP
"""

from __future__ import annotations

from .monitor import Monitor, TrainingStopped
from .ranges import RangeReport, RangeStats, check_ranges, record_ranges
from .report import RunSummary, summarize

__all__ = ["Monitor", "RangeReport", "RangeStats", "RunSummary", "TrainingStopped", "check_ranges", "record_ranges",
           "summarize"]
