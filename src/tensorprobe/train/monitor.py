"""`Monitor`: per-step numbers of a training run, streamed to a run directory, and what goes wrong in them.

    monitor = Monitor(model, optimizer, run_dir="runs/tts", watch=["decoder"])
    for batch in loader:
        loss = loss_fn(model(*batch))
        loss.backward()
        monitor.step(loss, mel=mel_loss, dur=dur_loss)      # after backward, before optimizer.step()
        optimizer.step(); optimizer.zero_grad()
    monitor.close()

Each step costs two reading passes over each gradient (its L2 norm and `aminmax`, taken by a post-accumulate
hook as the backward makes it, before any clipping; on a GPU, two fused `torch._foreach_norm` passes over all
of a backward's gradients at its end, `fused_grad_stats`) and one device-to-host copy of all the figures; with an
optimizer, the update ratio |Δw|/|w| needs a copy of the weights around `optimizer.step()`: into buffers
reused from step to step (every step; `monitor.updates.every = 10` samples them). Watched modules add
four reductions of their output per forward (`monitor.output_stats.every = 10` samples them likewise).
"""

from __future__ import annotations

import math
import re
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from ..errors import InputError, TensorprobeError
from .detect import (CROSS_LAYER, CROSS_LAYER_GRAD, UPDATE_BOUND, CrossLayer, DataCollapse, DeadGradients,
                     FrozenWeights, GradientHistory, Jumps, LossPlateau, LossTrend, OutputCollapse, SkippedSteps,
                     finding)
from .run import RunWriter, as_float, read_findings, read_rows
from .updates import Sampling, WeightSnapshot


