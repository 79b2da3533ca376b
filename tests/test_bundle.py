import json
import os

import numpy as np
import pytest
import safetensors.torch
import torch

from tensorprobe import Bundle, BundleError, capture
from tensorprobe.bundle import JOURNAL, MANIFEST, BundleWriter
from tensorprobe.bundle.reader import load_arrays
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
    names = [r.name for r in b if r.kind not in ("param", "buffer")]
    assert names == ["input.0", "a/addmm.0", "b/addmm.0"]  # no model output: the forward never returned
    assert b.tensor("b/addmm.0").shape == (2, 4)


def test_killed_capture_recovered_from_journal(tmp_path):
    w = BundleWriter(tmp_path / "k", shard_bytes=1)  # flush after every tensor
    for i in range(3):
        t = torch.full((4,), float(i))
        w.add(_rec(f"r{i}", t, i), t)
    w.flush()  # the records are journaled...
    w._shard_writer.finish()  # ...the shards reached the disk, and the process "dies" here: no close()
    w._lock.release(remove=False)   # as the kernel does for a process that dies
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


def test_values_read_must_hold_the_nonfinite_count_their_statistics_recorded(tmp_path):
    x = torch.randn(4, 8)
    x[1, 2] = float("nan")
    capture(torch.nn.Identity(), x, keep="full", out=tmp_path / "b")
    b = Bundle.open(tmp_path / "b")
    rec = next(r for r in b if r.kind == "model_output")
    b.check_nonfinite(rec.name, int((~np.isfinite(b.numpy(rec.name))).sum()))     # what was recorded: quiet
    for wrong in (0, 2):
        with pytest.raises(BundleError, match=rf"tensors-00000\.safetensors: corrupt tensor '{rec.name}': its "
                                              rf"stored values hold {wrong} NaN/Inf elements? where the statistics "
                                              r"recorded at capture count 1"):
            b.check_nonfinite(rec.name, wrong)


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


@pytest.mark.parametrize("content, msg", [(b"hi\n", r"not an \.npz file \(an \.npz is a zip archive of \.npy arrays; "
                                                     r"this file starts with b'hi\\n'\)"),
                                          (b"", "not an .npz file .* this file is empty"),
                                          (None, r"a single \.npy array, not an \.npz file")])
def test_a_file_that_is_not_an_npz_says_so_and_never_mentions_unpickling(tmp_path, content, msg):
    """Before: a text file renamed .npz was "contains pickled data ... load it unsafely"."""
    path = tmp_path / "renamed.npz"
    if content is None:
        np.save(tmp_path / "one.npy", np.zeros(3))
        os.replace(tmp_path / "one.npy", path)
    else:
        path.write_bytes(content)
    for read in (Bundle.open, load_arrays):
        with pytest.raises(BundleError, match=msg) as err:
            read(path)
        assert "pickle" not in str(err.value) and str(err.value).startswith(str(path))


def test_corrupt_npz(tmp_path):
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(BundleError, match="bad.npz: corrupt or truncated"):
        Bundle.open(tmp_path / "bad.npz")


def test_npz_text_and_object_arrays(tmp_path):
    from tensorprobe.bundle.reader import load_arrays

    np.savez(tmp_path / "text.npz", words=np.array(["monday", "tuesday"]), raw=np.array([b"a", b"bc"]),
             n=np.arange(3))
    feeds = load_arrays(tmp_path / "text.npz")                       # a model's inputs: text included, in order
    assert list(feeds) == ["words", "raw", "n"] and feeds["words"].tolist() == ["monday", "tuesday"]
    with pytest.raises(BundleError, match="array 'words' holds text .*a bundle's records are numbers"):
        Bundle.open(tmp_path / "text.npz")                          # a bundle's records are numbers
    np.savez(tmp_path / "obj.npz", words=np.array(["monday", None], dtype=object))   # stored pickled
    for read in (load_arrays, Bundle.open):
        with pytest.raises(BundleError, match="array 'words' holds Python objects.*never unpickles"):
            read(tmp_path / "obj.npz")


