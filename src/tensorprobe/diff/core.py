"""`diff`: compare a candidate bundle (a port, another dtype, another runtime) with a reference bundle.

    >>> import tensorprobe as tp
    >>> report = tp.diff("ref_bundle", "cand_bundle", min_snr=60)        # doctest: +SKIP
    >>> print(report.summary)                                           # doctest: +SKIP
    Diverged: first divergence at generator.conv_post (SNR 41.2 dB < 60 dB, correlation 0.99996);
    strongest amplifier generator.m_source.l_sin_gen/sin.0 (error gain x1,024); the divergence
    persists to the output <root> (SNR 12.3 dB).

Pairs are compared one at a time (tensors are memory-mapped from the bundles' shards, so bundles larger
than memory work), each in one fused pass (`metrics.py`). The analysis that follows (error gain over the
op graph, repeated calls, random ops) is in `analysis.py`; the findings are in `result.py`.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import replace
from typing import Callable, Mapping, Sequence

import numpy as np

from ..bundle import Bundle
from ..stats.sketch import ESTIMATE_MARGIN, SKETCH_SIZE, estimate_rel_err
from ..environment import explain as explain_environment
from ..errors import InputError
from ..record import KIND_MODEL_OUTPUT, TAG_RANDOM_REPLACED, WEIGHT_KINDS, Record, short_op
from ..stats import TensorStats
from . import analysis
from .align import (MATCH_READER_REPACKED, MATCH_READER_T, MATCH_VIEW, Pair, Rule, align, declared_outputs,
                    inconsistent_order_pairs, load_rules, parse_rule, parse_rules, same_shape, torch_gate_order)
from .compat import BOOL, INT, kinds_agree, not_comparable_reason, stats_bounds, value_kind
from .db import DB_SCALES, db_error
from .fusion import fused_successors, held_transposed
from .views import comparable_view, every_record
from .layout import (REORDER_MIN_ERROR, TAG_COMPARED_TRANSPOSED, TAG_LAYOUT, TRANSPOSED, closest_transpose, find_layout,
                     in_reference_layout)
from .metrics import Sums, accumulate, evaluate
from .noise import (OUTPUT_MIN_CORR, OUTPUT_MIN_SNR, OUTPUT_WORDS, Noise, Precision, dequantized_floor, expected_noise,
                    judged_floor, reduced_precision, weight_floor)
from .result import (METHOD_DIGEST, METHOD_ELEMENTWISE, METHOD_EXACT, METHOD_STATS, STATUS_FAIL,
                     STATUS_NO_DATA, STATUS_NOT_COMPARABLE, STATUS_NOT_PROVEN, STATUS_PASS, STATUS_SHAPE, AngleResult,
                     Criteria, DiffReport, PairResult)

ANGLE_OPS = ("atan2", "angle")
_EPS32 = 1.1920929e-07
# a sketch's estimate fails a pair only far above its limit (`sketch.ESTIMATE_MARGIN`) and above what rounding
# of its float32 inputs leaves in it
SKETCH_MIN_ERROR = 1e-5


def diff(ref: Bundle | str | os.PathLike, cand: Bundle | str | os.PathLike, *,
         atol: float | None = None, rtol: float | None = None, min_corr: float | None = None,
         min_snr: float | None = None, rules: Sequence[str | Rule] | str | os.PathLike | None = None,
         angles: Sequence[str] = (), db: Sequence[str] = (),
         progress: Callable[[str], None] | None = None) -> DiffReport:
    """Align two bundles and compare every pair: weights first, then the forward; find the first divergence,
    its cause and the strongest amplifier.

    Args:
        ref, cand: bundles (or paths: a bundle directory, a `.safetensors` or `.npz` dump).
        atol, rtol: element-wise tolerance |cand - ref| <= atol + rtol·|ref|.
        min_corr: minimum Pearson correlation; min_snr: minimum SNR in dB. With no criterion at all, the
            noise-or-divergence rule decides (`tensorprobe.diff.noise`): differences within each record's
            rounding-noise floor pass, anything beyond is a divergence.
        rules: name-mapping rules `PATTERN=REPLACEMENT` (candidate name -> reference name), the path
            of a rules file (format in `tensorprobe.diff.align`), or that file's text.
        angles: regexes (searched in reference names) of records to compare modulo 2π, besides those
            tagged "angle" by capture (outputs of atan2/angle).
        db: regexes of spectrogram / log-magnitude records to also report in dB; `REGEX=SCALE` picks how
            values map to dB (mag, power, ln, db; default auto: mag if all values >= 0, else ln).
        progress: called with each record name as it is compared.

    Returns:
        A `DiffReport`; `report.verdict` is "match", "diverged", "consistent" (statistics only, no
        divergence found) or "nothing_compared"; `report.passed` only for "match".

    Example:
        >>> r = diff("ref", "cand", rules=[r"dec\\.(.*)=decoder.\\1"], angles=[r"phase"])   # doctest: +SKIP
        >>> r.verdict, r.first_divergence, r.get(r.first_divergence).cause                 # doctest: +SKIP
        ('diverged', 'decode.1.conv1', 'own')
    """
    criteria = Criteria(atol, rtol, min_corr, min_snr)
    ref_b, cand_b = _open(ref), _open(cand)
    cand_b = comparable_view(ref_b, cand_b)       # a runtime's op records against module-level records
    rule_list = _rules(rules)
    angle_res = _compile_all(angles, "--angle")
    db_res = _db_specs(db)
    alignment = align(ref_b.records, cand_b.records, rule_list,
                      outputs=(declared_outputs(ref_b.manifest), declared_outputs(cand_b.manifest)),
                      readers=every_record(cand_b))
    inconsistent = inconsistent_order_pairs(alignment)
    ref_env, cand_env = ref_b.manifest.get("environment"), cand_b.manifest.get("environment")
    cand_of = {p.ref.name: p.cand for p in alignment.pairs}
    precision = Precision.of(ref_env, cand_env)
    noise = expected_noise(sorted(ref_b.records, key=lambda r: r.order), cand_of, precision)
    reduced = reduced_precision(ref_b.records, cand_b.records, precision)
    results = []
    for pair in alignment.pairs:
        if progress is not None:
            progress(pair.ref.name)
        results.append(compare_pair(ref_b, cand_b, pair, criteria, _is_angle(pair, angle_res),
                                    _db_scale(pair.ref.name, db_res), noise=noise.get(pair.ref.name),
                                    not_comparable=inconsistent.get(pair.ref.name), reduced=reduced))
    # a value the port holds for the reference's next record (an exporter fused the two): paired with that one
    results = held_transposed(results)       # ... or holds in another layout, which what reads it undoes
    results, ref_only = fused_successors(results, alignment, lambda pair: compare_pair(
        ref_b, cand_b, pair, criteria, _is_angle(pair, angle_res), _db_scale(pair.ref.name, db_res),
        noise=noise.get(pair.ref.name), reduced=reduced))
    return analysis.build_report(
        ref=str(ref_b.path), cand=str(cand_b.path), criteria=criteria, results=results,
        ref_records=ref_b.records, ref_only=[r.name for r in ref_only],
        cand_only=[c.name for c in alignment.cand_only], notes=[], incomplete=_incomplete(ref_b, cand_b),
        ref_bundle=ref_b, cand_bundle=cand_b, environment_notes=explain_environment(ref_env, cand_env),
        noise=noise, reduced=reduced, compare=compare_pair)


def compare_pair(ref_b: Bundle, cand_b: Bundle, pair: Pair, criteria: Criteria, angle: bool = False,
                 db_scale: str | None = None, *, noise: Noise | None = None,
                 not_comparable: str | None = None, reduced: str | None = None) -> PairResult:
    """Compare one aligned pair: every element when both sides kept the tensor (integers exactly), by
    content fingerprint for identical weights, else by statistics. Tensors are memory-mapped and dropped.
    `noise`: what rounding explains here (`noise.expected_noise`), which decides under the noise rule;
    `reduced`: why the candidate is not a same-precision port (`noise.reduced_precision`), or None."""
    r, c = pair.ref, pair.cand
    floor_reason = modelled = None
    if r.kind in WEIGHT_KINDS:
        floor: float | None = weight_floor(r, c)
        rounding = floor
        floor_reason = ("one quantisation step of a weight dequantised from integers" if floor and
                        (dequantized_floor(c) or dequantized_floor(r)) else
                        "rounding of a dtype conversion" if floor else "none: weights are data, compared exactly")
    elif noise is not None:
        judged = judged_floor(noise, r, reduced)
        floor, modelled, floor_reason, rounding = judged.value, judged.modelled, judged.reason, noise.rounding
    else:
        floor = rounding = None
    base = dict(name=r.name, cand_name=c.name, module=r.module, op=r.op, kind=r.kind, call=r.call,
                order=r.order, shape=tuple(r.shape), cand_shape=tuple(c.shape), dtype=r.dtype,
                cand_dtype=c.dtype, match=pair.method, tags=tuple(sorted(set(r.tags) | set(c.tags)
                                                                        | ({"angle"} if angle else set()))),
                floor=floor, rounding=rounding, floor_reason=floor_reason if criteria.noise else None,
                modelled_floor=modelled)
    output_rule = _output_rule(r, criteria, reduced)
    if TAG_RANDOM_REPLACED in base["tags"]:
        return PairResult(**base, status=STATUS_NO_DATA, reasons=(
            "not compared: computed from random ops the candidate replaced by zeros (random='zeros')",))
    if not_comparable is not None:
        if _finiteness_differs(r, c) and same_shape(r.shape, c.shape):
            # a value against no value is a divergence however each side computed it: only that is judged
            found = _compare_values(ref_b, cand_b, pair, criteria, angle, None, base, math.inf) \
                if r.has_tensor and c.has_tensor else _compare_stats(pair, criteria, base, math.inf)
            return replace(found, status=STATUS_FAIL, reasons=found.reasons + (
                "only its finiteness is compared: " + not_comparable.removeprefix("not comparable: "),))
        return PairResult(**base, status=STATUS_NOT_COMPARABLE, reasons=(not_comparable,))
    if pair.method.startswith(MATCH_READER_REPACKED):
        # a recurrent weight in ONNX's gate order: values compared in PyTorch's order; statistics hold as well
        if r.has_tensor and c.has_tensor:
            op = pair.method.split(":", 1)[1]
            return _compare_values(ref_b, cand_b, pair, criteria, angle, db_scale, base, floor,
                                   layout=lambda a: torch_gate_order(a, op))
        return _compare_stats(pair, criteria, base, floor, fingerprint=False)
    if pair.method == MATCH_READER_T:
        # a weight the port holds transposed (paired through its reader): values compared in the reference's
        # layout; statistics hold under a transpose, its bytes' fingerprint does not
        if r.has_tensor and c.has_tensor:
            return _compare_values(ref_b, cand_b, pair, criteria, angle, db_scale, base, floor,
                                   layout=lambda a: np.ascontiguousarray(a.T))
        return _compare_stats(pair, criteria, base, floor, fingerprint=False)
    if pair.method == MATCH_VIEW and r.has_tensor and c.has_tensor and r.stats.numel == c.stats.numel:
        # a view in another shape; or the same dimensions reordered (a transpose the reference took as a view,
        # which its op records do not show): then the transpose that fits best
        moved = closest_transpose(ref_b.numpy(r.name), cand_b.numpy(c.name)) \
            if sorted(r.shape) == sorted(c.shape) else None
        return _compare_values(ref_b, cand_b, pair, criteria, angle, db_scale, base, floor, output_rule,
                               layout=(lambda a: in_reference_layout(a, tuple(r.shape), moved)) if moved is not None
                               else (lambda a: a.reshape(tuple(r.shape))))
    if not same_shape(r.shape, c.shape):
        shapes = f"shape {_shape(r.shape)} vs {_shape(c.shape)}"
        layout = find_layout(ref_b.numpy(r.name), cand_b.numpy(c.name), _layout_limit(criteria, floor)) \
            if r.has_tensor and c.has_tensor and r.stats.numel == c.stats.numel else None
        if layout is not None:   # every value right, in another place: say so, not just "shape differs"
            return PairResult(**{**base, "tags": base["tags"] + (layout.tag(),)}, status=STATUS_SHAPE,
                              reasons=(f"same values in another layout ({layout.words()}): {shapes}",))
        closest = closest_transpose(ref_b.numpy(r.name), cand_b.numpy(c.name)) \
            if r.has_tensor and c.has_tensor and r.kind != KIND_MODEL_OUTPUT and r.stats.numel == c.stats.numel \
            else None
        if closest is not None:
            # held transposed (an exporter moved a transpose) and carrying error: compared in the reference's
            # layout, so the error is judged like any value's (inherited from a quantized input, or its own)
            found = _compare_values(ref_b, cand_b, pair, criteria, angle, db_scale, base, floor, output_rule,
                                    layout=lambda a: in_reference_layout(a, tuple(r.shape), closest))
            return replace(found, tags=found.tags + (TAG_COMPARED_TRANSPOSED,), reasons=found.reasons + (
                f"compared in the reference's layout: the port holds it {closest.words()} ({shapes})",))
        if not (r.has_tensor and c.has_tensor) and sorted(r.shape) == sorted(c.shape):
            found = _compare_stats(pair, criteria, base, floor, fingerprint=False)
            if not found.failed:
                # statistics hold under a transpose: what they show agrees, in the reference's dimensions reordered
                return PairResult(**{**base, "tags": base["tags"] + (TAG_LAYOUT + TRANSPOSED,)}, status=STATUS_SHAPE,
                                  reasons=(f"the same statistics with its dimensions reordered (statistics cannot tell "
                                           f"a transpose from other values; --keep full compares them): {shapes}",))
            # carrying error as well: judged by its statistics, which a transpose keeps (as values would be)
            return replace(found, tags=found.tags + (TAG_COMPARED_TRANSPOSED,), reasons=found.reasons + (
                f"compared by statistics, which hold under a transpose: the port holds it with its dimensions "
                f"reordered ({shapes})",))
        return PairResult(**base, status=STATUS_SHAPE, reasons=(shapes,))
    if not kinds_agree(r, c):
        return PairResult(**base, status=STATUS_NOT_COMPARABLE, reasons=(not_comparable_reason(r, c),))
    if r.has_tensor and c.has_tensor:
        return _compare_values(ref_b, cand_b, pair, criteria, angle, db_scale, base, floor, output_rule)
    if r.kind in WEIGHT_KINDS and r.digest and c.digest and r.digest == c.digest and r.dtype == c.dtype:
        return PairResult(**base, status=STATUS_PASS, method=METHOD_DIGEST, metrics={"rel_l2_err": 0.0},
                          reasons=())
    return _compare_stats(pair, criteria, base, floor)


def _finiteness_differs(r: Record, c: Record) -> bool:
    """NaN/Inf counts differ between the two records (statistics): some element is finite on one side only."""
    return (r.stats.nan, r.stats.posinf, r.stats.neginf) != (c.stats.nan, c.stats.posinf, c.stats.neginf)


def _output_rule(r: Record, criteria: Criteria, reduced: str | None) -> Criteria | None:
    """Under the noise rule a model output must also meet the output criterion, whatever floor its record was given
    (quantized, reduced precision, amplified rounding): an output is judged as an output. A port that is not
    same-precision: SNR >= 20 dB and correlation >= 0.99; a same-precision port: SNR >= 20 dB (a relative error
    above 0.1 is never a pass; the correlation of a near-constant output is left to the noise rule)."""
    if r.kind != KIND_MODEL_OUTPUT or not criteria.noise or r.stats.kind != "float":
        return None
    return Criteria(min_snr=OUTPUT_MIN_SNR, min_corr=OUTPUT_MIN_CORR if reduced is not None else None)


def _compare_values(ref_b: Bundle, cand_b: Bundle, pair: Pair, criteria: Criteria, angle: bool,
                    db_scale: str | None, base: dict, floor: float | None,
                    output_rule: Criteria | None = None,
                    layout: Callable[[np.ndarray], np.ndarray] | None = None) -> PairResult:
    r, c = pair.ref, pair.cand
    exact = value_kind(r) in (INT, BOOL)
    rt, ct = ref_b.numpy(r.name), cand_b.numpy(c.name)
    if layout is not None:      # the candidate's value in the reference's layout (a weight the port re-lays)
        ct = np.ascontiguousarray(layout(ct))
    if exact:
        sums = accumulate(rt, ct, shift_r=_shift(r), shift_c=_shift(c), floor=_floor(r), atol=0.0, rtol=0.0)
    else:
        sums = accumulate(rt, ct, shift_r=_shift(r), shift_c=_shift(c), floor=_floor(r),
                          atol=(criteria.atol or 0.0) if criteria.elementwise else math.inf,
                          rtol=criteria.rtol or 0.0, angle=angle)
    _check_read(ref_b, r, sums, sums.n_ref_finite)
    _check_read(cand_b, c, sums, sums.n_cand_finite)
    metrics = evaluate(sums)
    angle_res = _angle_result(sums, metrics, criteria, floor) if angle else None
    db_res = db_error(rt, ct, db_scale) if db_scale is not None and not exact else None
    if exact:
        mismatches = int(sums.violations)
        metrics = {**metrics, "mismatches": mismatches}
        reasons = [f"{mismatches:,} of {sums.n:,} values differ (integers and booleans compare exactly)"] \
            if mismatches or sums.nonfinite_mismatch else []
    else:
        reasons = judge(metrics, sums, criteria, floor, OUTPUT_WORDS if base["floor_reason"] == OUTPUT_WORDS else None)
        beyond = bool(reasons) and not sums.nonfinite_mismatch
        if output_rule is not None and not sums.nonfinite_mismatch:
            reasons += [f"{x}: the output criterion"
                        for x in judge(metrics, sums, output_rule)]
        if reasons and (metrics.get("rel_l2_err") or 0.0) >= REORDER_MIN_ERROR and \
                (layout := find_layout(rt, ct, _layout_limit(criteria, floor))) is not None:
            base = {**base, "tags": base["tags"] + (layout.tag(),)}
            reasons = [f"same values in another layout ({layout.words()}); as stored, {reasons[0]}", *reasons[1:]]
            beyond = False
        return PairResult(**base, status=STATUS_FAIL if reasons else STATUS_PASS, reasons=tuple(reasons),
                          metrics=metrics, angle=angle_res, db=db_res, method=METHOD_ELEMENTWISE,
                          beyond_floor=beyond and len(reasons) == 1)
    return PairResult(**base, status=STATUS_FAIL if reasons else STATUS_PASS, reasons=tuple(reasons),
                      metrics=metrics, angle=angle_res, db=db_res, method=METHOD_EXACT)


def _layout_limit(criteria: Criteria, floor: float | None) -> float:
    """How close values must be, once another layout is undone, to be called the same values."""
    if criteria.noise:
        return max(floor or 0.0, 1e-6)
    return max(criteria.significant_rel_err(), 1e-6)


def _check_read(bundle: Bundle, rec: Record, sums: Sums, finite: float) -> None:
    """The values read must hold the NaN/Inf count their statistics recorded (`Bundle.check_nonfinite`): a
    corrupt shard is bad input, never a NaN finding. The kernel has counted them already."""
    if rec.stats.kind == "float" and sums.n == rec.stats.numel:    # complex values are read as 2 floats each
        bundle.check_nonfinite(rec.name, sums.n - int(finite))


def _compare_stats(pair: Pair, criteria: Criteria, base: dict, floor: float | None,
                   fingerprint: bool = True) -> PairResult:
    """A side kept statistics only: what they prove (`compat.stats_bounds`), judged like values would be."""
    r, c = pair.ref, pair.cand
    b = stats_bounds(r.stats, c.stats)
    lower = math.inf if b.nonfinite_differ else b.rel_err_lower   # a value against no value: total error
    metrics = {"rel_l2_err_lower": lower, "max_abs_err_lower": math.inf if b.nonfinite_differ else b.max_abs_err_lower,
               "ref_finite_frac": r.stats.finite_frac, "cand_finite_frac": c.stats.finite_frac}
    reasons = list(b.reasons)
    if b.values_differ is False:
        reasons = [x for x in reasons if not x.startswith("integer")]
    limit = _stats_limit(criteria, floor)
    beyond = False
    if not b.nonfinite_differ and lower is not None and limit is not None and lower > limit:
        beyond = not reasons
        what = f", {OUTPUT_WORDS}" if base["floor_reason"] == OUTPUT_WORDS else ""
        reasons.append(f"relative error at least {lower:.3g} (SNR at most "
                       f"{_snr(lower):.1f} dB), proven by the statistics, > {limit:.3g}{what}")
    statistics_same = not reasons and (b.rel_err_lower or 0.0) == 0.0 and _same_values(r.stats, c.stats)
    estimate = _sketch_estimate(r, c, fingerprint)
    if estimate is not None:
        metrics["rel_l2_err_estimate"] = estimate
        if not b.nonfinite_differ and limit is not None and estimate > max(ESTIMATE_MARGIN * limit, SKETCH_MIN_ERROR):
            beyond = not reasons
            reasons.append(f"relative error about {estimate:.2g} (SNR about {_snr(estimate):.1f} dB), estimated from "
                           f"the two sketches ({SKETCH_SIZE} signed sums of each value's hashed elements)" + (f", > {limit:.3g}" if limit else ""))
    if criteria.elementwise and b.max_abs_err_lower is not None:
        allowed = (criteria.atol or 0.0) + (criteria.rtol or 0.0) * float(r.stats.absmax or 0.0)
        if b.max_abs_err_lower > allowed:
            reasons.append(f"max abs error at least {b.max_abs_err_lower:.3g} (statistics) > {allowed:.3g}")
    # a fingerprint (of the bytes: same dtype only) tells only that some bit differs: it fails a weight compared
    # exactly, never one whose floor allows a difference (dequantised from integers, derived: g·v/‖v‖)
    if fingerprint and r.kind in WEIGHT_KINDS and r.digest and c.digest and r.digest != c.digest \
            and r.dtype == c.dtype and not floor:
        reasons.append("values differ (content fingerprints differ)" + (
            " while every statistic is identical: a transpose or a permutation?" if statistics_same else ""))
    if not (r.has_tensor or c.has_tensor) and not reasons and b.rel_err_lower is None and b.values_differ is None:
        return PairResult(**base, status=STATUS_NO_DATA, reasons=("no statistics to compare",))
    # statistics prove differences, never sameness: a pair they find no difference in is not proven to match
    return PairResult(**base, status=STATUS_FAIL if reasons else STATUS_NOT_PROVEN, reasons=tuple(reasons),
                      metrics=metrics, method=METHOD_STATS, beyond_floor=beyond and len(reasons) == 1)


def _sketch_estimate(r: Record, c: Record, same_layout: bool) -> float | None:
    """The relative error estimated from both sides' sketches (`stats.sketch`), when both carry one of a value in
    the same layout; None otherwise."""
    a, b = r.stats.sketch, c.stats.sketch
    if a is None or b is None or not same_layout or tuple(r.shape) != tuple(c.shape) or r.stats.std is None:
        return None
    sumsq = r.stats.numel * (float(r.stats.std) ** 2 + float(r.stats.mean) ** 2)
    return estimate_rel_err(a, b, sumsq)


def _stats_limit(criteria: Criteria, floor: float | None) -> float | None:
    if criteria.noise:
        return floor
    if criteria.min_snr is not None:
        return 10 ** (-criteria.min_snr / 20)
    return None


def _same_values(a: TensorStats, b: TensorStats) -> bool:
    """The same multiset of values as far as statistics tell: equal counts and extremes (exact under any
    permutation), mean and std equal up to the statistics' own summation rounding."""
    exact = all(getattr(a, f) == getattr(b, f) for f in ("numel", "nan", "posinf", "neginf", "min", "max"))
    return exact and stats_bounds(a, b).rel_err_lower == 0.0


