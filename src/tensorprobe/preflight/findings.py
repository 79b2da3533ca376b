"""What preflight finds (`Finding`, `PreflightReport`) and what it knows of each target (`TARGETS`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError

ERROR, WARNING, INFO = "error", "warning", "info"
_RANK = {ERROR: 0, WARNING: 1, INFO: 2}
FLOAT32 = "float32_nonfinite"    # the kind of the finding that float32 PyTorch itself already fails


def clause(text: str) -> str:
    """`text` without its closing full stop, to join into a longer sentence (messages and headlines come
    both ways: a finding's message has none, `NanOrigin.headline()` sometimes does)."""
    return text.strip().rstrip(".").rstrip()


def sentence(text: str) -> str:
    """`text` ending with exactly one full stop."""
    return clause(text) + "."


def inner_clause(text: str) -> str:
    """`text` as a clause after a colon: no closing full stop, and a plain capitalised first word in lower
    case ("The model inputs" -> "the model inputs"; "NaN/Inf born" keeps its case)."""
    text = clause(text)
    word = text.split(" ", 1)[0]
    return text[0].lower() + text[1:] if word.isalpha() and word[1:].islower() else text


@dataclass(frozen=True)
class Target:
    """A port target as preflight sees it.

    exporter: how the target takes the model ("torch.export", "torch.onnx" or None for PyTorch itself).
    one_pass_variance: True when its normalisation kernels compute the variance as E[x²] − E[x]² (measured:
        TVM 0.27, ExecuTorch 1.5.1 portable kernels), False when they do not (ONNX Runtime), None if unknown.
    dtype: the float format its arithmetic runs in.
    random_ops: whether its importer takes random ops at all.
    """

    name: str
    exporter: str | None
    one_pass_variance: bool | None
    dtype: str = "float32"
    note: str = ""
    random_ops: bool = True      # its importer takes random ops (TVM 0.27's Relax importer and ExecuTorch
                                 # 1.5.1's to_edge do not: measured by the import check)
    runtime: str | None = None   # the tensorprobe runtime that runs it (--verify, the import check)


TARGETS: dict[str, Target] = {
    "executorch": Target("executorch", "torch.export", True, note="ExecuTorch 1.5.1 portable kernels",
                         random_ops=False, runtime="executorch"),    # to_edge: randn_like is not Core ATen
    "tvm": Target("tvm", "torch.export", True, note="TVM 0.27 Relax, llvm", random_ops=False, runtime="tvm"),
    "onnx": Target("onnx", "torch.onnx", False, note="ONNX Runtime 1.32, CPU", runtime="onnxruntime"),
    "coreml": Target("coreml", "torch.export", None, "float16", note="Core ML computes in float16 on GPU/ANE"),
    "mlx": Target("mlx", None, None, note="a hand-written MLX port: only the numbers are checked"),
    "fp16": Target("fp16", None, False, "float16", note="the PyTorch model run in float16"),
}


def get_target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise InputError(f"unknown preflight target {name!r}; known targets: {', '.join(TARGETS)}") from None


@dataclass(frozen=True)
class Finding:
    """One predicted problem: where (module path, source line), what, the evidence and the fix."""

    kind: str                     # docs/json-preflight.md lists them: non_core_op, random_op, complex, export_error, …
    severity: str                 # error: will break on the target; warning: may; info: worth knowing
    message: str
    module: str = ""
    source: str | None = None
    op: str | None = None
    count: int = 1                # occurrences folded into this finding (same kind, op, module, source)
    evidence: dict[str, Any] = field(default_factory=dict)
    fix: str | None = None
    rule: str | None = None        # the `tensorprobe.rewrite` rule that fixes it (applied by `preflight --fix`)
    confirmed: bool | None = None  # --verify: the real target did (True) or did not (False) fail this way
    observed: str | None = None    # --verify: what the real target did there

    def to_dict(self) -> dict[str, Any]:
        from ..numbers import json_number

        return {"kind": self.kind, "severity": self.severity, "message": self.message, "module": self.module,
                "source": self.source, "op": self.op, "count": self.count,
                "evidence": {k: json_number(v) for k, v in self.evidence.items()}, "fix": self.fix, "rule": self.rule,
                "confirmed": self.confirmed, "observed": self.observed}


@dataclass(frozen=True)
class Float32Check:
    """Whether float32 PyTorch itself already makes NaN/Inf on the inputs, before any port.

    finite: every op output of the run was finite (then nothing else is set).
    outputs_finite: the model's outputs are finite (False: the model is already broken; True with `finite`
        False: a NaN/Inf inside is masked before the outputs).
    origin: `tensorprobe.nan`'s `NanOrigin`: where the first non-finite value is born, with its diagnosis.
    left_out: target findings not given because their op or norm already met a non-finite value in float32
        (their figures would come from the finite values only, and the failure is not the target's).
    """

    finite: bool
    outputs_finite: bool
    origin: Any = None
    left_out: tuple[Finding, ...] = ()

    def finding(self) -> Finding | None:
        """The finding that comes before every target finding: error when the outputs are non-finite,
        warning when the NaN/Inf is masked before them; None when float32 is finite."""
        if self.finite:
            return None
        o = self.origin
        found = o is not None and o.found
        stats = o.output.stats if found and o.output is not None else None
        state = ("makes the outputs non-finite" if not self.outputs_finite else
                 "makes NaN/Inf inside the model (masked before the outputs, which are finite)")
        where = (inner_clause(o.headline()) if found
                 else "the live NaN finder did not see it again (random ops drawing otherwise?)")
        message = f"float32 PyTorch already {state} on these inputs, before any port: {where}"
        if self.left_out:
            message += (f"; {len(self.left_out)} target finding(s) at ops that meet these NaN/Inf in float32 are "
                        "left out")
        evidence = {"record": o.record if found else None, "cause": o.cause if found else None,
                    "outputs_finite": self.outputs_finite,
                    "channels": list(stats.nonfinite_channel_idx) if stats else [],
                    "channel_pattern": stats.channel_pattern() if stats else None,
                    "diagnosis": list(o.diagnosis) if found else [],
                    "left_out": [f"{f.kind} at {f.module or '<root>'} ({f.op or ''})" for f in self.left_out]}
        fix = ("make the model finite in float32 first (the diagnosis says why; `tensorprobe nan` shows the op): "
               "no port can be judged while PyTorch itself fails" if not self.outputs_finite else
               "compute the masked branch on safe values (e.g. where(mask, x, 1) before log): a masked NaN/Inf "
               "still makes NaN gradients, and a runtime that evaluates the mask otherwise lets it through")
        return Finding(FLOAT32, WARNING if self.outputs_finite else ERROR, message, module=(o.module or "") if found
                       else "", source=o.source if found else None, op=o.op if found else None, evidence=evidence,
                       fix=fix)

    def to_dict(self) -> dict[str, Any]:
        return {"finite": self.finite, "outputs_finite": self.outputs_finite,
                "origin": self.origin.to_dict() if self.origin is not None else None,
                "left_out": [f.to_dict() for f in self.left_out]}


@dataclass(frozen=True)
class PreflightReport:
    """Everything preflight found for one target, most severe first (JSON: docs/json-preflight.md).

    The float32 finding (`FLOAT32`), when PyTorch itself already fails on the inputs, comes first."""

    target: Target
    findings: tuple[Finding, ...]
    exported: bool | None = None   # the target's exporter took the model (None: not tried)
    notes: tuple[str, ...] = ()
    rewrite: Any = None            # with --fix: the `RewriteResult` (its `.model` is the fixed model)
    fixed_ok: bool | None = None   # with --fix --verify: the target ran the fixed model with every value finite
    float32: Float32Check | None = None        # None: the model was not run (numbers=False)
    remaining: tuple[Finding, ...] | None = None   # with --fix, when a rule applied: the fixed model's findings

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def finding(self) -> bool:
        """True when something will break: an error-level finding; after `--fix` rewrote the model, one left
        on the fixed model (or the target, run on it with --verify, still making NaN/Inf)."""
        if self.remaining is not None:
            return any(f.severity == ERROR for f in self.remaining) or self.fixed_ok is False
        return bool(self.errors)

    def summary(self) -> str:
        name = self.target.name
        f32 = [f for f in self.findings if f.kind == FLOAT32]
        rest = [f for f in self.findings if f.kind != FLOAT32]
        parts = [sentence(f32[0].message[0].upper() + f32[0].message[1:])] if f32 else []
        counts = {s: sum(1 for f in rest if f.severity == s) for s in (ERROR, WARNING, INFO)}
        if not rest:
            parts.append(f"Nothing {'else ' if f32 else ''}found that would break on {name}.")
        else:
            errors = [f for f in rest if f.severity == ERROR]
            parts.append(f"{counts[ERROR]} problem(s) that will break on {name}, {counts[WARNING]} that may, "
                         f"{counts[INFO]} worth knowing." + (f" First: {sentence(errors[0].message)}" if errors else ""))
        if self.remaining is not None:
            parts.append(self._after_fix())
        return " ".join(parts)

    def _after_fix(self) -> str:
        left = [f for f in self.remaining or () if f.severity == ERROR]
        if left:
            return f"After --fix, {len(left)} still break(s) on {self.target.name}; first: {sentence(left[0].message)}"
        if self.fixed_ok is False:
            return f"After --fix no finding is left, but {self.target.name} still makes NaN/Inf in the fixed model."
        ran = f", and {self.target.name} ran the fixed model with every value finite" if self.fixed_ok else ""
        return f"After --fix nothing is left that would break on {self.target.name}{ran}."

    def to_dict(self) -> dict[str, Any]:
        t = self.target
        return {"target": {"name": t.name, "exporter": t.exporter, "one_pass_variance": t.one_pass_variance,
                           "dtype": t.dtype, "note": t.note},
                "exported": self.exported, "summary": self.summary(), "finding": self.finding,
                "float32": self.float32.to_dict() if self.float32 is not None else None,
                "findings": [f.to_dict() for f in self.findings], "notes": list(self.notes),
                "rewrite": self.rewrite.to_dict() if self.rewrite is not None else None, "fixed_ok": self.fixed_ok,
                "remaining": [f.to_dict() for f in self.remaining] if self.remaining is not None else None}


def sorted_findings(findings: list[Finding] | tuple[Finding, ...]) -> tuple[Finding, ...]:
    """Most severe first; the float32 finding before everything (what PyTorch itself fails comes first)."""
    return tuple(sorted(findings, key=lambda f: (f.kind != FLOAT32, _RANK[f.severity])))
