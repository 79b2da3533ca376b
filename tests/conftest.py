"""Shared fixtures. Tests mirror the package layout; slow ones (full Kokoro decoder) are marked `slow`."""

from __future__ import annotations

import pytest
import torch


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