def _snr(rel: float) -> float:
    return -20 * math.log10(rel) if rel > 0 else math.inf


def judge(metrics: Mapping[str, float | None], sums: Sums, criteria: Criteria, floor: float | None = None,
          floor_words: str | None = None) -> list[str]:
    """The reasons a pair fails `criteria` (empty list: it passes). Under the noise rule (no criterion
    given) a pair fails when its relative error exceeds `floor`, its rounding-noise floor (`floor_words` says
    what the floor is, when it is not the rounding noise: "the most a model output ... may differ")."""
    reasons = []
    if sums.nonfinite_mismatch:
        reasons.append(nonfinite_words(metrics))
        return reasons    # total error: no threshold can pass it, and no other figure means anything
    if criteria.noise:
        rel = metrics.get("rel_l2_err")
        if floor is not None and rel is not None and rel > floor:
            snr = metrics.get("snr_db")
            snr_words = f", SNR {snr:.1f} dB" if isinstance(snr, float) and math.isfinite(snr) else ""
            limit = f"{floor:.2g}, {floor_words}" if floor_words else f"the rounding noise {floor:.2g}"
            reasons.append(f"relative error {rel:.3g}{snr_words} beyond {limit}")
        return reasons
    if criteria.elementwise and sums.violations:
        reasons.append(f"{int(sums.violations):,} of {sums.n:,} elements outside atol={criteria.atol or 0:g} "
                       f"+ rtol={criteria.rtol or 0:g}·|ref| (max abs err {metrics['max_abs_err']:.3g})")
    snr, corr = metrics["snr_db"], metrics["pearson"]
    if criteria.min_snr is not None and snr is not None and snr < criteria.min_snr:
        if not (snr == -math.inf and (metrics["max_abs_err"] or 0.0) <= 1e-6):  # all-zero ref, tiny noise
            reasons.append(f"SNR {snr:.1f} dB < {criteria.min_snr:g} dB")
    if criteria.min_corr is not None and corr is not None and corr < criteria.min_corr:
        reasons.append(f"correlation {corr:.6f} < {criteria.min_corr:g}")
    return reasons


