"""Deliberate infinities (issue 28): ±Inf that a constant writes on purpose — a mask — is information, not a NaN
origin, while no model output holds it and no op turns it into NaN.

The cases are the usual masks: attention's `masked_fill(~keep, -inf)` before a softmax (live in PyTorch, an op-level
capture, and its ONNX export run by ONNX Runtime), a `-inf` literal in `torch.where`, a causal-mask buffer of 0 and
-inf, and SwiftF0's ONNX file as it ships in its wheel (a `-inf` initializer that `Where` and `Pad` write before its
peak pick). Each is varied: the truth-keeping twin masks with a finite -1e9 (nothing to report either way), and
the truth-changing ones let the -inf reach an output, or make NaN of it (a row masked throughout before the softmax,
-inf − -inf, 0 × -inf), or overflow beside it — each of those is a finding, at the op where it happens.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn as nn
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorprobe as tp
from tensorprobe.nan.masks import constant_mask_value
from tensorprobe.stats import compute_stats

INF = float("inf")


class MaskedScores(nn.Module):
    """Scores masked where `keep` is False, then `tail`: a softmax (attention), or something that lets the mask out."""

    def __init__(self, fill: float = -INF, tail: str = "softmax", how: str = "masked_fill") -> None:
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(8, 8)
        self.fill, self.tail, self.how = fill, tail, how

    def forward(self, x, keep):
        s = self.proj(x)
        if self.how == "masked_fill":
            s = s.masked_fill(~keep, self.fill)
        else:   # a literal tensor, as `torch.where(keep, s, torch.tensor(-inf))` is written
            s = torch.where(keep, s, torch.tensor(self.fill))
        if self.tail == "softmax":
            return torch.softmax(s, dim=-1)
        if self.tail == "scores":            # the mask itself is returned
            return s
        if self.tail == "sub":               # -inf − -inf
            return s - s
        if self.tail == "mul":               # 0 × -inf
            return s * keep
        if self.tail == "exp":               # exp(-inf) = 0 is fine; exp(100·s) overflows where s > 0.89
            return torch.exp(s * 100.0)
        raise ValueError(self.tail)


def _inputs(all_masked_rows: int = 0):
    x = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(0))
    keep = torch.rand(2, 4, 8, generator=torch.Generator().manual_seed(1)) > 0.5
    keep[..., 0] = True                       # every row keeps an entry
    for r in range(all_masked_rows):
        keep[1, r] = False
    return x, keep


def _live(model, *inputs):
    return tp.find_first_nonfinite(model, *inputs)


def _bundle(model, x, keep, tmp_path, name="b"):
    return tp.find_nonfinite_in_bundle(tp.capture(model, x, keep, level="op", keep="full", out=tmp_path / name))


# ---- PyTorch: live search and an op-level bundle agree ------------------------------------------------------

@pytest.mark.parametrize("how", ["masked_fill", "where_literal"])
def test_a_masked_softmax_is_clean_and_the_mask_is_reported_as_such(tmp_path, how):
    x, keep = _inputs()
    masked = int((~keep).sum())
    for o in (_live(MaskedScores(how=how), x, keep), _bundle(MaskedScores(how=how), x, keep, tmp_path)):
        assert not o.found and o.cause is None, o.headline()
        assert len(o.masks) == 1 and o.masks[0].value == "-inf", o.masks
        made = "masked_fill" if how == "masked_fill" else "where"
        assert o.masks[0].record == f"<root>/{made}.0" and o.masks[0].count == masked
        assert "deliberate mask" in o.headline() and "every model output is finite" in o.headline()


def test_a_finite_large_negative_mask_has_nothing_to_report(tmp_path):
    """The truth-keeping twin: -1e9 instead of -inf. Same probabilities, no ±Inf, no mask."""
    x, keep = _inputs()
    ref = MaskedScores()(x, keep)
    twin = MaskedScores(fill=-1e9)
    assert torch.allclose(twin(x, keep), ref)
    for o in (_live(twin, x, keep), _bundle(twin, x, keep, tmp_path)):
        assert not o.found and o.masks == (), o.headline()
        assert o.headline().startswith("No NaN or Inf: all")


def test_a_row_masked_throughout_makes_nan_at_the_softmax(tmp_path):
    x, keep = _inputs(all_masked_rows=2)
    assert int((~keep).all(dim=-1).sum()) == 2
    for o, op in ((_live(MaskedScores(), x, keep), "aten._softmax.default"),
                  (_bundle(MaskedScores(), x, keep, tmp_path), "aten._softmax.default")):
        assert o.found and o.cause in ("op", "record") and o.op == op, o.headline()
        assert o.output.stats.nan == 2 * 8                   # the two rows, 8 entries each
        text = o.diagnosis[0]
        assert "turned a deliberate mask into NaN" in text and "2 of its rows" in text, text
        assert "<root>/masked_fill.0" in text
        assert [m.record for m in o.masks] == ["<root>/masked_fill.0"]


@pytest.mark.parametrize("tail, words", [("sub", "elements are inf − inf"), ("mul", "elements are 0 × inf")])
def test_arithmetic_that_makes_nan_of_the_mask_is_found_at_that_op(tmp_path, tail, words):
    x, keep = _inputs()
    masked = int((~keep).sum())
    for o in (_live(MaskedScores(tail=tail), x, keep), _bundle(MaskedScores(tail=tail), x, keep, tmp_path)):
        assert o.found and o.op == f"aten.{tail}.Tensor", o.headline()
        assert o.output.stats.nan == masked
        assert f"{masked} {words}" in o.diagnosis[0], o.diagnosis


def test_a_mask_that_reaches_the_output_is_a_finding_named_where_it_is_made(tmp_path):
    x, keep = _inputs()
    for o in (_live(MaskedScores(tail="scores"), x, keep), _bundle(MaskedScores(tail="scores"), x, keep, tmp_path)):
        assert o.found and o.cause == "mask_reaches_output", o.headline()
        assert o.record == "<root>/masked_fill.0" and o.op == "aten.masked_fill.Scalar"
        assert o.output.name == "output" and o.output.stats.neginf == int((~keep).sum())
        assert "reaches the model output output" in o.headline()


def test_an_overflow_beside_a_mask_is_still_found(tmp_path):
    """exp carries the mask (exp(-inf) = 0) but makes +Inf of its own where 100·s > 88.7: the op is the origin."""
    x, keep = _inputs()
    s = MaskedScores().proj(x).detach()
    over = int(((s * 100 > 88.73) & keep).sum())
    assert over > 0
    for o in (_live(MaskedScores(tail="exp"), x, keep), _bundle(MaskedScores(tail="exp"), x, keep, tmp_path)):
        assert o.found and o.op == "aten.exp.default" and o.output.stats.posinf == over, o.headline()
        assert f"makes {over} ±Inf of its own" in o.diagnosis[0] or "more ±Inf" in o.diagnosis[0], o.diagnosis


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.booleans(), min_size=8, max_size=8), min_size=4, max_size=4))
def test_any_keep_pattern_is_clean_exactly_when_every_row_keeps_an_entry(rows):
    x = torch.randn(1, 4, 8, generator=torch.Generator().manual_seed(3))
    keep = torch.tensor([rows])
    o = _live(MaskedScores(), x, keep)
    emptied = int((~keep).all(dim=-1).sum())
    if keep.all():
        assert not o.found and o.masks == ()        # nothing masked: no ±Inf at all
    elif emptied == 0:
        assert not o.found and len(o.masks) == 1 and o.masks[0].count == int((~keep).sum())
    else:
        assert o.found and o.op == "aten._softmax.default" and o.output.stats.nan == 8 * emptied
        assert f"{emptied} of its rows" in o.diagnosis[0]


class CausalAttention(nn.Module):
    """Self-attention with a causal mask held as a buffer of 0 and -inf (`triu(full(-inf), 1)`)."""

    def __init__(self, t: int = 6, diagonal: int = 1) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.qkv = nn.Linear(8, 24)
        self.register_buffer("causal", torch.full((t, t), -INF).triu(diagonal))

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        weights = torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5 + self.causal, dim=-1)
        return weights @ v


def test_a_causal_mask_buffer_is_a_mask_and_masking_the_diagonal_too_is_a_finding(tmp_path):
    x = torch.randn(1, 6, 8, generator=torch.Generator().manual_seed(0))
    o = _live(CausalAttention(), x)
    assert not o.found, o.headline()
    assert o.masks[0].record == "causal" and o.masks[0].op == "buffer" and o.masks[0].count == 15   # 6·5/2
    b = tp.find_nonfinite_in_bundle(tp.capture(CausalAttention(), x, level="op", out=tmp_path / "c"))
    assert not b.found and b.masks[0].record == "causal", b.headline()
    # diagonal=0 masks the first row entirely: the softmax makes NaN there, and that is the finding
    for o in (_live(CausalAttention(diagonal=0), x),
              tp.find_nonfinite_in_bundle(tp.capture(CausalAttention(diagonal=0), x, level="op", keep="full",
                                                     out=tmp_path / "d"))):
        assert o.found and o.op == "aten._softmax.default", o.headline()
        assert "1 of its rows" in o.diagnosis[0]


def test_a_buffer_holding_nan_or_scattered_inf_is_still_a_broken_weight():
    x = torch.randn(1, 6, 8)
    m = CausalAttention()
    m.causal[2, 0] = float("nan")
    o = _live(m, x)
    assert o.found and o.cause == "parameter" and o.record == "causal"
    scattered = compute_stats(np.array([1.0, -INF, 3.0], dtype=np.float32))
    assert constant_mask_value(scattered) is None     # several finite values: not a fill


class Encoder(nn.Module):
    """PyTorch's own transformer encoder with a key padding mask: its attention turns the bool mask into -inf
    (`masked_fill_`) itself."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

    def forward(self, x, pad):
        return self.enc(x, src_key_padding_mask=pad)


