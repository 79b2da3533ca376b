"""The plain-words paragraph of a `DiffReport`: what was compared, the verdict, where and why it diverges.

    >>> print(report.summary)                                                       # doctest: +SKIP
    Compared 1,312 records by statistics only and 4 element-wise (the model's outputs); 561 weights.
    Weights differ: decode.1.conv1.weight_g (relative error at least 0.01); decode.1.conv1, the forward's
    first divergence, is where it is used. Diverged: 218 of 1,316 records fail; first divergence at
    decode.1.conv1 (Conv1d): relative error at least 0.0099 ... It reads weight decode.1.conv1.weight_g,
    which differs. The divergence persists to the output: output (SNR 38.1 dB, correlation 0.999920).
"""

from __future__ import annotations

import math

from ..record import KIND_BUFFER, KIND_MODEL_INPUT, KIND_MODEL_OUTPUT, TAG_QUANTIZED, WEIGHT_KINDS, module_label, op_place, parse_name
from .evidence import CAND_ONLY, FED_OTHERWISE, NOT_COMPARED, UNPAIRED, made_in
from .layout import TAG_LAYOUT
from .noise import (CAUSE_AMPLIFIED, CAUSE_OWN, CAUSE_QUANTIZED, CAUSE_RANDOM, CAUSE_WEIGHTS, OUTPUT_MIN_CORR,
                    OUTPUT_MIN_SNR)
from .result import (TAG_FOLDED, TAG_PORT_OP, TAG_WEIGHT_MISSING, MATCH_SUGGESTED, METHOD_DIGEST, METHOD_ELEMENTWISE, METHOD_EXACT, METHOD_STATS, TAG_INPUT_UNSEEN,
                     TAG_READS_QUANTIZED, TAG_WEIGHT_BEHIND,
                     VERDICT_CONSISTENT, VERDICT_DIVERGED, VERDICT_EMPTY, DiffReport, PairResult)


MAX_OUTPUTS_LISTED = 12    # outputs named with their error; a model with more gets a count (all are in the JSON)


def fmt_err(p: PairResult) -> str:
    """A pair's error in a few words: 'SNR 41.2 dB, correlation 0.999920', 'non-finite on the candidate side:
    12 elements', 'relative error at least 0.01 (statistics)', 'exact'."""
    parts = []
    nonfinite = [f"non-finite on the {side} side: {int(n):,} element{'s' if n != 1 else ''}" for side, n in
                 (("candidate", p.metric("nonfinite_cand_only") or 0), ("reference", p.metric("nonfinite_ref_only") or 0))
                 if n]
    if nonfinite:
        return "; ".join(nonfinite) + " (SNR -inf)"
    if p.method == METHOD_EXACT:
        n = p.metrics.get("mismatches")
        return "exact" if not n else f"{int(n):,} values differ"
    if p.method == METHOD_STATS:
        lo = p.metrics.get("rel_l2_err_lower")
        if lo == math.inf:
            return "NaN/Inf counts differ (statistics; SNR -inf)"
        return f"relative error at least {lo:.2g} (statistics)" if lo else "statistics show no difference (not proven)"
    if p.method == METHOD_DIGEST:
        return "identical"
    layout = next((t[len(TAG_LAYOUT):] for t in p.tags if t.startswith(TAG_LAYOUT)), None)
    if layout is not None and p.method is None:
        return f"same values in another layout ({layout})"
    snr, corr = p.metric("snr_db"), p.metric("pearson")
    if snr is not None:
        parts.append("SNR inf" if snr == math.inf else f"SNR {snr:.1f} dB")
    if corr is not None:
        parts.append(f"correlation {corr:.6f}")
    return ", ".join(parts) or p.status.replace("_", " ")


def gain_words(g: float) -> str:
    return "x inf" if g == math.inf else f"x{g:,.3g}" if g < 1000 else f"x{g:,.0f}"


