"""Helpers for users' own test suites (pytest or unittest).

    >>> from tensorprobe.testing import assert_parity
    >>> assert_parity("ref_bundle", "port_bundle", min_snr=80)      # doctest: +SKIP
    AssertionError: candidate diverges from reference: first divergence at generator.conv_post (...);
    strongest amplifier generator.m_source.l_sin_gen/sin.0 (error gain x1,024) ...
"""

from __future__ import annotations

import os
from typing import Any

from .bundle import Bundle
from .diff import DiffReport, diff

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
    amp = report.strongest_amplifier
    lines.append(f"strongest amplifier: {amp.name} ({amp.op}), error gain {amp.gain:.4g}" if amp else
                 "strongest amplifier: none (no record amplifies the error)")
    if report.ref_only:
        lines.append(f"reference-only records: {', '.join(report.ref_only[:10])}")
    raise AssertionError("\n".join(lines))


__all__ = ["assert_parity"]