def nonfinite_words(metrics: Mapping[str, float | None]) -> str:
    """'non-finite on the candidate side: 12 elements (SNR -inf)', from a pair's metrics."""
    parts = [f"non-finite on the {side} side: {int(n):,} element{'s' if n != 1 else ''}"
             for side, n in (("candidate", metrics.get("nonfinite_cand_only") or 0),
                             ("reference", metrics.get("nonfinite_ref_only") or 0)) if n]
    return "; ".join(parts or ["elements finite on one side only"]) + " (SNR -inf: a value against no value is total error)"


def _angle_result(sums: Sums, metrics: Mapping[str, float | None], criteria: Criteria,
                  floor: float | None = None) -> AngleResult:
    e = sums.energy_ref()
    raw_snr = (math.inf if sums.raw_s_dd == 0 else (10 * math.log10(e / sums.raw_s_dd) if e > 0 else -math.inf)) \
        if sums.n_both else None
    raw_sums = Sums(**{**sums.__dict__, "s_dd": sums.raw_s_dd, "max_abs": sums.raw_max_abs})
    raw_rel = math.sqrt(sums.raw_s_dd / e) if e > 0 else (0.0 if sums.raw_s_dd == 0 else math.inf)
    raw_metrics = {**metrics, "snr_db": raw_snr, "max_abs_err": sums.raw_max_abs, "rel_l2_err": raw_rel}
    raw_criteria = criteria if criteria.noise else Criteria(min_snr=criteria.min_snr)
    raw_fails = bool(judge(raw_metrics, raw_sums, raw_criteria, floor)) or sums.raw_max_abs > math.pi
    wrapped_fails = bool(judge(metrics, sums, criteria, floor))
    flips = int(sums.flips)
    return AngleResult(flips=flips, raw_max_abs_err=sums.raw_max_abs, raw_snr_db=raw_snr, raw_rel_err=raw_rel,
                       explained=flips > 0 and raw_fails and not wrapped_fails)