def compared_words(r: DiffReport) -> str:
    """'Compared 1,037 records element-wise, 3 exactly, 280 by statistics only; 2 not comparable; 561 weights
    (559 identical).'"""
    c = r.counts()
    parts = []
    if c["elementwise"]:
        parts.append(f"{c['elementwise']:,} element-wise")
    if c["exact"]:
        parts.append(f"{c['exact']:,} exactly (integers)")
    if c["statistics"]:
        parts.append(f"{c['statistics']:,} by statistics only")
    head = f"Compared {', '.join(parts) or 'no records'}"
    if c["not_comparable"]:
        head += f"; {c['not_comparable']:,} not comparable"
    if c["weights"]:
        head += f"; {c['weights']:,} weights" + _weight_counts(r, c["weights_digest"])
    if r.weights_ref_only:
        head += (f"; {len(r.weights_ref_only):,} reference weights have no candidate counterpart by name or content "
                 "(exporters fold and rename weights; --map renames)")
    return head + "."


def _weight_counts(r: DiffReport, identical: int) -> str:
    """' (38 identical or within rounding, 7 of them dequantized from integers)': how the weights that do not
    differ compare. Those compared by statistics only are within their conversion as far as statistics tell."""
    same = [p for p in r.weights if p.method == METHOD_ELEMENTWISE and p.passed]
    deq_same = sum(1 for p in same if _dequantized(p))
    parts = []
    if identical + len(same):
        parts.append(f"{identical + len(same):,} identical or within rounding"
                     + (f", {deq_same:,} of them dequantized from integers" if deq_same else ""))
    stats = [p for p in r.weights if p.method == METHOD_STATS and not p.failed]
    deq = [p for p in stats if _dequantized(p)]
    converted: dict[str, int] = {}
    for p in stats:
        if not _dequantized(p) and p.cand_dtype != p.dtype:
            converted[p.cand_dtype] = converted.get(p.cand_dtype, 0) + 1
    plain = len(stats) - len(deq) - sum(converted.values())
    folded = sum(1 for p in r.weights if p.failed and TAG_FOLDED in p.tags)
    if folded:
        parts.append(f"{folded:,} folded by the port: they differ, and what reads them shows no difference of its own")
    if deq:
        parts.append(f"{len(deq):,} dequantized from integers, within a quantisation step as far as statistics tell")
    parts += [f"{n:,} converted to {dtype}, within its rounding as far as statistics tell"
              for dtype, n in converted.items()]
    if plain:
        parts.append(f"{plain:,} compared by statistics only, which show no difference (not proven)")
    return f" ({'; '.join(parts)})" if parts else ""


def _dequantized(p: PairResult) -> bool:
    return any(t.startswith("dequantized") for t in p.tags)


def summarize(r: DiffReport) -> str:
    """Verdict, what was compared, weights, first divergence and its cause, amplifier, outputs, calls, rng."""
    if not r.pairs and not r.weights:
        return (f"Nothing compared: no record of the candidate lines up with the reference "
                f"({len(r.ref_only)} reference-only, {len(r.cand_only)} candidate-only records).")
    verdict = r.verdict
    if verdict == VERDICT_EMPTY:
        return (f"Nothing compared: {len(r.pairs)} records line up, but none could be compared "
                "(no tensors and no statistics in common, or values of different kinds).")
    text = compared_words(r) + " "
    if r.levels:     # first: every other sentence is about what little lined up
        text = r.levels + " " + text
    if r.renames:    # first too: renamed modules leave the records that would say most unpaired
        text = _sentence(r.renames) + " " + text
    if r.incomplete:
        text = " ".join(n[0].upper() + n[1:] + "." for n in r.incomplete) + " " + text
    if verdict == VERDICT_CONSISTENT:
        text = ((r.levels + " " if r.levels else "") +
                f"No divergence found, but nothing was compared element-wise: {compared_words(r)[9:]} "
                "Statistics only prove differences, so a match is not proven; capture with --keep full to compare "
                "values.")
    elif verdict != VERDICT_DIVERGED:
        text += _match_words(r)
    else:
        text += _weights_words(r) + _divergence_words(r)
    text += _rng_words(r) + _calls_words(r)
    if r.environment_notes and verdict == VERDICT_DIVERGED:
        text += f" The environments differ: {r.environment_notes[0]}."
    first = r.get(r.first_divergence)
    unpaired = first is not None and first.cause == CAUSE_RANDOM and first.origin and r.get(first.origin) is None
    if r.rng_note and verdict == VERDICT_DIVERGED and r.rng_note not in text and not unpaired:   # nothing to replay
        text += f" Note: {r.rng_note}."
    unmatched = [n for n in r.ref_only if not n.startswith("input.")]
    if unmatched or r.cand_only or r.shape_mismatches:
        text += (f" Unmatched: {len(r.ref_only)} reference-only, {len(r.cand_only)} candidate-only records"
                 f"{f', {len(r.shape_mismatches)} shape mismatches' if r.shape_mismatches else ''}.")
    return text


