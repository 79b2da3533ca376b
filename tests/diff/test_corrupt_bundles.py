"""A bundle whose stored values disagree with the statistics recorded for them is corrupt: `diff` says so in one
line naming the file and the record (exit 2), never a NaN finding "(0 NaN, 0 ±Inf)" (issue 27's walk-through).

The bundles are real captures of a small conv + log model; the corruption is what a damaged disk or a careless
edit does to a shard: bytes overwritten. The truth is kept by a real NaN (the model's own log of negative
values), which stays a finding, and by a shard rewritten with its own bytes, which stays a match.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn

import tensorprobe as tp
from tensorprobe import BundleError
from tensorprobe.bundle.format import read_safetensors_header

LOG = "<root>/log.0"


class ConvLog(nn.Module):
    """conv -> tanh -> conv -> log(x + shift): finite for shift 2, NaN where the conv goes below -shift."""

    def __init__(self, shift: float = 2.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.pre = nn.Conv1d(1, 8, 5, padding=2)
        self.out = nn.Conv1d(8, 1, 3, padding=1)
        self.shift = shift

    def forward(self, x):
        return torch.log(self.out(torch.tanh(self.pre(x))) + self.shift)


def _capture(root, name, shift=2.0):
    x = torch.randn(1, 1, 256, generator=torch.Generator().manual_seed(1))
    return tp.capture(ConvLog(shift), x, out=root / name, level="op", keep="full")


def _overwrite(bundle_dir, record, values: np.ndarray, at: int = 0) -> None:
    """Write float32 `values` over `record`'s stored bytes from element `at` on (the shard's header is untouched)."""
    shard = bundle_dir / "tensors-00000.safetensors"
    header, data_start = read_safetensors_header(shard)
    begin = data_start + header[record]["data_offsets"][0] + 4 * at
    raw = bytearray(shard.read_bytes())
    raw[begin:begin + 4 * len(values)] = values.astype(np.float32).tobytes()
    shard.write_bytes(bytes(raw))


def run_cli(*args):
    p = subprocess.run([sys.executable, "-m", "tensorprobe", *map(str, args)], capture_output=True, text=True,
                       env={"COLUMNS": "160", "PATH": "/usr/bin:/bin", "HOME": "/tmp", "PYTHONWARNINGS": "ignore"})
    return p.returncode, p.stdout, p.stderr


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("corrupt")
    ref = _capture(root, "ref")
    same = _capture(root, "same")
    return root, ref.path, same.path


@pytest.mark.parametrize("how", ["all_nan", "three_inf", "nan_in_the_middle"])
@pytest.mark.parametrize("side", ["candidate", "reference"])
def test_values_that_disagree_with_their_statistics_are_a_corrupt_bundle_not_a_finding(bundles, tmp_path, how, side):
    """Before: "NaN/Inf born here ... log is the first record holding non-finite values (0 NaN, 0 ±Inf)", exit 1."""
    _, ref, same = bundles
    broken = tmp_path / "broken"
    shutil.copytree(same, broken)
    n = tp.Bundle.open(broken)[LOG].stats.numel
    values, at = {"all_nan": (np.full(n, np.nan), 0), "three_inf": (np.full(3, np.inf), 7),
                  "nan_in_the_middle": (np.array([np.nan]), n // 2)}[how]
    _overwrite(broken, LOG, values, at)
    pair = (ref, broken) if side == "candidate" else (broken, ref)
    with pytest.raises(BundleError) as err:
        tp.diff(*pair)
    msg = str(err.value)
    assert msg.startswith(str(broken / "tensors-00000.safetensors")) and repr(LOG) in msg
    assert f"hold {len(values):,} NaN/Inf element" in msg and "recorded at capture count 0" in msg
    code, out, stderr = run_cli("diff", *pair)
    assert code == 2 and out == "" and stderr.count("\n") == 1 and "corrupt tensor" in stderr, stderr
    assert "Traceback" not in stderr


def test_a_nan_the_model_makes_stays_a_finding_and_a_shard_rewritten_with_its_own_bytes_a_match(bundles, tmp_path):
    root, ref, same = bundles
    real_nan = _capture(root, "real_nan", shift=0.0)
    r = tp.diff(ref, real_nan)       # its log's input moved below zero: NaN the model really makes
    assert r.verdict == "diverged" and r.get(LOG).metric("nonfinite_cand_only") > 0, r.summary
    assert run_cli("diff", ref, real_nan.path)[0] == 1
    rewritten = tmp_path / "rewritten"
    shutil.copytree(same, rewritten)
    _overwrite(rewritten, LOG, tp.Bundle.open(same).numpy(LOG).ravel())
    assert tp.diff(ref, rewritten).verdict == "match"


def test_a_real_nan_whose_count_was_changed_is_corrupt_too(bundles, tmp_path):
    """The NaN count must agree, not only finiteness: one more NaN in a record that holds some already."""
    root, _, _ = bundles
    real_nan = _capture(root, "nan_source", shift=0.0)
    broken = tmp_path / "more_nan"
    shutil.copytree(real_nan.path, broken)
    values = tp.Bundle.open(broken).numpy(LOG).ravel()
    finite_at = int(np.flatnonzero(np.isfinite(values))[0])
    _overwrite(broken, LOG, np.array([np.nan]), finite_at)
    recorded = tp.Bundle.open(broken)[LOG].stats.nonfinite
    with pytest.raises(BundleError, match=rf"hold {recorded + 1:,} NaN/Inf elements where the statistics recorded "
                                          rf"at capture count {recorded:,}"):
        tp.diff(real_nan, broken)