def _open(b: Bundle | str | os.PathLike) -> Bundle:
    if isinstance(b, Bundle):
        return b
    if not isinstance(b, (str, os.PathLike)):
        raise InputError(f"diff takes bundles or bundle paths, got {type(b).__name__}")
    return Bundle.open(b)


def _rules(rules: Sequence[str | Rule] | str | os.PathLike | None) -> list[Rule]:
    if rules is None:
        return []
    if isinstance(rules, str) and "\n" in rules:   # the text of a rules file
        return parse_rules(rules.splitlines())
    if isinstance(rules, (str, os.PathLike)):
        if isinstance(rules, str) and "=" in rules and not os.path.exists(rules):
            return [parse_rule(rules)]
        return load_rules(rules)
    return parse_rules(rules)


def _compile_all(patterns: Sequence[str] | str, what: str) -> list[re.Pattern]:
    if isinstance(patterns, str):
        patterns = [patterns]
    out = []
    for p in patterns:
        try:
            out.append(re.compile(p))
        except re.error as e:
            raise InputError(f"{what} {p!r}: invalid regular expression ({e})") from None
    return out


def _db_specs(specs: Sequence[str] | str) -> list[tuple[re.Pattern, str]]:
    if isinstance(specs, str):
        specs = [specs]
    out = []
    for s in specs:
        pattern, scale = s, "auto"
        if "=" in s and re.fullmatch(r"\w+", tail := s.rsplit("=", 1)[1]):
            # REGEX=SCALE: a word after the last '=' names a scale (record names hold no '='), and a word
            # that names none is a typo, not part of the pattern
            if tail not in DB_SCALES:
                raise InputError(f"--db {s!r}: unknown scale {tail!r}; choose one of {', '.join(DB_SCALES)}")
            pattern, scale = s.rsplit("=", 1)
        out.append((_compile_all([pattern], "--db")[0], scale))
    return out


