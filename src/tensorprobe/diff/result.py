"""The findings of a diff, as frozen dataclasses with `to_dict()` (JSON schema: docs/json-diff.md).

Renderers (`report/terminal.py`, `report/html.py`), the CLI and `testing.assert_parity` all read these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

STATUS_PASS = "pass"
STATUS_FAIL = "fail"
STATUS_SHAPE = "shape_mismatch"
STATUS_NO_DATA = "no_data"

VERDICT_MATCH = "match"
VERDICT_DIVERGED = "diverged"
VERDICT_EMPTY = "nothing_compared"

DEFAULT_MIN_SNR = 60.0  # dB: relative L2 error 1e-3, used when no criterion is given


def jfloat(v: Any) -> Any:
    """JSON has no Inf/NaN: spell them "inf", "-inf", "nan" (the manifest's convention)."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _jdict(d: Mapping[str, Any]) -> dict[str, Any]:
    return {k: jfloat(v) for k, v in d.items()}


@dataclass(frozen=True)
class Criteria:
    """Pass/fail thresholds. A pair fails when any given criterion fails.

    atol/rtol: element-wise, |cand - ref| <= atol + rtol·|ref| for every element (as `numpy.allclose`).
    min_corr: minimum Pearson correlation. min_snr: minimum SNR in dB (reference energy over error energy).
    With none given, `min_snr = 60` dB applies.
    """

    atol: float | None = None
    rtol: float | None = None
    min_corr: float | None = None
    min_snr: float | None = None

    def resolved(self) -> "Criteria":
        if all(v is None for v in (self.atol, self.rtol, self.min_corr, self.min_snr)):
            return Criteria(min_snr=DEFAULT_MIN_SNR)
        return self

    @property
    def elementwise(self) -> bool:
        return self.atol is not None or self.rtol is not None

    def significant_rel_err(self) -> float:
        """A relative L2 error large enough to matter under these criteria (used to rank amplifiers)."""
        if self.min_snr is not None:
            return 10 ** (-self.min_snr / 20)
        if self.min_corr is not None:
            return math.sqrt(max(2 * (1 - self.min_corr), 1e-16))
        return max(self.rtol or 0.0, 1e-6)

    def to_dict(self) -> dict[str, Any]:
        return {"atol": self.atol, "rtol": self.rtol, "min_corr": self.min_corr, "min_snr": self.min_snr}


@dataclass(frozen=True)
class AngleResult:
    """Comparison modulo 2π of a record holding angles (atan2/angle output or marked by the user)."""

    flips: int                 # elements whose raw difference exceeds π: branch-cut flips
    raw_max_abs_err: float     # before wrapping
    raw_snr_db: float | None
    explained: bool            # the raw comparison fails, the modulo-2π one passes: flips explain it

    def to_dict(self) -> dict[str, Any]:
        return _jdict(self.__dict__)


@dataclass(frozen=True)
class DbResult:
    """Error in decibels of a spectrogram / log-magnitude record (as seed 004 reported by hand)."""

    scale: str                 # how values became dB: mag (20·log10), power (10·log10), ln, db
    mean_abs_db: float
    median_abs_db: float
    max_abs_db: float

    def to_dict(self) -> dict[str, Any]:
        return _jdict(self.__dict__)


@dataclass(frozen=True)
class PairResult:
    """One compared pair: a reference record and its candidate, metrics and verdict."""

    name: str
    cand_name: str
    module: str
    op: str
    kind: str
    call: int
    order: int
    shape: tuple[int, ...]
    cand_shape: tuple[int, ...]
    dtype: str
    cand_dtype: str
    match: str
    status: str
    reasons: tuple[str, ...] = ()
    metrics: Mapping[str, float | None] = field(default_factory=dict)
    angle: AngleResult | None = None
    db: DbResult | None = None
    input_rel_err: float | None = None
    gain: float | None = None
    tags: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        return self.status in (STATUS_PASS, STATUS_NO_DATA)

    @property
    def failed(self) -> bool:
        return self.status in (STATUS_FAIL, STATUS_SHAPE)

    def metric(self, name: str) -> float | None:
        return self.metrics.get(name)

    @property
    def rel_err(self) -> float | None:
        return self.metrics.get("rel_l2_err")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "cand_name": self.cand_name, "module": self.module, "op": self.op,
            "kind": self.kind, "call": self.call, "order": self.order, "shape": list(self.shape),
            "cand_shape": list(self.cand_shape), "dtype": self.dtype, "cand_dtype": self.cand_dtype,
            "match": self.match, "status": self.status, "reasons": list(self.reasons),
            "metrics": _jdict(self.metrics), "angle": self.angle.to_dict() if self.angle else None,
            "db": self.db.to_dict() if self.db else None, "input_rel_err": jfloat(self.input_rel_err),
            "gain": jfloat(self.gain), "tags": list(self.tags),
        }