def test_0d_tensors_describe_and_hash(tmp_path):
    from tensorprobe.bundle.writer import describe_inputs, tensor_sha256

    assert tensor_sha256(torch.tensor(2.0)) == tensor_sha256(torch.tensor([2.0])) == tensor_sha256(np.float32(2.0))
    described = describe_inputs({"t": torch.tensor(2.0), "words": np.array(["a", "b"])})
    assert described[0]["shape"] == [] and described[1]["dtype"] == "str"
    assert described[1]["sha256"] != tensor_sha256(np.array(["a", "c"]))


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


def _mixed_tensors():
    """Every dtype the staging path packs, odd byte counts (so later tensors start misaligned), layouts
    that trip naive flattening, and tensors it must hand to the plain path."""
    g = torch.Generator().manual_seed(0)
    big = torch.randn(300, generator=g)  # 1200 bytes: larger than the 1 KiB shards below
    return {
        "f32_odd": torch.randn(3, 5, generator=g),
        "bool_odd": torch.rand(7, generator=g) > 0.5,
        "i64": torch.arange(9, dtype=torch.int64) - 4,
        "f16": torch.randn(5, generator=g).half(),
        "bf16": torch.randn(3, generator=g).bfloat16(),
        "u8": torch.arange(3, dtype=torch.uint8),
        "transposed": torch.randn(4, 6, generator=g).t(),
        "one_elem_odd_stride": torch.randn(1, 9, generator=g)[:, 0],  # shape (1,), stride 9
        "with_nan": torch.tensor([1.0, float("nan"), float("-inf")]),
        "complex": torch.randn(4, dtype=torch.complex64, generator=g),  # not staged: plain path
        "bigger_than_a_shard": big,
        "after_big": torch.randn(2, 2, generator=g),
        "empty": torch.zeros(0, 3),
    }


@pytest.mark.parametrize("where", ["disk", "tmpfs"])
def test_reused_buffers_store_every_tensor_exactly(tmp_path, where):
    """Staged shards are written by our own safetensors writer (O_DIRECT where possible, page cache on
    tmpfs): the safetensors library must read back every tensor bit for bit."""
    root = tmp_path
    if where == "tmpfs":
        if not os.path.isdir("/dev/shm"):
            pytest.skip("no /dev/shm here")
        import tempfile
        root = tempfile.mkdtemp(dir="/dev/shm")
    path = os.path.join(root, "b")
    tensors = _mixed_tensors()
    with BundleWriter(path, shard_bytes=1024, reuse_buffers=True) as w:
        for i, (k, t) in enumerate(tensors.items()):
            w.add(_rec(k, t, i), t)
        made = w._staging._live
    assert made <= 3  # buffers are reused, not made per shard
    b = Bundle.open(path)
    shards = sorted(p for p in os.listdir(path) if p.endswith(".safetensors"))
    assert len(shards) >= 4
    for k, t in tensors.items():
        got, expect = b.tensor(k), t.contiguous()
        assert got.dtype == t.dtype and got.shape == t.shape, k
        if expect.is_floating_point():
            assert torch.equal(got.isnan(), expect.isnan()) and torch.equal(got.nan_to_num(), expect.nan_to_num()), k
        else:
            assert torch.equal(got, expect), k
    for s in shards:  # each shard is a standard safetensors file
        safetensors.torch.load_file(os.path.join(path, s))
    if where == "tmpfs":
        import shutil
        shutil.rmtree(root)


def test_reused_buffers_copy_at_add_time(tmp_path):
    t = torch.ones(8)
    with BundleWriter(tmp_path / "b", reuse_buffers=True) as w:
        w.add(_rec("x", t), t)
        t.mul_(5)  # an in-place op after the record: the bundle keeps what the tensor held then
    assert torch.equal(Bundle.open(tmp_path / "b").tensor("x"), torch.ones(8))


def test_safetensors_header_pads_to_alignment_and_loads(tmp_path):
    from tensorprobe.bundle import safetensors_header

    data = torch.arange(3, dtype=torch.float32).numpy().tobytes()
    head = safetensors_header([("x", "F32", (3,), 0, 12)], {"format": "t"}, align=4096)
    assert len(head) == 4096
    (tmp_path / "h.safetensors").write_bytes(head + data)
    assert torch.equal(safetensors.torch.load_file(tmp_path / "h.safetensors")["x"], torch.arange(3.0))


