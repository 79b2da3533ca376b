"""Sweep results on disk: `items.jsonl`, one line per item as it finishes (appended, flushed and synced, so
nothing written is lost when a run dies), read back to resume; and the aggregate over the latest line of
every item.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from .item import REPLAY_ADVICE, REPLAYED_ADVICE, STATUS_DONE, STATUS_FAILED, VERDICT_RANDOM

ITEMS_FILE = "items.jsonl"


IDENTITY_FILE = "sweep.json"   # what the sweep in RESULTS ran (target, candidate, runtime, options)
GROUP_COMMIT_S = 0.5     # at most this long between fsyncs of items.jsonl while a sweep writes it


class ResultStore:
    """RESULTS/items.jsonl: append-only; the last line of an item is its result.

    Each line is written (into the OS's page cache: a killed driver loses none) as its item finishes, and the
    file is fsynced at most every `GROUP_COMMIT_S` and at `close`: group commit. An fsync per line (~3 ms
    here) capped the driver at ~300 items/s; what a power loss can take back is the last half second of
    items, which a rerun redoes.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "bundles").mkdir(exist_ok=True)
        self.path = self.root / ITEMS_FILE
        self._file: Any = None
        self._synced = 0.0

    @property
    def bundles(self) -> Path:
        return self.root / "bundles"

    def read(self) -> dict[str, dict[str, Any]]:
        """item -> its latest record. A line cut short by a crash (the last one) is ignored."""
        latest: dict[str, dict[str, Any]] = {}
        if not self.path.exists():
            return latest
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(rec, dict) and "item" in rec:
                    latest[str(rec["item"])] = rec
        return latest

    def claim(self, identity: dict[str, Any]) -> None:
        """Make RESULTS this sweep's: a new directory records `identity` (sweep.json); a rerun must match it,
        else InputError (the old lines would be read as this sweep's results)."""
        from ..errors import InputError

        path = self.root / IDENTITY_FILE
        if path.exists():
            try:
                before = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                before = None
            if before != identity:
                diff = ", ".join(f"{k} was {before.get(k)!r}" for k in identity
                                 if isinstance(before, dict) and before.get(k) != identity[k]) or "unreadable"
                raise InputError(f"{self.root} holds the results of another sweep ({diff}): resume only the same "
                                 f"sweep there; use another directory, or delete this one to start again")
            return
        if self.path.exists() and self.path.stat().st_size:
            raise InputError(f"{self.root} holds items.jsonl from a sweep that did not record what it ran (older "
                             f"tensorprobe): use another directory, or delete this one to start again")
        from ..bundle import atomic_write_bytes

        atomic_write_bytes(path, json.dumps(identity, indent=1).encode())

    def done(self) -> set[str]:
        return {k for k, r in self.read().items() if r.get("status") == STATUS_DONE}

    def append(self, record: dict[str, Any]) -> None:
        line = json.dumps(record, allow_nan=False, default=str) + "\n"
        if self._file is None:
            self._file = open(self.path, "a", encoding="utf-8")
            if self._file.tell() and not _ends_with_newline(self.path):
                self._file.write("\n")            # a previous run died mid-line: start clean
        self._file.write(line)
        self._file.flush()
        now = time.monotonic()
        if now - self._synced >= GROUP_COMMIT_S:
            os.fsync(self._file.fileno())
            self._synced = now

    def close(self) -> None:
        """Fsync and close items.jsonl (every line appended so far is then on disk)."""
        if self._file is not None:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
            self._file = None

    def __enter__(self) -> "ResultStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


