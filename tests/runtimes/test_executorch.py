"""ExecuTorch adapter, run for real (portable kernels and XNNPACK): ETDump + ETRecord + module taps."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("executorch", reason="needs the executorch extra: pip install 'tensorprobe[executorch]'")

from tensorprobe.capture import capture  # noqa: E402
from tensorprobe.diff import diff  # noqa: E402
from tensorprobe.nan import find_nonfinite_in_bundle  # noqa: E402
from tensorprobe.runtimes import get_runtime  # noqa: E402

from ._export_models import Net, NormConv, mean100_input, nan_channels  # noqa: E402

pytestmark = pytest.mark.executorch


@pytest.mark.parametrize("runtime", ["executorch", "executorch-xnnpack"])
def test_instance_norm_nan_is_found_at_the_norm_with_its_channels(runtime, tmp_path):
    model, x = NormConv().eval(), mean100_input()
    b = get_runtime(runtime).capture(model, (x,), out=tmp_path / "et")
    origin = find_nonfinite_in_bundle(b)
    # ExecuTorch's portable `_native_batch_norm_legit.no_stats` kernel (instance norm is not delegated to
    # XNNPACK) computes the variance as E[x²]−E[x]²: channels 4, 6, 8 (mean 100, std < 1e-2) go NaN.
    # The ETDump debug buffer shows the kernel's own output; ETRecord maps its debug handle to `norm`.
    assert origin.found and origin.module == "norm"
    assert origin.record == "norm/_native_batch_norm_legit.0:0"
    assert b[origin.record].runtime_name.startswith("native_call__native_batch_norm_legit")
    assert nan_channels(b.numpy(origin.record)) == [4, 6, 8]
    assert nan_channels(b.numpy("norm")) == [4, 6, 8]          # the module tap, named like PyTorch's capture
    assert nan_channels(b.numpy("<root>")) == list(range(16))   # the conv spreads NaN to every channel


def test_healthy_model_matches_pytorch_record_by_record(tmp_path):
    model = Net().eval()
    x = torch.randn(1, 16, 400)
    with torch.no_grad():  # an identity pre-conv: zero-mean channels, where every variance formula is fine
        model.pre.bias.zero_()
        model.pre.weight.copy_(torch.eye(16)[:, :, None])
    ref = capture(model, x, level="module", keep="full", out=tmp_path / "ref")
    b = get_runtime("executorch-xnnpack").capture(model, (x,), out=tmp_path / "xnn")
    report = diff(ref, b, atol=1e-4, rtol=1e-4)
    names = {p.name for p in report.pairs}
    assert {"pre", "blocks.0.norm", "blocks.1.act", "post", "<root>"} <= names
    assert report.passed, report.summary


def test_saved_pte_is_captured_again_with_names(tmp_path):
    model, x = NormConv().eval(), mean100_input()
    adapter = get_runtime("executorch")
    adapter.capture(model, (x,), out=tmp_path / "a", save=str(tmp_path / "m.pte"))
    b = adapter.capture_artifact(tmp_path / "m.pte", (x,), out=tmp_path / "b")
    assert nan_channels(b.numpy("norm")) == [4, 6, 8]


class _DropoutBlock(torch.nn.Module):
    """Kokoro's AdainResBlk1d pattern: one LeakyReLU shared by two calls, an eval-mode Dropout between
    activation and conv. Tapped, the dropout (a clone in the graph) became a partition returning its own
    input, which XNNPACK refused ("pass through arguments")."""

    def __init__(self):
        super().__init__()
        self.actv = torch.nn.LeakyReLU(0.2)
        self.dropout = torch.nn.Dropout(0.1)
        self.conv1 = torch.nn.Conv1d(8, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv1d(8, 8, 3, padding=1)

    def forward(self, x):
        x = self.conv1(self.dropout(self.actv(x)))
        return self.conv2(self.dropout(self.actv(x)))


def test_tapped_dropout_lowers_with_xnnpack_and_matches_pytorch(tmp_path):
    torch.manual_seed(0)
    model, x = _DropoutBlock().eval(), torch.randn(1, 8, 32)
    b = get_runtime("executorch-xnnpack").capture(model, (x,), out=tmp_path / "xnn")
    ref = capture(model, x, level="module", keep="full", out=tmp_path / "ref")
    report = diff(ref, b)
    assert {"dropout", "dropout@1", "actv@1", "conv2"} <= {p.name for p in report.pairs}
    assert report.passed, report.summary
    # the delegate's outputs say that their op is hidden, so diff never pairs them by order
    delegated = [r for r in b if r.op.startswith("delegate.")]
    assert delegated and all("opaque" in r.tags for r in delegated)
    assert not any("opaque" in r.tags for r in b if not r.op.startswith("delegate."))


class _KokoroAdaIN(torch.nn.Module):
    """Kokoro's own AdaIN1d (affine instance norm, `(1 + gamma) * norm(x) + beta`), untouched."""

    def __init__(self):
        super().__init__()
        from kokoro.istftnet import AdaIN1d

        self.adain = AdaIN1d(8, 16)

    def forward(self, x, style):
        return self.adain(x, style)


