"""Two tiers of a sweep item: a plain run of both models first, the captures only where it is needed.

Tier 1 runs the reference and the candidate as a user would (no capture, no files) and judges their
outputs: same shapes, every sample finite on both sides, relative error within float32 rounding through a
deep path (`CEILING_UNITS` x 2^-24, what `diff` lets any same-precision record differ by without a
measurement) over the whole output and in every slice along each axis (a frame, a channel), and, with a sample rate, `audio check` of both and the `audio diff` verdict (computed where a
sample differs by half a 16-bit step or more). An item that passes is done:
its line says tier 1. Any other item (or one in the `sample` of passing items the driver asks for, to show
the distribution) gets tier 2, `SweepWorker.run`: both captures, `diff`, `nan`, the bundles kept
statistics-only when there is a finding. Tier 1 never decides a finding; it only lets a clean item skip
the captures, so a sweep's findings are tier 2's.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .item import STATUS_DONE, SweepWorker
from .prepared import ArtifactCache, model_digest

TIER1_REL_MAX = 2048 * 2.0 ** -24     # diff.noise's rounding ceiling: a faithful float32 port's output is within


@dataclass(frozen=True)
class Tiering:
    """How the driver wants items run: tier 1 first (`tier1`), the names to run at tier 2 whatever tier 1
    says (`sample`), and where prepared artifacts are shared (`cache_dir`, None: per worker)."""

    tier1: bool = True
    sample: frozenset = field(default_factory=frozenset)
    cache_dir: str | None = None


class TieredWorker(SweepWorker):
    """A `SweepWorker` that runs tier 1 before the captures and shares runtime exports through a cache."""

    def __init__(self, *setup: Any, scratch: str | None = None, tiering: Tiering | None = None):
        super().__init__(*setup, scratch=scratch)
        self.source = setup[0]
        self.tiering = tiering or Tiering()
        self.cache = ArtifactCache(self.tiering.cache_dir) if self.tiering.cache_dir else None
        self.exported: list[str] = []            # keys this worker exported itself (the rest came from the cache)
        self._sessions: dict[int, Any] = {}
        self._digest: str | None = None
        self._dynamic: dict[tuple, Any] = {}         # input ranks -> the dynamic-shape export (None: none)
        self._shapes_seen: dict[tuple, set] = {}     # input ranks -> the shapes met, until a dynamic export
        self.dynamic_refused: dict[tuple, str] = {}  # input shapes the dynamic export would not run, and why
        self.dynamic_note: str | None = None         # why there is no dynamic export, when there is none
        self.plain_export: str | None = None         # which export ran the latest plain run (ONNX Runtime)

    def run(self, name: str) -> dict[str, Any]:
        """Tier 1, then tier 2 when tier 1 does not pass (or the item is in the sample); never raises.
        The item that made a shared export says so (`exported`: the input shapes)."""
        before = len(self.exported)
        record = self._run_tiers(name)
        if len(self.exported) > before:
            record["exported"] = self.exported[before:]
        return record

    def _run_tiers(self, name: str) -> dict[str, Any]:
        coarse = self._coarse_candidate()
        if coarse is not None and self._tier1_applies() and name not in self.tiering.sample:
            record = super().run(name)      # tier 1's ceiling is float32 rounding: no such port passes it
            record["tier"], record["tier1"] = 2, f"a {coarse} candidate: tier 1 judges float32 ports only"
            return record
        if self._tier1_applies() and name not in self.tiering.sample:
            start = time.perf_counter()
            try:
                record, why = self._tier1(name)
            except Exception as e:  # noqa: BLE001 - tier 2 runs it again and reports the error as the item's
                record, why = None, f"{type(e).__name__}: {e}"
            if record is not None:
                record["seconds"] = round(time.perf_counter() - start, 4)
                return record
        else:
            why = "sampled" if name in self.tiering.sample else None
        record = super().run(name)
        record["tier"] = 2
        if why is not None:
            record["tier1"] = why          # why the plain run did not settle it
        return record

    def _tier1_applies(self) -> bool:
        return self.tiering.tier1 and self.sweep.pipeline is None

    def _coarse_candidate(self) -> str | None:
        """'float16' or 'bfloat16' for a PyTorch candidate whose weights are held so (a .half() port): its
        faithful outputs differ by its own rounding, far above tier 1's ceiling, so every item goes to tier 2
        without a plain run that could only fail."""
        if not isinstance(self.candidate, torch.nn.Module):
            return None
        dtypes = {p.dtype for p in self.candidate.parameters() if p.is_floating_point()}
        return next((str(d).removeprefix("torch.") for d in (torch.float16, torch.bfloat16) if d in dtypes), None)

    # ---- tier 1 ---------------------------------------------------------------------------------------
    def _tier1(self, name: str) -> tuple[dict[str, Any] | None, str]:
        """(the item's record, "") when the plain run passes; (None, why not) otherwise."""
        inputs = self.sweep.inputs_of(name)
        with torch.inference_mode():
            ref = _arrays(self.sweep.reference(*inputs))
        self.plain_export = None
        cand = self._plain_candidate(inputs)
        if len(ref) != len(cand) or not ref:
            return None, f"{len(ref)} reference outputs, {len(cand)} candidate outputs"
        judged = [_judge_output(f"output.{i}" if len(ref) > 1 else "output", r, c) for i, (r, c) in
                  enumerate(zip(ref, cand))]
        bad = next((why for _, why in judged if why), None)
        if bad is not None:
            return None, bad
        first, _ = judged[0]
        record = {"item": name, "status": STATUS_DONE, "tier": 1, "verdict": "match", "first_divergence": None,
                  "cause": None, "output": first.name, "output_snr_db": _num(_snr(first)),
                  "output_corr": _num(_corr(first)), "output_rel_err": _num(_rel(first)),
                  "output_nonfinite": first.to_dict(), "ref_nan": None, "cand_nan": None,
                  "strongest_amplifier": None, "records_compared": 0, "reasons": [], "model_properties": [],
                  "finding": False, "bundle": None}
        if self.plain_export is not None:
            record["tier1_export"] = self.plain_export
            why_not = self.dynamic_refused.get(_shape_key(inputs)) or self.dynamic_note
            if self.plain_export != "dynamic shapes" and why_not:
                record["tier1_export_why"] = why_not     # why the dynamic export did not serve this item
        if self.sweep.sample_rate and first.reference.squeeze().ndim == 1:
            record["audio"], props = _audio_checks(first, self.sweep.sample_rate)
            if record["audio"] is None:
                return None, f"{first.name}: audio diff finds a difference"
            record["model_properties"] = props
        return record, ""

    def _plain_candidate(self, inputs: tuple) -> list[np.ndarray]:
        """The candidate's outputs from a plain run: a PyTorch model called, a runtime's session run."""
        if not isinstance(self.candidate, str):
            with torch.inference_mode():
                return _arrays(self.candidate(*inputs))
        if self.candidate == "onnxruntime":
            dynamic = self._dynamic_for(inputs)
            if dynamic is not None:
                try:
                    outs = self._ort_outputs(dynamic, inputs)
                    self.plain_export = "dynamic shapes"
                    return outs
                except Exception as e:  # noqa: BLE001 - a dimension the export fixed: this shape gets its own
                    self.dynamic_refused[_shape_key(inputs)] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            self.plain_export = "this shape"
            return self._ort_outputs(self._prepared_for(inputs), inputs)
        artifact = self._prepared_for(inputs)
        from ..record import KIND_MODEL_OUTPUT
        from ..runtimes import get_runtime
        from ..runtimes.base import Selection

        nothing = Selection.of(include=r"(?!)")     # model outputs are always kept; nothing else is made
        outs = [(rt.name or rt.runtime_name, rt.value) for rt in
                get_runtime(self.candidate)._run(artifact, inputs, nothing) if rt.kind == KIND_MODEL_OUTPUT]
        return [np.asarray(_as_numpy(v)) for _, v in sorted(outs, key=lambda o: _output_index(o[0]))]

    def _ort_outputs(self, artifact: Any, inputs: tuple) -> list[np.ndarray]:
        from ..runtimes.onnxruntime.session import graph_feeds, make_session

        session = self._sessions.get(id(artifact))
        if session is None:
            session = self._sessions[id(artifact)] = make_session(artifact.model, artifact.threads)
        return [np.asarray(v) for v in session.run(None, graph_feeds(artifact.model, inputs))]

    # ---- prepare once ---------------------------------------------------------------------------------
    def _dynamic_for(self, inputs: tuple) -> Any:
        """The export with symbolic dimensions that serves plain runs of every item length (None: the model
        has none, or this shape was refused by it); exported once through the shared cache."""
        if self.artifact is not None or self.cache is None or _shape_key(inputs) in self.dynamic_refused:
            return None
        ranks = tuple(t.ndim if hasattr(t, "ndim") else repr(t) for t in inputs)
        if self._dynamic.get(ranks, "unknown") is None and self.dynamic_note is None:
            del self._dynamic[ranks]          # none made yet: ask again (another worker may have made it)
        if ranks not in self._dynamic:
            if self._digest is None:
                self._digest = model_digest(self.sweep.reference, self.source.text)
            # a corpus of one shape needs no dynamic export (the Kokoro decoder's fails after ~40 s): make one
            # when a second shape of these ranks comes; until then use one another worker or run has made
            seen = self._shapes_seen.setdefault(ranks, set())
            seen.add(_shape_key(inputs))
            art, made, why = self.cache.get_dynamic(self.candidate, self.sweep.reference, inputs, self.options,
                                                    self._digest, make=len(seen) > 1)
            self._dynamic[ranks] = art
            self.dynamic_note = why
            if made:
                self.exported.append("dynamic shapes")
        art = self._dynamic[ranks]
        if art is not None:
            from ..runtimes.onnxruntime.export import dims_accept

            refused = dims_accept(_dynamic_meta(art), [tuple(t.shape) for t in inputs if hasattr(t, "shape")])
            if refused is not None:       # outside the export's guards: the graph may do something else there
                self.dynamic_refused[_shape_key(inputs)] = refused
                return None
        return art

    def _prepared_for(self, inputs: tuple) -> Any:
        """The runtime artifact for these input shapes: from the shared cache where the runtime has one."""
        if self.artifact is not None or self.cache is None or not ArtifactCache.supports(self.candidate):
            return super()._prepared_for(inputs)
        key = _shape_key(inputs)
        if key not in self._prepared:
            if self._digest is None:
                self._digest = model_digest(self.sweep.reference, self.source.text)
            art, made = self.cache.get(self.candidate, self.sweep.reference, inputs, self.options, self._digest)
            self._prepared[key] = art
            if made:
                self.exported.append(repr(key))
        return self._prepared[key]

    def close(self) -> None:
        self._sessions.clear()
        super().close()


SLICE_MIN_ELEMENTS = 64            # tier 1 judges slices of at least this many elements (see _worst_slice)
PCM16_HALF_STEP = 0.5 / 32768     # outputs closer than this everywhere are the same 16-bit WAV, give or take a step


def _dynamic_meta(artifact: Any) -> dict[str, Any]:
    import json

    from ..runtimes.onnxruntime.export import DYNAMIC_DIMS_KEY

    entry = next((p.value for p in artifact.model.metadata_props if p.key == DYNAMIC_DIMS_KEY), None)
    return json.loads(entry) if entry else {}


def _shape_key(inputs: tuple) -> tuple:
    return tuple(tuple(t.shape) if hasattr(t, "shape") else repr(t) for t in inputs)


def _audio_checks(out: "_Judged", sample_rate: float) -> tuple[dict[str, Any] | None, list[dict[str, str]]]:
    """`audio check` of both outputs and the `audio diff` verdict. They agree within float32 rounding here,
    so a check the candidate fails is the model's (`compare.judge_audio` with agree=True). `audio diff` (0.5 s
    an item on a 0.25 s clip, as long as both models' run) is computed only where some sample differs by half
    a 16-bit PCM step or more; closer than that everywhere, written as 16-bit audio the two files are the same
    to within one step, and the verdict is "match" without it (`diff_by` says which). None (tier 1 does not
    settle the item) when audio diff finds a difference."""
    from .. import audio

    ref_out, cand_out = out.reference.squeeze(), out.candidate.squeeze()
    ref = audio.check(ref_out, sample_rate, source="reference output")
    cand = audio.check(cand_out, sample_rate, source="candidate output")
    props = [{"code": f"audio.{v.check}", "text": _shared_words(v.check, ref.verdict(v.check))} for v in cand.errors]
    largest = float(np.max(np.abs(cand_out.astype(np.float64) - ref_out))) if ref_out.size else 0.0
    if largest < PCM16_HALF_STEP:
        verdict = "identical" if largest == 0 else "match"
        by = f"every sample within half a 16-bit PCM step (largest difference {largest:.2g})"
    else:
        d = audio.diff(ref_out, cand_out, sample_rate)
        if d.status == "finding":
            return None, props
        verdict, by = d.verdict, "audio diff"
    return {"check": cand.status, "reference_check": ref.status, "problems": [],
            "model_problems": [v.check for v in cand.errors], "diff": verdict, "diff_by": by,
            "diff_skipped": None, "finding": False}, props


def _shared_words(check: str, ref_verdict: Any) -> str:
    """Why a check the candidate fails is the model's: the reference fails it too, or sits at its threshold."""
    where = ("the reference's output fails the same check" if ref_verdict.status == "error"
             else "the reference's output sits at the same place")
    return f"audio {check}: {where} and the outputs agree within float32 rounding ({ref_verdict.message})"


@dataclass(frozen=True)
class _Judged:
    name: str
    reference: np.ndarray
    candidate: np.ndarray
    err2: float
    ref2: float
    corr: float

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "candidate_only": 0, "reference_only": 0, "both": 0}


