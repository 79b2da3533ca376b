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


@pytest.fixture(scope="session")
def kokoro():
    """The Kokoro example module (skips when the `kokoro` extra is not installed)."""
    pytest.importorskip("kokoro", reason="needs the kokoro extra: pip install 'tensorprobe[kokoro]'")
    from tensorprobe.examples import kokoro as k

    return k
