"""Helpers for users' own test suites (pytest or unittest).

    >>> from tensorprobe.testing import assert_parity
    >>> assert_parity("ref_bundle", "port_bundle", min_snr=80)      # doctest: +SKIP
    AssertionError: candidate diverges from reference: first divergence at generator.conv_post (...);
    strongest amplifier generator.m_source.l_sin_gen/sin.0 (error gain x1,024) ...
"""

from __future__ import annotations

import math
import os
from typing import Any

from .bundle import Bundle
from .diff import DiffReport, diff
from .diff.result import METHOD_STATS, STATUS_FAIL, TAG_WEIGHT_UNSEEN, Criteria, PairResult

__tracebackhide__ = True  # pytest: show the caller's line, not ours


def assert_parity(ref: Bundle | str | os.PathLike, cand: Bundle | str | os.PathLike, **options: Any) -> DiffReport:
    """Fail (AssertionError) unless every intermediate of `cand` matches `ref`: the diff's verdict is
    "match" (values compared, everything within rounding noise or the given criteria). Statistics alone
    never assert parity.

    Args:
        ref, cand: bundles or their paths.
        **options: as `tensorprobe.diff` (atol, rtol, min_corr, min_snr, rules, angles, db).

    Returns:
        The `DiffReport` when everything matches.

    Raises:
        AssertionError: naming the first divergence, the strongest amplifier and whether the error
            reaches the output (the report's summary), plus unmatched records.
    """
    __tracebackhide__ = True
    report = diff(ref, cand, **options)
    if report.passed:
        return report
    if report.verdict in ("consistent", "nothing_compared"):
        raise AssertionError(f"parity of {report.cand} with {report.ref} can't be asserted: nothing was compared "
                             f"element-wise ({report.summary}) Capture both sides with keep='full', or dump the "
                             "port's tensors.")
    lines = [f"candidate {report.cand} diverges from reference {report.ref}:", report.summary]
    first = report.get(report.first_divergence)
    if first is not None:
        lines.append(f"first divergence: {first.name} ({first.op}): {'; '.join(first.reasons)}")
    else:   # every forward record compared agrees (a statistics-only bundle may show nothing): a weight differs
        first = next((w for w in report.weights if w.status == STATUS_FAIL), None)
        if first is not None:
            lines.append(f"first differing weight: {first.name}: {'; '.join(first.reasons)}")
    if first is not None:
        lines.append(f"failed criterion: {failed_criterion(report.criteria, first)}")
    amp = report.strongest_amplifier
    lines.append(f"strongest amplifier: {amp.name} ({amp.op}), error gain {amp.gain:.4g}" if amp else
                 "strongest amplifier: none (no record amplifies the error)")
    if report.ref_only:
        lines.append(f"reference-only records: {', '.join(report.ref_only[:10])}")
    raise AssertionError("\n".join(lines))


def failed_criterion(criteria: Criteria, p: PairResult) -> str:
    """The criterion a failing pair fails, in the same words whether its values were compared element-wise
    (keep='full', a dump) or bounded by statistics (keep='stats'), at module or op level: only the figure says
    how it was measured ('SNR 40.4 dB', or 'SNR at most 40.7 dB (bounded by the statistics)').

    >>> p = PairResult("0", "0", "0", "module:Conv1d", "output", 0, 0, (1,), (1,), "float32", "float32", "name",
    ...                "fail", ("...",), {"rel_l2_err": 0.0096, "snr_db": 40.4, "pearson": 1.0}, method="elementwise")
    >>> failed_criterion(Criteria(min_snr=80), p)
    'min_snr = 80 dB (the SNR must reach it): SNR 40.4 dB'
    """
    m = p.metrics or {}
    stats = p.method == METHOD_STATS
    how = " (bounded by the statistics)" if stats else ""
    rel = m.get("rel_l2_err_lower") if stats else m.get("rel_l2_err")
    bad_cand, bad_ref = m.get("nonfinite_cand_only") or 0, m.get("nonfinite_ref_only") or 0
    if bad_cand or bad_ref or (stats and rel == math.inf and p.reasons and "NaN" in p.reasons[0]):
        return ("NaN/Inf on one side only (no threshold passes a value against no value): "
                + "; ".join(p.reasons))
    snr = None if rel is None else (-20 * math.log10(rel) if rel > 0 else math.inf)
    snr = m.get("snr_db") if not stats and m.get("snr_db") is not None else snr
    at_least, at_most = ("at least ", "at most ") if stats else ("", "")
    out = []
    if criteria.noise and rel is not None and p.floor is not None and rel > p.floor:
        out.append(f"noise rule (the relative error must stay within its noise floor, {p.floor:.2g} here): "
                   f"relative error {at_least}{rel:.3g}{how}")
    if criteria.min_snr is not None and snr is not None and snr < criteria.min_snr:
        out.append(f"min_snr = {criteria.min_snr:g} dB (the SNR must reach it): SNR {at_most}{snr:.1f} dB{how}")
    if criteria.elementwise and any("outside atol" in r or r.startswith("max abs error at least") for r in p.reasons):
        err = m.get("max_abs_err_lower") if stats else m.get("max_abs_err")
        out.append(f"atol = {criteria.atol or 0:g}, rtol = {criteria.rtol or 0:g} (every element within "
                   f"atol + rtol·|ref|): max abs error {at_least}{err:.3g}{how}")
    if criteria.min_corr is not None and not stats and (m.get("pearson") or 1.0) < criteria.min_corr:
        out.append(f"min_corr = {criteria.min_corr:.10g} (the correlation must reach it): correlation "
                   f"{m['pearson']:.6f}")
    weight = p.origin if TAG_WEIGHT_UNSEEN in p.tags else p.name   # a reader failed on the weight it reads
    if not out and (TAG_WEIGHT_UNSEEN in p.tags or
                    any(r.startswith("values differ (content fingerprints differ)") for r in p.reasons)):
        # statistics bound no correlation: what fails is a weight's bytes against the reference's
        out.append(f"identical weights (a weight kept as statistics is compared by its content fingerprint): "
                   f"{weight}'s fingerprint differs")
    return "; ".join(out) if out else "; ".join(p.reasons)


__all__ = ["assert_parity", "failed_criterion"]
