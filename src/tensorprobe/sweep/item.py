"""One sweep item: what `compare` runs (or a capture of both models, for a PyTorch candidate), reduced to one
JSON line. A `SweepWorker` holds the models, built once per worker process, and the runtime artifacts,
prepared once per input shape.
"""

from __future__ import annotations

import math
import hashlib
import re
import shutil
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from ..diff.result import STATUS_SHAPE
from .spec import Candidate, Sweep, TargetSource

STATUS_DONE, STATUS_FAILED = "done", "failed"
VERDICT_RANDOM = "random_draws"        # the item first differs at a random draw each side drew on its own
CAUSE_RANDOM, CAUSE_AMPLIFIED = "random", "amplified"        # diff's causes (diff.noise)
SHAPE_VERDICT = "shape differs from the reference's"
MISSING_VERDICT = "no model output to compare"
REPLAY_ADVICE = ("Rerun with --replay-rng (Sweep(replay_rng=True)) so that both sides draw the same numbers, or "
                 "export the noise as a model input (rewrite --rules record_random).")
# with replay on, advising it would be to do what was done: say what replay cannot feed
REPLAYED_ADVICE = ("The draws were replayed (--replay-rng), but the candidate draws here with another op, shape or "
                   "order than the reference (a runtime's own Dropout or random op), which replay cannot feed: "
                   "export the noise as a model input (rewrite --rules record_random).")