def _padded(emptied: bool = False):
    x = torch.randn(2, 5, 16, generator=torch.Generator().manual_seed(0))
    pad = torch.tensor([[False] * 5, [False, False, False, True, True]])
    if emptied:
        pad[1] = True     # a sequence padded throughout
    return Encoder().eval(), x, pad


def test_torch_transformer_padding_is_a_mask_live_and_in_its_onnx_export(tmp_path):
    """nn.TransformerEncoder masks padded keys with -inf: clean live, in an op-level capture and in the ONNX export.
    With a sequence padded throughout, eager PyTorch's attention still gives finite values (its softmax makes
    rows masked throughout 0) while the ONNX export's Softmax makes NaN of them: the port's finding, at its op."""
    pytest.importorskip("onnxruntime")
    from tensorprobe.runtimes import get_runtime

    model, x, pad = _padded()
    o = _live(model, x, pad)
    assert not o.found and o.masks[0].record == "enc/masked_fill_.0" and o.masks[0].count == 2, o.headline()
    assert not tp.find_nonfinite_in_bundle(tp.capture(model, x, pad, level="op", out=tmp_path / "t")).found
    o = tp.find_nonfinite_in_bundle(get_runtime("onnxruntime").capture(model, (x, pad), out=tmp_path / "o"))
    assert not o.found and [m.op for m in o.masks] == ["Where"], o.headline()

    model, x, pad = _padded(emptied=True)
    assert not _live(model, x, pad).found
    o = tp.find_nonfinite_in_bundle(get_runtime("onnxruntime").capture(model, (x, pad), out=tmp_path / "e"))
    assert o.found and o.op == "Softmax" and o.module == "enc.layers.0.self_attn", o.headline()
    assert o.output.stats.nan == 2 * 5 * 5                  # 2 heads × 5 queries × 5 keys of the padded sequence
    assert "10 of its rows" in o.diagnosis[0], o.diagnosis


