"""What the per-pair results mean together: first divergence, error gain, repeated calls, random ops.

Error gain of a record = its relative L2 error over the largest relative error of its inputs (the
records it consumed, from `Record.inputs`, the op graph). Gain ≫ 1 marks an amplifier (a `sin` of a
large accumulated phase, an `exp`); an infinite gain (exact inputs, wrong output) marks a record where
error *enters*. Bundles without an op graph (a port's dump) use the previous record as the input. A record whose graph
shows no input, or only exact ones, while an earlier record already carries error, takes the latest
erroneous record as its input: its real input was made outside any captured record (code between the
modules of a module-level capture).
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from typing import Any, Sequence

from ..record import KIND_MODEL_INPUT, KIND_OUTPUT, KIND_RNG, Record, module_label
from .result import Amplifier, CallSeries, Criteria, DiffReport, PairResult

MAX_AMPLIFIERS = 10
MIN_GAIN = 2.0      # a record must at least double the relative error to count as an amplifier
_CALL_RE = re.compile(r"^([^@/:]*)@(\d+)(.*)$")


def build_report(*, ref: str, cand: str, criteria: Criteria, results: list[PairResult],
                 ref_records: Sequence[Record], ref_only: list[str], cand_only: list[str],
                 notes: list[str], ref_bundle: Any = None, cand_bundle: Any = None) -> DiffReport:
    """Assemble a `DiffReport` from the compared pairs (in reference execution order)."""
    results = sorted(results, key=lambda p: p.order)
    results, graph_note = with_gains(results, ref_records)
    notes = list(notes) + ([graph_note] if graph_note else [])
    first = next((p for p in results if p.failed), None)
    compared = [p for p in results if p.rel_err is not None]
    worst = max(compared, key=lambda p: p.rel_err, default=None)
    worst = worst if worst is not None and worst.rel_err > 0 else None
    amps = amplifiers(results, criteria)
    output = model_output(results)
    series = call_series(results)
    rng = rng_note(first, ref_records, ref_bundle, cand_bundle) if first else None
    notes += angle_notes(results)
    if ref_only and not results:
        notes.append("no record of the candidate lines up with the reference: is it the same model? "
                     "map names with --map PATTERN=REPLACEMENT or --rules FILE")
    report = DiffReport(ref=ref, cand=cand, criteria=criteria, pairs=tuple(results), ref_only=tuple(ref_only),
                        cand_only=tuple(cand_only), first_divergence=first.name if first else None,
                        worst=worst.name if worst else None, amplifiers=tuple(amps),
                        output=output.name if output else None, call_series=tuple(series), rng_note=rng,
                        notes=tuple(notes), summary="")
    return replace(report, summary=summarize(report))


def with_gains(results: list[PairResult], ref_records: Sequence[Record]) -> tuple[list[PairResult], str | None]:
    """Fill `input_rel_err` and `gain` of every compared pair."""
    rel = {p.name: p.rel_err for p in results if p.rel_err is not None}
    graph = {r.name: r.inputs for r in ref_records}
    has_graph = any(r.inputs for r in ref_records)
    out, prev, carrier = [], None, None  # carrier: the latest record with a non-zero error
    for p in results:
        inputs = graph.get(p.name, ()) if has_graph else ((prev,) if prev else ())
        known = [rel[i] for i in inputs if i in rel]
        if p.rel_err and (not known or max(known) == 0) and (carrier or prev):
            # No input in the graph, or only exact ones while error is already present upstream: the
            # tensor that carried it was made outside any captured record (module-level capture).
            known = [rel[carrier or prev]]
        if p.rel_err is not None:
            prev = p.name
            carrier = p.name if p.rel_err > 0 else carrier
        if not known or p.rel_err is None or p.kind in (KIND_RNG, KIND_MODEL_INPUT):
            # A random draw or a model input consumes nothing: its error is made there, not amplified.
            out.append(p)
            continue
        rin = max(known)
        gain = p.rel_err / rin if rin > 0 else (math.inf if p.rel_err > 0 else None)
        out.append(replace(p, input_rel_err=rin, gain=gain))
    note = None if has_graph or not results else (
        "the reference bundle has no op graph (Record.inputs): error gain uses the previous record as input")
    return out, note


def amplifiers(results: list[PairResult], criteria: Criteria) -> list[Amplifier]:
    """Records with the largest finite error gain whose output error is large enough to matter."""
    floor = criteria.significant_rel_err() / 10
    cands = [p for p in results if p.gain is not None and math.isfinite(p.gain) and p.gain >= MIN_GAIN
             and p.rel_err is not None and p.rel_err >= floor and p.kind != KIND_MODEL_INPUT]
    cands.sort(key=lambda p: p.gain, reverse=True)
    return [Amplifier(p.name, p.op, p.gain, p.input_rel_err, p.rel_err) for p in cands[:MAX_AMPLIFIERS]]


def model_output(results: list[PairResult]) -> PairResult | None:
    """The root module's output if it was captured, else the last output record in execution order."""
    roots = [p for p in results if p.module == "" and p.op.startswith("module:")]
    if roots:
        return roots[-1]
    outs = [p for p in results if p.kind == KIND_OUTPUT]
    return outs[-1] if outs else None