def _match_words(r: DiffReport) -> str:
    if r.judged_by_int8_outputs:
        return _int8_match_words(r)
    rule = "within rounding noise" if r.criteria.noise else "within the criteria"
    worst = r.get(r.worst)
    tail = ""
    if worst is not None:
        floor = f", noise floor {worst.floor:.2g}" if worst.floor and r.criteria.noise else ""
        why = f": {worst.floor_reason}" if floor and worst.floor_reason else ""
        if floor and worst.floor >= 1.0:   # a floor of 100% passes any value: say what still judges this port
            why += (" — above 100%, too wide to judge this record by; the port is judged by its outputs' SNR and "
                    "correlation")
        tail = f" (worst {worst.name}: relative error {worst.rel_err:.2g}{floor}{why}; {fmt_err(worst)})"
    stats = r.counts()["not_proven"]
    caveat = (f" {stats:,} records compared by statistics only show no difference: not proven (--keep full compares "
              "their values)." if stats else "")
    return f"Match: every compared record agrees {rule}{tail}.{caveat}" + _precision_words(r) + _blind_spot_words(r)


BLIND_FLOOR = 1e-3      # a floor this wide (SNR 60 dB) lets a change of a record's own pass as rounding: say so


def _blind_spot_words(r: DiffReport) -> str:
    """On a match whose floors are wide (a float16 port), how large a change of a record's own can pass as
    rounding, and where: what the match does not rule out (a norm's eps of 1e-3 for 1e-5 changes its output
    by ~2e-3, well inside float16's floors)."""
    if not r.criteria.noise:
        return ""
    judged = [p for p in r.pairs if p.kind not in (*WEIGHT_KINDS, KIND_MODEL_INPUT, KIND_MODEL_OUTPUT) and p.compared
              and p.floor is not None and p.floor >= BLIND_FLOOR and not p.failed
              and p.name.split(":")[0] != "<root>"]     # the model's output: judged by the output criterion too
    if not judged:
        return ""
    widest = max(judged, key=lambda p: p.floor)
    return (f" What a match cannot rule out here: a change of a record's own smaller than its floor reads as "
            f"rounding, and the floors reach {widest.floor:.2g} (SNR {_snr_db(widest.floor):.0f} dB) at "
            f"{widest.name}; a port's own change below that (a norm's eps of 1e-3 for 1e-5, for one) is not judged. "
            f"Compare a same-precision build of the port to judge it.")


def _snr_db(rel: float) -> float:
    return -20 * math.log10(rel) if rel > 0 else math.inf