def _db_scale(name: str, specs: list[tuple[re.Pattern, str]]) -> str | None:
    return next((scale for rx, scale in specs if rx.search(name)), None)


def _is_angle(pair: Pair, regexes: list[re.Pattern]) -> bool:
    r, c = pair.ref, pair.cand
    if "angle" in r.tags or "angle" in c.tags:
        return True
    if short_op(r.op).split(".")[0] in ANGLE_OPS:
        return True
    return any(rx.search(r.name) for rx in regexes)


def _shift(r: Record) -> float:
    m = r.stats.mean
    return float(m) if isinstance(m, (int, float)) and math.isfinite(m) else 0.0


def _floor(r: Record) -> float:
    a = r.stats.absmax
    a = float(a) if isinstance(a, (int, float)) and math.isfinite(a) else 0.0
    return max(_EPS32 * a, 1e-30)


def _shape(s: Sequence[int]) -> str:
    return "(" + ", ".join(map(str, s)) + ")"


def _incomplete(ref: Bundle, cand: Bundle) -> list[str]:
    return [f"the {label} bundle is incomplete: {b.incomplete_note()}; the records after it were not compared"
            for label, b in (("reference", ref), ("candidate", cand)) if not b.complete]


__all__ = ["diff", "compare_pair", "judge"]
