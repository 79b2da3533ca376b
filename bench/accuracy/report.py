"""Scores over a population of outcomes (`run.run_case`), per cell and overall, and the page docs/accuracy.md."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

# the targets of issue 42: no false alarm on a faithful port; the first divergence at the planted module in 98% of
# planted cases overall and 95% in every cell; the cause right in 90%
TARGETS = {"false_alarms": 0, "localized": 0.98, "localized_per_cell": 0.95, "cause_right": 0.90}


def _rate(num: int, den: int) -> float | None:
    return num / den if den else None


def score(outcomes: list[dict[str, Any]]) -> dict[str, Any]:
    """Counts and rates of a population (void cases and cases that failed to run are counted apart)."""
    faithful = [o for o in outcomes if o["bug"] is None and "error" not in o]
    planted = [o for o in outcomes if o["bug"] is not None and "error" not in o and not o.get("void")]
    return {
        "cases": len(outcomes),
        "faithful": len(faithful),
        "false_alarms": sum(o["false_alarm"] for o in faithful),
        "lossy": sum(bool(o.get("lossy")) for o in faithful),
        "planted": len(planted),
        "detected": _rate(sum(o["detected"] for o in planted), len(planted)),
        "localized": _rate(sum(o["localized"] for o in planted), len(planted)),
        "cause_right": _rate(sum(o["cause_right"] for o in planted), len(planted)),
        "void": sum(bool(o.get("void")) for o in outcomes),
        "errors": sum("error" in o for o in outcomes),
    }


def by_cell(outcomes: list[dict[str, Any]]) -> dict[tuple[str, ...], dict[str, Any]]:
    cells: dict[tuple[str, ...], list[dict[str, Any]]] = defaultdict(list)
    for o in outcomes:
        cells[tuple(o["cell"])].append(o)
    return {cell: score(rows) for cell, rows in sorted(cells.items())}


def misses(outcomes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every wrong or failed verdict, with what was wrong in words."""
    out = []
    for o in outcomes:
        if "error" in o:
            what = f"failed to run: {o['error']}"
        elif o.get("void"):
            continue
        elif o["bug"] is None:
            if not o["false_alarm"]:
                continue
            what = f"false alarm: diverged at {o['first_divergence']} (cause {o['cause']})"
        elif not o["detected"]:
            what = f"missed: {o['verdict']}"
        elif not o["localized"]:
            what = f"first divergence at {o['first_divergence']} (cause {o['cause']})"
        elif not o["cause_right"]:
            what = f"cause {o['cause']}"
        else:
            continue
        out.append({"id": o["id"], "what": what, "summary": o.get("summary", "")})
    return out


def miss_kinds(outcomes: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[set[str], int]]:
    """(port, what was wrong in general words) -> the bugs it happened on and how many cases."""
    out: dict[tuple[str, str], tuple[set[str], int]] = {}
    for o in outcomes:
        if "error" in o:
            kind = "failed to run"
        elif o.get("void"):
            continue
        elif o["bug"] is None:
            if not o["false_alarm"]:
                continue
            kind = "false alarm"
        elif not o["detected"]:
            kind = "missed"
        elif not o["localized"]:
            kind = "first divergence elsewhere"
        elif not o["cause_right"]:
            kind = f"cause {o['cause']}"
        else:
            continue
        bugs, n = out.get((o["cell"][1], kind), (set(), 0))
        out[o["cell"][1], kind] = (bugs | {o["bug"] or "faithful"}, n + 1)
    return out


def failed_targets(outcomes: list[dict[str, Any]], per_cell_min: int = 10) -> list[str]:
    """The targets a population misses, in words, for `diff` and `nan` apart (cells with fewer than `per_cell_min`
    planted cases are too small to hold to the per-cell target)."""
    return [line for tool, part in split_tools(outcomes).items()
            for line in _failed(part, "" if tool == "diff" else f"{tool}: ", per_cell_min)]


