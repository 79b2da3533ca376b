"""Full-tensor statistics in as few passes as possible.

Probes that look at head/tail slices mislead (seed 000 blamed the wrong layer that way): every
statistic here covers every element. The common case, a finite float32/float64 tensor, costs one
compiled pass (`_stats_kernel`) giving Σx, Σx², min and max; a finite Σx is proof that every element is
finite, so it doubles as the finiteness check. Other float dtypes use three torch reductions. Only a
tensor that holds NaN/Inf pays for masks and the per-channel analysis.

    >>> import torch
    >>> x = torch.ones(1, 4, 3); x[0, 1] = float("nan")
    >>> s = compute_stats(x)
    >>> s.nan, s.nonfinite_channels, s.nonfinite_channel_idx
    (3, 1, (1,))
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

# Channel indices kept in a record; the count is always exact.
MAX_CHANNEL_IDX = 64

_FLOAT_KIND, _INT_KIND, _BOOL_KIND, _COMPLEX_KIND = "float", "int", "bool", "complex"


@dataclass(frozen=True)
class TensorStats:
    """Statistics of one tensor. Float figures cover the finite elements only, so a tensor with a
    few NaNs still shows its real range; `None` means "no finite element to measure"."""

    numel: int
    kind: str = _FLOAT_KIND
    nan: int = 0
    posinf: int = 0
    neginf: int = 0
    finite_frac: float = 1.0
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    std: float | None = None
    absmax: float | None = None
    channel_dim: int | None = None
    channels: int | None = None
    nonfinite_channels: int = 0
    partial_nonfinite_channels: int = 0
    nonfinite_channel_idx: tuple[int, ...] = field(default_factory=tuple)

    @property
    def nonfinite(self) -> int:
        return self.nan + self.posinf + self.neginf

    @property
    def all_finite(self) -> bool:
        return self.nonfinite == 0

    def channel_pattern(self) -> str | None:
        """Plain-words channel pattern, e.g. '10 of 256 channels entirely non-finite'."""
        if self.all_finite or not self.channels:
            return None
        parts = []
        if self.nonfinite_channels:
            idx = ", ".join(map(str, self.nonfinite_channel_idx[:12]))
            more = "…" if self.nonfinite_channels > 12 else ""
            parts.append(
                f"{self.nonfinite_channels} of {self.channels} channels entirely non-finite "
                f"(channel{'s' if self.nonfinite_channels > 1 else ''} {idx}{more})"
            )
        if self.partial_nonfinite_channels:
            parts.append(f"{self.partial_nonfinite_channels} of {self.channels} partly non-finite")
        return "; ".join(parts) if parts else None

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)  # field order; every capture writes thousands of these
        for f in _FLOAT_FIELDS:
            d[f] = _json_float(d[f])
        d["nonfinite_channel_idx"] = list(self.nonfinite_channel_idx)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TensorStats":
        known = cls.__dataclass_fields__
        kw = {k: _from_json_float(v) for k, v in d.items() if k in known}
        kw["nonfinite_channel_idx"] = tuple(kw.get("nonfinite_channel_idx") or ())
        return cls(**kw)


_FLOAT_FIELDS = ("finite_frac", "min", "max", "mean", "std", "absmax")


def compute_stats(tensor: torch.Tensor | np.ndarray, channel_dim: int | None = 1) -> TensorStats:
    """Statistics of every element of `tensor` (torch or NumPy), in one or two passes.

    Args:
        tensor: any dtype, any shape, including zero elements.
        channel_dim: the dimension whose slices are analysed for being entirely non-finite
            (the fingerprint of a broken per-channel normalization). Used for tensors of rank >= 2;
            `None` disables the analysis.

    Returns:
        A `TensorStats`.
    """
    x = _as_torch(tensor).detach()
    n = x.numel()
    if n == 0:
        return TensorStats(numel=0, kind=_kind_of(x.dtype))
    if x.dtype == torch.bool:
        return _bool_stats(x)
    if x.is_complex():
        return _complex_stats(x, channel_dim)
    if not x.is_floating_point():
        return _int_stats(x)
    return _float_stats(x, channel_dim)


# Below this ratio var / mean², E[x²] − E[x]² in float32 loses too many digits: use the two-pass formula.
_CANCELLATION_RATIO = 1e-3


def _float_stats(x: torch.Tensor, channel_dim: int | None) -> TensorStats:
    n = x.numel()
    acc = torch.float32 if x.dtype in (torch.float16, torch.bfloat16) else None
    moments = _fused_moments(x)
    if moments is not None:
        total, sumsq, mn_v, mx_v = moments
    else:
        # Vectorised torch reductions: torch.var_mean (Welford) is ~100x slower than a sum on CPU.
        total = x.sum(dtype=acc).item()
    if not math.isfinite(total):
        return _nonfinite_float_stats(x if acc is None else x.float(), channel_dim)
    # A finite sum is proof that every element is finite: any NaN or Inf would propagate.
    if moments is None:
        mn, mx = torch.aminmax(x)
        mn_v, mx_v = mn.item(), mx.item()
        sumsq = _sum_of_squares(x, acc)
    mean = total / n
    var = sumsq / n - mean * mean
    if not math.isfinite(sumsq) or var < _CANCELLATION_RATIO * mean * mean:
        var = _two_pass_var(x, mean)
    return TensorStats(
        numel=n, min=mn_v, max=mx_v, mean=mean, std=math.sqrt(max(var, 0.0)),
        absmax=max(abs(mn_v), abs(mx_v)), **_channel_count(x.shape, channel_dim),
    )


_kernel: Any = None


def _fused_moments(x: torch.Tensor) -> tuple[float, float, float, float] | None:
    """(Σx, Σx², min, max) in one compiled pass for contiguous float32/float64 CPU tensors, else None.
    Over a Kokoro forward's op outputs this is ~2.5x faster than the three torch reductions."""
    global _kernel
    if x.dtype not in (torch.float32, torch.float64) or x.device.type != "cpu" or not x.is_contiguous():
        return None
    if _kernel is None:
        from . import _stats_kernel  # Numba: imported (and compiled, once, cached) on first use
        _kernel = _stats_kernel
    try:
        flat = x.reshape(-1).numpy()
    except (RuntimeError, TypeError):  # tensor subclasses and other tensors NumPy cannot view
        return None
    return _kernel.moments(flat)


