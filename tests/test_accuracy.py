"""The accuracy benchmark's quick slice (bench/accuracy, docs/accuracy.md): ~300 seeded truth-known cases, faithful
ports and one planted bug each, over every architecture family × port (PyTorch, float16, bfloat16, ONNX Runtime
through the legacy exporter, aot_eager) × capture level, run as a user runs them, ~120 `nan` cases (a planted
source of NaN/Inf, a handled mask, or none) and ~60 `isolate` cases (PyTorch, float16 and bfloat16
candidates) and 7 `sweep` cases (a corpus whose longer items only a planted bug bites). No faithful port may be
called diverged, and the first divergence and its cause must stay right
as often as they are now (the issue's targets, 98% and 90%, are in docs/accuracy.md with every miss listed;
these floors only rise)."""

from __future__ import annotations

import os

import pytest

from bench.accuracy.__main__ import QUICK
from bench.accuracy.cases import Case, generate
from bench.accuracy.isolate import IsolateCase, generate_isolate
from bench.accuracy.nan import NanCase, generate_nan
from bench.accuracy.report import misses, score
from bench.accuracy.run import run_case, run_population
from bench.accuracy.sweep import SweepCase, generate_sweep

LOCALIZED_FLOOR = 0.98   # measured 1.000 here (154 planted): three cases of margin for another CPU's rounding
CAUSE_FLOOR = 0.98       # measured 1.000


@pytest.fixture(scope="module")
def quick():
    pytest.importorskip("onnxruntime")
    cases = generate(QUICK["count"], QUICK["seed"], ports=QUICK["ports"]) + generate_nan(QUICK["nan"], QUICK["seed"]) \
        + generate_isolate(QUICK["isolate"], QUICK["seed"]) + generate_sweep(QUICK["sweep"], QUICK["seed"],
                                                                                 QUICK["sweep_ports"])
    return cases, run_population(cases, jobs=min(2, os.cpu_count() or 1), progress=False)


def test_the_quick_slice_is_at_least_200_cases_over_every_cell(quick):
    cases, _ = quick
    diffs, nans = [c for c in cases if isinstance(c, Case)], [c for c in cases if isinstance(c, NanCase)]
    assert len(diffs) >= 200
    assert {c.port for c in diffs} == set(QUICK["ports"]) and len({c.cell for c in diffs}) >= 150
    assert sum(c.bug is None for c in diffs) >= 100 and sum(c.bug is not None for c in diffs) >= 100
    # `nan`: planted sources of NaN/Inf, handled masks and faithful models over every family, float32 and float16
    assert len({c.cell for c in nans}) >= 14 and sum(c.bug is not None for c in nans) >= 50
    assert sum(c.truth.startswith("handled:") for c in nans) >= 20
    # `isolate`: planted bugs and faithful twins in PyTorch, float16 and bfloat16 candidates
    isolates = [c for c in cases if isinstance(c, IsolateCase)]
    assert len({c.cell for c in isolates}) >= 21 and sum(c.bug is not None for c in isolates) >= 30
    # `sweep`: a corpus per case, a bug biting its longer items only, or none, over every family
    sweeps = [c for c in cases if isinstance(c, SweepCase)]
    assert len({c.cell for c in sweeps}) >= 7 and sum(c.bug is None for c in sweeps) >= 2 and \
        sum(c.bug is not None for c in sweeps) >= 4


def test_no_false_alarm_on_a_faithful_port_and_every_case_runs(quick):
    _, outcomes = quick
    total = score(outcomes)
    wrong = [m for m in misses(outcomes) if m["what"].startswith(("false alarm", "failed to run"))]
    assert total["false_alarms"] == 0 and total["errors"] == 0, wrong


def test_the_first_divergence_and_its_cause_are_right_as_often_as_measured(quick):
    _, outcomes = quick
    total = score(outcomes)
    assert total["planted"] >= 100 and total["detected"] == 1.0, misses(outcomes)
    assert total["localized"] >= LOCALIZED_FLOOR, misses(outcomes)
    assert total["cause_right"] >= CAUSE_FLOOR, misses(outcomes)