def _judge_output(name: str, r: np.ndarray, c: np.ndarray) -> tuple[_Judged | None, str]:
    """(the output judged, "") when it passes tier 1; (None, why) otherwise."""
    if r.shape != c.shape:
        return None, f"{name}: shapes differ ({r.shape} vs {c.shape})"
    if r.dtype.kind not in "fc" or c.dtype.kind not in "fc":
        return (None, f"{name}: values differ") if not np.array_equal(r, c) else \
            (_Judged(name, r, c, 0.0, 1.0, 1.0), "")
    r64, c64 = r.astype(np.float64, copy=False), c.astype(np.float64, copy=False)
    if not (np.isfinite(r64).all() and np.isfinite(c64).all()):
        return None, f"{name}: non-finite values"
    err2, ref2 = float(np.sum((c64 - r64) ** 2)), float(np.sum(r64 ** 2))
    rel = math.sqrt(err2 / ref2) if ref2 > 0 else (0.0 if err2 == 0 else math.inf)
    if rel > TIER1_REL_MAX:
        return None, f"{name}: relative error {rel:.3g} beyond {TIER1_REL_MAX:.2g}"
    local = _worst_slice(c64 - r64, r64, ref2)
    if local is not None and local[0] > TIER1_REL_MAX:
        worst, axis, index = local
        return None, (f"{name}: relative error {worst:.3g} from index {index} of axis {axis} beyond "
                      f"{TIER1_REL_MAX:.2g} (whole output {rel:.3g})")
    rc, cc = r64.ravel() - r64.mean(), c64.ravel() - c64.mean()
    denom = math.sqrt(float(rc @ rc) * float(cc @ cc))
    corr = float(rc @ cc) / denom if denom > 0 else 1.0
    return _Judged(name, r, c, err2, ref2, corr), ""