# Row length for the sum of squares: each row's norm is accumulated in float32 over at most this many
# elements, and the rows are added in float64.
_SUMSQ_ROW = 1 << 14


def _sum_of_squares(x: torch.Tensor, acc: torch.dtype | None) -> float:
    """Σx², accurate to ~1e-7 at any size. One `vector_norm` over a whole 40M-element tensor is off by
    ~0.6% (float32 accumulation); norms of 16K-element rows, squared and summed in float64, are exact
    to float32 rounding and, as one batched kernel, ~1.5x faster in cache."""
    flat = x.reshape(-1)
    n = flat.numel()
    head = n - n % _SUMSQ_ROW
    total = 0.0
    if head:
        rows = torch.linalg.vector_norm(flat[:head].view(-1, _SUMSQ_ROW), dim=1, dtype=acc)
        total = float(rows.double().square().sum())
    if head < n:
        total += float(torch.linalg.vector_norm(flat[head:], dtype=acc)) ** 2
    return total


def _two_pass_var(x: torch.Tensor, mean: float) -> float:
    """Exact variance (float64), for the rare tensors whose mean dwarfs their spread."""
    xd = x.double()
    return float(torch.mean(torch.square(xd - xd.mean())))


def _nonfinite_float_stats(xf: torch.Tensor, channel_dim: int | None) -> TensorStats:
    n = xf.numel()
    finite = torch.isfinite(xf)
    n_finite = int(finite.sum())
    nan = int(torch.isnan(xf).sum())
    posinf = int((xf == math.inf).sum())
    neginf = n - n_finite - nan - posinf
    figures: dict[str, Any] = {}
    if n_finite:
        vals = xf[finite].double()
        var, mean = torch.var_mean(vals, correction=0)
        mn, mx = torch.aminmax(vals)
        figures = dict(
            min=mn.item(), max=mx.item(), mean=mean.item(), std=math.sqrt(max(var.item(), 0.0)),
            absmax=max(abs(mn.item()), abs(mx.item())),
        )
    return TensorStats(
        numel=n, nan=nan, posinf=posinf, neginf=neginf, finite_frac=n_finite / n,
        **figures, **_channel_analysis(finite, channel_dim),
    )