@dataclass(frozen=True)
class SweepSummary:
    """The aggregate of a sweep (JSON: docs/json-sweep.md)."""

    items: int
    done: int
    failed: int
    verdicts: dict[str, int]
    findings: int
    worst_snr: list[dict[str, Any]]
    worst_corr: list[dict[str, Any]]
    nonfinite: list[dict[str, Any]]
    first_divergence: list[tuple[str, int]]
    causes: dict[str, int]
    bad_stages: list[tuple[str, int]]
    audio: dict[str, int]
    seconds: dict[str, float]
    errors: list[dict[str, Any]]
    why: dict[str, int] = field(default_factory=dict)               # finding code -> items
    model_properties: dict[str, int] = field(default_factory=dict)  # shared with the reference -> items
    # items whose output holds NaN/Inf, grouped by where it was born: side, module, diagnosis, items, example
    nonfinite_groups: list[dict[str, Any]] = field(default_factory=list)
    # items with a finding and finite outputs, grouped by first divergence and its cause
    divergence_groups: list[dict[str, Any]] = field(default_factory=list)
    random_draws: int = 0          # items that differ by random draws only: not findings
    random_draws_replayed: int = 0  # of those, the items captured with replay on (replay could not feed them)

    @property
    def finding(self) -> bool:
        return bool(self.findings or self.failed)

    def headline(self) -> str:
        if not self.items:
            return "No items."
        text = (f"{self.done} of {self.items} items compared, {self.findings} with a finding"
                + (f", {self.failed} failed to run" if self.failed else "") + ".")
        if self.finding:
            text += " " + self.why_sentence()
        if self.errors:   # why an item did not run (a full disk: the OS message), not only how many
            first = self.errors[0]
            more = f"; {len(self.errors) - 1} more in errors" if len(self.errors) > 1 else ""
            text += f" {first['item']} failed to run: {first.get('error') or 'no error recorded'}{more}."
        text += "".join(" " + sentence for sentence in self.nonfinite_sentences())
        if self.random_draws:
            n = self.random_draws
            advice = REPLAYED_ADVICE if self.random_draws_replayed == n else REPLAY_ADVICE
            text += (f" {n} item{'s' if n != 1 else ''} differ{'s' if n == 1 else ''} by random draws only, not "
                     f"counted as findings: {advice}")
        if self.properties_sentence():
            text += " " + self.properties_sentence()
        if self.divergence_groups:
            g = self.divergence_groups[0]
            text += (f" Findings with finite output first diverge most often at {g['layer']} (cause {g['cause']}, "
                     f"{g['items']} item{'s' if g['items'] != 1 else ''}; e.g. {g['example']}).")
        if self.bad_stages:
            stage, n = self.bad_stages[0]
            text += f" Most frequent first bad TTS stage: {stage} ({n} items)."
        if self.worst_snr:
            w = self.worst_snr[0]
            text += f" Worst output SNR: {w['item']} ({_fmt(w['output_snr_db'])} dB)."
        return text

    def why_sentence(self) -> str:
        """Why the sweep has a finding (exit 1): each kind of finding and how many items it holds."""
        parts = [f"{_describe(code, _WHY)} ({n} item{'s' if n != 1 else ''})"
                 for code, n in sorted(self.why.items(), key=_most_then_worst)]
        if self.failed:
            parts.append(f"failed to run ({self.failed} item{'s' if self.failed != 1 else ''})")
        return "Findings: " + "; ".join(parts) + "."

    def nonfinite_sentences(self) -> list[str]:
        """One sentence per side: "8 items non-finite, all born at M (negative variance)", or the groups."""
        out = []
        for side, whose in (("candidate", "the candidate's"), ("reference", "the reference's")):
            groups = [g for g in self.nonfinite_groups if g["side"] == side]
            if not groups:
                continue
            total = sum(g["items"] for g in groups)
            head = f"{total} item{'s' if total != 1 else ''} with {whose} output non-finite"
            if len(groups) == 1:
                g = groups[0]
                born = "all born" if total > 1 else "born"
                out.append(f"{head}, {born} at {g['module']} ({g['diagnosis']}; e.g. {g['example']}).")
            else:
                out.append(head + ": " + "; ".join(f"{g['items']} born at {g['module']} ({g['diagnosis']}; e.g. "
                                                  f"{g['example']})" for g in groups) + ".")
        return out

    def properties_sentence(self) -> str:
        parts = [f"{_describe(code, _PROPERTY)} ({n} item{'s' if n != 1 else ''})"
                 for code, n in sorted(self.model_properties.items(), key=_most_then_worst)
                 if code != "random_draws"]      # a sentence of its own
        if not parts:
            return ""
        return ("Properties of the model, not findings (the reference's output shares them): "
                + "; ".join(parts) + ".")

    def to_dict(self) -> dict[str, Any]:
        return {"headline": self.headline(), "items": self.items, "done": self.done, "failed": self.failed,
                "findings": self.findings, "finding": self.finding, "why": self.why,
                "model_properties": self.model_properties, "verdicts": self.verdicts,
                "random_draws": self.random_draws, "random_draws_replayed": self.random_draws_replayed,
                "nonfinite_groups": self.nonfinite_groups,
                "divergence_groups": self.divergence_groups,
                "worst_snr": self.worst_snr, "worst_corr": self.worst_corr, "nonfinite": self.nonfinite,
                "first_divergence": [{"layer": k, "items": n} for k, n in self.first_divergence],
                "causes": self.causes, "bad_stages": [{"stage": k, "items": n} for k, n in self.bad_stages],
                "audio": self.audio, "seconds": self.seconds, "errors": self.errors}


