"""TARGET loading (`tensorprobe.targets`): a `file.py:factory` module is a real module, importable by its name."""

import importlib
import sys
import textwrap

import pytest

import tensorprobe as tp
from tensorprobe.errors import TargetError
from tensorprobe.targets import load_target


def _write(tmp_path):
    (tmp_path / "wrapper_lib.py").write_text(textwrap.dedent("""
        import torch

        class Doubled(torch.nn.Module):
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, x):
                return 2 * self.inner(x)
    """))
    target = tmp_path / "snake_target.py"
    target.write_text(textwrap.dedent("""
        import torch
        from wrapper_lib import Doubled

        ALPHA = 0.5

        def snake(x):
            return x + torch.sin(ALPHA * x) ** 2 / ALPHA

        class Snake(torch.nn.Module):
            def forward(self, x):
                return snake(x)

        def build():
            return Doubled(Snake()), (torch.randn(2, 8),)
    """))
    return target


def test_a_target_module_is_importable_by_its_name(tmp_path):
    """dynamo imports the module of a function it inlines by name (a model from an ordinary module wrapping one
    from the TARGET file): the file's module is registered as importlib registers modules. Before, compiling it
    failed with "No module named '_tensorprobe_target_...'" and was reported as the model failing to compile."""
    tgt = load_target(f"{_write(tmp_path)}:build")
    module = sys.modules[type(tgt.model.inner).__module__]
    assert importlib.import_module(module.__name__) is module
    bundle = tp.capture(tgt.model, *tgt.args, compile=True, backend="aot_eager", out=tmp_path / "c")
    eager = tp.capture(tgt.model, *tgt.args, out=tmp_path / "e")
    assert tp.diff(eager, bundle).verdict == "match"


def test_a_target_that_fails_to_import_is_not_left_registered(tmp_path):
    bad = tmp_path / "broken_target.py"
    bad.write_text("raise RuntimeError('no')\n")
    before = set(sys.modules)
    with pytest.raises(TargetError, match="raised RuntimeError: no"):
        load_target(f"{bad}:build")
    assert not [m for m in set(sys.modules) - before if m.startswith("_tensorprobe_target_")]
