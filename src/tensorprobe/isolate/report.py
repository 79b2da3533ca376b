"""What `isolate` finds: per layer, local vs accumulated error (`LayerError`, `IsolateReport`). No torch."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..diff.result import Criteria, jfloat
from ..errors import InputError

if TYPE_CHECKING:
    from .ascend import Ascent

LOCAL = "local"          # the layer's own error fails the criteria
INHERITED = "inherited"  # only the accumulated error fails: the layer passes on what it was given
OK = "ok"
UNKNOWN = "unknown"      # no comparison (no candidate module, shape mismatch, no accumulated run)


# ---------------------------------------------------------------------------------------------------
# The runner interface


@dataclass(frozen=True)
class LayerError:
    """One module call's output: accumulated error (two full runs) and local error (replay)."""

    name: str                      # record name: <module>[@call][:<output>]
    module: str
    call: int
    module_type: str
    order: int
    shape: tuple[int, ...]
    dtype: str
    cand_dtype: str | None = None
    accumulated: dict[str, float | None] | None = None
    local: dict[str, float | None] | None = None
    accumulated_reasons: tuple[str, ...] = ()
    local_reasons: tuple[str, ...] = ()
    note: str | None = None

    @property
    def local_fails(self) -> bool:
        return bool(self.local_reasons)

    @property
    def accumulated_fails(self) -> bool:
        return bool(self.accumulated_reasons)

    @property
    def verdict(self) -> str:
        if self.local_fails:
            return LOCAL
        if self.accumulated_fails:
            return INHERITED if self.local is not None else UNKNOWN
        if self.local is None and self.accumulated is None:
            return UNKNOWN
        return OK

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "module": self.module, "call": self.call, "module_type": self.module_type,
                "order": self.order, "shape": list(self.shape), "dtype": self.dtype,
                "cand_dtype": self.cand_dtype, "verdict": self.verdict,
                "accumulated": _jmetrics(self.accumulated), "local": _jmetrics(self.local),
                "accumulated_reasons": list(self.accumulated_reasons), "local_reasons": list(self.local_reasons),
                "note": self.note}


@dataclass(frozen=True)
class IsolateReport:
    """What `isolate` found, per layer in execution order; `summary()` says it in words."""

    layers: tuple[LayerError, ...]
    criteria: Criteria
    runner: str
    first_local: str | None
    first_accumulated: str | None
    rng: str | None = None          # how randomness was replayed: "state", "tensors" or None
    noise_replayed: int = 0         # random tensors replayed ("tensors") or module calls re-seeded ("state")
    reused: int = 0                 # module calls not re-run: the candidate's own inputs equalled the reference's
    seconds: float = 0.0
    notes: tuple[str, ...] = ()
    ascent: Ascent | None = None    # where isolate looked above the isolated modules, and what it found
    outputs: tuple[LayerError, ...] = ()   # the model's own outputs, accumulated error only (none: not compared)

    @property
    def found(self) -> bool:
        """True when some module call's local error alone fails the criteria (isolated, or found above)."""
        return self.first_local is not None or (self.ascent is not None and self.ascent.found is not None)

    @property
    def culprit(self) -> str | None:
        """The record name of the first module call that is wrong on its own: above the isolated modules
        when the accumulated error starts before any of them fails, else the first isolated one."""
        if self.ascent is not None and self.ascent.found is not None:
            return self.ascent.found
        return self.first_local

    def layer(self, name: str) -> LayerError:
        for layer in self.layers:
            if layer.name == name:
                return layer
        raise KeyError(name)

    def local_layers(self) -> list[str]:
        return [x.name for x in self.layers if x.local_fails]

    def inherited_layers(self) -> list[str]:
        return [x.name for x in self.layers if x.verdict == INHERITED]

    def local_snr(self) -> dict[str, float]:
        """Local error per record name as SNR dB, for `report.html.write_diff_html(..., local_snr=...)`."""
        return {x.name: x.local["snr_db"] for x in self.layers if x.local and x.local.get("snr_db") is not None}

    def summary(self) -> str:
        n = len(self.layers)
        leaf = self._leaf_summary(n)
        if self.ascent is None:
            return leaf
        if self.ascent.found is None:
            return self.ascent.summary()
        if self.first_local is None:
            return self.ascent.summary() + self._output_words()
        return f"{self.ascent.summary()} Later: {leaf[0].lower()}{leaf[1:]}"

    def _output_words(self) -> str:
        """When the ascent started from the model's output: how that output differs."""
        out = next((x for x in self.outputs if x.name == self.ascent.start), None) if self.ascent else None
        if out is None or not out.accumulated_reasons:
            return ""
        return f" The model's {out.name} differs ({'; '.join(out.accumulated_reasons)})."

    def _leaf_summary(self, n: int) -> str:
        if self.first_local is None:
            if self.first_accumulated is None:
                model = " and the model's output" if self.outputs else ""
                return f"No divergence: all {n} module outputs{model} pass, locally and accumulated."
            return (f"No isolated module is wrong on its own: every local error passes, yet the accumulated "
                    f"error fails from {self.first_accumulated} on. The error enters outside the isolated "
                    f"modules (functional code between them) or builds up from small local errors over {n} "
                    f"module calls: isolate finer modules, or diff op-level captures, to see where.")
        first = self.layer(self.first_local)
        locals_ = self.local_layers()
        more = f"; {len(locals_) - 1} more layer(s) also fail locally" if len(locals_) > 1 else ""
        inh = self.inherited_layers()
        tail = f"; {len(inh)} layer(s) fail only by inheritance" if inh else ""
        return (f"Local error first exceeds the criteria at {first.name} ({first.module_type}: "
                f"{'; '.join(first.local_reasons)}){more}{tail}.")

    def to_dict(self) -> dict[str, Any]:
        return {"summary": self.summary(), "found": self.found, "runner": self.runner,
                "criteria": self.criteria.to_dict(), "first_local": self.first_local,
                "first_accumulated": self.first_accumulated, "culprit": self.culprit,
                "ascent": self.ascent.to_dict() if self.ascent is not None else None, "rng": self.rng, "noise_replayed": self.noise_replayed, "reused": self.reused,
                "seconds": self.seconds, "notes": list(self.notes),
                "counts": {"layers": len(self.layers), "local": len(self.local_layers()),
                           "inherited": len(self.inherited_layers())},
                "layers": [x.to_dict() for x in self.layers], "outputs": [x.to_dict() for x in self.outputs]}


def _jmetrics(m: dict | None) -> dict | None:
    return None if m is None else {k: jfloat(v) for k, v in m.items()}


# ---------------------------------------------------------------------------------------------------
# Module selection


def local_snr_from_json(path: str | os.PathLike) -> dict[str, float]:
    """Local error per record name (SNR dB) from a saved `tensorprobe isolate --json` document, for
    `report.html.write_diff_html(..., local_snr=...)` (e.g. a `diff --local isolate.json` option).

    Example:
        >>> local_snr_from_json("isolate.json")["decode.1.conv1x1"]          # doctest: +SKIP
        60.0
    """
    import json
    import math

    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        layers = (doc.get("report", doc))["layers"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise InputError(f"{path}: not an isolate JSON document ({e}); write one with tensorprobe isolate --json") from None
    out = {}
    for layer in layers:
        v = (layer.get("local") or {}).get("snr_db")
        if v is not None:
            out[str(layer["name"])] = math.inf if v == "inf" else (-math.inf if v == "-inf" else float(v))
    return out
