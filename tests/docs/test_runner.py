"""The guide runner itself: which blocks it runs, how it compares output, how a failure reads."""

from __future__ import annotations

import pytest

from .runner import GuideRun, check, match, parse

GUIDE = '''# A guide

```bash
echo hello
```

```text
hello
```

Some words.

```text
an illustration, not an output
```

<!-- not-run: needs a GPU -->
```python
import cuda_thing
```

<!-- requires: no_such_extra_xyz -->
<!-- slow -->
```python
x = 1
print(x + 1)
```

<!-- tolerance: 5% -->
```text
2.0
```

```json
{"not": "run"}
```
'''


def test_parse_pairs_outputs_and_directives():
    blocks = parse(GUIDE)
    assert [(b.lang, b.line) for b in blocks] == [("bash", 3), ("python", 18), ("python", 24)]
    assert blocks[0].expected == "hello" and blocks[0].expected_line == 7
    assert blocks[1].not_run == "needs a GPU" and blocks[1].expected is None
    assert blocks[2].requires == ["no_such_extra_xyz"] and blocks[2].slow and blocks[2].tolerance == 0.05
    assert blocks[2].expected == "2.0"


def test_match_exact_ellipsis_and_tolerance():
    assert match("a\nb  \n", "a\nb") is None                        # trailing spaces and blank ends dropped
    assert match("a\nb", "a\nc") is not None
    assert match("a long line\nwrapped", "a long\nline wrapped") is None          # rich's wrapping is the terminal's
    assert match("a b", "ab") is not None
    assert match("source: .../kokoro.py:129", "source: /x/y/kokoro.py:129") is None
    assert match("start\n...\nend", "start\n1\n2\n3\nend") is None    # ... spans lines
    assert match("took 6.56s", "took 7.01s") is not None                # exact without a tolerance
    assert match("took 6.56s", "took 6.80s", 0.05) is None
    assert "7.50 where the guide shows 6.56" in match("took 6.56s", "took 7.50s", 0.05)


def test_bash_exit_1_is_a_finding_2_fails(tmp_path):
    run = GuideRun(tmp_path)
    assert run._bash("echo found; exit 1") == "found\n"
    with pytest.raises(AssertionError, match="exit status 2"):
        run._bash("echo bad >&2; exit 2\necho never")
    with pytest.raises(AssertionError, match="exit status 127"):
        run._bash("no_such_command_xyz")


def test_python_blocks_share_a_namespace_and_a_failure_names_the_line(tmp_path):
    blocks = parse("```python\nx = 41\n```\n\n```python\nprint(x + 1)\n```\n\n```text\n43\n```\n")
    run = GuideRun(tmp_path)
    check("g.md", blocks[0], run)
    with pytest.raises(AssertionError, match=r"g\.md:5: the output differs") as e:
        check("g.md", blocks[1], run)
    assert "-43" in str(e.value) and "+42" in str(e.value)


def test_console_blocks_run_their_commands_and_compare_the_rest(tmp_path):
    blocks = parse("```console\n$ echo one\none\n$ echo two\ntwo\n```\n")
    check("g.md", blocks[0], GuideRun(tmp_path))


def test_each_guide_imports_its_own_copy_of_examples(tmp_path):
    blocks = parse("```python\nfrom examples import where\nprint(where.NAME)\n```\n")
    printed = []
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        run = GuideRun(tmp_path / name)
        (tmp_path / name / "examples").mkdir(exist_ok=True)
        (tmp_path / name / "examples" / "__init__.py").write_text("")
        (tmp_path / name / "examples" / "where.py").write_text(f"NAME = {name!r}\n")
        printed.append(run.run(blocks[0]).strip())
    assert printed == ["first", "second"]
