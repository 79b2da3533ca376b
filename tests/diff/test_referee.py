"""The float64 referee (`tensorprobe.diff.referee`, `tensorprobe.referee.capture_fp64`, `diff --referee fp64`):
which side of a port is closer to the exact answer. Every side runs for real: eager, torch.compile (aot_eager;
Inductor marked slow), reduced precision."""

import copy

import pytest
import torch

import tensorprobe as tp
# imported when the tests are collected: the docs tests later put their own copies of examples/ in sys.modules
from examples.noisy import build as noisy
from tensorprobe.diff.referee import judge, referee
from tensorprobe.referee import capture_fp64
from tests.test_compiled import LowPrecisionNorm, _net


def _gelu_mlp(seed: int = 0):
    """A second architecture: an MLP with a layer norm and GELU, a model without convolutions."""
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.LayerNorm(64), torch.nn.GELU(),
                            torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8))
    return m.eval(), (torch.randn(32, 16) * 2,)


def test_judge_rule():
    assert judge(4.8e-6, 2.1e-6) == "closer"
    assert judge(1e-7, 1.6e-7) == "as_close"
    assert judge(1e-9, 5e-7) == "as_close"        # both within rounding of float64
    assert judge(1e-7, 3e-3) == "parts"


@pytest.mark.parametrize("build", [_net, _gelu_mlp])
def test_faithful_compiled_port_is_not_a_bug(build, tmp_path):
    model, x = build()
    eager = tp.capture(model, *x, keep="full", out=tmp_path / "e")
    comp = tp.capture(model, *x, keep="full", compile=True, backend="aot_eager", out=tmp_path / "c")
    r = referee(eager, comp, capture_fp64(model, *x, out=tmp_path / "f"), ref_label="eager", cand_label="compiled")
    assert r.verdict in ("as_close", "closer") and not r.is_bug and r.first_parting is None
    assert "not a bug" in r.summary()
    assert r.outputs and all(o.ref_err < 1e-5 for o in r.outputs)


def test_compile_only_float16_reduction_parts_from_both(tmp_path):
    model, x = _net()
    eager = tp.capture(model, *x, keep="full", out=tmp_path / "e")
    fp64 = capture_fp64(model, *x, out=tmp_path / "f")
    model.blocks[1].norm = LowPrecisionNorm(model.blocks[1].norm)   # compiled path only
    comp = tp.capture(model, *x, keep="full", compile=True, backend="aot_eager", out=tmp_path / "c")
    r = referee(eager, comp, fp64, ref_label="eager", cand_label="compiled")
    assert r.verdict == "parts" and r.is_bug
    assert r.first_parting.name == "blocks.1.norm"
    first = r.first_parting
    assert first.cand_err > 100 * first.ref_err
    assert "parts from both the eager and float64 at blocks.1.norm" in r.summary()
    # the records before it are judged as close as eager
    assert all(rec.verdict != "parts" for rec in r.records if rec.name in ("pre", "blocks.0.norm", "blocks.1.conv"))


@pytest.mark.parametrize("build", [_net, _gelu_mlp])
def test_a_port_that_keeps_float32_is_closer_than_a_bfloat16_reference(build, tmp_path):
    """The reference rounds every op to bfloat16 (what eager does under a bf16 model); the candidate keeps
    float32 (what a fused kernel does with its intermediates): it parts from the reference, by far more than
    float32 rounding, yet it is the one closer to float64."""
    model, x = build()
    ref_model = copy.deepcopy(model).to(torch.bfloat16)
    xb = tuple(t.to(torch.bfloat16) for t in x)
    ref = tp.capture(ref_model, *xb, keep="full", out=tmp_path / "bf16")
    # the port: the same bf16 weights, computed in float32
    cand_model = copy.deepcopy(ref_model).float()
    cand = tp.capture(cand_model, *(t.float() for t in xb), keep="full", out=tmp_path / "fp32")
    fp64 = capture_fp64(ref_model, *xb, out=tmp_path / "f")
    r = referee(ref, cand, fp64, ref_label="bfloat16 eager", cand_label="float32 port")
    assert r.verdict == "closer" and not r.is_bug
    out = r.outputs[0]
    assert out.cand_err < out.ref_err / 10
    assert "float32 port is closer to float64 than bfloat16 eager" in r.summary()


def test_stats_only_bundles_judge_the_outputs(tmp_path):
    model, x = _net()
    eager = tp.capture(model, *x, out=tmp_path / "e")
    comp = tp.capture(model, *x, compile=True, backend="aot_eager", out=tmp_path / "c")
    r = referee(eager, comp, capture_fp64(model, *x, out=tmp_path / "f"))
    assert {o.name for o in r.outputs} == {"output.0", "output.1"}
    assert r.skipped > 0 and r.notes and not r.is_bug


