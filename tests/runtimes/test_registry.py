"""The runtime interface itself: registry, artifacts by suffix, options checked up front, selection, run_module."""

import pytest
import torch

from tensorprobe.errors import InputError
from tensorprobe.runtimes import get_runtime, runtime_for_artifact, runtime_names
from tensorprobe.runtimes.base import RuntimeAdapter, Selection
from tensorprobe.runtimes.components import isolate_components


def test_artifacts_open_in_the_runtime_whose_adapter_claims_the_suffix():
    assert runtime_for_artifact("model.onnx") == "onnxruntime"
    assert runtime_for_artifact("dir/model.pte") == "executorch"
    assert runtime_for_artifact("model.so") == "tvm"
    assert runtime_for_artifact("model.tflite") is None


def test_options_come_from_the_hooks_signatures_and_unknown_ones_fail_before_running():
    ort = get_runtime("onnxruntime")
    assert set(ort.option_names()) == {"exporter", "opset", "rules", "max_bytes", "threads", "dynamic"}
    with pytest.raises(InputError, match="does not take option.*backend.*it takes exporter"):
        ort.check_options({"backend": "xnnpack"})
    get_runtime("tvm").check_options({"random": "zeros", "kernels": True})
    assert "kernels" in get_runtime("tvm").option_names(artifact=True)


def test_selection_keeps_a_record_when_any_of_its_names_is_included_and_none_excluded():
    sel = Selection.of(include=r"norm", exclude=r"fc")
    assert sel.wants("decode.0.norm1", "/Add_3_output_0")
    assert not sel.wants("decode.0.norm1.fc")
    assert not sel.wants("decode.0.conv1")
    assert Selection().wants("anything")


def test_only_runtimes_with_run_module_isolate_components():
    assert {n: get_runtime(n).can_run_modules() for n in runtime_names()} == {
        "executorch": True, "executorch-xnnpack": True, "onnx": False, "onnxruntime": False, "tvm": True,
        "inductor": False, "aot_eager": False}
    with pytest.raises(InputError, match="'onnxruntime' cannot run one module alone"):
        isolate_components(torch.nn.Linear(2, 2), (torch.ones(1, 2),), get_runtime("onnxruntime"))


def test_an_adapter_holds_no_state_of_one_capture():
    """Options travel on the artifact: one adapter serves captures with different options."""
    pytest.importorskip("onnxruntime")
    ort = get_runtime("onnxruntime")
    assert [k for k in vars(ort) if k != "last_run"] == []
    assert not hasattr(RuntimeAdapter(), "_select")
