"""Load a TARGET: a factory returning `(model, inputs)`.

    path/to/file.py:factory         a file anywhere (its directory is put first on sys.path while importing)
    package.module:factory          an importable module, e.g. tensorprobe.examples.kokoro:faulty_decoder

The factory takes no arguments and returns `(model, inputs)`, where `inputs` is a tuple/list of
positional inputs, a dict of keyword inputs, or a single tensor:

    # my_port.py
    def build():
        model = MyDecoder().eval()
        return model, (torch.randn(1, 512, 40), torch.zeros(1, 80))

    $ tensorprobe nan my_port.py:build
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .errors import TargetError, TensorprobeError


@dataclass
class Target:
    spec: str
    model: torch.nn.Module
    args: tuple
    kwargs: dict

    def describe(self) -> dict[str, Any]:
        return {"target": self.spec, "class": type(self.model).__name__,
                "parameters": sum(p.numel() for p in self.model.parameters())}


def load_target(spec: str) -> Target:
    """Import `spec` (`file.py:factory` or `pkg.module:factory`), call the factory, check what it returns."""
    return _check_result(spec, call_factory(spec))


@dataclass
class TrainingStep:
    """A training-step TARGET: `loss = loss_fn(model(*args))`, then `loss.backward()`."""

    spec: str
    model: torch.nn.Module
    args: tuple
    loss_fn: Any


def load_training_step(spec: str) -> TrainingStep:
    """Import `spec` and check that its factory returns `(model, inputs, loss_fn)`."""
    result = call_factory(spec)
    if not (isinstance(result, (tuple, list)) and len(result) == 3):
        raise TargetError(f"TARGET {spec!r}: a training step's factory must return (model, inputs, loss_fn), got "
                          + (f"{len(result)} values" if isinstance(result, (tuple, list)) else type(result).__name__))
    model, inputs, loss_fn = result
    step = _check_result(spec, (model, inputs))
    if step.kwargs:
        raise TargetError(f"TARGET {spec!r}: a training step takes positional inputs (a tuple), not a dict")
    if not callable(loss_fn):
        raise TargetError(f"TARGET {spec!r}: loss_fn is a {type(loss_fn).__name__}, not callable")
    return TrainingStep(spec, step.model, step.args, loss_fn)


def call_factory(spec: str) -> Any:
    """Import `spec` (`file.py:factory` or `pkg.module:factory`) and return what its factory returns."""
    if ":" not in spec:
        raise TargetError(f"TARGET {spec!r} must look like path/to/file.py:factory or package.module:factory")
    where, _, attr = spec.rpartition(":")
    factory = getattr(_import(where, spec), attr, None)
    if factory is None:
        raise TargetError(f"TARGET {spec!r}: {where} has no attribute {attr!r}")
    if not callable(factory):
        raise TargetError(f"TARGET {spec!r}: {attr!r} is not callable")
    try:
        return factory()
    except TensorprobeError:
        raise
    except Exception as e:
        raise TargetError(f"TARGET {spec!r}: the factory raised {type(e).__name__}: {e}") from None


def _import(where: str, spec: str):
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where)
        if not path.is_file():
            raise TargetError(f"TARGET {spec!r}: no such file {where}")
        name = f"_tensorprobe_target_{abs(hash(str(path.resolve())))}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise TargetError(f"TARGET {spec!r}: can't import {where}")
        module = importlib.util.module_from_spec(module_spec)
        # registered as importlib's recipe does: code that imports the module by its name meets it there (dynamo
        # does, to read the globals of a function it inlines: "No module named '_tensorprobe_target_...'")
        sys.modules[name] = module
        sys.path.insert(0, str(path.resolve().parent))
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:
            sys.modules.pop(name, None)
            raise TargetError(f"TARGET {spec!r}: importing {where} raised {type(e).__name__}: {e}") from None
        finally:
            sys.path.pop(0)
        return module
    try:
        return importlib.import_module(where)
    except TensorprobeError:
        raise
    except Exception as e:
        raise TargetError(f"TARGET {spec!r}: can't import module {where!r} ({type(e).__name__}: {e})") from None


def _check_result(spec: str, result: Any) -> Target:
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
        raise TargetError(f"TARGET {spec!r}: the factory must return (model, inputs), got {type(result).__name__}")
    model, inputs = result
    if not isinstance(model, torch.nn.Module):
        raise TargetError(f"TARGET {spec!r}: the factory's model is a {type(model).__name__}, not a torch.nn.Module")
    if isinstance(inputs, torch.Tensor):
        return Target(spec, model, (inputs,), {})
    if isinstance(inputs, dict):
        return Target(spec, model, (), dict(inputs))
    if isinstance(inputs, (tuple, list)):
        return Target(spec, model, tuple(inputs), {})
    raise TargetError(f"TARGET {spec!r}: inputs must be a tensor, a tuple/list or a dict, got {type(inputs).__name__}")
