"""Every guide in docs/ runs as written: its bash, console and Python blocks are executed in order and what
they print is compared with the output the guide shows (convention: tests/docs/runner.py and
docs/CONTRIBUTING.md, "Executable docs"). Blocks marked `<!-- slow -->` run as their own test, marked slow."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

from .runner import DOCS, REPO, GuideRun, check, missing_extras, parse

# Guides not yet rewritten to run as written (issue 32 item 1): skipped with this reason until they are.
NOT_YET: set[str] = set()


def _cases():
    for guide in sorted(DOCS.glob("guide-*.md")):
        yield pytest.param(guide.name, None, id=guide.stem)
        if guide.name in NOT_YET:
            continue
        for block in parse(guide.read_text(encoding="utf-8")):
            if block.slow:
                yield pytest.param(guide.name, block.line, id=f"{guide.stem}:{block.line}", marks=pytest.mark.slow)


def _readme_cases():
    yield pytest.param(None, id="README")
    for block in parse((REPO / "README.md").read_text(encoding="utf-8")):
        if block.slow:
            yield pytest.param(block.line, id=f"README:{block.line}", marks=pytest.mark.slow)


@pytest.mark.parametrize("line", list(_readme_cases()))
def test_readme_runs_as_written(line):
    """The README's examples run as written too. It opens with its two set-up commands (they install
    packages: shown, not run, each saying why); the demo's output is a slow block."""
    blocks = parse((REPO / "README.md").read_text(encoding="utf-8"))
    assert [b.not_run is not None for b in blocks[:2]] == [True, True], "the README opens with the two set-up commands"
    workdir = Path(tempfile.mkdtemp(prefix="tpdoc-"))
    try:
        _run_blocks("README.md", line, blocks, GuideRun(workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.parametrize(("guide", "line"), list(_cases()))
def test_guide_runs_as_written(guide, line):
    if guide in NOT_YET:
        pytest.skip(f"{guide} is not executable yet (issue 32 item 1)")
    text = (DOCS / guide).read_text(encoding="utf-8")
    blocks = parse(text)
    first_fence = next(n for n, line in enumerate(text.splitlines(), 1) if line.startswith("```"))
    assert blocks and blocks[0].line == first_fence and not blocks[0].slow and blocks[0].not_run is None, (
        f"{guide}: the guide opens with a runnable example (its first code block, run in every test run)")
    # a short directory: the guides' tables show source paths, which rich truncates past the terminal width
    workdir = Path(tempfile.mkdtemp(prefix="tpdoc-"))
    try:
        _run_blocks(guide, line, blocks, GuideRun(workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _run_blocks(guide, line, blocks, run):
    skipped = []
    selected = [b for b in blocks if b.line == line] if line is not None else [b for b in blocks if not b.slow]
    for block in selected:
        if block.not_run is not None:
            assert block.not_run.strip(), f"{guide}:{block.line}: a not-run block must say why (<!-- not-run: REASON -->)"
            continue
        missing = missing_extras(block)
        if missing:
            skipped.append(f"line {block.line} needs {', '.join(missing)}, not installed")
            continue
        try:
            check(guide, block, run)
        except AssertionError as e:                # the guide's line, the diff and the output; no runner traceback
            failure = str(e)
        else:
            continue
        pytest.fail(failure, pytrace=False)
    if skipped:
        pytest.skip(f"{guide}: the other blocks ran as written; " + "; ".join(skipped))