def _int8_match_words(r: DiffReport) -> str:
    """A quantized port judged by its outputs: what its records carry and what its outputs show, with figures."""
    failing = [p for p in r.pairs if p.failed]
    first = next((p for p in failing if p.cause == CAUSE_QUANTIZED), failing[0] if failing else None)
    outs = [o for o in (r.get(n) for n in (r.outputs or (r.output,))) if o is not None]
    shown = "; ".join(f"{o.name}: {fmt_err(o)}" for o in outs[:3])
    n = sum(1 for q in r.pairs if TAG_QUANTIZED in q.tags or TAG_READS_QUANTIZED in q.tags)
    carry = (f"its first divergence, {first.name}, is int8's rounding ({first.explanation or 'quantized arithmetic'})"
             f"; {n:,} of the {len(r.pairs):,} compared records are computed with quantized arithmetic or from its "
             "results and carry its error by design; " if first else "")
    amp = r.strongest_amplifier    # what would make a longer or louder input fail: said even on a match
    grows = (f" The error grows most at {amp.name} (error gain {gain_words(amp.gain)}, relative error "
             f"{amp.input_rel_err:.2g} -> {amp.output_rel_err:.2g})" + (f": {amp.explanation}." if amp.explanation
                                                                        else ".") if amp is not None else "")
    return (f"Match by its outputs, as a quantized port: {carry}every model output meets the output criterion of a "
            f"quantized port (SNR >= {OUTPUT_MIN_SNR:g} dB, correlation >= {OUTPUT_MIN_CORR:g}): {shown}.{grows}")


def _precision_words(r: DiffReport) -> str:
    """For a port that is not same-precision, whether its outputs meet the output criterion."""
    if not r.reduced_precision or not r.criteria.noise:
        return ""
    outs = [o for o in (r.get(n) for n in r.outputs) if o is not None and o.method == METHOD_ELEMENTWISE]
    if not outs or any(o.failed for o in outs):
        return ""
    return (f" The outputs meet the output criterion of a {r.reduced_precision} port (SNR >= {OUTPUT_MIN_SNR:g} dB, "
            f"correlation >= {OUTPUT_MIN_CORR:g}).")


def _weights_words(r: DiffReport) -> str:
    bad = r.weights_differ
    if not bad:
        return ""
    first = bad[0]
    err = first.rel_err if first.rel_err is not None else first.metrics.get("rel_l2_err_lower")
    how = (f"relative error {err:.2g}" if first.rel_err is not None else
           f"relative error at least {err:.2g}" if err else "; ".join(first.reasons))
    more = f", and {len(bad) - 1} more" if len(bad) > 1 else ""
    how = f"a buffer, {how}" if first.kind == KIND_BUFFER else how
    text = f"Weights differ: {first.name} ({how}){more}."
    if any(w.match == MATCH_SUGGESTED for w in bad):   # unpaired by name: the rename offered above pairs them
        text += " They pair only by the rename suggested above; the outputs alone need not show such a bug."
    div = r.get(r.first_divergence)
    if div is not None and div.kind != KIND_MODEL_INPUT:
        users = {w.module for w in bad}
        if div.origin in {w.name for w in bad} or div.module in users:
            text += f" The forward's first divergence, {div.name}, is where {'it is' if len(bad) == 1 else 'they are'} used."
    return text + " "


def _divergence_words(r: DiffReport) -> str:
    c = r.counts()
    first = r.get(r.first_divergence)
    if first is None:
        return "Diverged: the weights differ, but every forward record compared agrees."
    why = "; ".join(first.reasons)
    where = (f"{first.op} in {op_place('', r.model_class, r.first_source)}"   # the root's own code, not the loss
             if not first.module and first.op and not first.op.startswith("module:") and "/" in first.name
             else f"{module_label(first.module)}, {first.op}")
    place, enters = r.first_place, ""
    if TAG_PORT_OP in first.tags and first.origin:
        enters = f" {module_label(place or '')} ({first.origin}, an op only the port has), seen first at"
    elif place and first.cause == CAUSE_WEIGHTS and first.origin and place != parse_name(first.name)[0]:
        enters = (f" {place} (its weight {first.origin} differs, and the port has no value of {place}'s own to "
                  "compare), seen first at")
    partner = r.fused_with(first.name)
    both = f" or {partner} (the port holds the two in one value)" if partner else ""
    text = (f"Diverged: {c['failed']:,} of {c['pairs']:,} records fail; first divergence at{enters} {first.name}{both} "
            f"({where}): {why}.")
    text += _cause_words(r, first)
    amp = r.strongest_amplifier
    if amp is not None and amp.name != first.name:
        text += (f" Strongest amplifier: {amp.name} (error gain {gain_words(amp.gain)}, relative error "
                 f"{amp.input_rel_err:.2g} -> {amp.output_rel_err:.2g})"
                 + (f": {amp.explanation}." if amp.explanation else "."))
    text += _output_words(r, first)
    if r.first_difference:
        earlier = r.get(r.first_difference)
        cause = {CAUSE_AMPLIFIED: "amplified rounding", CAUSE_RANDOM: "random draws that differ"}.get(
            earlier.cause or "", earlier.cause or "")
        text += f" An earlier record, {earlier.name}, also differs ({cause})."
    return text