# ---- the ONNX export of the same model, run by ONNX Runtime -----------------------------------------------

@pytest.mark.parametrize("fill, tail, found, cause", [
    (-INF, "softmax", False, None), (-1e9, "softmax", False, None),
    (-INF, "scores", True, "mask_reaches_output"), (-INF, "sub", True, "record")])
def test_the_onnx_export_keeps_the_verdicts_and_onnx_names(tmp_path, fill, tail, found, cause):
    pytest.importorskip("onnxruntime")
    from tensorprobe.runtimes import get_runtime

    x, keep = _inputs()
    b = get_runtime("onnxruntime").capture(MaskedScores(fill=fill, tail=tail), (x, keep), out=tmp_path / "o")
    o = tp.find_nonfinite_in_bundle(b)
    assert o.found is found and o.cause == cause, o.headline()
    if fill == -INF:
        assert [m.op for m in o.masks] == ["Where"], o.masks       # ONNX's name for masked_fill
    if tail == "sub":
        assert o.op == "Sub" and "Sub turned a deliberate mask into NaN" in o.diagnosis[0], o.diagnosis
    text = o.headline() + " ".join(o.diagnosis)
    assert "masked_fill" not in text and "aten" not in text and ("(Where)" in text) is (tail != "softmax"), text


def test_the_onnx_export_with_a_row_masked_throughout_finds_nan_at_softmax(tmp_path):
    pytest.importorskip("onnxruntime")
    from tensorprobe.runtimes import get_runtime

    x, keep = _inputs(all_masked_rows=1)
    o = tp.find_nonfinite_in_bundle(get_runtime("onnxruntime").capture(MaskedScores(), (x, keep), out=tmp_path / "o"))
    assert o.found and o.op == "Softmax" and o.output.stats.nan == 8, o.headline()
    assert o.diagnosis[0].startswith("Softmax turned a deliberate mask into NaN") and "1 of its rows" in o.diagnosis[0]