def call_key(name: str) -> tuple[str, int]:
    """'dec.step@3/addmm.0' -> ('dec.step/addmm.0', 3); names without @ are call 0."""
    m = _CALL_RE.match(name)
    return (m.group(1) + m.group(3), int(m.group(2))) if m else (name, 0)


def call_series(results: list[PairResult]) -> list[CallSeries]:
    """Per-call comparison of every record whose module ran more than once (loops, ODE steps)."""
    groups: dict[str, list[tuple[int, PairResult]]] = {}
    for p in results:
        key, call = call_key(p.name)
        groups.setdefault(key, []).append((call, p))
    out = []
    for key, items in groups.items():
        if len({c for c, _ in items}) < 2:
            continue
        items.sort(key=lambda t: t[0])
        rel = tuple(p.rel_err for _, p in items)
        first_fail = next((c for c, p in items if p.failed), None)
        nonzero = [r for r in rel if r]
        growth = rel[-1] / nonzero[0] if nonzero and rel[-1] is not None else None
        out.append(CallSeries(key=key, calls=tuple(c for c, _ in items), rel_err=rel,
                              snr_db=tuple(p.metric("snr_db") for _, p in items),
                              passed=tuple(not p.failed for _, p in items), first_failing_call=first_fail,
                              growth=growth))
    return out


def rng_note(first: PairResult, ref_records: Sequence[Record], ref_bundle: Any = None,
             cand_bundle: Any = None) -> str | None:
    """Words for a first divergence that is a random op, or comes right after one whose noise differs.

    Uses `tensorprobe.rng.unreplayed_rng_before` (op-graph ancestry, noise really compared) when both
    bundles are at hand; else the simple rule: the divergent record is, consumes, or directly follows
    a random op.
    """
    if cand_bundle is not None:
        try:
            from ..rng import unreplayed_rng_before
        except ImportError:
            pass
        else:
            s = unreplayed_rng_before(cand_bundle, first.cand_name, ref=ref_bundle, cand=cand_bundle)
            if s is None:
                return None
            if s.replayed:
                return s.sentence()
            corr = f"; noise correlation {s.pearson:.4f}" if s.pearson is not None else ""
            where = "is" if s.rng == s.divergent else ("sits right after" if s.direct else "sits after")
            return (f"random op {s.rng} was not replayed; use --replay-rng (the first divergence "
                    f"{first.name} {where} that random op{corr})")
    if first.kind == KIND_RNG:
        return f"random op {first.name} was not replayed; use --replay-rng (the first divergence is that op)"
    by_name = {r.name: r for r in ref_records}
    rec = by_name.get(first.name)
    rngs = [i for i in (rec.inputs if rec else ()) if i in by_name and by_name[i].kind == KIND_RNG]
    if not rngs and rec is not None:
        before = [r for r in ref_records if r.order < rec.order]
        if before and before[-1].kind == KIND_RNG:
            rngs = [before[-1].name]
    if not rngs:
        return None
    return (f"random op {rngs[0]} was not replayed; use --replay-rng (the first divergence {first.name} "
            "sits right after that random op)")


