"""The numerics environment of a run: everything besides the code and the weights that changes the numbers.

Each bundle records it (`manifest["environment"]`), and `diff` compares the two sides: a candidate that ran
its convolutions in TF32, on another device, with other thread counts or another runtime differs from the
reference for reasons that are not a porting bug, and the report says so.

    >>> env = collect()                                    # doctest: +SKIP
    >>> env["device"], env["tf32"]                         # doctest: +SKIP
    ('cpu', {'matmul': False, 'cudnn': True})
    >>> explain(ref_env, cand_env)                         # doctest: +SKIP
    ['the candidate ran convolutions in TF32 (10-bit mantissa) on cuda: expect ~1e-3 relative error per conv; ...']

`arithmetic(env)` turns an environment into the unit roundoff of each op family, which `diff`'s
noise-or-divergence rule uses (`tensorprobe.diff.noise`).
"""

from __future__ import annotations

import os
import platform
from typing import Any, Iterable

# Unit roundoff (half an ulp at 1.0) of each arithmetic.
UNIT_ROUNDOFF = {
    "float64": 2.0 ** -53, "float32": 2.0 ** -24, "tf32": 2.0 ** -11, "float16": 2.0 ** -11,
    "bfloat16": 2.0 ** -8, "float8_e4m3fn": 2.0 ** -4, "float8_e5m2": 2.0 ** -3,
}
# Op families whose arithmetic a backend may lower in precision (TF32 matmuls and convolutions).
CONV, MATMUL = "conv", "matmul"

_EMULATED: list[dict[str, str]] = []   # arithmetic emulations active now (see tensorprobe.emulate)


def collect(tensors: Iterable[Any] = (), *, runtime: dict[str, Any] | None = None) -> dict[str, Any]:
    """The environment of a PyTorch run (or of a runtime's run, with `runtime` info), as plain JSON.

    Args:
        tensors: tensors of the run (parameters, inputs): their devices and dtypes are recorded.
        runtime: for a capture in another runtime, its name, version, execution provider or backend.
    """
    import torch

    devices, dtypes = set(), set()
    for t in tensors:
        if isinstance(t, torch.Tensor):
            devices.add(str(t.device))
            dtypes.add(str(t.dtype).removeprefix("torch."))
    device = sorted(devices)[0] if devices else "cpu"
    env: dict[str, Any] = {
        "device": device,
        "device_name": _device_name(device),
        "dtypes": sorted(dtypes),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "tf32": {"matmul": bool(torch.backends.cuda.matmul.allow_tf32), "cudnn": bool(torch.backends.cudnn.allow_tf32)},
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "reduced_precision_reduction": {
            "float16": bool(torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction),
            "bfloat16": bool(torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)},
        "deterministic": bool(torch.are_deterministic_algorithms_enabled()),
        "threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "emulated": dict(_EMULATED[-1]) if _EMULATED else {},
    }
    if runtime:
        env["runtime"] = dict(runtime)
    return env


def _device_name(device: str) -> str:
    import torch

    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    if device.startswith("mps"):
        return "Apple MPS"
    return platform.processor() or platform.machine() or "cpu"


def arithmetic(env: dict[str, Any] | None) -> dict[str, str]:
    """The arithmetic each op family ran in beyond its dtype: {"conv": "tf32", "matmul": "tf32"} or {}.

    TF32 applies on CUDA only: cuDNN convolutions with `torch.backends.cudnn.allow_tf32` (default on), and
    matmuls with `torch.backends.cuda.matmul.allow_tf32` or `float32_matmul_precision` "high"/"medium".
    An emulation (`tensorprobe.emulate.tf32()`) counts wherever it ran.
    """
    if not env:
        return {}
    out = dict(env.get("emulated") or {})
    if str(env.get("device", "")).startswith("cuda"):
        tf32 = env.get("tf32") or {}
        if tf32.get("cudnn"):
            out.setdefault(CONV, "tf32")
        if tf32.get("matmul") or env.get("float32_matmul_precision") in ("high", "medium"):
            out.setdefault(MATMUL, "tf32")
    return out


_ARITHMETIC_KEYS = ("runtime", "torch", "device", "device_name", "cuda", "cudnn", "tf32", "float32_matmul_precision",
                    "reduced_precision_reduction", "threads", "machine", "emulated")