def _channel_count(shape: tuple[int, ...], channel_dim: int | None) -> dict[str, Any]:
    cd = _resolve_channel_dim(shape, channel_dim)
    return {} if cd is None else {"channel_dim": cd, "channels": shape[cd]}


def _channel_analysis(finite: torch.Tensor, channel_dim: int | None) -> dict[str, Any]:
    cd = _resolve_channel_dim(finite.shape, channel_dim)
    if cd is None:
        return {}
    per_channel = finite.movedim(cd, 0).reshape(finite.shape[cd], -1)
    any_finite = per_channel.any(dim=1)
    all_finite = per_channel.all(dim=1)
    dead = torch.nonzero(~any_finite).flatten()
    return {
        "channel_dim": cd,
        "channels": finite.shape[cd],
        "nonfinite_channels": int(dead.numel()),
        "partial_nonfinite_channels": int((any_finite & ~all_finite).sum()),
        "nonfinite_channel_idx": tuple(int(i) for i in dead[:MAX_CHANNEL_IDX]),
    }


def _resolve_channel_dim(shape: tuple[int, ...], channel_dim: int | None) -> int | None:
    if channel_dim is None or len(shape) < 2:
        return None
    cd = channel_dim % len(shape)
    return cd if shape[cd] > 1 else None


def _int_stats(x: torch.Tensor) -> TensorStats:
    mn, mx = torch.aminmax(x)
    xd = x.double()
    var, mean = torch.var_mean(xd, correction=0)
    mn_v, mx_v = int(mn), int(mx)
    return TensorStats(
        numel=x.numel(), kind=_INT_KIND, min=mn_v, max=mx_v, mean=mean.item(),
        std=math.sqrt(var.item()), absmax=max(abs(mn_v), abs(mx_v)),
    )


def _bool_stats(x: torch.Tensor) -> TensorStats:
    true = int(x.sum())
    n = x.numel()
    return TensorStats(
        numel=n, kind=_BOOL_KIND, min=float(true == n), max=float(true > 0), mean=true / n,
        absmax=float(true > 0),
    )


def _complex_stats(x: torch.Tensor, channel_dim: int | None) -> TensorStats:
    # Magnitude carries the figures; a NaN in either part makes the element non-finite.
    parts = torch.view_as_real(x)
    finite = torch.isfinite(parts).all(dim=-1)
    mag = _float_stats(x.abs(), channel_dim)
    nan = int(torch.isnan(parts).any(dim=-1).sum())
    n = x.numel()
    inf = n - int(finite.sum()) - nan
    return TensorStats(**{**asdict(mag), "kind": _COMPLEX_KIND, "nan": nan, "posinf": inf, "neginf": 0,
                          "finite_frac": int(finite.sum()) / n,
                          "nonfinite_channel_idx": mag.nonfinite_channel_idx})


def tensor_digest(tensor: torch.Tensor | np.ndarray) -> str:
    """A 128-bit fingerprint of a tensor's bytes (32 hex digits): equal for bit-identical data on any device,
    different (with overwhelming probability) for any change, a transpose or a permutation included.

    Not cryptographic: it tells "same weights" from "changed weights" at memory speed (~5 GB/s per core;
    SHA-256 runs at ~1.2 GB/s here). Shape and dtype are not part of it: records carry those.

        >>> w = torch.randn(4, 4)
        >>> tensor_digest(w) == tensor_digest(w.clone()), tensor_digest(w) == tensor_digest(w.t().contiguous())
        (True, False)
    """
    global _kernel
    x = _as_torch(tensor).detach()
    if x.device.type != "cpu":
        return _digest_torch(x)
    if _kernel is None:
        from . import _stats_kernel
        _kernel = _stats_kernel
    a, b = _kernel.fingerprint_words(_words(x))
    return f"{a:016x}{b:016x}"