def test_the_float64_run_draws_the_references_noise(tmp_path):
    """A model with a noise source: the float64 referee replays the reference's draws (widened), so both sides
    are judged on the same noise (relative error ~1e-7); drawing its own, the referee was 0.16 from both, and a
    compile that changed the noise's scale would have been 'as close' too. The CLI replays when the reference
    bundle holds draws; `capture_fp64` takes `replay_rng`."""
    model, x = noisy()
    torch.manual_seed(0)
    eager = tp.capture(model, *x, keep="full", out=tmp_path / "e")
    torch.manual_seed(0)   # the compiled run draws the same noise
    comp = tp.capture(model, *x, keep="full", compile=True, backend="aot_eager", out=tmp_path / "c")
    fp64 = capture_fp64(model, *x, replay_rng=eager, out=tmp_path / "f")
    r = referee(eager, comp, fp64)
    assert r.verdict == "as_close" and max(o.ref_err for o in r.outputs) < 1e-6
    own = referee(eager, comp, capture_fp64(model, *x, out=tmp_path / "own"))
    assert min(o.ref_err for o in own.outputs) > 1e-2   # without replay: another noise


def test_cli_diff_referee_fp64(tmp_path):
    from typer.testing import CliRunner

    from tensorprobe.cli import app

    target = tmp_path / "t.py"
    target.write_text(
        "import sys\n"
        f"sys.path.insert(0, {str(tmp_path.parent)!r})\n"
        "from tests.test_compiled import LowPrecisionNorm, _net\n"
        "def build():\n"
        "    return _net()\n"
        "def planted():\n"
        "    model, x = _net()\n"
        "    model.blocks[1].norm = LowPrecisionNorm(model.blocks[1].norm)\n"
        "    return model, x\n")
    run = CliRunner().invoke
    assert run(app, ["capture", f"{target}:build", "-o", str(tmp_path / "e"), "--keep", "full"]).exit_code == 0
    for name, factory in (("c", "build"), ("bad", "planted")):
        res = run(app, ["capture", f"{target}:{factory}", "-o", str(tmp_path / name), "--keep", "full", "--compile",
                        "--backend", "aot_eager"])
        assert res.exit_code == 0, res.output
    ok = run(app, ["diff", str(tmp_path / "e"), str(tmp_path / "c"), "--referee", "fp64", "--referee-target",
                   f"{target}:build"])
    assert ok.exit_code == 0, ok.output
    assert "float64 referee" in ok.output and "not a bug" in ok.output
    bad = run(app, ["diff", str(tmp_path / "e"), str(tmp_path / "bad"), "--referee", "fp64", "--referee-target",
                    f"{target}:build", "--json"])
    assert bad.exit_code == 1
    import json
    doc = json.loads(bad.output)
    assert doc["referee"]["verdict"] == "parts" and doc["referee"]["first_parting"] == "blocks.1.norm"
    missing = run(app, ["diff", str(tmp_path / "e"), str(tmp_path / "c"), "--referee", "fp64"])
    assert missing.exit_code == 2 and "--referee-target" in missing.output


@pytest.mark.slow
def test_inductor_bfloat16_is_closer_to_float64_than_eager_bfloat16(tmp_path):
    """The public shape of many 'compiled differs from eager' reports: a bf16 model, where eager rounds every
    op's result to bf16 and Inductor keeps float32 inside its fused kernels. The referee says which is right."""
    model, x = _gelu_mlp()
    model = model.to(torch.bfloat16)
    xb = tuple(t.to(torch.bfloat16) for t in x)
    eager = tp.capture(model, *xb, keep="full", out=tmp_path / "e")
    comp = tp.capture(model, *xb, keep="full", compile=True, backend="inductor", out=tmp_path / "c")
    r = referee(eager, comp, capture_fp64(model, *xb, out=tmp_path / "f"), ref_label="eager",
                cand_label="compiled")
    assert not r.is_bug, r.summary()
    assert r.outputs[0].cand_err <= r.outputs[0].ref_err * 2


class _CompileOnlySlope(torch.nn.Module):
    """A LeakyReLU whose compiled path uses slope 0.3 instead of the model's."""

    def __init__(self, slope):
        super().__init__()
        self.slope = slope

    def forward(self, x):
        return torch.nn.functional.leaky_relu(x, 0.3 if torch.compiler.is_compiling() else self.slope)


@pytest.mark.slow
def test_a_compile_only_bug_in_a_model_that_amplifies_rounding_is_still_a_bug(tmp_path):
    """The Kokoro decoder's float32 output is itself 1.2 (relative) from float64: at the outputs both sides are
    'as close', and the referee cleared a compile-only slope change in encode.actv (exit 0, found by the new-user
    validation). With outputs that cannot tell, the first record where eager is still close to float64 and the
    compiled side is 100x further decides: it parts there."""
    from tensorprobe.compare import compare
    from tensorprobe.examples import kokoro

    model, x = kokoro.decoder()
    model.encode.actv = _CompileOnlySlope(model.encode.actv.negative_slope)
    res = compare(model, x, "aot_eager", out=tmp_path / "k", referee="fp64")
    assert res.referee.ill_conditioned and res.referee.verdict == "parts" and res.finding
    assert res.referee.clear_parting.name == "encode.actv"
    assert "the record decides" in res.referee.summary()