class SweepWorker:
    """The state of one worker: the sweep (models and items) and the prepared runtime artifacts."""

    def __init__(self, source: TargetSource, candidate: Candidate, keep_dir: str,
                 options: dict[str, Any] | None = None, replay_rng: bool | None = None, *,
                 scratch: str | None = None):
        from ..logs import quiet_third_party

        quiet_third_party()
        self.sweep: Sweep = source.load()
        self.replay_rng = self.sweep.replay_rng if replay_rng is None else replay_rng
        if self.sweep.reference is not None:
            self.sweep.reference.eval()
        self.candidate, self.artifact = candidate.build(self.sweep)
        self.options = {**self.sweep.runtime_options, **(options or {})}
        if isinstance(self.candidate, str):
            from ..runtimes import get_runtime

            takes = get_runtime(self.candidate).option_names(artifact=self.artifact is not None) or ()
            if "threads" in takes and "threads" not in self.options:
                # the pool runs one item per core: a runtime that also spreads each item over every core
                # oversubscribes them (2 workers on 2 cores ran no faster than 1)
                import torch

                self.options["threads"] = torch.get_num_threads()
        self.keep_dir = Path(keep_dir)
        self._prepared: dict[tuple, Any] = {}
        if scratch is not None:
            Path(scratch).mkdir(parents=True, exist_ok=True)
        # under the driver's scratch directory when there is one: the driver removes it even when this
        # process is killed (a pool's workers end without running finalizers)
        self._workdir = Path(tempfile.mkdtemp(prefix="tensorprobe-sweep-artifacts-", dir=scratch))

    def close(self) -> None:
        """Remove the prepared artifacts (exported models, ~200 MB for the Kokoro decoder)."""
        self._prepared.clear()
        shutil.rmtree(self._workdir, ignore_errors=True)

    def run(self, name: str) -> dict[str, Any]:
        """Run item `name`; never raises (an error is the item's result)."""
        start = time.perf_counter()
        try:
            record = self._run(name)
            record["status"] = STATUS_DONE
        except Exception as e:  # noqa: BLE001 - one item's failure is a result, not the sweep's end
            record = {"item": name, "status": STATUS_FAILED, "error": f"{type(e).__name__}: {e}",
                      "traceback": traceback.format_exc(limit=4)}
        record["seconds"] = round(time.perf_counter() - start, 4)
        return record

    def _run(self, name: str) -> dict[str, Any]:
        inputs = self.sweep.inputs_of(name)
        if self.sweep.pipeline is not None:
            return _tts_record(name, *self.sweep.pipeline.run(inputs[0]))
        with tempfile.TemporaryDirectory(prefix="tensorprobe-sweep-item-") as d:
            root = Path(d)
            record = self._judge(name, *self._compare(inputs, root))
            record["bundle"] = None
            if record["finding"]:
                kept = self.keep_dir / _safe(name)
                if kept.exists():
                    shutil.rmtree(kept)
                for manifest in root.glob("*/manifest.json"):
                    keep_statistics_only(manifest.parent)
                shutil.move(str(root), str(kept))
                Path(d).mkdir()        # the TemporaryDirectory removes what is there on exit
                record["bundle"] = str(kept)
        return record

    def _judge(self, name: str, report: Any, ref_nan: Any, cand_nan: Any, ref_path: Path,
               cand_path: Path) -> dict[str, Any]:
        """The item's record: what `compare` says, the audio of both outputs, and which of it is the port's."""
        from ..bundle import Bundle
        from ..compare import judge_audio, module_view, output_pair, outputs_agree

        ref_b, cand_b = Bundle.open(ref_path), Bundle.open(cand_path)
        out = output_pair(ref_b, module_view(cand_b), report)
        record = _record(name, report, ref_nan, cand_nan, out)
        _draw_first(record, ref_b, cand_b)
        agree = outputs_agree(report, out)
        judged = None
        if self.sweep.sample_rate and out is not None and out.reference.squeeze().ndim == 1:
            judged = judge_audio(out, self.sweep.sample_rate, agree)
            record["audio"] = judged.to_dict()
        reasons, properties = _port_reasons(record, report, out, judged), _model_properties(record, judged)
        reasons, properties = _explained_divergence(record, reasons, properties, agree,
                                                    bool(self.replay_rng or report.rng_replayed))
        record["reasons"] = [{"code": c, "text": t} for c, t in reasons]
        record["model_properties"] = [{"code": c, "text": t} for c, t in properties]
        record["finding"] = bool(reasons)
        return record

    def _compare(self, inputs: tuple, root: Path) -> tuple[Any, Any, Any, Path, Path]:
        from ..capture import capture
        from ..compare import compare
        from ..diff import diff
        from ..nan import find_nonfinite_in_bundle

        if isinstance(self.candidate, str):
            res = compare(self.sweep.reference, inputs, self.candidate, out=root,
                          prepared=self._prepared_for(inputs), replay_rng=self.replay_rng)
            return res.diff, res.ref_nan, res.cand_nan if res.cand_nan_escapes else _clean(), \
                Path(res.ref_bundle), Path(res.cand_bundle)
        ref = capture(self.sweep.reference, *inputs, level="module", keep="full", out=root / "ref")
        # a PyTorch candidate always takes the reference's draws: two models drawing their own noise differ by
        # the draws, which says nothing about the port (the runtime path replays only with replay_rng)
        cand = capture(self.candidate, *inputs, level="module", keep="full", out=root / "cand",
                       replay_rng=ref if _draws(ref) else None)
        report = diff(ref, cand, rules=wrapper_rules(self.sweep.reference, self.candidate))
        return report, find_nonfinite_in_bundle(ref), find_nonfinite_in_bundle(cand), ref.path, cand.path

    def _prepared_for(self, inputs: tuple) -> Any:
        from ..runtimes import get_runtime

        adapter = get_runtime(self.candidate)
        if self.artifact is not None:      # an exported file: loaded once, whatever the inputs' shapes
            if "artifact" not in self._prepared:
                self._prepared["artifact"] = adapter.load(self.artifact, **self.options)
            return self._prepared["artifact"]
        key = tuple(tuple(t.shape) if hasattr(t, "shape") else repr(t) for t in inputs)
        if key not in self._prepared:
            where = self._workdir / str(len(self._prepared))
            self._prepared[key] = adapter.prepare(self.sweep.reference, inputs, where, **self.options)
        return self._prepared[key]