@pytest.mark.parametrize("runtime", ["executorch", "executorch-xnnpack"])
def test_kokoro_adain_norm_kernel_is_recorded_and_named_as_the_origin(runtime, tmp_path):
    torch.manual_seed(0)
    model, x, style = _KokoroAdaIN().eval(), mean100_input(), torch.randn(1, 8)
    b = get_runtime(runtime).capture(model, (x, style), out=tmp_path / "et")
    # The affine instance norm lowers to two `repeat` kernels and the batch-norm kernel under one debug
    # handle. Every kernel of a shared handle has its own event; keeping one event per handle lost the norm
    # kernel, and `nan` had to blame the `mul` after it.
    origin = find_nonfinite_in_bundle(b)
    assert origin.found and origin.cause == "record"
    assert origin.record == "adain.norm/_native_batch_norm_legit.0:0" and origin.module == "adain.norm"
    assert nan_channels(b.numpy(origin.record)) == [4, 6, 8]
    assert any("Every NaN channel (4, 6, 8)" in d for d in origin.diagnosis)   # measured on its input
    assert b.numpy("adain.norm/_native_batch_norm_legit.0:1").shape == (16,)   # its other outputs too
    # chunk's kernel returns a tensor list: one record per element, equal to PyTorch's gamma and beta
    with torch.no_grad():
        gamma, beta = model.adain.fc(style)[..., None].chunk(2, dim=1)
    torch.testing.assert_close(torch.from_numpy(b.numpy("adain/split_with_sizes_copy.0:0")), gamma)
    torch.testing.assert_close(torch.from_numpy(b.numpy("adain/split_with_sizes_copy.0:1")), beta)


def test_linear_kernels_sharing_a_debug_handle_are_each_recorded(tmp_path):
    torch.manual_seed(0)
    model, x, style = _KokoroAdaIN().eval(), torch.randn(1, 16, 40), torch.randn(1, 8)
    b = get_runtime("executorch").capture(model, (x, style), out=tmp_path / "et")
    with torch.no_grad():
        expected = model.adain.fc(style)
    torch.testing.assert_close(torch.from_numpy(b.numpy("adain.fc/addmm.0")), expected)
    assert b["adain.fc/permute_copy.0"].shape == (8, 32)   # the weight's transpose, same handle


def test_delegate_records_hold_its_outputs_not_its_inputs(tmp_path):
    torch.manual_seed(0)
    model, x, style = _KokoroAdaIN().eval(), torch.randn(1, 16, 40), torch.randn(1, 8)
    b = get_runtime("executorch-xnnpack").capture(model, (x, style), out=tmp_path / "xnn")
    delegated = [r for r in b if r.op.startswith("delegate.")]
    assert delegated
    # ExecuTorch logs every argument of a delegate call, inputs first. The style vector goes into the first
    # delegate (the fc) and never comes out unchanged, so no record of a delegate's outputs may hold it.
    assert not [r.name for r in delegated if r.shape == tuple(style.shape)]
    with torch.no_grad():
        expected = model(x, style)
    torch.testing.assert_close(torch.from_numpy(b.numpy(delegated[-1].name)), expected)
