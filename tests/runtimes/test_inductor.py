"""`compare --runtime inductor` / `aot_eager`: torch.compile as a runtime (`tensorprobe.runtimes.inductor`).
Real compiles; Inductor's C++ codegen is marked slow."""

import pytest
import torch

import tensorprobe as tp
from tests.test_compiled import LowPrecisionNorm, _net


def test_compare_aot_eager_matches_and_names_a_compile_only_bug():
    model, x = _net()
    res = tp.compare(model, x, "aot_eager")
    assert res.diff.verdict == "match" and res.first_divergence is None
    assert res.runtime_info["backend"] == "aot_eager"
    model.blocks[1].norm = LowPrecisionNorm(model.blocks[1].norm)      # float16 statistics, compiled path only
    res = tp.compare(model, x, "aot_eager")
    assert res.first_divergence == "blocks.1.norm"
    assert res.diff.get("blocks.1.norm").cause == "own"


def test_unknown_option_fails_before_anything_runs():
    model, x = _net()
    with pytest.raises(tp.InputError, match="does not take option"):
        tp.compare(model, x, "inductor", runtime_options={"fusion": "off"})


@pytest.mark.slow
def test_compare_inductor_within_noise():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv1d(4, 16, 5, padding=2), torch.nn.GroupNorm(4, 16), torch.nn.GELU(),
                                torch.nn.Conv1d(16, 4, 1)).eval()
    res = tp.compare(model, (torch.randn(1, 4, 400),), "inductor")
    assert res.diff.verdict == "match", res.summary
