"""`Monitor`: per-step numbers of a training run, streamed to a run directory, and what goes wrong in them.

    monitor = Monitor(model, optimizer, run_dir="runs/tts", watch=["decoder"])
    for batch in loader:
        loss = loss_fn(model(*batch))
        loss.backward()
        monitor.step(loss, mel=mel_loss, dur=dur_loss)      # after backward, before optimizer.step()
        optimizer.step(); optimizer.zero_grad()
    monitor.close()

Each step costs two reading passes over each gradient (its L2 norm and `aminmax`, taken by a post-accumulate
hook as the backward makes it, before any clipping) and one device-to-host copy of all the figures; with an
optimizer, the update ratio |Δw|/|w| needs a copy of the weights around `optimizer.step()`: into buffers
reused from step to step, on every step of the first 20 and every 10th after (`monitor.updates.every`). Watched modules add
four reductions of their output per forward.
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from ..errors import InputError, TensorprobeError
from .detect import FrozenWeights, GradientHistory, Jumps, LossPlateau, OutputCollapse, SkippedSteps
from .run import RunWriter, as_float, read_findings, read_rows
from .updates import WeightSnapshot


class TrainingStopped(TensorprobeError):
    """Raised by `Monitor.step` when a finding of a kind in `stop_on` is made."""

    def __init__(self, finding: dict[str, Any]):
        super().__init__(f"training stopped at step {finding['step']}: {finding['message']}")
        self.finding = finding


class Monitor:
    """Record every step's loss terms, gradient statistics, update ratios and watched outputs; flag what goes
    wrong, with the step and the layer. Never stops training unless asked (`stop_on`).

    Args:
        model: the module being trained.
        optimizer: its optimizer (optional): update ratios |Δw|/|w|, frozen weights and skipped steps need it.
        run_dir: where the run's rows and findings go (reopened to resume).
        watch: module names or regexes whose outputs' statistics are recorded (output collapse).
        scaler: a `torch.amp.GradScaler`: gradients are unscaled for the statistics, its scale is logged.
        window: steps of history the detectors compare with.
        every: write a row every `every` steps (and every step with a finding); detection runs every step.
        stop_on: finding kinds that raise `TrainingStopped` (e.g. `("nonfinite_gradient",)`).
        diagnose: `fn() -> (inputs, loss_fn[, call])` giving the step's batch (and how to run the model on it,
            `call(model, *inputs)`, when not `model(*inputs)`): on the first non-finite gradient the
            step is run again under `find_first_nonfinite_backward` to name the op where it is born.

    Example:
        >>> with Monitor(model, opt, run_dir="runs/a", watch=["decoder"]) as mon:    # doctest: +SKIP
        ...     for x, y in loader:
        ...         loss = F.mse_loss(model(x), y); loss.backward()
        ...         mon.step(loss); opt.step(); opt.zero_grad()
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 run_dir: str | Path = "tensorprobe-run", *, watch: Iterable[str] = (), scaler: Any = None,
                 window: int = 50, every: int = 1, stop_on: Sequence[str] = (),
                 diagnose: Callable[[], tuple[Any, Callable]] | None = None):
        if not isinstance(model, torch.nn.Module):
            raise InputError(f"Monitor needs a torch.nn.Module, got {type(model).__name__}")
        if window < 2 or every < 1:
            raise InputError("Monitor: window must be at least 2 and every at least 1")
        self.model, self.optimizer, self.scaler = model, optimizer, scaler
        self.params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.every, self.stop_on, self.diagnose = every, tuple(stop_on), diagnose
        self.run_dir = Path(run_dir)
        self.findings: list[dict[str, Any]] = []
        self._gradients = GradientHistory(window)
        self._plateau = LossPlateau(window)
        self._collapse = OutputCollapse()
        self._frozen = FrozenWeights(patience=max(3, window // 5))
        self._updates = Jumps(window, "update ratio |Δw|/|w|", "exploding_update", None)
        self._skips = SkippedSteps(window)
        self._watched = self._watch(watch)
        self._outputs: dict[str, torch.Tensor] = {}
        self._grad_stats: dict[str, torch.Tensor] = {}
        self._handles: list[Any] = []
        # the weights before an optimizer step, in reused buffers, on sampled steps (`updates.every`, after
        # `updates.warmup` steps measured one by one): |Δw| is exact where measured, absent between
        self.updates = WeightSnapshot()
        self._before: list[torch.Tensor] | None = None
        self._ratios: dict[str, float] | None = None
        self._stepped = False
        self._pending: dict[str, Any] | None = None
        self._diagnosed = False
        self.step_index = self._resume()
        self._writer = RunWriter(self.run_dir)
        self._writer.write_meta({"model": type(model).__name__, "parameters": [n for n, _ in self.params],
                                 "watch": [n for n, _ in self._watched], "window": window, "every": every,
                                 "optimizer": type(optimizer).__name__ if optimizer is not None else None})
        self.resume()

    # ---- the loop's one call ------------------------------------------------------------------------
    def step(self, loss: torch.Tensor | float | None = None, **terms: torch.Tensor | float) -> list[dict[str, Any]]:
        """Record this step (call after `backward()`, before `optimizer.step()`); return its findings."""
        self._flush_pending()
        k = self.step_index
        self.step_index += 1
        named = [n for n, p in self.params if p.grad is not None or n in self._grad_stats]
        scalars = {"loss": loss, **{f"loss/{t}": v for t, v in terms.items()}}
        scalars = {n: v for n, v in scalars.items() if v is not None}
        values = self._gather(named, scalars)
        norms = dict(zip(named, values["norm"]))
        absmax = dict(zip(named, values["absmax"]))
        # a norm overflows float32 long before its elements do: the count decides what is non-finite
        nonfinite = {n: int(c) for n, c in zip(named, values["nonfinite"]) if c}
        losses = dict(zip(scalars, values["scalars"]))
        outputs = values["outputs"]
        found = (self._gradients.update(k, norms, nonfinite)
                 + self._collapse.update(k, {m: s["std"] for m, s in outputs.items()}))
        row: dict[str, Any] = {"step": k, "time": round(time.time(), 3), **losses}
        row.update({f"grad_norm/{n}": v for n, v in norms.items()})
        row.update({f"grad_absmax/{n}": v for n, v in absmax.items()})
        row.update({f"grad_nonfinite/{n}": c for n, c in nonfinite.items()})
        for m, s in outputs.items():
            row.update({f"out_{stat}/{m}": v for stat, v in s.items()})
        if self.scaler is not None:
            row["scale"] = float(self.scaler.get_scale())
        for f in found:
            if f["kind"] == "nonfinite_gradient" and self.diagnose is not None and not self._diagnosed:
                self._diagnosed = True
                f.update(self._origin())
        self._pending = {"row": row, "norms": norms, "findings": found}
        self._stepped = False
        for f in found:
            self._record(f)
        for f in found:
            if f["kind"] in self.stop_on:
                self.close()
                raise TrainingStopped(f)
        return found

    def add_loss(self, loss: torch.Tensor | float | None = None, **terms: torch.Tensor | float) -> None:
        """Attach loss terms to the step recorded last, when they are known only after `step()` (a trainer
        that hands out the loss at the end of the batch)."""
        if self._pending is None:
            return
        for name, v in {"loss": loss, **{f"loss/{t}": v for t, v in terms.items()}}.items():
            if v is not None:
                self._pending["row"][name] = float(v.detach().float()) if isinstance(v, torch.Tensor) else float(v)

    def pause(self) -> None:
        """Take the monitor's hooks off the model and optimizer (e.g. around validation); `resume()` puts
        them back."""
        for h in self._handles:
            h.remove()
        self._handles = []

    def resume(self) -> None:
        if self._handles:
            return
        self._handles = [m.register_forward_hook(self._output_hook(name)) for name, m in self._watched]
        # gradients as the backward made them, before a trainer's clipping rescales them (global-norm clipping
        # spreads one NaN to every parameter, and hides an explosion)
        self._handles += [p.register_post_accumulate_grad_hook(self._grad_hook(n)) for n, p in self.params]
        if self.optimizer is not None:
            self._handles += [self.optimizer.register_step_pre_hook(self._before_update),
                              self.optimizer.register_step_post_hook(self._after_update)]

    def close(self) -> None:
        """Write the last row and close the files (also on `with` exit)."""
        self._flush_pending()
        self.pause()
        self._writer.close()

    def __enter__(self) -> "Monitor":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- internals ----------------------------------------------------------------------------------
    def _gather(self, named: list[str], scalars: dict[str, Any]) -> dict[str, Any]:
        """Every figure of the step in one device-to-host copy."""
        grads = dict(self.params)
        stats = [self._grad_stats.pop(n, None) for n in named]
        stats = [s if s is not None else _grad_stats(grads[n].grad) for n, s in zip(named, stats)]
        self._grad_stats.clear()
        parts = [torch.stack(stats).T.reshape(-1)] if stats else []
        self._stats_grads = {n: grads[n].grad for n in named}
        tensors = [v.detach().float().reshape(()) for v in scalars.values() if isinstance(v, torch.Tensor)]
        outs = [self._outputs[m] for m, _ in self._watched if m in self._outputs]
        device = stats[0].device if stats else torch.device("cpu")
        pieces = parts + ([torch.stack(tensors)] if tensors else []) + outs
        flat = torch.cat([t.to(device) for t in pieces]).cpu().tolist() if pieces else []
        n = len(stats)
        norm, absmax, rest = flat[:n], flat[n:2 * n], flat[2 * n:]
        # an L2 norm overflows float32 long before an element does: count the elements to tell
        counts = [0 if math.isfinite(v) else _count_nonfinite(self._stats_grads[name])
                  for name, v in zip(named, norm)]
        self._stats_grads = {}
        if self.scaler is not None and stats:
            inv = 1.0 / float(self.scaler.get_scale())
            norm, absmax = [v * inv for v in norm], [v * inv for v in absmax]
        it = iter(rest[:len(tensors)])
        scalar_values = [next(it) if isinstance(v, torch.Tensor) else float(v) for v in scalars.values()]
        out_values = rest[len(tensors):]
        outputs = {}
        for i, (m, _) in enumerate((m, _) for m, _ in self._watched if m in self._outputs):
            mean, std, amax, bad = out_values[4 * i:4 * i + 4]
            outputs[m] = {"mean": mean, "std": std, "absmax": amax, "nonfinite": int(bad)}
        self._outputs.clear()
        return {"norm": norm, "absmax": absmax, "nonfinite": counts, "scalars": scalar_values, "outputs": outputs}

    def _grad_hook(self, name: str):
        def hook(param: torch.Tensor) -> None:
            self._grad_stats[name] = _grad_stats(param.grad)
        return hook

    def _watch(self, patterns: Iterable[str]) -> list[tuple[str, torch.nn.Module]]:
        patterns = list(patterns)
        if not patterns:
            return []
        names = dict(self.model.named_modules())
        chosen = []
        for pat in patterns:
            if pat in names:
                chosen.append((pat, names[pat]))
                continue
            try:
                rx = re.compile(pat)
            except re.error as e:
                raise InputError(f"Monitor watch={pat!r}: not a module name and not a valid regex ({e})") from None
            hits = [(n, m) for n, m in names.items() if n and rx.fullmatch(n)]
            if not hits:
                raise InputError(f"Monitor watch={pat!r}: no module of {type(self.model).__name__} has that name")
            chosen += hits
        return list(dict(chosen).items())

    def _output_hook(self, name: str):
        def hook(module, args, output):
            t = output[0] if isinstance(output, (tuple, list)) else output
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 1:
                x = t.detach().float()
                finite = torch.isfinite(x)
                self._outputs[name] = torch.stack([x.mean(), x.std(), x.abs().amax(), (~finite).sum().float()])
        return hook

    def _before_update(self, optimizer, args, kwargs) -> None:
        self._before = self.updates.take(self.step_index - 1, [p for _, p in self.params])

    def _after_update(self, optimizer, args, kwargs) -> None:
        self._stepped = True
        if self._before is None:
            return
        after = [p.detach() for _, p in self.params]
        deltas = torch._foreach_norm(torch._foreach_sub(after, self._before))
        sizes = torch._foreach_norm(after)
        ratio = (torch.stack(deltas).float() / torch.stack(sizes).float().clamp_min(1e-30)).cpu().tolist()
        self._ratios = {n: r for (n, _), r in zip(self.params, ratio)}
        self._before = None

    def _flush_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        row, k = pending["row"], pending["row"]["step"]
        found = self._plateau.update(k, {n: v for n, v in row.items() if n == "loss" or n.startswith("loss/")})
        if self.optimizer is not None:
            skipped = not self._stepped
            row["skipped"] = skipped
            found += self._skips.update(k, skipped)
            if self._ratios is not None and not skipped:
                row.update({f"update_ratio/{n}": r for n, r in self._ratios.items()})
                found += self._updates.update(k, self._ratios) + self._frozen.update(k, self._ratios, pending["norms"])
            self._ratios = None
        for f in found:
            self._record(f)
        if k % self.every == 0 or pending["findings"] or found:
            self._writer.row(row)

    def _record(self, f: dict[str, Any]) -> None:
        self.findings.append(f)
        self._writer.finding(f)

    def _origin(self) -> dict[str, Any]:
        """Run this step again in backward-NaN mode: the op where the non-finite gradient is born."""
        from ..nan.backward import find_first_nonfinite_backward

        self.pause()            # the re-run's gradients and outputs are not this step's
        try:
            inputs, loss_fn, *call = self.diagnose()
            origin = find_first_nonfinite_backward(self.model, inputs, loss_fn, call=call[0] if call else None)
        except Exception as e:  # noqa: BLE001 - a diagnosis that fails must not stop the training it watches
            return {"origin": None, "origin_error": f"{type(e).__name__}: {e}"}
        finally:
            self.resume()
        return {"origin": origin.to_dict() if origin.found else None,
                "origin_headline": origin.headline(), "origin_record": origin.record}

    def _resume(self) -> int:
        """The next step index, with the detectors' history refilled from the run directory's last rows."""
        last = -1
        for row in read_rows(self.run_dir):
            k = int(row.get("step", -1))
            last = max(last, k)
            norms = {n.split("/", 1)[1]: as_float(v) for n, v in row.items() if n.startswith("grad_norm/")}
            self._gradients.update(k, {n: v for n, v in norms.items() if v is not None and math.isfinite(v)}, {})
            self._plateau.update(k, {n: as_float(v) for n, v in row.items()
                                     if (n == "loss" or n.startswith("loss/")) and as_float(v) is not None})
        if last >= 0:
            # what the history replay just found was found (and written) by the earlier run
            self._gradients.episodes.active.clear()
            self._plateau.episodes.active.clear()
            self.findings = read_findings(self.run_dir)
        return last + 1


def _grad_stats(g: torch.Tensor) -> torch.Tensor:
    """(L2 norm, abs-max) of a gradient, on its device, in float32: two reading passes, no temporary (the
    non-finite count is taken only where a norm is not finite)."""
    g = g.detach()
    if g.numel() == 0:
        return torch.zeros(2, device=g.device)
    lo, hi = torch.aminmax(g)      # 6x faster than an inf-norm on CPU (which is not vectorised), NaN kept
    return torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32), torch.maximum(hi.float(), -lo.float())])


def _count_nonfinite(g: torch.Tensor | None) -> int:
    return 0 if g is None else int((~torch.isfinite(g.detach())).sum())