@dataclass(frozen=True)
class Amplifier:
    """A record that turns a small relative error at its inputs into a larger one at its output."""

    name: str
    op: str
    gain: float
    input_rel_err: float
    output_rel_err: float

    def to_dict(self) -> dict[str, Any]:
        return _jdict(self.__dict__)


@dataclass(frozen=True)
class CallSeries:
    """A module (or op inside it) called several times, compared call by call (ODE / decoding steps)."""

    key: str                          # the record name with its @call part removed
    calls: tuple[int, ...]
    rel_err: tuple[float | None, ...]
    snr_db: tuple[float | None, ...]
    passed: tuple[bool, ...]
    first_failing_call: int | None
    growth: float | None              # relative error at the last call over the first non-zero one

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "calls": list(self.calls), "rel_err": [jfloat(v) for v in self.rel_err],
                "snr_db": [jfloat(v) for v in self.snr_db], "passed": list(self.passed),
                "first_failing_call": self.first_failing_call, "growth": jfloat(self.growth)}


@dataclass(frozen=True)
class DiffReport:
    """Everything `tensorprobe.diff` found. `summary` is the plain-words paragraph printed first."""

    ref: str
    cand: str
    criteria: Criteria
    pairs: tuple[PairResult, ...]
    ref_only: tuple[str, ...]
    cand_only: tuple[str, ...]
    first_divergence: str | None
    worst: str | None
    amplifiers: tuple[Amplifier, ...]
    output: str | None
    call_series: tuple[CallSeries, ...]
    rng_note: str | None
    notes: tuple[str, ...]
    summary: str

    @property
    def verdict(self) -> str:
        if all(p.status == STATUS_NO_DATA for p in self.pairs):  # also when there are no pairs
            return VERDICT_EMPTY
        return VERDICT_DIVERGED if any(p.failed for p in self.pairs) else VERDICT_MATCH

    @property
    def passed(self) -> bool:
        return self.verdict == VERDICT_MATCH

    @property
    def shape_mismatches(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.pairs if p.status == STATUS_SHAPE)

    @property
    def strongest_amplifier(self) -> Amplifier | None:
        return self.amplifiers[0] if self.amplifiers else None

    def pair(self, name: str) -> PairResult:
        for p in self.pairs:
            if p.name == name:
                return p
        raise KeyError(name)

    def get(self, name: str | None) -> PairResult | None:
        return next((p for p in self.pairs if p.name == name), None) if name else None

    @property
    def output_persists(self) -> bool | None:
        """Does the divergence reach the model output (True) or wash out before it (False)?"""
        out = self.get(self.output)
        if out is None or self.first_divergence is None:
            return None
        return out.failed

    def to_dict(self) -> dict[str, Any]:
        return {
            "ref": self.ref, "cand": self.cand, "verdict": self.verdict, "summary": self.summary,
            "criteria": self.criteria.to_dict(), "first_divergence": self.first_divergence,
            "worst": self.worst, "output": self.output, "output_persists": self.output_persists,
            "strongest_amplifier": self.amplifiers[0].to_dict() if self.amplifiers else None,
            "amplifiers": [a.to_dict() for a in self.amplifiers], "rng_note": self.rng_note,
            "notes": list(self.notes), "counts": self.counts(),
            "ref_only": list(self.ref_only), "cand_only": list(self.cand_only),
            "shape_mismatches": list(self.shape_mismatches),
            "call_series": [c.to_dict() for c in self.call_series],
            "pairs": [p.to_dict() for p in self.pairs],
        }

    def counts(self) -> dict[str, int]:
        c = {"pairs": len(self.pairs), "failed": sum(p.failed for p in self.pairs),
             "ref_only": len(self.ref_only), "cand_only": len(self.cand_only)}
        for s in (STATUS_PASS, STATUS_FAIL, STATUS_SHAPE, STATUS_NO_DATA):
            c[s] = sum(p.status == s for p in self.pairs)
        return c
