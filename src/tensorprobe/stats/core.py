"""The record of a tensor's statistics (`TensorStats`) and what both backends share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..numbers import from_json_number, json_number

# Channel indices kept in a record; the count is always exact.
MAX_CHANNEL_IDX = 64

FLOAT_KIND, INT_KIND, BOOL_KIND, COMPLEX_KIND = "float", "int", "bool", "complex"


@dataclass(frozen=True)
class TensorStats:
    """Statistics of one tensor. Float figures cover the finite elements only, so a tensor with a
    few NaNs still shows its real range; `None` means "no finite element to measure"."""

    numel: int
    kind: str = FLOAT_KIND
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
    # the sketch of a finite float value (`stats.sketch`): what a permutation changes; None: not made
    sketch: tuple[float, ...] | None = None

    @classmethod
    def finite(cls, numel: int, min: float, max: float, mean: float, std: float, absmax: float,
               channels: dict[str, Any]) -> "TensorStats":
        """The statistics of an all-finite float tensor, made without the dataclass's `__init__` (its 16
        frozen-field assignments cost ~2 µs; a runtime capture makes one per value: `stats.batch`).
        `channels`: `channel_count(shape, channel_dim)`."""
        s = object.__new__(cls)
        s.__dict__.update(_FINITE_DEFAULTS, numel=numel, min=min, max=max, mean=mean, std=std, absmax=absmax,
                          **channels)
        return s

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
            parts.append(f"{self.partial_nonfinite_channels} of {self.channels} channels partly non-finite")
        return "; ".join(parts) if parts else None

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)  # field order; every capture writes thousands of these
        for f in _FLOAT_FIELDS:
            v = d[f]
            if type(v) is not float or v - v != 0.0:   # a finite float is written as it is (the common case)
                d[f] = json_number(v)
        d["nonfinite_channel_idx"] = list(self.nonfinite_channel_idx)
        if self.sketch is None:
            del d["sketch"]
        else:
            d["sketch"] = list(self.sketch)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TensorStats":
        known = cls.__dataclass_fields__
        kw = {k: from_json_number(v) for k, v in d.items() if k in known}
        kw["nonfinite_channel_idx"] = tuple(kw.get("nonfinite_channel_idx") or ())
        if kw.get("sketch") is not None:
            kw["sketch"] = tuple(float(v) for v in kw["sketch"])
        return cls(**kw)


_FLOAT_FIELDS = ("finite_frac", "min", "max", "mean", "std", "absmax")
_FINITE_DEFAULTS = dict(TensorStats(numel=0).__dict__)


_kernel: Any = None


# Below this many elements NumPy's own reductions are as fast as the compiled pass, and a command that
# reads small tensors (a bundle's `nan`, a unit test) does not pay Numba's ~0.3 s import.
KERNEL_MIN_ELEMENTS = 1 << 16


def kernel() -> Any:
    """The compiled Numba kernels (`stats/_kernel.py`), imported (and compiled, once, cached) on first use."""
    global _kernel
    if _kernel is None:
        from . import _kernel as compiled
        _kernel = compiled
    return _kernel


# Below this ratio var / mean², E[x²] − E[x]² in float32 loses too many digits: use the two-pass formula.
CANCELLATION_RATIO = 1e-3


def bool_stats(true: int, n: int) -> TensorStats:
    """The statistics of a bool tensor of `n` elements, `true` of them True (min/max/absmax as 0.0 or 1.0)."""
    return TensorStats(numel=n, kind=BOOL_KIND, min=float(true == n), max=float(true > 0), mean=true / n,
                       absmax=float(true > 0))


def channel_count(shape: tuple[int, ...], channel_dim: int | None) -> dict[str, Any]:
    cd = resolve_channel_dim(shape, channel_dim)
    return {} if cd is None else {"channel_dim": cd, "channels": shape[cd]}


def resolve_channel_dim(shape: tuple[int, ...], channel_dim: int | None) -> int | None:
    if channel_dim is None or len(shape) < 2:
        return None
    cd = channel_dim % len(shape)
    return cd if shape[cd] > 1 else None