def _failed(outcomes: list[dict[str, Any]], label: str, per_cell_min: int) -> list[str]:
    if not outcomes:
        return []
    total, failed = score(outcomes), []
    if total["false_alarms"] > TARGETS["false_alarms"]:
        failed.append(f"{total['false_alarms']} false alarm(s) on {total['faithful']} faithful cases")
    if total["localized"] is not None and total["localized"] < TARGETS["localized"]:
        failed.append(f"first divergence right in {total['localized']:.1%} < {TARGETS['localized']:.0%}")
    if total["cause_right"] is not None and total["cause_right"] < TARGETS["cause_right"]:
        failed.append(f"cause right in {total['cause_right']:.1%} < {TARGETS['cause_right']:.0%}")
    for cell, s in by_cell(outcomes).items():
        if s["planted"] >= per_cell_min and s["localized"] < TARGETS["localized_per_cell"]:
            failed.append(f"{'/'.join(cell)}: first divergence right in {s['localized']:.1%}")
    if total["errors"]:
        failed.append(f"{total['errors']} case(s) failed to run")
    return [label + line for line in failed]


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


TOOLS = ("diff", "nan", "isolate", "sweep")


def tool_of(outcome: dict[str, Any]) -> str:
    """Which tool a case measures: `nan/...`, `isolate/...` and `sweep/...` ids name theirs; the others are `diff`'s."""
    head = outcome["id"].split("/", 1)[0]
    return head if head in TOOLS else "diff"