def summarize(records: Iterable[dict[str, Any]], worst: int = 10) -> SweepSummary:
    """Aggregate the latest record of every item."""
    recs = list(records)
    done = [r for r in recs if r.get("status") == STATUS_DONE]
    failed = [r for r in recs if r.get("status") == STATUS_FAILED]

    def ranked(key: str) -> list[dict[str, Any]]:
        scored = [r for r in done if _value(r.get(key)) is not None]
        scored.sort(key=lambda r: _value(r[key]))
        return [{"item": r["item"], key: r[key], "verdict": r.get("verdict"), "output_nonfinite": r.get("output_nonfinite"),
                 "first_divergence": r.get("first_divergence"), "bundle": r.get("bundle")} for r in scored[:worst]]

    times = sorted(float(r.get("seconds", 0.0)) for r in recs)
    return SweepSummary(
        items=len(recs), done=len(done), failed=len(failed),
        verdicts=dict(Counter(r.get("verdict") for r in done)),
        findings=sum(1 for r in done if r.get("finding")),
        why=_codes(done, "reasons"), model_properties=_codes(done, "model_properties"),
        worst_snr=ranked("output_snr_db"), worst_corr=ranked("output_corr"),
        nonfinite=[{"item": r["item"], "origin": r["cand_nan"], "bundle": r.get("bundle")} for r in done
                   if r.get("cand_nan")],
        first_divergence=Counter(r["first_divergence"] for r in done if r.get("first_divergence")).most_common(),
        causes=dict(Counter(r["cause"] for r in done if r.get("cause"))),
        bad_stages=Counter(r["first_bad_stage"] for r in done if r.get("first_bad_stage")).most_common(),
        audio=dict(Counter((r.get("audio") or {}).get("diff") for r in done if r.get("audio"))),
        seconds={"total": round(sum(times), 3), "mean": round(sum(times) / len(times), 4) if times else 0.0,
                 "max": times[-1] if times else 0.0},
        errors=[{"item": r["item"], "error": r.get("error")} for r in failed],
        nonfinite_groups=_nonfinite_groups(done), divergence_groups=_divergence_groups(done),
        random_draws=sum(1 for r in done if r.get("verdict") == VERDICT_RANDOM),
        random_draws_replayed=sum(1 for r in done if r.get("verdict") == VERDICT_RANDOM and r.get("rng_replayed")))


def _nonfinite_groups(done: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items whose output is non-finite, by side and (origin module, diagnosis), largest group first."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for r in done:
        counts = r.get("output_nonfinite") or {}
        for side, key, only in (("candidate", "cand_nan", "candidate_only"), ("reference", "ref_nan", "reference_only")):
            origin = r.get(key)
            if origin and (counts.get(only) or counts.get("both") or not counts):
                module = origin.get("module") or origin.get("record") or "?"
                groups.setdefault((side, module, origin.get("diagnosis") or "undiagnosed"), []).append(r["item"])
    ranked = sorted(groups.items(), key=lambda kv: (kv[0][0] != "candidate", -len(kv[1]), kv[0]))
    return [{"side": side, "module": module, "diagnosis": diagnosis, "items": len(items), "example": items[0]}
            for (side, module, diagnosis), items in ranked]


def _divergence_groups(done: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Findings with finite outputs, by (first divergence, cause), largest group first."""
    groups: dict[tuple[str, str], list[str]] = {}
    for r in done:
        counts = r.get("output_nonfinite") or {}
        if r.get("finding") and not (counts.get("candidate_only") or counts.get("reference_only") or counts.get("both")):
            key = (r.get("first_divergence") or r.get("output") or "?", r.get("cause") or "-")
            groups.setdefault(key, []).append(r["item"])
    ranked = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return [{"layer": layer, "cause": cause, "items": len(items), "example": items[0]}
            for (layer, cause), items in ranked]


_WHY = {"diverged": "diverge from the reference",
        "nonfinite": "NaN/Inf in the candidate's output where the reference's is finite",
        "output": "the output is missing or shaped otherwise than the reference's",
        "finding": "a finding (recorded by an older tensorprobe: see items.jsonl)",
        "audio.diff": "the audio differs from the reference's (audio diff)",
        "audio.": "the candidate's audio fails {check}, the reference's passes",
        "tts.": "the TTS stage check {check} fires"}
_PROPERTY = {"nonfinite": "the reference makes NaN/Inf too", "audio.": "audio {check}",
             "amplified": "rounding amplified inside the model, the outputs agree",
             "random_draws": "differs by random draws"}


def _most_then_worst(entry: tuple[str, int]) -> tuple[int, int, str]:
    """Order of the headline's kinds: most items first; among equal counts, in `_WHY`'s order of gravity (a
    divergence before an audio difference), then by name. Items finish in any order: the text must not."""
    code, n = entry
    gravity = list(_WHY)
    rank = next((i for i, key in enumerate(gravity) if code == key or (key.endswith(".") and code.startswith(key))),
                len(gravity))
    return -n, rank, code


def _describe(code: str, table: dict[str, str]) -> str:
    """The phrase of a finding or property code (`audio.<check>` through the table's `audio.` template)."""
    if code in table:
        return table[code]
    family, _, check = code.partition(".")
    template = table.get(family + ".")
    return template.format(check=check) if template and check else code


def _codes(records: list[dict[str, Any]], key: str) -> dict[str, int]:
    """How many items carry each code under `key` (an item counts once per code). A finding written by an
    older tensorprobe, without reasons, counts as "finding"."""
    counts = Counter(code for r in records for code in {x["code"] for x in r.get(key) or ()})
    if key == "reasons":
        counts.update("finding" for r in records if r.get("finding") and not r.get(key))
    return dict(counts)


def _value(v: Any) -> float | None:
    """A JSON metric as a number to sort by ("inf": identical output sorts last, "nan" first)."""
    if v is None:
        return None
    if isinstance(v, str):
        return {"inf": float("inf"), "-inf": float("-inf"), "nan": float("-inf")}.get(v)
    return float(v)


def _fmt(v: Any) -> str:
    x = _value(v)
    return "n/a" if x is None else (str(v) if isinstance(v, str) else f"{x:.1f}")
