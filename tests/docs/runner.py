"""Run a guide's code blocks as written and compare what they print with what the guide shows.

The convention (docs/CONTRIBUTING.md, "Executable docs"):

- ```` ```bash ```` blocks run in `bash` in one temporary directory per guide (the repository's `examples/`
  copied into it), so `tensorprobe capture ... -o ref` in one block and `tensorprobe show ref` in the next
  see the same files. Exit 0 and 1 (a finding) are normal; any other exit status fails the block.
- ```` ```console ```` blocks hold `$ command` lines followed by what the command prints.
- ```` ```python ```` blocks run in one namespace per guide (a fresh one for each guide), in the same
  directory; what they print to stdout is their output.
- A ```` ```text ```` block that follows a runnable block with only blank lines between is its expected
  output. `...` in it matches anything (a path, a time, a line of a long table), as doctest's ELLIPSIS; every
  other character is compared exactly, with runs of whitespace (line breaks included) compared as one space,
  as doctest's NORMALIZE_WHITESPACE: where a long line wraps depends on the terminal.
- HTML comments on the lines right before a block change how it runs:
  `<!-- not-run: REASON -->` (shown, never run: the reason is said in the test report),
  `<!-- requires: EXTRA -->` (skipped, with the reason, when the extra's package is missing),
  `<!-- slow -->` (runs as its own test marked `slow`, in a fresh directory and namespace),
  `<!-- tolerance: 10% -->` before an output block (each number in it compared within that relative
  tolerance: figures that depend on the machine or on the library version's rounding).
- Other blocks (```` ```json ````, no language, ...) are illustrations and are not run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
EXAMPLES = REPO / "examples"

RUNNABLE = {"bash", "sh", "shell", "console", "python", "py"}
OUTPUT = {"text", "output"}
# an extra's name -> the package that proves it is installed
EXTRA_MODULES = {"kokoro": "kokoro", "onnx": "onnxruntime", "executorch": "executorch", "tvm": "tvm",
                 "mlx": "mlx", "ray": "ray", "dask": "dask", "train": "lightning", "lightning": "lightning",
                 "transformers": "transformers"}

_FENCE = re.compile(r"^(`{3,}|~{3,})\s*([\w+-]*)[^`]*$")
_DIRECTIVE = re.compile(r"^<!--\s*(not-run|requires|slow|tolerance)\s*(?::\s*(.*?))?\s*-->$")
_NUMBER = r"[-+]?(?:\d[\d,]*)?\.?\d+(?:[eE][-+]?\d+)?"


@dataclasses.dataclass
class Block:
    lang: str
    code: str
    line: int                                    # 1-based line of the opening fence
    expected: str | None = None                  # the output block that follows, if any
    expected_line: int | None = None
    not_run: str | None = None
    requires: list[str] = dataclasses.field(default_factory=list)
    slow: bool = False
    tolerance: float | None = None


def parse(text: str) -> list[Block]:
    """The runnable blocks of a markdown text, each with its directives and the output block after it."""
    lines = text.splitlines()
    raw: list[tuple[str, str, int, dict, int]] = []     # lang, code, line, directives, closing line index
    pending: dict = {}
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        m = _DIRECTIVE.match(stripped)
        if m:
            pending.setdefault(m.group(1), m.group(2) or "")
            i += 1
            continue
        f = _FENCE.match(lines[i].rstrip())        # fences at the start of a line (not inside a list item)
        if f:
            fence, lang = f.group(1), f.group(2).lower()
            j = i + 1
            while j < len(lines) and not lines[j].strip().startswith(fence):
                j += 1
            raw.append((lang, "\n".join(lines[i + 1:j]), i + 1, pending, j))
            pending = {}
            i = j + 1
            continue
        if stripped:
            pending = {}
        i += 1

    blocks: list[Block] = []
    previous: tuple | None = None
    for lang, code, line, directives, end in raw:
        follows_runnable = previous is not None and previous[0] in RUNNABLE and all(
            not s.strip() or _DIRECTIVE.match(s.strip()) for s in lines[previous[4] + 1: line - 1])
        previous = (lang, code, line, directives, end)
        if lang in OUTPUT and follows_runnable and blocks[-1].expected is None:
            blocks[-1].expected, blocks[-1].expected_line = code, line
            if "tolerance" in directives:
                blocks[-1].tolerance = float(directives["tolerance"].rstrip("%")) / 100
        elif lang in RUNNABLE:
            blocks.append(Block(lang=lang, code=code, line=line,
                                not_run=directives.get("not-run") if "not-run" in directives else None,
                                requires=[r.strip() for r in directives.get("requires", "").split(",") if r.strip()],
                                slow="slow" in directives))
    return blocks


def _normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines()).strip("\n")


def match(expected: str, actual: str, tolerance: float | None = None) -> str | None:
    """None when `actual` is what `expected` shows (`...` matches anything; numbers within `tolerance`
    when given), else a sentence saying what differs."""
    # whitespace runs compare as one space (doctest's NORMALIZE_WHITESPACE): where rich wraps a long line
    # depends on the terminal, not on what the command says
    expected, actual = " ".join(expected.split()), " ".join(actual.split())
    pattern = []
    numbers: list[str] = []
    for k, part in enumerate(expected.split("...")):
        if k:
            pattern.append(r".*?")
        if tolerance is None:
            pattern.append(re.escape(part))
            continue
        pos = 0
        for n in re.finditer(_NUMBER, part):
            pattern.append(re.escape(part[pos:n.start()]))
            pattern.append(f"({_NUMBER})")
            numbers.append(n.group())
            pos = n.end()
        pattern.append(re.escape(part[pos:]))
    m = re.fullmatch("".join(pattern), actual, flags=re.DOTALL)
    if m is None:
        return "the output differs from the guide's"
    for want, got in zip(numbers, m.groups()):
        w, g = float(want.replace(",", "")), float(got.replace(",", ""))
        if abs(g - w) > tolerance * max(abs(w), 1e-12):
            return f"{got} where the guide shows {want} (beyond {tolerance:.0%})"
    return None


def missing_extras(block: Block) -> list[str]:
    return [e for e in block.requires if importlib.util.find_spec(EXTRA_MODULES.get(e, e)) is None]


class GuideRun:
    """One guide's shared state: its working directory and Python namespace."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.namespace: dict = {"__name__": "__guide__"}
        # Python blocks run in this process: forget the `examples` package another guide imported from its own
        # (now deleted) directory, so `from examples import ...` reads this guide's copy
        for name in [n for n in sys.modules if n == "examples" or n.startswith("examples.")]:
            del sys.modules[name]
        importlib.invalidate_caches()
        if EXAMPLES.is_dir():
            shutil.copytree(EXAMPLES, workdir / "examples", dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
        bindir = str(Path(sys.executable).parent)
        self.env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
                        PYTHONPATH=os.pathsep.join(p for p in (str(workdir), os.environ.get("PYTHONPATH")) if p))

    def run(self, block: Block) -> str:
        """Run one block; return what it printed. Raises AssertionError with the reason when it fails."""
        if block.lang == "python" or block.lang == "py":
            return self._python(block)
        if block.lang == "console":
            return self._console(block)
        return self._bash(block.code)

    def _bash(self, script: str) -> str:
        # exit 1 is a finding (what most guide commands show); 2 and above is bad input or a crash
        guarded = "trap 'rc=$?; if [ $rc -gt 1 ]; then exit $rc; fi' ERR\nset -o pipefail -o errtrace\n" + script
        proc = subprocess.run(["bash", "-c", guarded], cwd=self.workdir, env=self.env, capture_output=True,
                              text=True, timeout=900)
        out = proc.stdout + proc.stderr
        if proc.returncode > 1:
            raise AssertionError(f"exit status {proc.returncode}:\n{out}")
        return out

    def _console(self, block: Block) -> str:
        commands = [line[2:] for line in block.code.splitlines() if line.startswith("$ ")]
        return "".join(self._bash(c) for c in commands)

    def _python(self, block: Block) -> str:
        out = io.StringIO()
        cwd = os.getcwd()
        os.chdir(self.workdir)
        sys.path.insert(0, str(self.workdir))
        try:
            with contextlib.redirect_stdout(out):
                exec(compile(block.code, f"<guide block at line {block.line}>", "exec"), self.namespace)
        except Exception:
            raise AssertionError(f"the block raised:\n{traceback.format_exc(limit=-3)}\nprinted:\n{out.getvalue()}")
        finally:
            os.chdir(cwd)
            sys.path.remove(str(self.workdir))
        return out.getvalue()


def console_expected(block: Block) -> str | None:
    """A console block's expected output: its lines that are not `$ command` lines."""
    if block.lang != "console":
        return block.expected
    lines = [line for line in block.code.splitlines() if not line.startswith("$ ")]
    return "\n".join(lines) if any(s.strip() for s in lines) else None


def check(guide: str, block: Block, run: GuideRun) -> None:
    """Run a block and compare its output with the guide's; a failure names the guide's line and the diff."""
    where = f"{guide}:{block.line}"
    try:
        actual = run.run(block)
    except AssertionError as e:
        raise AssertionError(f"{where}: ```{block.lang} block failed: {e}\n--- block ---\n{block.code}") from None
    expected = console_expected(block)
    if expected is None:
        return
    problem = match(expected, actual, block.tolerance)
    if problem:
        import difflib

        diff = "\n".join(difflib.unified_diff(_normalise(expected).splitlines(), _normalise(actual).splitlines(),
                                              "guide", "printed", lineterm=""))
        raise AssertionError(f"{where}: {problem} (output block at line {block.expected_line or block.line}):\n"
                             f"{diff}\n--- printed ---\n{actual}")