def _cause_words(r: DiffReport, p: PairResult) -> str:
    if any(t.startswith(TAG_LAYOUT) for t in p.tags) and p.cause == CAUSE_OWN:
        return (" The candidate holds the reference's values in another layout: transpose or reorder where the "
                "port stores or reads it (or compare in one layout).")
    if p.kind == KIND_MODEL_INPUT:
        return " The model inputs already differ: compare the inputs before blaming a layer."
    if p.cause == CAUSE_WEIGHTS:
        return _weight_cause_words(r, p)
    if p.cause == CAUSE_RANDOM:
        if p.origin != p.name and p.explanation and r.get(p.origin) is None:   # a draw with no counterpart
            return f" {_sentence(p.explanation)}"
        if r.rng_replayed:   # the advice would be to do what was done: say what replay could not do
            return (" It comes from random draws that differ between the runs, though the candidate replayed the "
                    "reference's: the port draws with another op, shape or order here.")
        return " It comes from random draws that differ between the runs (use --replay-rng)."
    if p.cause == CAUSE_QUANTIZED:
        n = sum(1 for q in r.pairs if TAG_QUANTIZED in q.tags or TAG_READS_QUANTIZED in q.tags)
        return (f" {p.explanation[0].upper() + p.explanation[1:]}; {n:,} of the {len(r.pairs):,} compared records "
                "are computed with quantized arithmetic or from its results. Judge the port by its outputs (or with "
                "--min-snr)."
                if p.explanation else "")
    if p.cause == CAUSE_AMPLIFIED and TAG_INPUT_UNSEEN in p.tags:
        # its input was made by code no record shows: the gain was measured from the records before that code
        code = made_in(p.tags, p.module)
        by = _unrecorded_code(code, r) if code is not None else "code no record shows"
        g = f" by {gain_words(p.gain)}" if p.gain is not None and p.gain >= 1 else ""
        src = f" ({p.input_name}: {p.input_rel_err:.2g})" if p.input_name and p.input_rel_err else ""
        return (f" No compared record adds error of its own, but its input is made by {by}: either that code adds "
                f"the error, or this op amplifies the rounding noise of the records it is computed from{src}{g}. "
                "Capture at --level op to see that code.")
    if p.cause == CAUSE_AMPLIFIED:
        g = f" ({gain_words(p.gain)})" if p.gain is not None and p.gain >= 1 else ""
        words = f": {p.explanation}" if p.explanation else ""
        return (f" No record adds error of its own: its inputs differ only by rounding noise, which it "
                f"amplifies{g}{words}.")
    if p.cause == CAUSE_OWN and p.explanation:     # NaN/Inf born here, with its diagnosis
        return f" {_sentence(p.explanation)}"
    if p.cause == CAUSE_OWN and (p.uncompared_inputs or made_in(p.tags, p.module) is not None):
        return _uncompared_words(p, r)
    if p.cause == CAUSE_OWN and p.method != METHOD_STATS:
        if p.input_rel_err:
            return (f" The error is its own: its inputs differ by at most {p.input_rel_err:.2g}, which its op "
                    f"cannot turn into {p.rel_err:.2g}{' (composite module: capture at op level to see which op)' if p.op.startswith('module:') else ''}.")
        src = r.get(p.input_name)
        if p.input_rel_err == 0 and src is not None and src.method in (METHOD_ELEMENTWISE, METHOD_EXACT, METHOD_DIGEST):
            return " The error enters here: its inputs are identical."
        if p.input_rel_err == 0 and src is not None:
            return (" The error enters here: its inputs, compared by statistics only, show no difference "
                    "(not proven identical).")
        return " The error enters here: no recorded value it is computed from differs."
    return ""