def same_arithmetic(ref: dict[str, Any] | None, cand: dict[str, Any] | None) -> bool:
    """Did both runs use exactly the same arithmetic (same runtime and version, device, threads, precision
    flags), deterministically (CPU, or CUDA with deterministic algorithms)? Then two records computed from
    identical inputs in the same dtype are bit-identical, and rounding explains no difference at all."""
    if not ref or not cand:
        return False
    if any(ref.get(k) != cand.get(k) for k in _ARITHMETIC_KEYS):
        return False
    device = str(ref.get("device", ""))
    return device == "cpu" or bool(ref.get("deterministic") and cand.get("deterministic"))


def explain(ref: dict[str, Any] | None, cand: dict[str, Any] | None) -> list[str]:
    """Plain-words notes on what differs between two environments and what it does to the numbers."""
    if not ref or not cand:
        missing = "reference" if not ref else "candidate"
        return [] if not (ref or cand) else [f"the {missing} bundle records no numerics environment "
                                             "(captured by an older tensorprobe or another tool)"]
    notes = []
    r_rt, c_rt = (ref.get("runtime") or {}), (cand.get("runtime") or {})
    if r_rt.get("name") != c_rt.get("name") or r_rt.get("version") != c_rt.get("version"):
        def rt(d: dict, env: dict) -> str:
            return f"{d.get('name')} {d.get('version')}" if d else f"pytorch {env.get('torch')}"
        notes.append(f"the runs used different runtimes ({rt(r_rt, ref)} vs {rt(c_rt, cand)}): kernels differ in "
                     "operation order, so float rounding differs; expect differences at the rounding level")
    if ref.get("device") != cand.get("device"):
        notes.append(f"the runs used different devices ({ref.get('device')} {ref.get('device_name')} vs "
                     f"{cand.get('device')} {cand.get('device_name')}): kernels and reduction orders differ, and "
                     "random generators draw different numbers on each device (replay them with --replay-rng)")
    for side, env, other in (("candidate", cand, ref), ("reference", ref, cand)):
        mine, theirs = arithmetic(env), arithmetic(other)
        fams = sorted(f for f, what in mine.items() if theirs.get(f) != what and what == "tf32")
        if not fams:
            continue
        emulated = all((env.get("emulated") or {}).get(f) == "tf32" for f in fams)
        ops = " and ".join("convolutions" if f == CONV else "matmuls" for f in fams)
        flags = " and ".join("torch.backends.cudnn.allow_tf32 = False" if f == CONV else
                             "torch.backends.cuda.matmul.allow_tf32 = False" for f in fams)
        fix = "" if emulated else f"; set {flags} to compare at float32"
        notes.append(f"the {side} ran {ops} in {'emulated ' if emulated else ''}TF32 (10-bit mantissa): expect "
                     f"~1e-3 relative error per op, which the noise rule allows for{fix}")
    # the floating dtypes: an integer buffer one side keeps (BatchNorm's num_batches_tracked, int64, which an
    # export drops) is no arithmetic
    r_dt, c_dt = ({d for d in env.get("dtypes") or () if _floating(d)} for env in (ref, cand))
    if r_dt and c_dt and r_dt != c_dt:
        notes.append(f"the runs computed in different dtypes ({', '.join(sorted(r_dt))} vs {', '.join(sorted(c_dt))}): "
                     "differences at the rounding level of the coarser one are expected")
    if ref.get("threads") != cand.get("threads") and ref.get("device") == cand.get("device") == "cpu":
        notes.append(f"the runs used different thread counts ({ref.get('threads')} vs {cand.get('threads')}): "
                     "parallel reductions may add in another order (differences at the rounding level)")
    return notes


def emulating(arith: dict[str, str]) -> "_Emulating":
    """Mark `arith` (e.g. {"conv": "tf32"}) as the arithmetic emulated while the context is active, so that
    captures record it in their environment. Used by `tensorprobe.emulate`."""
    return _Emulating(arith)


class _Emulating:
    def __init__(self, arith: dict[str, str]):
        self.arith = arith

    def __enter__(self) -> None:
        merged = dict(_EMULATED[-1]) if _EMULATED else {}
        merged.update(self.arith)
        _EMULATED.append(merged)

    def __exit__(self, *exc: Any) -> None:
        _EMULATED.pop()


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


__all__ = ["UNIT_ROUNDOFF", "arithmetic", "collect", "emulating", "explain", "same_arithmetic"]


def _floating(dtype: str) -> bool:
    """float16, bfloat16, float32, float64, the float8 kinds; complex too (its parts are floats)."""
    return dtype.startswith(("float", "bfloat", "complex"))
