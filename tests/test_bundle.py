import json
import os

import numpy as np
import pytest
import safetensors.torch
import torch

from tensorprobe import Bundle, BundleError, capture
from tensorprobe.bundle import JOURNAL, MANIFEST, BundleWriter
from tensorprobe.record import Record
from tensorprobe.stats import compute_stats


def _rec(name, t, order=0):
    return Record(name=name, module=name, op="test", order=order, shape=tuple(t.shape), dtype="float32",
                  stats=compute_stats(t))


def test_roundtrip_and_sharding(tmp_path):
    tensors = {f"layer{i}": torch.randn(64, 64) for i in range(10)}
    with BundleWriter(tmp_path / "b", shard_bytes=3 * 64 * 64 * 4) as w:
        for i, (k, t) in enumerate(tensors.items()):
            w.add(_rec(k, t, i), t)
    b = Bundle.open(tmp_path / "b")
    assert b.complete and len(b) == 10
    shards = sorted(p.name for p in (tmp_path / "b").glob("tensors-*.safetensors"))
    assert len(shards) == 4  # 3 + 3 + 3 + 1 tensors
    for k, t in tensors.items():
        assert torch.equal(b.tensor(k), t)
    assert not (tmp_path / "b" / JOURNAL).exists()


class Boom(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4)
        self.b = torch.nn.Linear(4, 4)

    def forward(self, x):
        x = self.b(self.a(x))
        raise RuntimeError("kernel exploded at step 3")


def test_forward_that_raises_leaves_incomplete_readable_bundle(tmp_path):
    with pytest.raises(RuntimeError, match="kernel exploded"):
        capture(Boom(), torch.randn(2, 4), level="op", keep="full", out=tmp_path / "crash")
    b = Bundle.open(tmp_path / "crash")
    assert not b.complete
    assert b.error["type"] == "RuntimeError" and "kernel exploded" in b.error["message"]
    names = [r.name for r in b]
    assert names == ["input.0", "a/addmm.0", "b/addmm.0"]
    assert b.tensor("b/addmm.0").shape == (2, 4)


def test_killed_capture_recovered_from_journal(tmp_path):
    w = BundleWriter(tmp_path / "k", shard_bytes=1)  # flush after every tensor
    for i in range(3):
        t = torch.full((4,), float(i))
        w.add(_rec(f"r{i}", t, i), t)
    w._shard_writer.finish()  # the shards reached the disk...
    w._journal.flush()  # ...and the process "dies" here: no close(), manifest still says running
    b = Bundle.open(tmp_path / "k")
    assert not b.complete and "did not finish" in b.error["message"]
    assert [r.name for r in b] == ["r0", "r1", "r2"]
    assert float(b.tensor("r2")[0]) == 2.0


def test_corrupt_manifest_is_one_clear_error(tmp_path):
    capture(torch.nn.Linear(3, 3), torch.randn(1, 3), out=tmp_path / "c")
    (tmp_path / "c" / MANIFEST).write_text("{not json")
    with pytest.raises(BundleError, match=r"manifest\.json: corrupt manifest"):
        Bundle.open(tmp_path / "c")


def test_truncated_shard_names_the_file(tmp_path):
    capture(torch.nn.Linear(3, 3), torch.randn(1, 3), keep="full", out=tmp_path / "t")
    shard = tmp_path / "t" / "tensors-00000.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(BundleError, match=r"tensors-00000\.safetensors: corrupt or truncated"):
        Bundle.open(tmp_path / "t")


def test_missing_bundle_and_not_a_bundle(tmp_path):
    with pytest.raises(BundleError, match="no such bundle"):
        Bundle.open(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BundleError, match="manifest.json is missing"):
        Bundle.open(tmp_path / "empty")


@pytest.mark.parametrize("bad", ["../evil.safetensors", "/etc/passwd", "sub/../../x.safetensors"])
def test_unsafe_shard_path_rejected(tmp_path, bad):
    capture(torch.nn.Linear(3, 3), torch.randn(1, 3), keep="full", out=tmp_path / "u")
    m = json.loads((tmp_path / "u" / MANIFEST).read_text())
    m["records"][0]["shard"] = bad
    (tmp_path / "u" / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(BundleError, match="unsafe shard path"):
        Bundle.open(tmp_path / "u")


def test_npz_dump_opens_as_bundle_with_stats(tmp_path):
    x = np.ones((1, 8, 5), np.float32)
    x[0, [2, 6]] = np.nan
    np.savez(tmp_path / "port.npz", encoder_out=np.arange(6, dtype=np.float32), norm_out=x)
    b = Bundle.open(tmp_path / "port.npz")
    assert [r.name for r in b] == ["encoder_out", "norm_out"]
    assert b["norm_out"].stats.nonfinite_channels == 2
    assert b["encoder_out"].stats.max == 5.0
    np.testing.assert_array_equal(b.numpy("norm_out"), x)


def test_safetensors_dump_opens_as_bundle(tmp_path):
    safetensors.torch.save_file({"a": torch.zeros(3), "b": torch.tensor([1.0, float("inf")])}, tmp_path / "d.safetensors")
    b = Bundle.open(tmp_path / "d.safetensors")
    assert b["b"].stats.posinf == 1 and b["a"].stats.all_finite


def test_corrupt_npz(tmp_path):
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(BundleError, match="bad.npz: corrupt or truncated"):
        Bundle.open(tmp_path / "bad.npz")


def test_writer_refuses_non_bundle_directory(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "thesis.tex").write_text("precious")
    with pytest.raises(BundleError, match="not a tensorprobe bundle"):
        BundleWriter(tmp_path / "docs")
    assert (tmp_path / "docs" / "thesis.tex").read_text() == "precious"


def test_stats_only_record_has_no_tensor(tmp_path):
    b = capture(torch.nn.Linear(3, 3), torch.randn(1, 3), out=tmp_path / "s")
    with pytest.raises(BundleError, match="statistics only"):
        b.tensor("<root>")
    assert os.path.exists(tmp_path / "s" / MANIFEST)