def _weight_cause_words(r: DiffReport, p: PairResult) -> str:
    """' It reads buffer body.scale, which differs.', or, where a parent's own code read it on the way in:
    ' Its input is made by body's own code, which reads buffer body.scale, which differs.'"""
    w = r.get(p.origin)
    what = f"{'buffer' if w is not None and w.kind == KIND_BUFFER else 'weight'} {p.origin}"
    if TAG_WEIGHT_MISSING in p.tags:
        return (f" It reads {what}, which the port has no counterpart of, and every weight the port reads here "
                "is paired with another: the port computes it without that weight (a bias dropped or zeroed?).")
    code = made_in(p.tags, p.module)
    if code is not None and w is not None and w.module == code and w.module != p.module:
        return f" Its input is made by {_own_code(code, r)}, which reads {what}, which differs."
    if TAG_WEIGHT_BEHIND in p.tags and p.explanation:   # `fusion.weights_behind_unpaired`
        return f" {p.explanation[0].upper()}{p.explanation[1:]}."
    return f" It reads {what}, which differs."


def _own_code(module: str, r: DiffReport | None) -> str:
    """'enc's own code', or the root's: "the model's own forward (Vocoder.forward)"."""
    return f"{module}'s own code" if module else op_place("", r.model_class if r is not None else None)


def _unrecorded_code(module: str, r: DiffReport | None) -> str:
    """'enc's own code, which no record shows' (the root's: its forward)."""
    return f"{_own_code(module, r)}, which no record shows"


def _uncompared_words(p: PairResult, r: DiffReport | None = None) -> str:
    """The error is first seen here, but not every input was compared: say which were not, and what the
    compared ones show. (Never "its inputs are identical": nothing proved it.)"""
    parts = []
    code = made_in(p.tags, p.module)
    if code is not None:
        parts.append(f"made by {_unrecorded_code(code, r)}")
    for why in (UNPAIRED, NOT_COMPARED, CAND_ONLY):
        names = [n for n, w in p.uncompared_inputs if w == why]
        if names:
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            parts.append(f"{why}: {', '.join(names[:3])}{more}")
    fed = [n for n, w in p.uncompared_inputs if w == FED_OTHERWISE]
    if fed:
        parts.append(f"the reference feeds it {', '.join(fed[:3])}, the candidate a value made by code no record "
                     "shows")
    shown = ("; the compared records it is computed from agree" if p.input_rel_err == 0 else
             f"; the compared records it is computed from differ by at most {p.input_rel_err:.2g}"
             if p.input_rel_err else "")
    see = " Capture at --level op to see that code." if code is not None or fed else ""
    return (f" The error enters here or in what feeds it: its inputs were not compared ({'; '.join(parts)})"
            f"{shown}.{see}")


def _sentence(text: str) -> str:
    """`text` as a sentence: capitalised, ending with one full stop."""
    text = text.strip()
    return text[0].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _output_words(r: DiffReport, first: PairResult) -> str:
    outs = [r.get(n) for n in r.outputs] or ([r.get(r.output)] if r.output else [])
    outs = [o for o in outs if o is not None and o.name != first.name]
    if not outs:
        return ""
    failing = [o for o in outs if o.failed]
    listed = _listed_outputs(failing or outs, outs)
    if failing:
        by = ""
        if all(o.cause == CAUSE_RANDOM for o in failing):
            replay = ("draws the replay could not feed differ too" if r.rng_replayed else
                      "random draws differ too, so replay them (--replay-rng) to tell noise from this error")
            by = f" — {replay}" if _port_error(r) else " — by random noise, not by the port"
        return (f" The divergence persists to the output{'s' if len(failing) > 1 else ''}{by}: {listed}."
                + "".join(_spectral_words(o) for o in failing))
    return f" The error recovers: the output{'s pass' if len(outs) > 1 else ' passes'}: {listed}."


