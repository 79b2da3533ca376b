"""One sweep item: what `compare` runs (or a capture of both models, for a PyTorch candidate), reduced to one
JSON line. A `SweepWorker` holds the models, built once per worker process, and the runtime artifacts,
prepared once per input shape.
"""

from __future__ import annotations

import math
import re
import shutil
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from .spec import Candidate, Sweep, TargetSource

STATUS_DONE, STATUS_FAILED = "done", "failed"


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

        out = output_pair(Bundle.open(ref_path), module_view(Bundle.open(cand_path)), report)
        record = _record(name, report, ref_nan, cand_nan, out)
        judged = None
        if self.sweep.sample_rate and out is not None and out.reference.squeeze().ndim == 1:
            judged = judge_audio(out, self.sweep.sample_rate, outputs_agree(report, out))
            record["audio"] = judged.to_dict()
        reasons, properties = _port_reasons(record, report, out, judged), _model_properties(record, judged)
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
        cand = capture(self.candidate, *inputs, level="module", keep="full", out=root / "cand",
                       replay_rng=ref if self.replay_rng and _draws(ref) else None)
        return diff(ref, cand), find_nonfinite_in_bundle(ref), find_nonfinite_in_bundle(cand), ref.path, cand.path

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
    if out is not None and out.candidate_only:
        reasons.append(("nonfinite", f"output {out.name}: {out.nonfinite_text()}"))
    elif record["cand_nan"] and not record["ref_nan"]:
        reasons.append(("nonfinite", f"NaN/Inf born in the candidate at {record['cand_nan']['record']}, "
                                     "the reference stays finite"))
    if judged is not None:
        reasons += judged.reasons
    return reasons


def _model_properties(record: dict[str, Any], judged: Any) -> list[tuple[str, str]]:
    """What the reference's output shares with the candidate's: properties of the model, never findings."""
    props = []
    if record["ref_nan"] and record["cand_nan"]:
        props.append(("nonfinite", f"the reference makes NaN/Inf too (first at {record['ref_nan']['record']})"))
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


def _origin(o: Any) -> dict[str, Any] | None:
    if not o.found:
        return None
    return {"record": o.record, "op": o.op, "module": o.module, "cause": o.cause}


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
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:120] or "item"
