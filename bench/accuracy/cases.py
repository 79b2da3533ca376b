"""Truth-known cases: an architecture, a port made by the usual tool, a capture level, and either no bug (the
faithful twin) or one bug planted in one module. A case is named by its id, and rebuilt from it alone:

    convnorm-group-affine-gelu/onnx/module-stats/scale_weight@blocks.1.0/s3

`generate(count, seed)` draws a population stratified over the cells (architecture family × port × level), each
cell with faithful twins and planted bugs; the same arguments give the same cases.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from .archs import ARCHS
from .bugs import BUGS

# ports and what makes them (ports.py); levels and the capture options they stand for
PORTS = ("torch", "fp16", "bf16", "onnx", "onnx-legacy", "onnx-int8", "onnx-qdq", "aot_eager", "inductor",
         "executorch")
LEVELS = {"module-stats": ("module", "stats"), "module-full": ("module", "full"), "op-full": ("op", "full")}
SIXTEEN_BIT = ("fp16", "bf16")
# ports whose own error is far above float32 rounding: bugs of the order of their error have no truth to find
COARSE = (*SIXTEEN_BIT, "onnx-int8", "onnx-qdq")
# bugs whose effect is of the order of float16 rounding: a 16-bit port has no truth to find for them
SUBTLE = ("eps", "approx_activation", "one_pass_variance", "fp16_module")
# a candidate made with torch.onnx takes positional inputs only (tensorprobe compare refuses a dict)
POSITIONAL_ONLY = ("onnx", "onnx-legacy", "onnx-int8", "onnx-qdq", "executorch")
ONNX_PORTS = ("onnx", "onnx-legacy", "onnx-int8", "onnx-qdq")
COMPILED = ("aot_eager", "inductor")


@dataclass(frozen=True)
class Case:
    arch: str
    port: str
    level: str
    bug: str | None
    site: str | None
    seed: int

    @property
    def id(self) -> str:
        truth = "faithful" if self.bug is None else f"{self.bug}@{self.site}"
        return f"{self.arch}/{self.port}/{self.level}/{truth}/s{self.seed}"

    @classmethod
    def from_id(cls, case_id: str) -> "Case":
        arch, port, level, truth, seed = case_id.split("/")
        if arch not in ARCHS or port not in PORTS or level not in LEVELS or not seed.startswith("s"):
            raise ValueError(f"not a case id: {case_id!r} (arch/port/level/truth/sSEED)")
        bug, site = (None, None) if truth == "faithful" else truth.split("@", 1)
        if bug is not None and bug not in BUGS:
            raise ValueError(f"unknown bug {bug!r} in {case_id!r}")
        return cls(arch, port, level, bug, site, int(seed[1:]))

    @property
    def cell(self) -> tuple[str, str, str]:
        return family(self.arch), self.port, self.level

    @property
    def strength(self) -> float:
        """How far a numeric bug moves its module: far above the port's own rounding (bfloat16's 4e-3 steps
        accumulate to a few percent over a small net, float16's 5e-4 to ~1e-2, float32's to ~1e-6)."""
        return {"bf16": 0.5, "fp16": 0.3, "onnx-int8": 0.3, "onnx-qdq": 0.3}.get(self.port, 0.02)

    @property
    def min_effect(self) -> float:
        """The least relative change of the planted module's own output that is a truth to find on this port."""
        return {"bf16": 0.15, "fp16": 0.03, "onnx-int8": 0.05, "onnx-qdq": 0.05}.get(self.port, 1e-4)


def port_takes(arch: str, port: str) -> bool:
    """Whether the usual tool makes this port at all: torch.onnx takes positional inputs only (tensorprobe
    compare refuses a dict), and the legacy exporter has no ONNX op for nn.MultiheadAttention's fused path."""
    if port in POSITIONAL_ONLY and arch == "dictio":
        return False
    if port == "executorch" and arch == "noisy":     # ExecuTorch has no kernels for random draws
        return False
    return not (port == "onnx-legacy" and arch == "attention")


# bugs made of float16 arithmetic inside a float32 model: ONNX Runtime's CPU kernels compute most float16 ops in
# float32 (it inserts the casts), so the port does not have the bug the PyTorch model has
FLOAT16_ARITHMETIC = ("one_pass_variance", "fp16_module")


def applicable(arch: str, port: str, bug: str, site: str) -> bool:
    return port_takes(arch, port) and not (port in COARSE and bug in SUBTLE) and \
        not (port in POSITIONAL_ONLY and bug in FLOAT16_ARITHMETIC)


def family(arch: str) -> str:
    """The architecture's family (convnorm-group-affine-gelu -> convnorm-group): a row of the table."""
    parts = arch.split("-")
    return "-".join(parts[:2]) if parts[0] == "convnorm" else parts[0]


# ports whose cases cost far more than the others' (ExecuTorch lowers each case, ~15 s on 2 cores; Inductor
# compiles C++ kernels): their cells get this share of the cases
PORT_SHARE = {"executorch": 0.15, "inductor": 0.4}


def generate(count: int, seed: int = 0, ports: tuple[str, ...] = PORTS, levels: tuple[str, ...] = tuple(LEVELS),
             faithful_share: float = 0.3) -> list[Case]:
    """`count` cases spread evenly over the cells (architecture family × port × level; a `PORT_SHARE` of them in a
    costly port's cells), each cell with at least one faithful twin when it has two cases or more, the rest bugs
    drawn from those that apply; the same arguments give the same cases, in an order that mixes the cells."""
    rng = random.Random(seed)
    by_family: dict[str, list[str]] = {}
    for arch in ARCHS:
        by_family.setdefault(family(arch), []).append(arch)
    cells = [(f, p, lv) for f in by_family for p in ports for lv in levels
             if any(port_takes(a, p) for a in by_family[f])]
    per_cell = -(-count // len(cells))
    sites = {arch: ARCHS[arch](0).sites for arch in ARCHS}
    cases: dict[str, Case] = {}
    for fam, port, level in cells:
        in_cell = max(1, math.ceil(per_cell * PORT_SHARE.get(port, 1.0)))
        n_faithful = max(1 if in_cell >= 2 else 0, round(in_cell * faithful_share))
        for k in range(in_cell):
            arch = rng.choice([a for a in by_family[fam] if port_takes(a, port)])
            case_seed = rng.randrange(10_000)
            planted = [(b, s) for s, bugs in sites[arch].items() for b in bugs if applicable(arch, port, b, s)]
            if k < n_faithful or not planted:
                case = Case(arch, port, level, None, None, case_seed)
            else:
                bug, site = rng.choice(planted)
                case = Case(arch, port, level, bug, site, case_seed)
            cases[case.id] = case
    out = list(cases.values())
    rng.shuffle(out)
    return out