def test_staging_buffers_start_small_grow_and_stay_few(tmp_path):
    """A small capture must not fault in three full shards; a large one reaches full-size shards and
    never holds more than three buffers."""
    from tensorprobe.bundle.writer import release_buffers

    release_buffers()   # as in a fresh process: no buffer kept from an earlier capture
    small = tmp_path / "small"
    with BundleWriter(small, reuse_buffers=True) as w:
        t = torch.randn(100)
        w.add(_rec("x", t), t)
        assert w._staging._live == 1 and w._stage.capacity == 1 << 20
    tensors = [torch.full((1 << 18,), float(i)) for i in range(40)]  # 1 MiB each, 40 MiB in all
    release_buffers()
    with BundleWriter(tmp_path / "big", shard_bytes=8 << 20, reuse_buffers=True) as w:
        for i, t in enumerate(tensors):
            w.add(_rec(f"t{i}", t, i), t)
            assert w._staging._live <= 3
    b = Bundle.open(tmp_path / "big")
    sizes = [p.stat().st_size for p in sorted((tmp_path / "big").glob("tensors-*.safetensors"))]
    assert sizes[0] < 2 << 20 and max(sizes) > 7 << 20   # 1 MiB first, full 8 MiB shards later
    for i, t in enumerate(tensors):
        assert torch.equal(b.tensor(f"t{i}"), t)


def test_staged_shard_with_a_header_too_big_for_its_room(tmp_path, monkeypatch):
    import tensorprobe.bundle.writer as bundle_mod

    monkeypatch.setattr(bundle_mod, "_HEADER_ROOM", 4096)
    tensors = {f"a.rather.long.module.path.{i:04d}/op.{i}": torch.tensor([float(i)]) for i in range(200)}
    with BundleWriter(tmp_path / "b", reuse_buffers=True) as w:
        for i, (k, t) in enumerate(tensors.items()):
            w.add(_rec(k, t, i), t)
    b = Bundle.open(tmp_path / "b")
    for k, t in tensors.items():
        assert torch.equal(b.tensor(k), t)


def test_captured_bundle_equals_the_bundle_read_back(tmp_path):
    """capture() returns the bundle built from what it wrote, without reading the manifest back: it must
    be the same as opening the directory."""
    class M(torch.nn.Module):
        def forward(self, x):
            y = torch.log(x)             # NaN for the negative entries
            return y.sum(), torch.randn(3) * 0, x > 0

    x = torch.tensor([[1.0, -1.0, 2.0], [0.5, 3.0, -2.0]])
    got = capture(M(), x, level="op", keep="full", out=tmp_path / "b")
    again = Bundle.open(tmp_path / "b")
    assert [r.to_dict() for r in got] == [r.to_dict() for r in again]
    assert got.manifest == {k: v for k, v in again.manifest.items() if k != "records"}
    assert not got["<root>/log.0"].stats.all_finite
    for r in again:
        if r.has_tensor:
            assert torch.equal(got.tensor(r.name).nan_to_num(), again.tensor(r.name).nan_to_num())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.complex64,
                                   torch.complex128, torch.int8, torch.int64, torch.uint8, torch.bool])
def test_numpy_reads_every_dtype_a_capture_stores_as_torch_does(tmp_path, dtype):
    """`Bundle.numpy` (memory-mapped, no torch) and `Bundle.tensor` give the same values; bfloat16 widened."""
    t = (torch.randn(3, 5, dtype=torch.complex64 if dtype.is_complex else torch.float32) * 5).to(dtype)
    with BundleWriter(tmp_path / "b") as w:
        w.add(Record(name="x", module="x", op="x", order=0, shape=tuple(t.shape), dtype=str(dtype)[6:],
                     stats=compute_stats(t)), t)
    b = Bundle.open(tmp_path / "b")
    want = t.float().numpy() if dtype == torch.bfloat16 else t.numpy()
    got = b.numpy("x")
    assert got.dtype == want.dtype and np.array_equal(got, want)
    assert b.tensor("x").dtype == dtype and torch.equal(b.tensor("x"), t)