def _words(x: torch.Tensor) -> np.ndarray:
    """The tensor's bytes as uint32 words (zero-padded to a multiple of 4 bytes)."""
    x = x.contiguous()
    if x.is_complex():
        x = torch.view_as_real(x.resolve_conj()).contiguous()
    flat = x.reshape(-1).view(torch.uint8) if x.numel() else torch.empty(0, dtype=torch.uint8)
    n = flat.numel()
    if n % 4:
        flat = torch.cat([flat, flat.new_zeros(4 - n % 4)])
    return flat.numpy().view(np.uint32)


_DIGEST_CHUNK = 1 << 24  # words per torch pass (int64 temporaries: 128 MiB)


def _digest_torch(x: torch.Tensor) -> str:
    """`tensor_digest` on the tensor's own device, with torch integer ops (int64 holding uint32 values)
    reproducing the Numba kernel exactly; only the per-block sums come back to the host."""
    from ._stats_kernel import (FP_BLOCK, FP_M1, FP_M2, FP_M3, FP_M4, FP_SALT, fold_block_sums)

    x = x.contiguous()
    if x.is_complex():
        x = torch.view_as_real(x.resolve_conj()).contiguous()
    flat = x.reshape(-1).view(torch.uint8)
    if flat.numel() % 4:
        flat = torch.cat([flat, flat.new_zeros(4 - flat.numel() % 4)])
    words = flat.view(torch.int32)
    mask = 0xFFFFFFFF
    pos = ((torch.arange(FP_BLOCK, device=x.device, dtype=torch.int64) * FP_M3) & mask) ^ FP_SALT
    sums = []
    for start in range(0, words.numel(), _DIGEST_CHUNK):  # chunks are whole blocks
        w = words[start:start + _DIGEST_CHUNK].to(torch.int64) & mask
        n = w.numel()
        blocks = -(-n // FP_BLOCK)
        w = torch.nn.functional.pad(w, (0, blocks * FP_BLOCK - n)).view(blocks, FP_BLOCK)
        v = ((w ^ pos) * FP_M1) & mask
        v = v ^ (v >> 15)
        y = (v * FP_M2) & mask
        z = (v * FP_M4) & mask
        lanes = torch.stack([y ^ (y >> 13), z ^ (z >> 16)], dim=-1)
        if blocks * FP_BLOCK > n:  # padding words contribute nothing: the kernel only sums real words
            lanes.view(-1, 2)[n:] = 0
        sums.append((lanes.sum(dim=1) & mask).cpu())
    block_sums = torch.cat(sums).numpy().astype(np.uint32) if sums else np.empty((0, 2), np.uint32)
    a, b = fold_block_sums(block_sums)
    return f"{int(a):016x}{int(b):016x}"


def _kind_of(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return _BOOL_KIND
    if dtype.is_complex:
        return _COMPLEX_KIND
    return _FLOAT_KIND if dtype.is_floating_point else _INT_KIND


def _as_torch(tensor: torch.Tensor | np.ndarray) -> torch.Tensor:
    if isinstance(tensor, torch.Tensor):
        return tensor
    arr = np.asarray(tensor)
    if not arr.flags.writeable or not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr).copy()
    return torch.from_numpy(arr)


def _json_float(v: Any) -> Any:
    """JSON has no Inf/NaN: spell them as strings so the manifest stays valid JSON."""
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return v


def _from_json_float(v: Any) -> Any:
    if isinstance(v, str) and v in ("nan", "inf", "-inf"):
        return float(v)
    return v