@pytest.mark.parametrize("case_id, first", [
    # an exporter folds the eval-mode BatchNorm into the conv before it: the conv's value holds the norm's
    ("convnorm-batch-affine-gelu/onnx-legacy/module-stats/faithful/s666", None),
    # ... and the dynamo exporter keeps the conv's weight names with the folded values
    ("convnorm-batch-affine-gelu/onnx/module-stats/faithful/s666", None),
    # the same port with the norm's eps changed: named at the norm the port fused
    ("convnorm-batch-affine-gelu/onnx-legacy/module-full/eps@blocks.0.1/s9954", "blocks.0.1"),
    # two output channels swapped: statistics cannot see it, the weight's fingerprint can: named at its reader
    ("convnorm-instance-affine-gelu/torch/module-stats/permute_out@post/s4242", "post"),
    # a bias dropped in a bfloat16 port, inside its wide noise floor but far above what comes before it
    ("attention/bf16/module-full/drop_bias@ff.0/s9802", "ff.0"),
    # the dynamo exporter stores a Linear's weight transposed as val_N: paired through the MatMul that reads it
    ("attention/onnx/module-stats/scale_weight@mix/s62", "mix"),
    ("attention/onnx/module-stats/faithful/s62", None),
    # a zeroed bias is dropped from the export: the conv reads no bias, and that is the cause
    ("convnorm-group-affine-gelu/onnx/module-full/drop_bias@pre/s5685", "pre"),
    # permutations and reversed kernels in float16/bfloat16 ports, seen by the sketches of statistics captures
    ("rnn-gru/fp16/module-stats/permute_out@head/s6934", "head"),
    ("convnorm-group-plain-leaky/fp16/module-stats/flip_kernel@blocks.0.0/s9497", "blocks.0.0"),
    # at op level, a gain from frame 20 on inside pre: named at the op only the port has
    ("convnorm-instance-affine-leaky/torch/op-full/late_frames@pre/s4617", "blocks.0.0/convolution.0"),
])
def test_the_repros_of_exporter_folding_and_unseen_weights(case_id, first):
    pytest.importorskip("onnxruntime")
    outcome = run_case(Case.from_id(case_id))
    if first is None:
        assert outcome["verdict"] == "match", outcome["summary"]
    else:
        assert outcome["first_divergence"] == first and outcome["cause_right"], outcome["summary"]


@pytest.mark.parametrize("case_id, place, cause_right", [
    # op level, the dynamo export: the Linear's ops have no counterpart, the next norm is the first record that
    # fails; the verdict names the module whose weight differs and has no value of its own in the port
    ("attention/onnx/op-full/scale_weight@mix/s7784", "mix (its weight mix.weight differs", True),
    # the dynamo exporter folds the BatchNorm into the conv: "made here or in blocks.0.0" (the cause cannot be
    # told: folded weights differ in a faithful export too)
    ("convnorm-batch-plain-leaky/onnx/module-full/permute_out@blocks.0.0/s5273", "blocks.0.1 or blocks.0.0", False),
    # ... at op level, a norm's eps changed: the norm reads the conv's folded weights, which differ by the folding
    # and by the eps alike; the first record is the norm's "or the conv's (the port holds the two in one value)"
    ("convnorm-batch-plain-gelu/onnx/op-full/eps@blocks.0.1/s6262",
     "blocks.0.0 (its weight blocks.0.0.bias differs, and the port has no value of blocks.0.0's own to compare), "
     "seen first at blocks.0.1/native_batch_norm.0:0 or blocks.0.0/convolution.0", False),
])
def test_the_verdict_names_where_the_error_enters_when_the_port_has_no_value_there(case_id, place, cause_right):
    pytest.importorskip("onnxruntime")
    outcome = run_case(Case.from_id(case_id))
    assert outcome["localized"] and outcome["cause_right"] == cause_right, outcome["summary"]
    assert f"first divergence at {place}" in outcome["summary"]


