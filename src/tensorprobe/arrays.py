"""Torch tensors and NumPy arrays, without importing torch for NumPy callers.

Reading, diffing and diagnosing run on NumPy; a torch tensor handed to them goes through `as_numpy`.

    >>> import numpy as np
    >>> is_torch_tensor(np.ones(2)), as_numpy([1.0, 2.0]).dtype
    (False, dtype('float64'))
"""

from __future__ import annotations

from typing import Any

import numpy as np


def is_torch_tensor(x: Any) -> bool:
    """True for a torch tensor (or a subclass), checked without importing torch."""
    return any(c.__module__.startswith("torch") and c.__name__ == "Tensor" for c in type(x).__mro__)


def as_numpy(x: Any) -> np.ndarray:
    """A NumPy array of `x`: a torch tensor goes to the CPU (a conjugate view resolved; bfloat16, which NumPy
    lacks, widened exactly to float32); anything else through `np.asarray`."""
    if not is_torch_tensor(x):
        return np.asarray(x)
    t = x.detach().cpu()
    if t.is_complex():
        t = t.resolve_conj()
    if str(t.dtype) == "torch.bfloat16":
        t = t.float()
    return t.numpy()


__all__ = ["as_numpy", "is_torch_tensor"]
