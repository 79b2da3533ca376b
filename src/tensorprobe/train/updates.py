"""The weights before an optimizer step, for the update ratio |Δw|/|w|, at a bounded cost.

|Δw| is exact only from the weights before and after the step (no optimizer's state gives it in general:
Adam's step depends on its moments, weight decay, clipping, a GradScaler's skip). So a copy is taken, but:

- into buffers allocated once and reused (`torch._foreach_copy_`): a fresh `clone()` each step costs an
  allocation and, on CPU, a page fault per 4 KiB touched, ~2x the copy itself on a 50M-parameter model;
- on every step by default; with `every=k` on sampled steps only: every step of the first `warmup` (an lr
  typo shows from step 0), then every k-th. The ratios of the sampled steps are exact; the steps between are
  not measured (no row value), and the rules that compare a ratio with its own history then look further
  back (a median over 50 sampled steps spans 500 steps at k=10).

The buffers hold one copy of the trainable weights for the run (the same peak memory as a per-step clone).
"""

from __future__ import annotations

import torch

UPDATE_EVERY = 1        # after the warm-up, measured every this many steps (10: ~1/10 of the copies; the
                        # history-based rules then compare with a longer span of the run)
UPDATE_WARMUP = 20      # steps measured one by one at the start


class Sampling:
    """Which steps are measured: every step of the first `warmup`, then every `every`-th.

        >>> s = Sampling(every=10, warmup=2); [k for k in range(35) if s.sampled(k)]
        [0, 1, 10, 20, 30]
    """

    def __init__(self, every: int = UPDATE_EVERY, warmup: int = UPDATE_WARMUP):
        self.every, self.warmup = max(1, int(every)), max(0, int(warmup))

    def sampled(self, step: int) -> bool:
        return step < self.warmup or step % self.every == 0


class WeightSnapshot(Sampling):
    """`take(step, params)`: the weights copied into reused buffers on a sampled step, else None."""

    def __init__(self, every: int = UPDATE_EVERY, warmup: int = UPDATE_WARMUP):
        super().__init__(every, warmup)
        self._buffers: list[torch.Tensor] | None = None

    def take(self, step: int, params: list[torch.Tensor]) -> list[torch.Tensor] | None:
        if not self.sampled(step):
            return None
        weights = [p.detach() for p in params]
        if self._buffers is None or any(b.shape != w.shape or b.dtype != w.dtype or b.device != w.device
                                        for b, w in zip(self._buffers, weights)):
            self._buffers = [torch.empty_like(w) for w in weights]
        torch._foreach_copy_(self._buffers, weights)
        return self._buffers