def wrapper_rules(reference: Any, candidate: Any) -> list[str] | None:
    r"""Mapping rules for a PyTorch candidate that wraps a model shaped like the reference (an fp16 port that
    casts its inputs: `self.m = ref.half()`; a guard around the model): the wrapped model's module names under
    its attribute path (`m.decode.0`) are the reference's (`decode.0`). None when the names already match, or
    no submodule has exactly the reference's module names.

        >>> import torch.nn as nn
        >>> class Half(nn.Module):
        ...     def __init__(self, m):
        ...         super().__init__(); self.m = m
        >>> ref = nn.Sequential(nn.Conv1d(1, 2, 3), nn.ReLU())
        >>> print(*wrapper_rules(ref, Half(nn.Sequential(nn.Conv1d(1, 2, 3), nn.ReLU()))))
        m\.(.+)=\1
    """
    import re

    def tree(m: Any) -> set[str]:        # names only: a port replaces classes (a faulty norm) but keeps paths
        return {n for n, _ in m.named_modules() if n}

    want = tree(reference)
    if not want or want <= tree(candidate):
        return None
    for path, mod in candidate.named_modules():
        if path and tree(mod) == want:
            return [f"{re.escape(path)}\\.(.+)=\\1"]
    return None


def keep_statistics_only(bundle_dir: Path) -> None:
    """Turn a full capture into a statistics-only one in place: the manifest says keep="stats" and no record
    points to a shard (written atomically first), then the shards go. A sweep keeps its failing items this
    way: 10,000 items of a vocoder at full capture would be terabytes (~350 MB per 0.1 s Kokoro item)."""
    import json

    from ..bundle import MANIFEST, atomic_write_bytes

    path = bundle_dir / MANIFEST
    manifest = json.loads(path.read_text())
    shards = list(manifest.get("shards", []))
    manifest["shards"] = []
    manifest.setdefault("capture", {})["keep"] = "stats"
    for rec in manifest.get("records", []):
        rec.pop("shard", None)
    atomic_write_bytes(path, json.dumps(manifest, indent=1).encode())
    for shard in shards:
        (bundle_dir / shard).unlink(missing_ok=True)


def _draws(bundle: Any) -> bool:
    from ..record import KIND_RNG

    return any(r.kind == KIND_RNG for r in bundle.records)


def _clean() -> Any:
    from ..nan import NanOrigin

    return NanOrigin(found=False)


def _record(name: str, report: Any, ref_nan: Any, cand_nan: Any, out: Any) -> dict[str, Any]:
    pair = report.get(report.output) if report.output else None
    metrics = pair.metrics if pair is not None else {}
    amp = report.strongest_amplifier
    verdict = report.verdict
    first = report.get(report.first_divergence) if verdict == "diverged" and report.first_divergence else None
    snr, corr = _num(metrics.get("snr_db")), _num(metrics.get("pearson"))
    if out is not None and out.one_sided:
        snr, corr = "-inf", "nan"      # an element finite on one side only is total error
    return {
        "item": name, "verdict": verdict,
        "first_divergence": first.name if first is not None else None,
        "cause": first.cause if first is not None else None,     # own, weights, amplified, random, inherited
        "output": report.output,
        "output_snr_db": snr, "output_corr": corr,
        "output_nonfinite": out.to_dict() if out is not None else None,
        "output_verdict": _output_verdict(pair, out),
        "ref_nan": _origin(ref_nan), "cand_nan": _origin(cand_nan),
        "strongest_amplifier": amp.name if amp is not None else None,
        "records_compared": len(report.pairs),
    }


def _port_reasons(record: dict[str, Any], report: Any, out: Any, judged: Any) -> list[tuple[str, str]]:
    """Why the item is a finding about the port, as (code, sentence); empty when it is not one."""
    reasons = []
    if record["verdict"] == "diverged":
        where = record["first_divergence"] or report.first_difference or report.output
        reasons.append(("diverged", f"diverges from the reference at {where}"
                                    + (f" (cause {record['cause']})" if record["cause"] else "")))
    if out is None and record["output_verdict"] in (SHAPE_VERDICT, MISSING_VERDICT):
        reasons.append(("output", f"output {record['output'] or '?'}: {record['output_verdict']}"))
    if out is not None and out.candidate_only:
        reasons.append(("nonfinite", f"output {out.name}: {out.nonfinite_text()}"
                                     + (f", born at {_born(record['cand_nan'])}" if record["cand_nan"] else "")))
    elif record["cand_nan"] and not record["ref_nan"]:
        reasons.append(("nonfinite", f"NaN/Inf born in the candidate at {_born(record['cand_nan'])}, "
                                     "the reference stays finite"))
    if judged is not None:
        reasons += judged.reasons
    return reasons


