"""Per-component isolation, run for real in TVM and ExecuTorch (and in PyTorch float16 for composition)."""

from __future__ import annotations

import pytest
import torch

from tensorprobe.runtimes.components import STATUS_NONFINITE, STATUS_OK, isolate_components

from ._export_models import Net  # noqa: E402


def _runtime_or_skip(name: str, package: str, extra: str):
    pytest.importorskip(package, reason=f"needs the {extra} extra: pip install 'tensorprobe[{extra}]'")
    from tensorprobe.runtimes import get_runtime

    return get_runtime(name)


@pytest.mark.parametrize("name,package,extra", [
    pytest.param("tvm", "tvm", "tvm", marks=pytest.mark.tvm),
    pytest.param("executorch", "executorch", "executorch", marks=pytest.mark.executorch),
])
def test_bisects_down_to_the_instance_norm(name, package, extra):
    adapter = _runtime_or_skip(name, package, extra)
    model, x = Net().eval(), torch.randn(1, 16, 400, generator=torch.Generator().manual_seed(0))
    report = isolate_components(model, (x,), adapter.run_module)
    # root fails -> blocks.0 fails (blocks.1 passes on its recorded, already-normalised input) -> its norm.
    assert [c.path for c in report.culprits] == ["blocks.0.norm"]
    culprit = report.culprits[0]
    assert culprit.status == STATUS_NONFINITE and culprit.nonfinite_channels == (4, 6, 8)
    status = {c.path: c.status for c in report.checked}
    assert status["pre"] == status["post"] == status["blocks.1"] == status["blocks.0.act"] == STATUS_OK
    assert report.composition == ()


class _Product(torch.nn.Module):
    """Each branch alone is fine in float16; their product (the parent's own op) overflows."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)
        with torch.no_grad():
            for m in (self.a, self.b):
                m.weight.copy_(torch.eye(8) * 300)
                m.bias.zero_()

    def forward(self, x):
        return self.a(x) * self.b(x)


def _float16(module, inputs):
    """A real second 'runtime': PyTorch itself in half precision."""
    import copy

    with torch.no_grad():
        return [copy.deepcopy(module).half()(*[t.half() for t in inputs]).float().numpy()]


def test_each_component_works_the_whole_does_not():
    report = isolate_components(_Product(), (torch.ones(1, 8),), _float16)
    assert [c.path for c in report.culprits] == [""]
    assert report.composition == ("",)
    assert {c.path: c.status for c in report.checked} == {"": STATUS_NONFINITE, "a": STATUS_OK, "b": STATUS_OK}
    assert report.to_dict()["composition"] == ["<root>"]