def angle_notes(results: list[PairResult]) -> list[str]:
    notes = []
    for p in results:
        if p.angle is not None and p.angle.flips:
            verdict = ("this explains its raw divergence: modulo 2π it matches" if p.angle.explained else
                       "compared modulo 2π")
            notes.append(f"{p.name}: {p.angle.flips:,} branch-cut flips (differences of ±2π) in an angle; "
                         f"{verdict}")
    return notes


def _fmt_err(p: PairResult) -> str:
    parts = []
    snr, corr = p.metric("snr_db"), p.metric("pearson")
    if snr is not None:
        parts.append("SNR inf" if snr == math.inf else f"SNR {snr:.1f} dB")
    if corr is not None:
        parts.append(f"correlation {corr:.6f}")
    return ", ".join(parts) or p.status.replace("_", " ")


def _gain_words(g: float) -> str:
    return "x inf" if g == math.inf else f"x{g:,.3g}" if g < 1000 else f"x{g:,.0f}"


def summarize(r: DiffReport) -> str:
    """The plain-words paragraph: verdict, first divergence, strongest amplifier, output, calls, rng."""
    if not r.pairs:
        return (f"Nothing compared: no record of the candidate lines up with the reference "
                f"({len(r.ref_only)} reference-only, {len(r.cand_only)} candidate-only records).")
    c = r.counts()
    if r.first_divergence is None and c["no_data"] == c["pairs"]:
        return (f"Nothing compared: {c['pairs']} records line up by name, but neither side's tensors are in both "
                "bundles (captured with keep='stats'); capture both with --keep full.")
    if r.first_divergence is None:
        head = f"Match: all {c['pairs']} compared records pass"
        worst = r.get(r.worst)
        text = head + (f" (worst {worst.name}: {_fmt_err(worst)})." if worst else ".")
    else:
        first = r.get(r.first_divergence)
        why = "; ".join(first.reasons)
        text = (f"Diverged: {c['failed']} of {c['pairs']} records fail; first divergence at "
                f"{first.name} ({module_label(first.module)}, {first.op}): {why}.")
        if first.kind == KIND_MODEL_INPUT:
            text += " The model inputs already differ: compare the inputs before blaming a layer."
        amp = r.strongest_amplifier
        if amp is not None:
            text += (f" Strongest amplifier: {amp.name} (error gain {_gain_words(amp.gain)}, relative error "
                     f"{amp.input_rel_err:.2g} -> {amp.output_rel_err:.2g}).")
        out = r.get(r.output)
        if out is not None and out.name != first.name:
            text += (f" The divergence persists to the output {out.name} ({_fmt_err(out)})." if out.failed else
                     f" The error recovers: the output {out.name} passes ({_fmt_err(out)}).")
    text += _calls_words(r) + (f" Note: {r.rng_note}." if r.rng_note else "")
    if r.ref_only or r.cand_only or r.shape_mismatches:
        text += (f" Unmatched: {len(r.ref_only)} reference-only, {len(r.cand_only)} candidate-only records"
                 f"{f', {len(r.shape_mismatches)} shape mismatches' if r.shape_mismatches else ''}.")
    return text


def _calls_words(r: DiffReport) -> str:
    failing = [s for s in r.call_series if s.first_failing_call is not None]
    if not failing:
        return ""
    s = min(failing, key=lambda s: (s.key.count("/"), s.first_failing_call))
    grow = f", relative error grows {_gain_words(s.growth)} by call {s.calls[-1]}" if s.growth else ""
    return (f" Repeated calls: {s.key} runs {len(s.calls)} times; error enters at call "
            f"{s.first_failing_call}{grow}.")
