"""`find_nonfinite_in_bundle` names where NaN was made, in the words of what the bundle can show (issue 27's
walk-through): at module level, the module whose own code made an input no record holds; in a port's plain
tensor dump, the record (a dump has no op).

The module-level cases are real captures of small models with a sqrt of a conv's output (negative values: NaN)
written where a user writes it: in the root's forward before a submodule that hands the value down to its own
child, in that submodule's forward, or inside the child. The truth is kept by renaming and nesting the modules
deeper, and changed by moving the sqrt from one forward to another.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn as nn

import tensorprobe as tp


class Inner(nn.Module):
    def __init__(self, where: str) -> None:
        super().__init__()
        self.lin = nn.Conv1d(8, 8, 1)
        self.where = where

    def forward(self, x):
        if self.where == "inner":
            x = torch.sqrt(x)          # made in this module's own code, before its child
        return torch.tanh(self.lin(x))


class Wrap(nn.Module):
    """A module that only hands its input down (nesting the child one level deeper)."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.body = Inner(where)

    def forward(self, x):
        return self.body(x)


class Net(nn.Module):
    def __init__(self, where: str, nested: bool = False, name: str = "post") -> None:
        super().__init__()
        torch.manual_seed(1)
        self.pre = nn.Conv1d(4, 8, 3, padding=1)
        setattr(self, name, Wrap(where) if nested else Inner(where))
        self.name = name
        self.out = nn.Conv1d(8, 1, 1)
        self.where = where

    def forward(self, x):
        h = self.pre(x)
        if self.where == "root":
            h = torch.sqrt(h)          # made in the root's own forward, handed down
        return self.out(getattr(self, self.name)(h))


def _origin(tmp_path, model, name="b"):
    x = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(0))
    return tp.find_nonfinite_in_bundle(tp.capture(model, x, out=tmp_path / name))


@pytest.mark.parametrize("nested, name", [(False, "post"), (True, "post"), (False, "stage")])
def test_a_nan_made_in_the_roots_forward_and_handed_down_is_the_roots(tmp_path, nested, name):
    """Before: "born inside it, or in the code of post that made its input" for a sqrt in <root>'s forward."""
    o = _origin(tmp_path, Net("root", nested, name))
    child = f"{name}.body.lin" if nested else f"{name}.lin"
    assert o.found and o.record == child and o.or_born_in == "the model's own forward (Net.forward)", o.headline()
    assert "in the code of the model's own forward (Net.forward) that made its input" in o.headline()
    assert any("made by the code of the model's own forward (Net.forward) itself" in d for d in o.diagnosis)


@pytest.mark.parametrize("where, said", [("root", "post or the model's own forward (Net.forward)"), ("inner", "post")])
def test_a_bundle_without_the_tag_names_every_module_that_may_have_made_the_input(tmp_path, where, said):
    """A bundle captured before `inputs_made_in:` was recorded: where post's own input was unrecorded too, the value
    may have come down from the root, and both are named; where post read a recorded value, post alone made it."""
    import json

    x = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(0))
    path = tp.capture(Net(where), x, out=tmp_path / "b").path
    manifest = json.loads((path / "manifest.json").read_text())
    for r in manifest["records"]:
        r["tags"] = [t for t in r.get("tags") or () if not t.startswith("inputs_made_in:")]
    (path / "manifest.json").write_text(json.dumps(manifest))
    o = tp.find_nonfinite_in_bundle(path)
    assert o.record == "post.lin" and o.or_born_in == said, o.headline()


@pytest.mark.parametrize("nested", [False, True])
def test_a_nan_made_in_the_submodules_forward_is_that_submodules(tmp_path, nested):
    o = _origin(tmp_path, Net("inner", nested))
    place = "post.body" if nested else "post"
    assert o.record == ("post.body.lin" if nested else "post.lin") and o.or_born_in == place, o.headline()


