"""Fixtures of the diff tests: bundles written directly with BundleWriter (see diff_bundles.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from diff_bundles import write_bundle  # noqa: E402


@pytest.fixture
def make_bundle(tmp_path):
    counter = iter(range(1000))

    def make(items, name=None):
        return write_bundle(tmp_path / (name or f"b{next(counter)}"), items)

    return make