# ---- the CLI: nan exits 0 on masks only, capture does not warn -----------------------------------------------

def clean_target():
    """TARGET for the CLI: a masked softmax whose every row keeps an entry."""
    return MaskedScores(), _inputs()


def all_masked_target():
    return MaskedScores(), _inputs(all_masked_rows=1)


ROOT = Path(__file__).resolve().parents[2]


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "tensorprobe", *args], capture_output=True, text=True, cwd=ROOT)


def test_cli_nan_exits_0_on_a_mask_and_1_on_nan_and_capture_warns_only_then(tmp_path):
    clean = _cli("nan", "tests.nan.test_masks:clean_target")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert "deliberate mask" in clean.stdout and "NaN/Inf born" not in clean.stdout
    bad = _cli("nan", "tests.nan.test_masks:all_masked_target", "--json")
    assert bad.returncode == 1
    origin = json.loads(bad.stdout)["origin"]
    assert origin["op"] == "aten._softmax.default" and origin["masks"][0]["record"] == "<root>/masked_fill.0"
    cap = _cli("capture", "tests.nan.test_masks:clean_target", "--level", "op", "-o", str(tmp_path / "b"))
    assert cap.returncode == 0 and "records hold NaN/Inf" not in cap.stdout and "info:" in cap.stdout, cap.stdout
    assert _cli("nan", str(tmp_path / "b")).returncode == 0
    cap = _cli("capture", "tests.nan.test_masks:all_masked_target", "--level", "op", "-o", str(tmp_path / "c"),
               "--json")
    assert json.loads(cap.stdout)["nan_finding"] is True
    assert _cli("nan", str(tmp_path / "c")).returncode == 1


# ---- SwiftF0 as it ships: an ONNX Pad with a -inf initializer before the peak pick --------------------------

def _swift_f0_model() -> Path:
    spec = importlib.util.find_spec("swift_f0")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("swift-f0 is not installed (pip install 'tensorprobe[test]'): SwiftF0's ONNX file comes from it")
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    return Path(next(iter(spec.submodule_search_locations))) / "model.onnx"


def _swift_inputs(fmin: float = 46.875, fmax: float = 2093.75) -> dict[str, np.ndarray]:
    t = np.arange(16000) / 16000
    audio = (0.5 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)[None]
    return {"audio": audio, "fmin": np.array(fmin, np.float32), "fmax": np.array(fmax, np.float32)}


def _swift_capture(tmp_path, name, inputs, edit=None, keep="stats"):
    import onnx

    from tensorprobe.runtimes import get_runtime

    path = _swift_f0_model()
    if edit is not None:
        m = onnx.load(path)
        edit(m)
        path = tmp_path / f"{name}.onnx"
        onnx.save(m, path)
    return get_runtime("onnxruntime").capture_artifact(path, inputs, tmp_path / name, keep=keep)


def _pad_of_the_peak_pick(m):
    return next(n for n in m.graph.node if n.op_type == "Pad" and n.input[2:] and n.input[2] == "v442")