def test_short_capture_writes_its_manifest_once(tmp_path, monkeypatch):
    """A capture that ends within its first second writes no provisional manifest and no journal: its
    records reach the disk once, in the final manifest (renamed into place, not fsynced: see docs/design.md)."""
    import tensorprobe.bundle.writer as bundle_mod

    writes = []
    real = bundle_mod.atomic_write_bytes
    monkeypatch.setattr(bundle_mod, "atomic_write_bytes",
                        lambda path, data, sync=True: (writes.append(sync), real(path, data, sync=sync)))
    tensors = [torch.full((300,), float(i)) for i in range(300)]   # past a journal batch (256 records)
    with BundleWriter(tmp_path / "b", shard_bytes=4096, reuse_buffers=True) as w:
        for i, t in enumerate(tensors):
            w.add(_rec(f"t{i}", t, i), t)
    assert writes == [False]
    b = Bundle.open(tmp_path / "b")
    assert b.complete and len(b) == 300 and float(b.tensor("t299")[0]) == 299.0
    assert not (tmp_path / "b" / JOURNAL).exists()


def test_long_capture_journals_and_a_kill_keeps_header_and_records(tmp_path, monkeypatch):
    """Past its first second a capture journals every batch and every shard, with a provisional manifest
    (not fsynced) that keeps the header: a kill loses at most the records since the last batch."""
    import tensorprobe.bundle.writer as bundle_mod

    monkeypatch.setattr(bundle_mod, "_JOURNAL_AFTER_S", 0.0)   # as if the capture had run for a while
    w = BundleWriter(tmp_path / "k", shard_bytes=1, model={"name": "killed-model"})
    for i in range(3):
        t = torch.full((4,), float(i))
        w.add(_rec(f"r{i}", t, i), t)   # each tensor fills a shard: each is journaled with its records
    w._shard_writer.finish()            # the shards reached the disk, and the process "dies" here
    w._lock.release(remove=False)       # as the kernel does for a process that dies
    b = Bundle.open(tmp_path / "k")
    assert not b.complete and b.manifest["model"] == {"name": "killed-model"}
    assert [r.name for r in b] == ["r0", "r1", "r2"] and float(b.tensor("r2")[0]) == 2.0


def test_prefaulted_buffers_serve_the_next_capture_and_stay_bounded(tmp_path):
    """The staging buffer of one capture is the next capture's (no new memory to fault in), holds no
    stale bytes in what is read back, and what is kept between captures never passes the bound."""
    from tensorprobe.bundle.writer import PREFAULTED, _PrefaultedBuffers, release_buffers

    release_buffers()
    first = [torch.full((1000,), 1.0), torch.arange(10, dtype=torch.int64)]
    with BundleWriter(tmp_path / "a", reuse_buffers=True) as w:
        for i, t in enumerate(first):
            w.add(_rec(f"x{i}", t, i), t)
        ptr = w._stage.buffer.data_ptr()
    assert PREFAULTED.kept_bytes() > 0
    second = [torch.full((10,), 7.0)]
    with BundleWriter(tmp_path / "b", reuse_buffers=True) as w:
        w.add(_rec("y", second[0]), second[0])
        assert w._stage.buffer.data_ptr() == ptr
    b = Bundle.open(tmp_path / "b")
    assert torch.equal(b.tensor("y"), second[0]) and len(b) == 1

    cache = _PrefaultedBuffers(3 << 20)
    for n in (1 << 20, 2 << 20, 1 << 20, 8 << 20):   # 8 MiB alone is past the bound: let go
        cache.give(torch.zeros(n, dtype=torch.uint8))
        assert cache.kept_bytes() <= 3 << 20
    assert cache.take(1500 << 10).numel() == 2 << 20   # the smallest kept one that fits
    assert cache.take(4 << 20).numel() == 4 << 20      # none fits: a new one


def test_prefaulted_buffers_bound_holds_for_any_sequence():
    """Whatever captures give and take, what is kept never passes the bound and a taken buffer fits."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from tensorprobe.bundle.writer import _PrefaultedBuffers

    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.tuples(st.booleans(), st.integers(1, 64 << 10)), max_size=30))
    def run(steps):
        cache = _PrefaultedBuffers(128 << 10)
        for give, n in steps:
            if give:
                cache.give(torch.empty(n, dtype=torch.uint8))
            else:
                assert cache.take(n).numel() >= n
            assert cache.kept_bytes() <= 128 << 10

    run()