def split_tools(outcomes: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The outcomes of each tool's cases."""
    return {t: [o for o in outcomes if tool_of(o) == t] for t in TOOLS}


def markdown(doc: dict[str, Any]) -> str:
    """docs/accuracy.md from a run's JSON document."""
    everything, machine = doc["outcomes"], doc["machine"]
    tools = split_tools(everything)
    outcomes, nans = tools["diff"], tools["nan"]
    total = score(outcomes)
    lines = [
        "# How often tensorprobe's verdicts are right",
        "",
        "Generated by `python -m bench.accuracy --full` (the file and `bench/results/accuracy.json` are written",
        "together; do not edit by hand).",
        "",
        f"Measured on {doc['date']} on {machine['platform']} ({machine['cpus']} CPUs), torch {machine['torch']}, "
        f"in {doc['seconds']:.0f} s: {total['cases']} `diff` cases, {len(nans)} `nan` cases, "
        f"{len(tools['isolate'])} `isolate` cases and {len(tools['sweep'])} `sweep` cases drawn with seed {doc['seed']}.",
        "",
        "## How it is measured",
        "",
        "Each case is an architecture (`bench/accuracy/archs.py`: conv stacks with each norm, a HiFi-GAN-like",
        "generator with weight norm, transposed convolutions and Snake or LeakyReLU, a conv front end that transposes",
        "into a batch-first LSTM or GRU, masked attention, a log-mel front end in dB, a flow with exp, noise from",
        "randn_like, a model that takes and returns dicts), with seeded weights and inputs, and a port made by the",
        "usual tool: the model run in PyTorch as is (`torch`), cast to float16 or bfloat16, compiled by `torch.compile`",
        "(`aot_eager`; `inductor`, drawing eager's random numbers with `fallback_random` where the model draws), lowered to",
        "ExecuTorch (`executorch`: its portable kernels, run with ETDump debug outputs; no model that draws noise, which",
        "ExecuTorch has no kernels for), or",
        "exported by torch.onnx's dynamo or legacy exporter through `tensorprobe.runtimes.onnxruntime.export_onnx`",
        "(which writes each node's module into the file's metadata) and run in ONNX Runtime (`onnx-int8`: the dynamo export",
        "quantized by ONNX Runtime's `quantize_dynamic`, int8 weights; `onnx-qdq`: by its `quantize_static` in QDQ format,",
        "per-channel int8 weights and uint8 activations calibrated on the case's input and three noisy copies of it;",
        "a bug planted before the export; a faithful",
        "int8 port is right when it matches as a quantized port, judged by its outputs, or diverges with int8's",
        "error as the first divergence's cause, its outputs below the criterion: lossy, and no bug blamed; so is a",
        "float16 or bfloat16 port whose model output misses the output criterion by rounding its ops amplify); both",
        "sides are captured and",
        "diffed as a user does (`tensorprobe capture` of each, `tensorprobe diff`; a model with random draws goes",
        "through `compare --replay-rng`). The candidate is either the same model (faithful: any finding is a false",
        "alarm) or a second",
        "build with one bug planted in one module (`bench/accuracy/bugs.py`: a weight scaled, two output channels",
        "swapped, a bias dropped, a kernel reversed in time, a square weight transposed, a norm's epsilon changed, GELU",
        "approximated, a one-pass variance in float16, one module computed in float16, frames from 20 on scaled, an",
        "RNN's first two gates swapped, a uniform draw for a normal one; the two float16-arithmetic bugs are not",
        "planted in ONNX ports, whose CPU kernels compute float16 ops in float32). The reference is captured at the level",
        "named (module/statistics is the default capture; module/full keeps values; op/full records every op).",
        "",
        "A planted case is *localized* when the first divergence is the planted module or a record inside it (or",
        "the module enclosing it, when the port has no value of the planted module's own to compare: an exporter",
        "fused it; or, where the verdict says that the value the first divergence reads was changed by an op only",
        "the port has, that op's module, which the verdict's first sentence names), and its *cause* is right when",
        "that pair's cause is one the bug allows (a weight bug: `weights`; a changed computation: `own`). A bug",
        "that moves its own module's output by less than 1e-4 (float32 ports), 3e-2 (float16), 5e-2 (int8) or 0.15 (bfloat16)",
        "is *void*: it has no truth to find on that port, and is not scored. ExecuTorch and Inductor cases cost far more",
        "to make (a lowering, a C++ compile), so their cells hold 15% and 40% as many cases as the others",
        "(`cases.PORT_SHARE`).",
        "",
        "Statistics captures carry a sketch of every value they do not keep (8 signed sums of its hashed elements,",
        "`src/tensorprobe/stats/sketch.py`): it sees a permutation or a kernel reversed in time, which full-tensor",
        "statistics cannot, and estimates the error between two statistics-only captures.",
        "",
        "## Overall",
        "",
        "| cases | faithful | false alarms | planted | detected | first divergence right | cause right | void | failed to run |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {total['cases']} | {total['faithful']} | {total['false_alarms']} | {total['planted']} | "
        f"{_pct(total['detected'])} | {_pct(total['localized'])} | {_pct(total['cause_right'])} | {total['void']} | "
        f"{total['errors']} |",
        "",
        f"Faithful ports that diverge by their precision alone, the verdict blaming no bug (an int8 port's error, "
        f"or a 16-bit port's rounding amplified past a model output's criterion): {total['lossy']}.",
        "",
        f"Targets: {TARGETS['false_alarms']} false alarms; first divergence right in "
        f"{TARGETS['localized']:.0%} overall and {TARGETS['localized_per_cell']:.0%} in every cell; cause right in "
        f"{TARGETS['cause_right']:.0%}.",
        "",
        "## Per cell",
        "",
        "| family | port | level | faithful | false alarms | planted | first divergence right | cause right | failed |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for cell, s in by_cell(outcomes).items():
        lines.append(f"| {' | '.join(cell)} | {s['faithful']} | {s['false_alarms']} | {s['planted']} | "
                     f"{_pct(s['localized'])} | {_pct(s['cause_right'])} | {s['errors']} |")
    lines += [line for tool in ("nan", "isolate", "sweep") for line in _tool_section(tool, tools[tool])]
    wrong = misses(everything)
    lines += ["", "## Wrong verdicts by port and kind", "",
              "| port | what was wrong | bugs | cases |", "|---|---|---|---|"]
    for (port, kind), (bugs, n) in sorted(miss_kinds(everything).items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| {port} | {kind} | {', '.join(sorted(bugs))} | {n} |")
    lines += ["", f"## Wrong verdicts ({len(wrong)})", "",
              "Each reproduces with `python -m bench.accuracy --case ID`.", ""]
    lines += [f"- `{m['id']}`: {m['what']}" for m in wrong]
    return "\n".join(lines) + "\n"


# each tool's section: its title, how its cases are made and scored, and its tables' column words
_SECTIONS = {
    "nan": ("`nan`: where NaN or Inf is born", (
        "Each case is an architecture above run in float32 or float16 (`model.half()`) with one planted source of",
        "NaN/Inf in one module (its output through `log` or `sqrt` of negative values, a division by zero, `exp` of",
        "200x it, a gain of 7e4 that float16 cannot hold: `bench/accuracy/nan.py`), a deliberate infinity the model",
        "handles (a softmax over a mask of -inf), or nothing. `tensorprobe nan` runs on it as a user runs it",
        "(`find_first_nonfinite`). A planted case is *localized* when the op it names is in the planted module, and its",
        "*cause* is right when its diagnosis names the mechanism (log, sqrt, division by zero, overflow); any finding",
        "on a handled or faithful model is a false alarm. A source that makes no NaN/Inf on the inputs (a small exp,",
        "the gain in float32) is void."), ("faithful or handled", "dtype", "op right")),
    "isolate": ("`isolate`: is a layer wrong, or inheriting error?", (
        "Each case is an architecture and a bug of the `diff` cases (or none), the candidate run in PyTorch as is, in",
        "float16 or in bfloat16, and `tensorprobe isolate` run on the reference and the candidate as a user runs it",
        "(`bench/accuracy/isolate.py`). A planted case is *localized* when the layer whose local error first fails",
        "(or, where none does alone, the smallest module call that fails alone) is the planted module or inside",
        "it; isolate names a place, not a cause. Any layer failing alone on a faithful candidate is a false alarm."),
        ("faithful", "port", "layer right")),
    "sweep": ("`sweep`: which items of a corpus does a port get wrong, and where?", (
        "Each case is an architecture above, a corpus of six items (its input cut to 1/4 ... all of its length) and a",
        "PyTorch candidate run as is or in float16 (a wrapper around `model.half()`): the same model, or one whose",
        "module M scales its output past the frame where the middle item ends at M, so the bug bites only the",
        "longer items (`bench/accuracy/sweep.py`). `tensorprobe.sweep` runs the corpus as a user runs it (a sweep",
        "file, tier 1 first). An item is planted when the bug moves M's own output and the model's output on it",
        "beyond the port's rounding, clean when it moves neither. A case is *localized* when the items with a finding",
        "are exactly the planted ones and each names M (or a record inside it) as its first divergence; its cause is",
        "right when each says `own`. A finding on a clean item is a false alarm."),
        ("faithful", "port", "exact items, layer right")),
}


def _tool_section(tool: str, outcomes: list[dict[str, Any]]) -> list[str]:
    """A tool's cases other than `diff`'s: how they are made and scored, overall and per cell."""
    if not outcomes:
        return []
    title, how, words = _SECTIONS[tool]
    return ["", f"## {title}", "", *how, ""] + _tool_tables(outcomes, *words)


def _tool_tables(outcomes: list[dict[str, Any]], faithful: str, port: str, right: str) -> list[str]:
    total = score(outcomes)
    lines = [
        f"| cases | {faithful} | false alarms | planted | detected | {right} | cause right | void | failed |",
        "|---|---|---|---|---|---|---|---|---|",
        f"| {total['cases']} | {total['faithful']} | {total['false_alarms']} | {total['planted']} | "
        f"{_pct(total['detected'])} | {_pct(total['localized'])} | {_pct(total['cause_right'])} | {total['void']} | "
        f"{total['errors']} |",
        "",
        f"| family | {port} | {faithful} | false alarms | planted | {right} | cause right | failed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cell, s in by_cell(outcomes).items():
        lines.append(f"| {cell[0]} | {cell[1].split('-', 1)[1]} | {s['faithful']} | {s['false_alarms']} | "
                     f"{s['planted']} | {_pct(s['localized'])} | {_pct(s['cause_right'])} | {s['errors']} |")
    return lines
