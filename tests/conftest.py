"""Shared fixtures. Tests mirror the package layout; slow ones (full Kokoro decoder) are marked `slow`."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import settings

# Property tests run the same examples on every run (CI must not pass or fail by the draw); to explore new ones
# locally: TENSORPROBE_HYPOTHESIS=explore python -m pytest ...
settings.register_profile("repeatable", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("TENSORPROBE_HYPOTHESIS", "repeatable"))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _threads():
    """torch's thread count as each test found it: a sweep engine run in this process (Dask's in-process
    workers) sets it to 1, and a later guide's in-process dump then rounds otherwise than its CLI capture
    (guide-diff read 'inputs differ by 7.3e-08' in the full suite, 'identical' alone)."""
    n = torch.get_num_threads()
    yield
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


@pytest.fixture(scope="session")
def kokoro():
    """The Kokoro example module (skips when the `kokoro` extra is not installed)."""
    pytest.importorskip("kokoro", reason="needs the kokoro extra: pip install 'tensorprobe[kokoro]'")
    from tensorprobe.examples import kokoro as k

    return k