def _worst_slice(diff: np.ndarray, ref: np.ndarray, ref2: float) -> tuple[float, int, int] | None:
    """(relative error, axis, index) of the slice along some axis (a frame, a channel) with the largest error,
    each slice against its own energy or the average slice's, whichever is larger; None for a scalar output.
    Slices of fewer than `SLICE_MIN_ELEMENTS` elements are taken in runs of neighbours (the samples of a
    waveform in blocks of 64), so that one element's rounding is never judged alone.

    Why: an error in a few frames of a long output (a table that ends at 200 frames, in an item of 205) is
    diluted in the whole output's L2 by the frames that agree; per slice it stands out as what it is. Rounding
    scales with the values, so a faithful port's loud slices read about its whole-output error, and the floor
    at the average slice's energy keeps near-silent slices from reading their rounding as large."""
    worst: tuple[float, int, int] | None = None
    for axis, size in enumerate(diff.shape):
        if size < 2:
            continue
        others = tuple(a for a in range(diff.ndim) if a != axis)
        e2, r2 = np.sum(diff * diff, axis=others), np.sum(ref * ref, axis=others)
        run = max(1, -(-SLICE_MIN_ELEMENTS * size // diff.size))          # neighbouring slices taken together
        if run >= size:
            continue
        starts = np.arange(0, size, run)
        e2, r2 = np.add.reduceat(e2, starts), np.add.reduceat(r2, starts)
        rel2 = e2 / np.maximum(r2, ref2 * np.diff(np.append(starts, size)) / size) if ref2 > 0 else e2
        i = int(np.argmax(rel2))
        if worst is None or rel2[i] > worst[0] ** 2:
            worst = (math.sqrt(float(rel2[i])), axis, int(starts[i]))
    return worst


def _snr(j: _Judged) -> float:
    return math.inf if j.err2 == 0 else 10 * math.log10(j.ref2 / j.err2) if j.ref2 > 0 else -math.inf


def _rel(j: _Judged) -> float:
    return math.sqrt(j.err2 / j.ref2) if j.ref2 > 0 else 0.0


def _corr(j: _Judged) -> float:
    return j.corr


def _num(v: float) -> float | str:
    return v if math.isfinite(v) else ("inf" if v > 0 else "-inf")


def _arrays(out: Any) -> list[np.ndarray]:
    """A model's outputs flattened in order (tensor, tuple/list, dict values), as numpy arrays."""
    if isinstance(out, torch.Tensor):
        return [_as_numpy(out)]
    if isinstance(out, dict):
        return [a for v in out.values() for a in _arrays(v)]
    if isinstance(out, (tuple, list)):
        return [a for v in out for a in _arrays(v)]
    return []


def _as_numpy(v: Any) -> np.ndarray:
    if isinstance(v, torch.Tensor):
        v = v.detach().cpu()
        return (v.float() if v.dtype == torch.bfloat16 else v).numpy()
    return np.asarray(v)


def _output_index(name: str) -> int:
    tail = name.rpartition(".")[2]
    return int(tail) if tail.isdigit() else 0
