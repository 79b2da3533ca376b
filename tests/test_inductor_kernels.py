"""Inductor's kernels per module call (`tensorprobe.inductor_kernels`): recorded by a compiled capture from
Inductor's own provenance tracking, on a real compile (C++ code generation on this CPU), then worded for the
first divergence by compare and diff."""

import pytest
import torch

import tensorprobe as tp
from examples.compiled_net import build, wrong_decomposition
from tensorprobe.compare import compare
from tensorprobe.inductor_kernels import kernel_facts


def test_facts_words_fused_and_external_kernels():
    kernels = [
        {"kernel": "extern_kernels.convolution", "extern": True, "modules": ["conv"], "within": ["conv"],
         "ops": ["convolution"], "reductions": []},
        {"kernel": "cpp_fused_0", "extern": False, "modules": ["norm", "act"], "within": ["act", "block", "norm"],
         "ops": ["_native_batch_norm_legit", "leaky_relu"], "reductions": ["var_mean"],
         "module_reductions": {"block": ["var_mean"], "norm": ["var_mean"]}},
    ]
    assert kernel_facts(kernels, "conv").startswith("Inductor runs conv as external kernels (convolution)")
    fact = kernel_facts(kernels, "norm")
    assert "one generated kernel with act" in fact and "reduces (var_mean)" in fact
    assert "external kernels: convolution" not in fact
    assert "reduces" not in kernel_facts(kernels, "act")   # the norm's reduction, fused beside it, is not its own
    assert kernel_facts(kernels, "block") is not None and kernel_facts(kernels, "other") is None
    assert kernel_facts(None, "norm") is None and kernel_facts([], "norm") is None


@pytest.mark.slow
def test_an_inductor_capture_records_which_kernel_computes_each_module(tmp_path):
    model, x = build()
    first = tp.capture(model, *x, compile=True, backend="inductor", out=tmp_path / "a")
    kernels = first.manifest["capture"]["compile"]["kernels"]
    by_module = {m: k for k in kernels for m in k["modules"]}
    assert by_module["blocks.0.conv"]["extern"] and by_module["blocks.0.conv"]["kernel"] == "extern_kernels.convolution"
    norm = by_module["blocks.0.norm"]
    assert not norm["extern"] and "blocks.0.act" in norm["modules"] and "var_mean" in norm["reductions"]
    assert by_module["blocks.1.norm@1"] is not by_module["blocks.1.norm"]   # each call its own kernel
    # a second capture is served by Inductor's FX graph cache: the kernels come with the cached graph
    again = tp.capture(model, *x, compile=True, backend="inductor", out=tmp_path / "b")
    assert again.manifest["capture"]["compile"]["kernels"] == kernels
    # aot_eager generates no kernels: nothing is claimed
    plain = tp.capture(model, *x, compile=True, backend="aot_eager", out=tmp_path / "c")
    assert "kernels" not in plain.manifest["capture"]["compile"]


@pytest.mark.slow
def test_compare_names_the_kernel_of_the_first_divergence(tmp_path):
    model, x = wrong_decomposition()
    res = compare(model, x, "inductor", out=tmp_path / "c")
    assert res.first_divergence == "blocks.1.act.1"
    fact = next(n for n in res.notes if n.startswith("Inductor fuses"))
    assert "blocks.1.act.1 into one generated kernel" in fact and "rms" in fact and "blocks.1.norm" in fact


@pytest.mark.slow
def test_diff_of_an_inductor_capture_names_the_kernel_of_the_first_divergence(tmp_path):
    """`capture --compile` keeps the kernels in the bundle: `diff` prints them for the first divergence (and
    `--json` carries them as `inductor`); against a faithful eager capture of the plain net, nothing is said."""
    from typer.testing import CliRunner

    from tensorprobe.cli import app

    model, x = wrong_decomposition()
    tp.capture(model, *x, out=tmp_path / "e")
    tp.capture(model, *x, compile=True, backend="inductor", out=tmp_path / "c")
    res = CliRunner().invoke(app, ["diff", str(tmp_path / "e"), str(tmp_path / "c")])
    assert res.exit_code == 1
    text = " ".join(res.output.split())
    assert "kernels: Inductor fuses blocks.1.act.1 into one generated kernel" in text and "rms" in text
    model, x = build()
    tp.capture(model, *x, out=tmp_path / "e2")
    tp.capture(model, *x, compile=True, backend="inductor", out=tmp_path / "c2")
    ok = CliRunner().invoke(app, ["diff", str(tmp_path / "e2"), str(tmp_path / "c2")])
    assert ok.exit_code == 0 and "kernels:" not in ok.output
