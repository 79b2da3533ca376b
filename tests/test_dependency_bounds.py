"""The set-up the README promises holds together: CI runs the README's test command, that command installs the
versions in constraints/newest.txt, and the two constraints files agree with pyproject.toml's bounds (newest.txt
inside them, oldest.txt at their lower ends), so moving a bound without moving the file that was run fails here.
How to move them: docs/CONTRIBUTING.md, "Dependency versions"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from .docs.runner import REPO, parse

tomllib = pytest.importorskip("tomllib")   # Python 3.11+


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    return pins


def _test_command() -> str:
    return parse((REPO / "README.md").read_text(encoding="utf-8"))[1].code.strip()


def _requirements() -> list[Requirement]:
    """tensorprobe's own requirements and those of every extra the README's test command installs."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras = re.search(r'-e "\.\[([a-z,]+)\]"', _test_command()).group(1).split(",")
    return [Requirement(r) for r in project["dependencies"]] + [
        Requirement(r) for extra in extras for r in project["optional-dependencies"][extra]]


def test_ci_runs_the_readme_test_command_with_the_newest_constraints():
    command = _test_command()
    assert command in (REPO / ".ci" / "run").read_text()
    assert "-c constraints/newest.txt" in command


def test_the_versions_run_lie_within_the_bounds():
    newest, oldest = _pins(REPO / "constraints" / "newest.txt"), _pins(REPO / "constraints" / "oldest.txt")
    for req in _requirements():
        name = canonicalize_name(req.name)
        if name == "torch":
            continue   # given on the command line (torch==2.13.0), a build with a local version label
        assert req.specifier.contains(newest[name]), f"constraints/newest.txt: {name} {newest[name]} not in {req}"
        lower = [s.version for s in req.specifier if s.operator in (">=", "==")]
        assert lower, f"pyproject.toml: {req} has no lower bound"
        assert oldest.get(name) is not None, f"constraints/oldest.txt lacks {name}"
        assert Version(oldest[name]) == Version(lower[0]), (
            f"constraints/oldest.txt: {name} {oldest[name]}, but pyproject.toml's lower bound is {lower[0]}")