@pytest.mark.parametrize("band", [(46.875, 2093.75), (150.0, 400.0)])
def test_swift_f0_pads_with_minus_inf_on_purpose_and_nothing_is_born(tmp_path, band):
    b = _swift_capture(tmp_path, "s", _swift_inputs(*band))
    o = tp.find_nonfinite_in_bundle(b)
    assert not o.found, o.headline()
    (mask,) = o.masks
    assert mask.record == "v442" and mask.op == "initializer" and mask.value == "-inf"
    pad = b["<root>/Pad.4"]
    assert pad.op == "Pad" and "<root>/Pad.4" in mask.carried_by
    where = b["<root>/Where.0"]   # the band's mask, then one -inf bin padded on each side
    assert pad.stats.neginf == where.stats.neginf + (pad.shape[-1] - where.shape[-1]) * pad.shape[1]
    # a narrower band masks bins in Where too; the full band masks none there
    assert ("<root>/Where.0" in mask.carried_by) == (band != (46.875, 2093.75))
    assert all(b[f"output.{n}"].stats.all_finite for n in ("pitch", "confidence"))


def test_swift_f0_with_a_finite_mask_constant_has_nothing_to_report(tmp_path):
    """The truth-keeping twin: the -inf initializer made -1e9. Same pitch, no ±Inf anywhere."""
    from onnx import numpy_helper

    def finite(m):
        init = next(i for i in m.graph.initializer if i.name == "v442")
        init.CopyFrom(numpy_helper.from_array(np.array(-1e9, np.float32), "v442"))

    ref = _swift_capture(tmp_path, "r", _swift_inputs(), keep="full")
    twin = _swift_capture(tmp_path, "t", _swift_inputs(), edit=finite, keep="full")
    o = tp.find_nonfinite_in_bundle(twin)
    assert not o.found and o.masks == () and o.headline().startswith("No NaN or Inf: all")
    np.testing.assert_array_equal(twin.numpy("output.pitch"), ref.numpy("output.pitch"))


def test_swift_f0_mask_reaching_an_output_or_made_nan_is_a_finding(tmp_path):
    from onnx import TensorProto, helper

    def expose(m):       # the padded scores become a model output: the -inf reaches it
        m.graph.output.append(helper.make_tensor_value_info(_pad_of_the_peak_pick(m).output[0], TensorProto.FLOAT, None))

    def subtract(m):     # padded − padded: -inf − -inf is NaN at each padded place
        pad = _pad_of_the_peak_pick(m).output[0]
        m.graph.node.append(helper.make_node("Sub", [pad, pad], ["diff"]))
        m.graph.output.append(helper.make_tensor_value_info("diff", TensorProto.FLOAT, None))

    b = _swift_capture(tmp_path, "e", _swift_inputs(), edit=expose)
    pad = next(r for r in b if r.op == "Pad" and "v442" in r.inputs)   # a graph output now: named as the root's
    o = tp.find_nonfinite_in_bundle(b)
    assert o.found and o.cause == "mask_reaches_output" and o.record == "v442", o.headline()
    assert o.output.stats.neginf == 124 and f"read by {pad.name}" in o.diagnosis[0], o.diagnosis
    o = tp.find_nonfinite_in_bundle(_swift_capture(tmp_path, "n", _swift_inputs(), edit=subtract, keep="full"))
    assert o.found and o.op == "Sub" and o.output.stats.nan == 124, o.headline()
    assert "124 elements are inf − inf" in o.diagnosis[0], o.diagnosis
    assert "constant_pad_nd" not in " ".join(o.diagnosis) + o.headline()


def test_swift_f0_capture_cli_does_not_warn_and_nan_exits_0(tmp_path):
    path = _swift_f0_model()
    np.savez(tmp_path / "in.npz", **_swift_inputs())
    cap = subprocess.run([sys.executable, "-m", "tensorprobe", "capture", str(path), "--inputs", "in.npz", "-o", "s"],
                         capture_output=True, text=True, cwd=tmp_path)
    assert cap.returncode == 0 and "records hold NaN/Inf" not in cap.stdout, cap.stdout + cap.stderr
    assert "info:" in cap.stdout and "v442" in cap.stdout
    nan = subprocess.run([sys.executable, "-m", "tensorprobe", "nan", "s"], capture_output=True, text=True, cwd=tmp_path)
    assert nan.returncode == 0 and "constant_pad_nd" not in nan.stdout, nan.stdout
    assert "deliberate mask" in nan.stdout and "Pad.4" in nan.stdout