def _model_properties(record: dict[str, Any], judged: Any) -> list[tuple[str, str]]:
    """What the reference's output shares with the candidate's: properties of the model, never findings."""
    props = []
    if record["ref_nan"] and record["cand_nan"]:
        props.append(("nonfinite", f"the reference makes NaN/Inf too (born at {_born(record['ref_nan'])})"))
    if judged is not None:
        props += judged.model_reasons
    return props


def _tts_record(name: str, audio: Any, report: Any) -> dict[str, Any]:
    """A text through a TTS pipeline: the stage checker's verdict, the first bad stage, what fired."""
    errors = [f for f in report.findings if f.severity == "error"]
    return {"item": name, "verdict": report.status, "finding": report.status == "error",
            "reasons": [{"code": f"tts.{f.stage}.{f.check}", "text": f.message} for f in errors],
            "first_bad_stage": report.first_bad_stage, "first_divergence": None,
            "problems": [f"{f.stage}.{f.check}" for f in report.findings if f.severity != "info"],
            "audio_samples": None if audio is None else int(getattr(audio, "size", len(audio)))}


def _draw_first(record: dict[str, Any], ref: Any, cand: Any) -> None:
    """A port that draws its own noise in the model's own forward (`<root>/randn_like.0`, ONNX Runtime's
    RandomNormalLike) and adds it before a submodule: no record holds the sum, so the first submodule reading
    it looks like the port's own error (cause own). When a draw the candidate did not replay differs (cause
    random) before the first divergence, in that module's own code or an ancestor's, the divergence is the
    draw's: the item is not comparable value by value (`random_draws`), as for a draw inside a submodule."""
    from ..diff import diff
    from ..record import KIND_RNG, TAG_REPLAYED

    if record["verdict"] != "diverged" or record.get("cause") == CAUSE_RANDOM or not record["first_divergence"]:
        return
    if not any(r.kind == KIND_RNG and TAG_REPLAYED not in r.tags for r in cand.records):
        return
    plain = diff(ref, cand)
    first = plain.get(record["first_divergence"])
    if first is None:
        return
    draw = next((p for p in plain.pairs if p.kind == KIND_RNG and p.cause == CAUSE_RANDOM and p.order < first.order
                 and (p.module == "" or first.module == p.module or first.module.startswith(f"{p.module}."))), None)
    if draw is not None:
        record["module_view_first_divergence"] = (record["first_divergence"], record["cause"])
        record["first_divergence"], record["cause"] = draw.name, CAUSE_RANDOM