@pytest.mark.parametrize("case_id, place, cause", [
    # int8 (quantize_dynamic): a gain from frame 20 on after the quantized conv of `post`, judged by that kernel's
    # figures ("not quantization noise") at module level, and at op level through the module's value
    ("convnorm-instance-plain-leaky/onnx-int8/module-full/late_frames@post/s8659", "post", "own"),
    ("convnorm-instance-plain-leaky/onnx-int8/op-full/late_frames@blocks.1.0/s5627", "blocks.1.0/convolution.0", "own"),
    # ... after a ConvTranspose the quantizer leaves in float: a linear op that multiplies its input's error by 32
    ("hifi-leaky/onnx-int8/module-full/late_frames@up/s7262", "up", "own"),
    # the weight an int8 kernel reads, paired through its quant tag: weight_norm's computed weight, MatMulInteger's B
    ("hifi-snake/onnx-int8/module-full/scale_weight@post/s2667", "post", "weights"),
    ("attention/onnx-int8/module-full/scale_weight@inp/s6454", "inp", "weights"),
    # a bias the int8 port lacks is named before "beyond what int8 explains"
    ("convnorm-instance-plain-leaky/onnx-int8/module-full/drop_bias@post/s2363", "post", "weights"),
    # a draw of another distribution is the port's bug even after int8 error entered
    ("noisy/onnx-int8/module-full/uniform_for_normal@noise/s6406", "noise/randn_like.0", "own"),
    # a mel MatMul whose int8 nodes carry no module (the quantizer drops node metadata, and its weight is a
    # constant the exporter made): the export's value scopes give its value to mel, compared there
    ("meldb/onnx-int8/module-full/scale_weight@mel/s9168", "mel (mel, module:Linear)", "weights"),
    # bfloat16 at op level: the norm reading the port's gain (a cat only the port has) no longer passes on its
    # input's measured error, which is not of the value it reads
    ("convnorm-batch-affine-leaky/bf16/op-full/late_frames@blocks.0.0/s3586", "blocks.0.0 (blocks.0.0/cat.0", "own"),
    ("convnorm-group-plain-gelu/bf16/op-full/late_frames@blocks.1.0/s6740", "blocks.1.0 (blocks.1.0/cat.0", "own"),
    # aot_eager at op level: the compiled capture's <root> holds the value of post's cat
    ("convnorm-layer-plain-leaky/aot_eager/op-full/late_frames@post/s4371", "post (post/cat.0", "own"),
    # ONNX Runtime's int8 LSTM (DynamicQuantizeLSTM): its dequantized W and R pair with the layer's weights
    ("rnn-lstm/onnx-int8/module-full/scale_weight@rnn/s4365", "rnn:0", "weights"),
    # a weight of a module the port records no judged value of (its ops compiled away; an all-zero mask is not one)
    ("attention/aot_eager/op-full/scale_weight@attn/s4276", "attn (its weight attn.in_proj_weight differs", "weights"),
    # weight_norm in a float export: the conv reads the computed weight, not v
    ("hifi-leaky/onnx/module-full/scale_weight@res.convs.0/s2174", "res.convs.0", "weights"),
    # int8 conv with no bias and a folded weight_norm weight: its rescale keeps its module through the export's
    # value scopes (the quantizer drops node metadata), and the missing bias is named there
    ("hifi-leaky/onnx-int8/module-stats/drop_bias@pre/s505", "pre", "weights"),
    # ... at op level, the conv's weight_norm op (made from weights alone, folded by the exporter) is no input
    # "not compared"
    ("hifi-snake/onnx-int8/op-full/drop_bias@pre/s1078", "pre/convolution.0", "weights"),
    # statistics only: a float ConvTranspose whose proven error is 27x its int8 input's estimate; with a bias
    # the port lacks, that bias; a quantized conv 16x over its input with its bias gone
    ("hifi-leaky/onnx-int8/module-stats/late_frames@up/s3484", "up", "own"),
    ("hifi-leaky/onnx-int8/module-stats/drop_bias@up/s4850", "up", "weights"),
    ("convnorm-instance-plain-gelu/onnx-int8/module-stats/drop_bias@blocks.0.0/s9993", "blocks.0.0", "weights"),
    # a gain on late frames that the LayerNorm after it removes: the norm's value agrees, what it reads does not;
    # a GroupNorm after it fails "amplified" on the input the reference reads, not the one the port's op reads
    ("convnorm-layer-plain-leaky/bf16/op-full/late_frames@blocks.0.0/s196", "blocks.0.0 (blocks.0.0/cat.0", "own"),
    ("convnorm-group-plain-leaky/bf16/op-full/late_frames@blocks.1.0/s4807", "blocks.1.0 (blocks.1.0/cat.0", "own"),
    # a GroupNorm the port computes by other ops on a (batch, groups, -1) view: compared with the reference's
    # norm op as that view, the error enters in the norm
    ("convnorm-group-plain-leaky/torch/op-full/one_pass_variance@blocks.0.1/s4612", "blocks.0.1 (blocks.0.1/div.0",
     "own"),
    # an LSTM the two sides decompose differently (no comparable value of its own) reads a weight that differs:
    # no exporter folds a weight into a recurrent layer, so the float16 floor after it does not clear it
    ("rnn-lstm/fp16/op-full/scale_weight@rnn/s2740", "rnn (its weight rnn.weight_ih_l0 differs", "weights"),
    # op level: the conv reads weight_norm's op value, the same value as the derived weight the port's folded
    # constant was paired with
    ("hifi-snake/onnx/op-full/scale_weight@up/s7999", "up/convolution.0", "weights"),
    # static int8 (QDQ): a mel front end whose |X| the port quantizes in the model's own code is int8's loss,
    # not the first divergence, so the conv with the wrong weight after it is named
    ("meldb/onnx-qdq/op-full/scale_weight@proj/s4407", "proj/convolution.0", "weights"),
    # Inductor's kernels round otherwise than eager's: the front end's sqrt is no divergence, the mel weight is
    ("meldb/inductor/op-full/scale_weight@mel/s6506", "mel/mm.0", "weights"),
    # static int8: a gain past frame N after the conv, each branch re-quantized before the cat, judged by the
    # conv's figures (statistics only)
    ("convnorm-instance-affine-leaky/onnx-qdq/module-stats/late_frames@pre/s708", "pre", "own"),
    # ... a DFT basis whose sine rows at 0 Hz and Nyquist are zero: their channels' scale of 1 is no step of the
    # weight's
    ("meldb/onnx-qdq/module-full/scale_weight@stft/s4363", "stft", "weights"),
    # ExecuTorch records no weights: a gain in a module's own code is its own, not "a bias the port lacks"
    ("hifi-snake/executorch/module-stats/late_frames@up/s4783", "up", "own"),
])
def test_planted_bugs_found_where_quantization_compilation_or_16_bits_hid_them(case_id, place, cause):
    pytest.importorskip("onnxruntime")
    outcome = run_case(Case.from_id(case_id))
    assert outcome["localized"] and outcome["cause"] == cause, outcome["summary"]
    assert f"first divergence at {place}" in outcome["summary"], outcome["summary"]