def _scaled_loss(loss_fn: Callable, scale: float) -> Callable:
    """loss_fn times the GradScaler's scale, under loss_fn's own name (a finding in it reads 'the loss
    (spectral_loss)', not an anonymous lambda's)."""
    def scaled(out):
        return loss_fn(out) * scale
    scaled.__name__ = getattr(loss_fn, "__name__", type(loss_fn).__name__)
    return scaled


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
        scaler: a `torch.amp.GradScaler`: gradients are unscaled for the statistics, its scale is logged; a
            step it skips on an overflow (its calibration, an occasional back-off) is info, not an error, unless
            the skips exceed its normal rate or the loss stops improving.
        window: steps of history the detectors compare with.
        every: write a row every `every` steps (and every step with a finding); detection runs every step.
        stop_on: finding kinds that raise `TrainingStopped` (e.g. `("nonfinite_gradient",)`).
        diagnose: `fn() -> (inputs, loss_fn[, call])` giving the step's batch (and how to run the model on it,
            `call(model, *inputs)`, when not `model(*inputs)`): on the first non-finite gradient the
            step is run again under `find_first_nonfinite_backward` to name the op where it is born (under
            the step's autocast context and the scaler's scale).
        update_bound: an update ratio |Δw|/|w| above this, in one step, is an exploding update (from step 0).

    Example:
        >>> with Monitor(model, opt, run_dir="runs/a", watch=["decoder"]) as mon:    # doctest: +SKIP
        ...     for x, y in loader:
        ...         loss = F.mse_loss(model(x), y); loss.backward()
        ...         mon.step(loss); opt.step(); opt.zero_grad()
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 run_dir: str | Path = "tensorprobe-run", *, watch: Iterable[str] = (), scaler: Any = None,
                 window: int = 50, every: int = 1, stop_on: Sequence[str] = (),
                 diagnose: Callable[[], tuple[Any, Callable]] | None = None, update_bound: float = UPDATE_BOUND):
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
        self._skips = SkippedSteps(window, scaler=scaler)
        self._cross_updates = CrossLayer("exploding_update", update_bound, CROSS_LAYER, self._describe_update)
        self._cross_grads = CrossLayer("exploding_gradient", None, CROSS_LAYER_GRAD, self._describe_grad)
        self._dead = DeadGradients(patience=max(5, window // 5))
        self._trend = LossTrend(window)
        self._data_collapse = DataCollapse(patience=max(5, window // 5))
        for detector in (self._gradients, self._gradients.jumps, self._frozen, self._updates, self._cross_updates,
                         self._cross_grads, self._dead):   # the root's own parameters are the model's layer
            detector.root = type(model).__name__
        self._judged = {n for n, p in self.params if p.dim() >= 2}
        self._numel = {n: p.numel() for n, p in self.params}
        self._group_of = self._param_groups()
        self._autocast: dict[str, Any] = {}
        self._first_update_error: dict[str, Any] | None = None
        self._watched = self._watch(watch)
        self._outputs: dict[str, torch.Tensor] = {}
        self._grad_stats: dict[str, torch.Tensor] = {}
        # On a GPU, per-parameter statistics cost kernel launches (~5 per parameter and step): there the
        # gradients that arrived in a backward are reduced together at its end, in two fused passes
        # (`torch._foreach_norm`, L2 and inf), still before any clipping. On the CPU a launch costs nothing
        # and an inf-norm is not vectorised: each gradient is reduced as it arrives.
        self.fused_grad_stats = any(p.device.type != "cpu" for _, p in self.params)
        self._arrived: dict[str, torch.Tensor] = {}
        self._fused_queued = False
        self._handles: list[Any] = []
        # the weights before an optimizer step, in reused buffers; sampled with `updates.every` (after
        # `updates.warmup` steps measured one by one): |Δw| is exact where measured, absent between
        self.updates = WeightSnapshot()
        # watched outputs' statistics (four reductions per watched module per forward), sampled the same way:
        # `output_stats.every = 10` reduces them on every step of the first `warmup`, then every 10th
        self.output_stats = Sampling()
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
    def step(self, loss: torch.Tensor | float | None = None, *, outputs: Any = None, targets: Any = None,
             **terms: torch.Tensor | float) -> list[dict[str, Any]]:
        """Record this step (call after `backward()`, before `optimizer.step()`); return its findings.

        `outputs` and `targets`: the prediction and the target of a watched output (tensors, or dicts of them
        by name): a prediction whose spread across batch and time stays below a tenth of its target's, and a
        loss that stays at the cost of predicting the targets' mean, are collapses."""
        data = _prediction_stats(outputs, targets)
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
        # with a scaler, an overflow is judged once we know whether the scaler skipped the step
        judged_nonfinite = {} if self.scaler is not None else nonfinite
        found = self._gradients.update(k, norms, judged_nonfinite)
        for f in found:
            if f["kind"] == "nonfinite_gradient":
                self._explain_nonfinite(f, losses.get("loss"))
        rms = {n: v / math.sqrt(self._numel[n]) for n, v in norms.items() if n in self._judged and n not in nonfinite}
        found += self._cross_grads.update(k, rms)
        found += self._dead.update(k, {n: norms.get(n, 0.0) for n, _ in self.params})
        found += self._collapse.update(k, {m: s["std"] for m, s in outputs.items()})

        row: dict[str, Any] = {"step": k, "time": round(time.time(), 3), **losses}
        row.update({f"grad_norm/{n}": v for n, v in norms.items()})
        row.update({f"grad_absmax/{n}": v for n, v in absmax.items()})
        row.update({f"grad_nonfinite/{n}": c for n, c in nonfinite.items()})
        for m, s in outputs.items():
            row.update({f"out_{stat}/{m}": v for stat, v in s.items()})
        if self.scaler is not None:
            row["scale"] = float(self.scaler.get_scale())
        for f in found:
            if f["kind"] == "nonfinite_gradient":
                self._diagnose_once(f, row.get("scale"))
        self._pending = {"row": row, "norms": norms, "findings": found, "nonfinite": nonfinite,
                         "data": data, "scale": row.get("scale")}
        self._stepped = False
        for f in found:
            self._record(f)
        self._stop_if_asked(found)
        return found

    def add_loss(self, loss: torch.Tensor | float | None = None, *, outputs: Any = None, targets: Any = None,
                 **terms: torch.Tensor | float) -> None:
        """Attach loss terms (and a watched prediction with its target) to the step recorded last, when they
        are known only after `step()` (a trainer that hands out the loss at the end of the batch)."""
        if self._pending is None:
            return
        if outputs is not None:
            self._pending["data"] = _prediction_stats(outputs, targets)
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
        self._handles.append(self.model.register_forward_pre_hook(self._note_autocast))
        # gradients as the backward made them, before a trainer's clipping rescales them (global-norm clipping
        # spreads one NaN to every parameter, and hides an explosion)
        self._handles += [p.register_post_accumulate_grad_hook(self._grad_hook(n)) for n, p in self.params]
        if self.optimizer is not None:
            self._handles += [self.optimizer.register_step_pre_hook(self._before_update),
                              self.optimizer.register_step_post_hook(self._after_update)]

    def close(self) -> None:
        """Write the last row and close the files (also on `with` exit)."""
        self._flush_pending(closing=True)
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
        missing = [n for n, s in zip(named, stats) if s is None]
        if missing:   # gradients no hook saw this step (kept from an earlier step, or made outside a backward)
            reduce = _fused_grad_stats if self.fused_grad_stats else (lambda gs: [_grad_stats(g) for g in gs])
            made = dict(zip(missing, reduce([grads[n].grad for n in missing])))
            stats = [s if s is not None else made[n] for n, s in zip(named, stats)]
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
            if not self.fused_grad_stats:
                self._grad_stats[name] = _grad_stats(param.grad)
                return
            self._arrived[name] = param
            if not self._fused_queued:   # once per backward: reduce what arrived when the backward ends
                self._fused_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._reduce_arrived)
        return hook

    def _reduce_arrived(self) -> None:
        self._fused_queued = False
        names = [n for n, p in self._arrived.items() if p.grad is not None]
        rows = _fused_grad_stats([self._arrived[n].grad for n in names])
        self._arrived.clear()
        self._grad_stats.update(zip(names, rows))

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
            if not self.output_stats.sampled(self.step_index):
                return
            t = output[0] if isinstance(output, (tuple, list)) else output
            if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() > 1:
                x = t.detach().float()
                finite = torch.isfinite(x)
                self._outputs[name] = torch.stack([x.mean(), x.std(), x.abs().amax(), (~finite).sum().float()])
        return hook

    def _note_autocast(self, module, args) -> None:
        """The autocast context the model's forward runs in, for a diagnosis re-run of the step."""
        for device_type in ("cuda", "cpu"):
            if torch.is_autocast_enabled(device_type):
                self._autocast = {"enabled": True, "device_type": device_type,
                                  "dtype": str(torch.get_autocast_dtype(device_type)).replace("torch.", "")}
                return
        self._autocast = {"enabled": False}

    def _before_update(self, optimizer, args, kwargs) -> None:
        self._before = self.updates.take(self.step_index - 1, [p for _, p in self.params])

    def _after_update(self, optimizer, args, kwargs) -> None:
        self._stepped = True
        if self._before is None:
            return
        after = [p.detach() for _, p in self.params]
        deltas = torch._foreach_norm(torch._foreach_sub(after, self._before))
        # against the norm before the step: a step that moves w 4x its size reads 4, not ~1
        sizes = torch.maximum(torch.stack(torch._foreach_norm(self._before)).float(),
                              1e-3 * torch.stack(torch._foreach_norm(after)).float())
        ratio = (torch.stack(deltas).float() / sizes.clamp_min(1e-30)).cpu().tolist()
        self._ratios = {n: r for (n, _), r in zip(self.params, ratio)}
        self._before = None

    def _flush_pending(self, closing: bool = False) -> None:
        pending, self._pending = self._pending, None
        if pending is None:
            return
        row, k = pending["row"], pending["row"]["step"]
        losses = {n: v for n, v in row.items() if n == "loss" or n.startswith("loss/")}
        found = self._plateau.update(k, losses)
        skipped = None
        if self.optimizer is not None:
            skipped = not self._stepped
            row["skipped"] = skipped
            scale = float(self.scaler.get_scale()) if self.scaler is not None else None
            found += self._skips.update(k, skipped, scale)
            if self._ratios is not None and not skipped:
                row.update({f"update_ratio/{n}": r for n, r in self._ratios.items()})
                cross = self._cross_updates.update(k, {n: r for n, r in self._ratios.items() if n in self._judged})
                if cross and self._first_update_error is None:
                    self._first_update_error = cross[0]
                found += (cross + self._updates.update(k, self._ratios)
                          + self._frozen.update(k, self._ratios, pending["norms"]))
            self._ratios = None
        if self.scaler is not None:
            # an overflow the scaler skipped is its business (info above); one it let through is an error
            let_through = pending["nonfinite"] if skipped is False else {}
            nan = [f for f in self._gradients.update(k, {}, let_through) if f["kind"] == "nonfinite_gradient"]
            for f in nan:
                self._explain_nonfinite(f, as_float(row.get("loss")))
                self._diagnose_once(f, pending["scale"])
            found += nan
        found += self._trend.update(k, {n: as_float(v) for n, v in losses.items()
                                        if as_float(v) is not None}, skips=self._skips.in_window())
        if pending["data"]:
            found += self._data_collapse.update(k, pending["data"], as_float(row.get("loss")))
        for f in found:
            self._record(f)
        if k % self.every == 0 or pending["findings"] or found:
            self._writer.row(row)
        if not closing:
            self._stop_if_asked(found)

    def _stop_if_asked(self, found: list[dict[str, Any]]) -> None:
        for f in found:
            if f["kind"] in self.stop_on:
                self.close()
                raise TrainingStopped(f)

    def _param_groups(self) -> dict[str, int]:
        if self.optimizer is None:
            return {}
        index = {id(p): i for i, g in enumerate(self.optimizer.param_groups) for p in g["params"]}
        return {n: index[id(p)] for n, p in self.params if id(p) in index}

    def _lr_words(self, name: str) -> str:
        """"its group's lr is 200 against 0.01": the parameter's group and the other groups' lrs."""
        if self.optimizer is None or name not in self._group_of:
            return ""
        groups = self.optimizer.param_groups
        i = self._group_of[name]
        lr = groups[i].get("lr")
        others = sorted({g.get("lr") for j, g in enumerate(groups) if j != i and g.get("lr") is not None})
        text = f": its param group {i} has lr {lr:.3g}"
        if others:
            text += " against " + ", ".join(f"{o:.3g}" for o in others) + " in the other groups"
        return text

    def _describe_update(self, name: str, value: float, ref: float | None) -> str:
        vs = f", {value / ref:,.0f}x the median layer ({ref:.2g})" if ref else ""
        return (f"{name} moves {value:.3g}x its norm per step{vs}{self._lr_words(name)}; a healthy step moves "
                "1e-4..1e-2 of it: lower that group's lr (or warm it up), clip the gradients")

    def _describe_grad(self, name: str, value: float, ref: float | None) -> str:
        return (f"the gradient of {name} is {value:.3g} per element (RMS), {value / ref:,.0f}x the median layer "
                f"({ref:.2g}){self._lr_words(name)}: a loss term or an op that scales this layer's gradient "
                "(clip the gradients, check the loss weights)")

    def _explain_nonfinite(self, f: dict[str, Any], loss: float | None) -> None:
        f.update(self._what_came_first(loss))
        f["message"] = f["message"].replace("; later steps", f"; {f['cause']}; later steps")

    def _what_came_first(self, loss: float | None) -> dict[str, Any]:
        """Which came first: an update that blew up, a non-finite loss (the forward), or the backward."""
        first = self._first_update_error
        if first is not None:
            return {"came_first": "update", "cause": f"after an update blew up at step {first['step']}: "
                                                      f"{first['message']}"}
        if loss is not None and not math.isfinite(loss):
            return {"came_first": "loss", "cause": "the loss itself is non-finite: the forward (or the loss) made "
                                                   "it, not the backward (tensorprobe nan finds the op)"}
        return {"came_first": "backward", "cause": "the loss is finite and no update blew up before: the backward "
                                                   "made it (Monitor(diagnose=...) or nan --backward names the op)"}

    def _diagnose_once(self, f: dict[str, Any], scale: float | None) -> None:
        if self.diagnose is not None and not self._diagnosed:
            self._diagnosed = True
            f.update(self._origin(scale))

    def _record(self, f: dict[str, Any]) -> None:
        self.findings.append(f)
        self._writer.finding(f)

    def _origin(self, scale: float | None = None) -> dict[str, Any]:
        """Run this step again in backward-NaN mode, under the autocast context the step's forward ran in and
        with the loss scaled as the scaler scaled it: the op where the non-finite gradient is born."""
        from ..nan.backward import find_first_nonfinite_backward

        context = dict(self._autocast)
        self.pause()            # the re-run's gradients and outputs are not this step's
        try:
            inputs, loss_fn, *call = self.diagnose()
            scaled = loss_fn if not scale else _scaled_loss(loss_fn, scale)
            with _autocast_like(context):
                origin = find_first_nonfinite_backward(self.model, inputs, scaled, call=call[0] if call else None)
        except Exception as e:  # noqa: BLE001 - a diagnosis that fails must not stop the training it watches
            return {"origin": None, "origin_error": f"{type(e).__name__}: {e}", "origin_context": context}
        finally:
            self.resume()
        out = {"origin": origin.to_dict() if origin.found else None, "origin_context": context,
               "origin_headline": origin.headline(), "origin_record": origin.record}
        if not origin.found:
            where = (f"autocast {context['dtype']} on {context['device_type']}" if context.get("enabled")
                     else "no autocast")
            out["origin_headline"] = (
                f"the re-run did not reproduce the non-finite gradient (it ran with {where}"
                f"{f', loss scaled by {scale:g}' if scale else ''}): the step's context differs; return "
                "(inputs, loss_fn, call) from diagnose= with call running the model as the loop does (its "
                "torch.autocast, dtype, train/eval mode, the same batch and random state)")
        return out

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


def _fused_grad_stats(grads: list[torch.Tensor]) -> list[torch.Tensor]:
    """`_grad_stats` of each gradient, as two fused passes per device (`torch._foreach_norm` with ord 2 and
    inf: the same figures, NaN kept), in float32; rows of one (k, 2) tensor per device."""
    out: list[torch.Tensor | None] = [None] * len(grads)
    by_device: dict[torch.device, list[int]] = {}
    for i, g in enumerate(grads):
        if g.numel() == 0:   # an inf-norm has no value for no elements
            out[i] = torch.zeros(2, device=g.device)
        else:
            by_device.setdefault(g.device, []).append(i)
    for device, idx in by_device.items():
        gs = [grads[i].detach() for i in idx]
        norms = torch.stack(torch._foreach_norm(gs, 2, dtype=torch.float32))
        absmax = torch.stack(torch._foreach_norm(gs, math.inf)).float()
        rows = torch.stack([norms, absmax], dim=1)
        for j, i in enumerate(idx):
            out[i] = rows[j]
    return out   # type: ignore[return-value]


def _count_nonfinite(g: torch.Tensor | None) -> int:
    return 0 if g is None else int((~torch.isfinite(g.detach())).sum())


def _autocast_like(context: dict[str, Any]):
    if not context.get("enabled"):
        return _nullcontext()
    return torch.autocast(context["device_type"], dtype=getattr(torch, context["dtype"]))


def _nullcontext():
    import contextlib
    return contextlib.nullcontext()


def _named(x: Any, default: str) -> dict[str, torch.Tensor]:
    if x is None:
        return {}
    if isinstance(x, torch.Tensor):
        return {default: x}
    if isinstance(x, dict):
        return {str(k): v for k, v in x.items() if isinstance(v, torch.Tensor)}
    if isinstance(x, (list, tuple)):
        return {f"{default}.{i}": v for i, v in enumerate(x) if isinstance(v, torch.Tensor)}
    raise InputError(f"Monitor.step outputs=/targets=: a tensor, or a dict or list of tensors, not {type(x).__name__}")


def _spreads(x: torch.Tensor) -> list[torch.Tensor]:
    """The spread of x across batch and time, per channel (RMS over channels), for each place the channel
    axis may have ((B, C, T) or (B, T, C)): a prediction that outputs each channel's mean has ~0 spread."""
    x = x.detach().float()
    if x.dim() < 3:
        return [x.std() if x.numel() > 1 else x.new_zeros(())]
    out = []
    for axis in (1, x.dim() - 1):
        per_channel = x.movedim(axis, 0).reshape(x.shape[axis], -1)
        out.append(per_channel.var(dim=1).mean().sqrt())
    return out


def _mean_costs(t: torch.Tensor) -> list[torch.Tensor]:
    """What an MSE or L1 loss costs a model that predicts the targets' mean (overall, and per channel)."""
    t = t.detach().float()
    costs = [(t - t.mean()).pow(2).mean(), (t - t.median()).abs().mean()]
    if t.dim() >= 3:
        for axis in (1, t.dim() - 1):
            c = t.movedim(axis, 0).reshape(t.shape[axis], -1)
            costs.append((c - c.mean(1, keepdim=True)).pow(2).mean())
    return costs


def _prediction_stats(outputs: Any, targets: Any) -> dict[str, dict[str, Any]]:
    """Per watched prediction: its spread, its target's, and the loss a mean-predicting model would have
    (one host copy)."""
    preds = _named(outputs, "output")
    trues = _named(targets, "output")
    if not preds:
        return {}
    if trues and set(trues) != set(preds):
        if len(trues) == len(preds) == 1:
            trues = {next(iter(preds)): next(iter(trues.values()))}
        else:
            raise InputError(f"Monitor.step: outputs {sorted(preds)} and targets {sorted(trues)} name different "
                             "predictions")
    layout, flat = [], []
    for name, p in preds.items():
        ps = _spreads(p)
        t = trues.get(name)
        ts = _spreads(t) if t is not None else []
        costs = _mean_costs(t) if t is not None else []
        layout.append((name, len(ps), len(ts), len(costs)))
        flat += ps + ts + costs
    values = torch.stack([v.to(flat[0].device) for v in flat]).cpu().tolist()
    out, i = {}, 0
    for name, n_p, n_t, n_c in layout:
        ps, ts, cs = values[i:i + n_p], values[i + n_p:i + n_p + n_t], values[i + n_p + n_t:i + n_p + n_t + n_c]
        i += n_p + n_t + n_c
        if ts:
            # the layout where the prediction is flattest against its target is the one that shows a collapse
            k = min(range(len(ps)), key=lambda j: ps[j] / max(ts[j], 1e-30))
            out[name] = {"spread": ps[k], "target_spread": ts[k], "mean_baselines": cs}
        else:
            out[name] = {"spread": min(ps)}
    return out