SPECTRAL_MATCH_ERR = 0.1    # STFT magnitudes within 10% (about -20 dB of difference): the same sound


def _spectral_words(o: PairResult) -> str:
    """Whether a failing waveform output differs by phase only: its STFT magnitude against the reference's."""
    err, corr = o.metric("spec_mag_rel_err"), o.metric("log_spec_corr")
    if err is None or corr is None:
        return ""
    figures = f"magnitude error {err:.2g}, log-spectrogram correlation {corr:.3f}"
    if err <= SPECTRAL_MATCH_ERR:
        return (f" The waveform of {o.name} differs but its spectral magnitude matches ({figures}): the phase "
                "differs (an oscillator's phase drifts), not the spectrum; judge it by ear with `tensorprobe audio diff`.")
    return f" The spectral magnitude of {o.name} differs too ({figures}): not a difference of phase alone."


def _listed_outputs(shown: list[PairResult], outs: list[PairResult]) -> str:
    """Every output of `shown` with its error, in the model's order (the first graph output first), then the
    outputs that pass, by name: a model's main result is never left out behind its caches."""
    text = "; ".join(f"{o.name} ({fmt_err(o)})" for o in shown[:MAX_OUTPUTS_LISTED])
    if len(shown) > MAX_OUTPUTS_LISTED:
        text += f"; and {len(shown) - MAX_OUTPUTS_LISTED:,} more"
    rest = [o.name for o in outs if o not in shown]
    if rest:
        names = ", ".join(rest[:MAX_OUTPUTS_LISTED]) + (f" and {len(rest) - MAX_OUTPUTS_LISTED:,} more"
                                                         if len(rest) > MAX_OUTPUTS_LISTED else "")
        text += f" ({names} pass{'es' if len(rest) == 1 else ''})"
    return text


def _port_error(r: DiffReport) -> bool:
    """Does anything fail for a reason other than random draws (a bug, weights, quantization, amplification)?"""
    return any(p.failed and p.cause in (CAUSE_OWN, CAUSE_WEIGHTS, CAUSE_QUANTIZED, CAUSE_AMPLIFIED)
               for p in r.pairs) or bool(r.weights_differ)


def _rng_words(r: DiffReport) -> str:
    if not r.rng_differs:
        return ""
    n = len(r.rng_differs)
    outs = [r.get(o) for o in r.outputs]
    reaches = any(o is not None and o.failed and o.cause == CAUSE_RANDOM for o in outs)
    these = "these were" if n > 1 else "this one was"
    advice = (f"the candidate was captured with --replay-rng, and {these} not replayed: the port draws with another "
              "op, shape or order than the reference" if r.rng_replayed else "--replay-rng feeds the reference's")
    if reaches and _port_error(r):
        return f" {n} random op{'s' if n > 1 else ''} drew different noise: {advice}."
    effect = (": the outputs differ by noise, not by the port" if reaches else
              "; it does not reach the outputs" if outs and not any(o and o.failed for o in outs) else "")
    return f" {n} random op{'s' if n > 1 else ''} drew different noise{effect}; {advice}."


def _calls_words(r: DiffReport) -> str:
    failing = [s for s in r.call_series if s.first_failing_call is not None]
    if not failing:
        return ""
    s = min(failing, key=lambda s: (s.key.count("/"), s.first_failing_call))
    grow = f", relative error grows {gain_words(s.growth)} by call {s.calls[-1]}" if s.growth else ""
    return (f" Repeated calls: {s.key} runs {len(s.calls)} times; error enters at call "
            f"{s.first_failing_call}{grow}.")


__all__ = ["compared_words", "fmt_err", "gain_words", "summarize"]