def _explained_divergence(record: dict[str, Any], reasons: list[tuple[str, str]], properties: list[tuple[str, str]],
                          agree: bool, replayed: bool = False) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Take out of the findings what the port did not do: a first divergence at a random draw the two sides drew
    on their own (verdict `random_draws`: the item says how to make it comparable), and rounding the model
    amplified inside while the outputs agree (a property of the model). NaN/Inf on the candidate side only stays
    a finding: other random numbers do not make a faithful port non-finite."""
    cause = record.get("cause")
    if record["verdict"] != "diverged" or cause not in (CAUSE_RANDOM, CAUSE_AMPLIFIED):
        return reasons, properties
    if cause == CAUSE_AMPLIFIED and not agree:
        return reasons, properties
    kept = [(c, t) for c, t in reasons if c == "nonfinite" or c == "output"]
    moved = [(c, t) for c, t in reasons if (c, t) not in kept]
    if cause == CAUSE_RANDOM:
        record["diff_verdict"], record["verdict"] = record["verdict"], VERDICT_RANDOM
        record["random_draws"] = (f"first differs at the random draw {record['first_divergence']}: reference and "
                                  f"candidate draw other numbers, so the items are not comparable value by value. "
                                  f"{REPLAYED_ADVICE if replayed else REPLAY_ADVICE}")
        record["rng_replayed"] = replayed
        text = "differs by random draws: " + "; ".join(t for _, t in moved)
        return kept, properties + [("random_draws", text)]
    return kept, properties + [("amplified", f"rounding amplified inside the model (first parts at "
                                             f"{record['first_divergence']}); the outputs agree")]


def _output_verdict(pair: Any, out: Any) -> str:
    """What became of the model output, in words: finite and compared (the diff's status), non-finite on
    which side, or not comparable (a missing or wrong-shaped output)."""
    if pair is None:
        return MISSING_VERDICT
    if pair.status == STATUS_SHAPE:
        return SHAPE_VERDICT
    if out is not None and (out.one_sided or out.both):
        parts = [f"{side} {n}" for side, n in (("candidate only", out.candidate_only),
                                              ("reference only", out.reference_only), ("both", out.both)) if n]
        return "non-finite (" + ", ".join(parts) + ")"
    if out is not None and out.reference.size == 0:
        return "empty"
    return pair.status


def _origin(o: Any) -> dict[str, Any] | None:
    """Where NaN/Inf was born on one side, as `nan` reports it on that capture."""
    if not o.found:
        return None
    pattern = o.output.stats.channel_pattern() if o.output is not None else None
    return {"record": o.record, "op": o.op, "module": o.module, "module_type": o.module_type, "cause": o.cause,
            "channels": o.elements or pattern, "diagnosis": diagnosis_label(o),
            "headline": o.headline(), "diagnosis_text": list(o.diagnosis)}


# the diagnosis sentences of `nan`, each as the short label a sweep groups items by (first match wins)
_DIAGNOSES = (("variance came out negative", "negative variance"),
              ("E[x²] − E[x]²", "negative variance"),          # a one-pass variance cancelling (nan.diagnose)
              ("non-finite per-channel statistics", "negative variance"),
              ("running_var", "negative running variance"),
              ("division by zero", "division by zero"),
              ("zero variance", "zero variance (0/0)"),
              ("exact zero", "sqrt/log of zero"),
              ("negative value", "sqrt/log of a negative value"),
              ("outside [-1, 1]", "input outside [-1, 1]"),
              ("overflow", "overflow"),
              ("mask", "a deliberate ±Inf mask"))
_CONTEXT = ("Its input is most likely", "Pattern:", "A module-level record", "Inputs are")   # not causes


def diagnosis_label(origin: Any) -> str:
    """A short name for why NaN/Inf was born (`negative variance`), from `nan`'s diagnosis of `origin`."""
    from ..nan.origin import CAUSE_MODEL_INPUT, CAUSE_PARAMETER

    if origin.cause == CAUSE_MODEL_INPUT:
        return "non-finite model input"
    if origin.cause == CAUSE_PARAMETER:
        return "non-finite weights"
    for sentence in origin.diagnosis:
        if sentence.startswith(_CONTEXT):     # context ("Inputs are float16: ... overflow far more likely")
            continue
        for words, label in _DIAGNOSES:
            if words in sentence:
                return label
    if origin.module_type and any("from finite inputs" in d for d in origin.diagnosis):
        return f"made inside {origin.module_type} from finite inputs"      # `nan` names no cause
    if any(d.startswith("Inputs are") for d in origin.diagnosis):
        return "reduced precision"            # the only thing `nan` could say
    return "undiagnosed"


def _born(origin: dict[str, Any]) -> str:
    return f"{origin['module'] or origin['record']} ({origin['diagnosis']})"


def _num(v: Any) -> float | str | None:
    if v is None:
        return None
    v = float(v)
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return v


def _safe(name: str) -> str:
    """The item's directory name under RESULTS/bundles: the name where it is a plain lower-case file name,
    else the name made safe plus 8 hex digits of its hash, so that no two items share a directory ("spk1/a"
    and "spk1_a"; "A" and "a" on a case-insensitive disk).

    >>> _safe("spk1_a"), _safe("spk1/a")
    ('spk1_a', 'spk1_a-56f3b6ab')
    """
    safe = re.sub(r"[^a-z0-9._-]+", "_", name.lower())[:120].strip(".") or "item"
    if safe == name:
        return safe
    return f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
