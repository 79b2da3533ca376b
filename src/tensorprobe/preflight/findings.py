"""What preflight finds (`Finding`, `PreflightReport`) and what it knows of each target (`TARGETS`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import InputError

ERROR, WARNING, INFO = "error", "warning", "info"
_RANK = {ERROR: 0, WARNING: 1, INFO: 2}


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
class PreflightReport:
    """Everything preflight found for one target, most severe first (JSON: docs/json-preflight.md)."""

    target: Target
    findings: tuple[Finding, ...]
    exported: bool | None = None   # the target's exporter took the model (None: not tried)
    notes: tuple[str, ...] = ()
    rewrite: Any = None            # with --fix: the `RewriteResult` (its `.model` is the fixed model)
    fixed_ok: bool | None = None   # with --fix --verify: the target ran the fixed model with every value finite

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == ERROR]

    @property
    def finding(self) -> bool:
        """True when something is predicted to break on the target (an error-level finding)."""
        return bool(self.errors)

    def summary(self) -> str:
        counts = {s: sum(1 for f in self.findings if f.severity == s) for s in (ERROR, WARNING, INFO)}
        if not self.findings:
            return f"Nothing found that would break on {self.target.name}."
        head = (f"{counts[ERROR]} problem(s) that will break on {self.target.name}, {counts[WARNING]} that may, "
                f"{counts[INFO]} worth knowing.")
        return head + (f" First: {self.errors[0].message}" if self.errors else "")

    def to_dict(self) -> dict[str, Any]:
        t = self.target
        return {"target": {"name": t.name, "exporter": t.exporter, "one_pass_variance": t.one_pass_variance,
                           "dtype": t.dtype, "note": t.note},
                "exported": self.exported, "summary": self.summary(), "finding": self.finding,
                "findings": [f.to_dict() for f in self.findings], "notes": list(self.notes),
                "rewrite": self.rewrite.to_dict() if self.rewrite is not None else None, "fixed_ok": self.fixed_ok}


def sorted_findings(findings: list[Finding]) -> tuple[Finding, ...]:
    return tuple(sorted(findings, key=lambda f: _RANK[f.severity]))