def test_a_nan_made_inside_the_module_whose_inputs_are_recorded_is_born_there(tmp_path):
    class Log(nn.Module):
        def forward(self, x):
            return torch.log(x)

    class Made(nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(1)
            self.pre = nn.Conv1d(4, 8, 3, padding=1)
            self.log = Log()

        def forward(self, x):
            return self.log(self.pre(x))

    o = _origin(tmp_path, Made())
    assert o.record == "log" and o.or_born_in is None and o.headline().startswith("NaN/Inf born in log"), o.headline()


def test_the_diff_of_the_healthy_model_names_the_same_module(tmp_path):
    x = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(0))
    ref = tp.capture(Net("none"), x, out=tmp_path / "ref")
    for where, place in (("root", "the model's own forward (Net.forward)"), ("inner", "post")):
        r = tp.diff(ref, tp.capture(Net(where), x, out=tmp_path / where))
        first = r.get(r.first_divergence)
        assert first.name == "post.lin" and f"made by the code of {place} itself" in first.explanation, r.summary


# ---- a port's plain tensor dump ----------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["npz", "safetensors"])
def test_a_dump_names_the_record_not_an_op_it_does_not_know(tmp_path, fmt):
    """Before: "NaN/Inf born at tensor in post"."""
    ok = np.ones((1, 8, 16), np.float32)
    bad = ok.copy()
    bad[0, 3] = np.nan
    arrays = {"encoder.conv": ok, "decoder.norm": bad, "decoder.out": np.full_like(ok, np.nan)}
    path = tmp_path / f"dump.{fmt}"
    if fmt == "npz":
        np.savez(path, **arrays)
    else:
        from safetensors.numpy import save_file
        save_file(arrays, str(path))
    o = tp.find_nonfinite_in_bundle(path)
    assert o.record == "decoder.norm"
    assert o.headline().startswith("NaN/Inf first appears in decoder.norm, the first tensor holding it in the "
                                   "file's order"), o.headline()
    assert "born at tensor" not in o.headline()


# ---- `tensorprobe nan SPEC`: a bundle, unless SPEC looks like a model TARGET -------------------------------------
def _nan_cli(*args, cwd=None):
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "tensorprobe", "nan", *map(str, args)], capture_output=True, text=True,
                       cwd=cwd, env={"COLUMNS": "160", "PATH": "/usr/bin:/bin", "HOME": "/tmp",
                                     "PYTHONWARNINGS": "ignore"})
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize("spec, msg", [
    ("notabundle", "notabundle: no such bundle (expected a directory with manifest.json, a .safetensors or a .npz "
                   "file)"),
    ("model.onnx", "model.onnx: no such bundle"),
    ("models.py", "TARGET 'models.py' must look like path/to/file.py:factory"),       # a factory hint: it is one
    ("tensorprobe.examples.kokoro", "must look like path/to/file.py:factory or package.module:factory"),
    ("emptydir", "not a tensorprobe bundle (manifest.json is missing)"),
])
def test_nan_of_a_path_that_is_no_bundle_says_so(tmp_path, spec, msg):
    """Before: `tensorprobe nan notabundle` answered "TARGET must look like file.py:factory"."""
    (tmp_path / "emptydir").mkdir()
    code, out, err = _nan_cli(spec, cwd=tmp_path)
    assert code == 2 and out == "" and msg in err and err.count("\n") == 1, err
    # a bare name may have meant a TARGET: its message says what one looks like too; a file name does not
    bare = "." not in spec and not (tmp_path / spec).exists()
    assert ("factory" in err) == (spec.endswith((".py", ".kokoro")) or bare)


def test_nan_of_a_dump_names_its_record(tmp_path):
    bad = np.ones((1, 8, 16), np.float32)
    bad[0, 3] = np.nan
    np.savez(tmp_path / "port_dump.npz", pre=np.ones_like(bad), post=bad, out=np.full_like(bad, np.nan))
    code, out, _ = _nan_cli(tmp_path / "port_dump.npz")
    assert code == 1 and "NaN/Inf first appears in post, the first tensor holding it" in out, out