@pytest.mark.parametrize("case_id, verdict", [
    # the faithful twins of the int8 and bfloat16 cases above: no bug is named
    ("convnorm-instance-plain-leaky/onnx-int8/module-full/faithful/s8659", None),
    ("hifi-leaky/onnx-int8/module-full/faithful/s7262", None),
    ("convnorm-batch-affine-leaky/bf16/op-full/faithful/s3586", "match"),
    ("convnorm-layer-plain-leaky/aot_eager/op-full/faithful/s4371", "match"),
    ("hifi-leaky/onnx-int8/module-stats/faithful/s4850", None),
    ("convnorm-layer-plain-leaky/bf16/op-full/faithful/s196", "match"),
    # an op the port computes by other ops (a transposed front end, attention's in-projection) is no view of
    # the reference's value it stands for
    ("meldb/onnx/op-full/faithful/s4903", "match"),
    # ... nor a model output that passes a quantized port's criterion, read through the int8 Linear it replaces
    ("attention/onnx-int8/op-full/faithful/s4810", "match"),
    ("attention/aot_eager/op-full/faithful/s4525", "match"),
    ("rnn-lstm/fp16/op-full/faithful/s2740", None),
    # conv + BatchNorm folded by the exporter, then quantized: the int8 conv keeps the conv's module
    ("convnorm-batch-plain-leaky/onnx-int8/module-stats/faithful/s8077", "match"),
    # a flow's log-determinant in bfloat16: a sum near zero of two terms, each off by bfloat16's rounding, misses
    # the output criterion (SNR -4 dB): diverged, by rounding amplified, no bug blamed (lossy, not a false alarm)
    ("flow/bf16/module-stats/faithful/s1536", "diverged"),
    # static int8 (QDQ): conv + BatchNorm folded, then the folded bias quantized to int32 under the new scale: no
    # weight blamed, at module level (the Sequential read the folded conv's bias) or op level (the norm did)
    ("convnorm-batch-affine-gelu/onnx-qdq/module-full/faithful/s9177", "match"),
    ("convnorm-batch-plain-leaky/onnx-qdq/op-full/faithful/s8654", "match"),
    # ... a Linear's weight the exporter made a transposed constant, read through its DequantizeLinear
    ("attention/onnx-qdq/module-full/faithful/s7024", "match"),
    # ... a magnitude spectrum the port quantizes inside the model's own code (sqrt of quantized squares): int8's
    # loss, not the mel Linear's own error
    ("meldb/onnx-qdq/module-full/faithful/s4028", "match"),
    # Inductor: its own kernels are not eager's arithmetic (a floor of rounding, not of zero); with
    # fallback_random it draws eager's numbers
    ("flow/inductor/op-full/faithful/s797", "match"),
    ("noisy/inductor/module-full/faithful/s5060", "match"),
    # static int8: an instance norm's weight repeated by the reference's op (made from weights alone, which
    # agree) pairs with a constant the port made: not compared, not a divergence
    ("convnorm-instance-affine-gelu/onnx-qdq/op-full/faithful/s4437", "match"),
    # ... a flow's log-determinant sums the quantized log-scales its own code makes: int8's error summed
    ("flow/onnx-qdq/module-full/faithful/s4768", "match"),
])
def test_faithful_twins_blame_no_bug(case_id, verdict):
    pytest.importorskip("onnxruntime")
    outcome = run_case(Case.from_id(case_id))
    assert not outcome["false_alarm"], outcome["summary"]
    if verdict is not None:
        assert outcome["verdict"] == verdict, outcome["summary"]
    if verdict == "diverged":
        assert outcome["lossy"] and outcome["cause"] == "amplified", outcome["summary"]
