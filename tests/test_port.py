"""The port's side: dumps from NumPy and a real MLX port of a Kokoro block, lined up with PyTorch."""

from __future__ import annotations

import numpy as np
import pytest

from tensorprobe.bundle import Bundle
from tensorprobe.errors import InputError
from tensorprobe.port import Recorder, dump


def test_recorder_keeps_call_order_and_names_repeated_calls(tmp_path):
    rec = Recorder()
    for name in ["z.last_name_first", "a.second", "z.last_name_first"]:
        rec(name, np.full((1, 2, 3), len(rec.names), np.float32))
    b = Bundle.open(rec.save(tmp_path / "port.safetensors"))
    assert [r.name for r in sorted(b, key=lambda r: r.order)] == ["z.last_name_first", "a.second",
                                                                   "z.last_name_first@1"]
    assert b.numpy("z.last_name_first@1")[0, 0, 0] == 2


def test_dump_statistics_see_nonfinite_channels(tmp_path):
    x = np.zeros((1, 4, 10), np.float32)
    x[0, 2] = np.nan
    b = Bundle.open(dump(tmp_path / "d.safetensors", norm=x))
    assert b["norm"].stats.nan == 10 and not b["norm"].stats.all_finite


def test_unsupported_dtype_is_a_clear_error(tmp_path):
    with pytest.raises(InputError, match="complex64"):
        dump(tmp_path / "c.safetensors", z=np.zeros(3, np.complex64))


@pytest.fixture
def mlx_port(kokoro):
    pytest.importorskip("mlx.core", reason="needs the mlx extra: pip install 'tensorprobe[mlx]'")
    from tensorprobe.examples import mlx_port

    return mlx_port


@pytest.mark.mlx
def test_mlx_port_lines_up_with_pytorch_by_name(mlx_port, tmp_path):
    from tensorprobe.capture import capture
    from tensorprobe.diff import diff

    block, x, s = mlx_port.reference_block()
    mlx_port.run_port(block, x, s, str(tmp_path / "port.safetensors"))
    ref = capture(block, x, s, level="module", keep="full", out=tmp_path / "ref")
    report = diff(ref, Bundle.open(tmp_path / "port.safetensors"), atol=1e-4, rtol=1e-4)
    assert len(report.pairs) == 25 and all(p.match == "name" for p in report.pairs)  # no rules needed
    assert report.passed and report.first_divergence is None, report.summary


@pytest.mark.mlx
def test_mlx_port_bug_is_located_at_its_first_layer(mlx_port, tmp_path):
    from tensorprobe.capture import capture
    from tensorprobe.diff import diff

    block, x, s = mlx_port.reference_block()
    mlx_port.run_port(block, x, s, str(tmp_path / "bug.safetensors"), bug="weight_v")
    ref = capture(block, x, s, level="module", keep="full", out=tmp_path / "ref")
    report = diff(ref, tmp_path / "bug.safetensors", atol=1e-4, rtol=1e-4)
    # weight_v loaded without the weight-norm scale, in convs2 only: everything before convs2.0 matches.
    assert report.first_divergence == "convs2.0"
    passed = {p.name for p in report.pairs if p.status == "pass"}
    assert {"adain1.0", "convs1.0", "adain2.0.norm", "adain2.0"} <= passed
