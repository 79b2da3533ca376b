"""Replay feeds a recorded draw only to the same kind of draw, and a draw of another kind, or draws consumed in
another order, is a port difference at that random op in `diff`, `isolate` and `sweep` alike, never noise.

Each bug has its twin that keeps the truth: the same distribution drawn by another call (`torch.randn(shape)`
for `randn_like`, `normal_(0, 1)`, ONNX's RandomNormal) or the same ops computed in another order."""

from __future__ import annotations

import json
import textwrap
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorprobe as tp
from tensorprobe.bundle import Bundle
from tensorprobe.diff import diff
from tensorprobe.diff.draws import TAG_DRAW_DIFFERS, TAG_DRAW_ORDER
from tensorprobe.isolate import isolate
from tensorprobe.rng import RngReplay, export_noise
from tensorprobe.rng.draws import Draw, draw_of

DRAWS = {
    "randn_like": lambda x: torch.randn_like(x),
    "randn": lambda x: torch.randn(x.shape),                       # twin: the same normal(0, 1) draw
    "normal_": lambda x: torch.empty_like(x).normal_(0.0, 1.0),    # twin
    "rand_like": lambda x: torch.rand_like(x),                     # bug: uniform
    "normal_half": lambda x: torch.empty_like(x).normal_(0.0, 0.5),  # bug: std 0.5
}
TWINS, BUGS = ("randn", "normal_"), ("rand_like", "normal_half")


class Source(torch.nn.Module):
    def __init__(self, draw: str):
        super().__init__()
        self.draw = draw
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        draw = DRAWS[self.draw] if isinstance(self.draw, str) else self.draw
        return self.lin(x + 0.1 * draw(x))


class Net(torch.nn.Module):
    def __init__(self, draw: str = "randn_like"):
        super().__init__()
        torch.manual_seed(0)
        self.src = Source(draw)
        self.out = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.out(torch.tanh(self.src(x)))


@pytest.fixture()
def x():
    return torch.ones(2, 8)


def _cap(model, x, seed, level="op", **kw):
    torch.manual_seed(seed)
    return tp.capture(model, x, level=level, keep="full", **kw)


def _draw_pair(report):
    return next(p for p in report.pairs if p.kind == "rng")


@pytest.mark.parametrize("level", ["op", "module"])
def test_replayed_draw_of_another_kind_is_refused_and_found_at_the_random_op(x, level):
    ref = _cap(Net(), x, 1, level)
    for draw in BUGS:
        with pytest.warns(UserWarning, match="where the reference draws normal"):
            cand = _cap(Net(draw), x, 2, level, replay_rng=ref)
        rng = next(r for r in cand if r.kind == "rng")
        assert "replayed" not in rng.tags                                 # it kept its own draw
        assert any("not replayed, it keeps its own draw" in w for w in cand.manifest["warnings"])
        report = diff(ref, cand)
        pair = _draw_pair(report)
        assert report.verdict == "diverged" and report.first_divergence == "src/randn_like.0", report.summary
        assert pair.cause == "own" and TAG_DRAW_DIFFERS in pair.tags and report.rng_differs == ()
        assert report.get(report.output).cause == "inherited"
        words = ("uniform `rand_like` where the reference draws normal `randn_like`" if draw == "rand_like" else
                 "normal (mean 0, std 0.5) `normal_` where the reference draws normal (mean 0, std 1) `randn_like`")
        assert words in report.summary and "noise, not by the port" not in report.summary
    for draw in TWINS:
        cand = _cap(Net(draw), x, 2, level, replay_rng=ref)
        assert "replayed" in next(r for r in cand if r.kind == "rng").tags
        report = diff(ref, cand)
        assert report.verdict == "match", report.summary
        assert _draw_pair(report).match == "order"      # randn.0 (normal_.0) stands for randn_like.0


def test_without_replay_another_draw_is_the_port_and_the_same_draw_is_noise(x):
    ref = _cap(Net(), x, 1)
    for draw in BUGS:
        report = diff(ref, _cap(Net(draw), x, 2))
        assert report.first_divergence == "src/randn_like.0" and _draw_pair(report).cause == "own", report.summary
        assert "by random noise, not by the port" not in report.summary and report.rng_note is None
    for draw in TWINS + ("randn_like",):
        report = diff(ref, _cap(Net(draw), x, 2))
        assert report.verdict == "diverged" and _draw_pair(report).cause == "random"
        assert "by random noise, not by the port" in report.summary


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(mean=st.sampled_from([0.0, 0.0, -1.0, 0.25]), std=st.sampled_from([1.0, 1.0, 0.5, 2.0]))
def test_normal_draw_parameters_decide_the_verdict(x, mean, std):
    """`normal_(mean, std)` against `randn_like`: replayed and matching exactly when it is normal(0, 1)."""
    ref = _cap(Net(), x, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cand = _cap(Net(lambda t: torch.empty_like(t).normal_(mean, std)), x, 2, replay_rng=ref)
    report = diff(ref, cand)
    same = mean == 0.0 and std == 1.0
    assert (report.verdict == "match") == same, report.summary
    assert any("replay:" in str(w.message) for w in caught) == (not same)
    if not same:
        assert TAG_DRAW_DIFFERS in _draw_pair(report).tags


class Swap(torch.nn.Module):
    """Two draws of one module. "swap" consumes them in the other order; "reorder" computes the same two
    products in another order (the math kept)."""

    def __init__(self, variant: str = "ref"):
        super().__init__()
        torch.manual_seed(0)
        self.variant = variant
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        a, b = torch.randn_like(x), torch.randn_like(x)
        if self.variant == "swap":
            a, b = b, a
        if self.variant == "reorder":
            bb = b * 0.1
            aa = a * 0.5
        else:
            aa, bb = a * 0.5, b * 0.1
        return self.lin(x + aa + bb)


def test_draws_consumed_in_another_order_are_named_at_the_random_op(x):
    ref = _cap(Swap(), x, 1)
    swapped = diff(ref, _cap(Swap("swap"), x, 2, replay_rng=ref))
    first = swapped.get(swapped.first_divergence)
    assert swapped.first_divergence == "<root>/randn_like.0" and first.cause == "own", swapped.summary
    assert TAG_DRAW_ORDER in first.tags and "in another order" in swapped.summary
    assert swapped.get("<root>/add.0").cause == "inherited"             # not blamed on the op that reads them
    assert swapped.get("<root>/add.0").origin == "<root>/randn_like.0"
    reordered = diff(ref, _cap(Swap("reorder"), x, 2, replay_rng=ref))
    assert reordered.verdict == "match", reordered.summary
    # without replay the draws differ anyway: noise, not an order the run could show
    fresh = diff(ref, _cap(Swap("swap"), x, 2))
    assert not any(TAG_DRAW_ORDER in p.tags for p in fresh.pairs) and "in another order" not in fresh.summary


@pytest.mark.parametrize("mode", ["tensors", "state"])
def test_isolate_agrees(x, mode):
    bug = isolate(Net(), Net("rand_like"), x, replay_rng=mode)
    assert bug.found and bug.culprit == "src", bug.summary()
    assert "the candidate draws uniform `rand_like` where the reference draws normal `randn_like`" in bug.summary()
    for draw in TWINS:
        same = isolate(Net(), Net(draw), x, replay_rng=mode)
        assert not same.found and same.first_accumulated is None, same.summary()


def test_noise_file_carries_the_draw_and_a_list_replay_refuses_by_it(x, tmp_path):
    ref = _cap(Net(), x, 1)
    entries = export_noise(ref, tmp_path / "noise.safetensors")
    assert entries[0].draw == "normal(mean=0,std=1):float"
    with pytest.warns(UserWarning, match="uniform"):
        cand = _cap(Net("rand_like"), x, 2, replay_rng=str(tmp_path / "noise.safetensors"))
    assert "replayed" not in next(r for r in cand if r.kind == "rng").tags
    noise = torch.zeros(2, 8)
    with RngReplay([noise], draws=[Draw.parse("normal(mean=0,std=1):float")]) as replay:
        got = torch.rand_like(noise)
    assert not torch.equal(got, noise) and replay.refused and replay.refused[0].recorded == "rng.0"
    with RngReplay([noise], draws=["normal(mean=0,std=1):float"]) as replay:
        assert torch.equal(torch.randn(2, 8), noise) and not replay.refused


def test_draws_of_aten_and_onnx_ops_are_comparable():
    onnx = Draw.parse("draw:normal(mean=0,std=0.100000001)")
    assert onnx.conflict(Draw.parse("normal(mean=0,std=0.1):float")) is None
    assert onnx.conflict(Draw.parse("normal(mean=0,std=1):float")) == "parameters"
    assert Draw.parse("uniform(low=0,high=1):float").conflict(onnx) == "distribution"
    assert Draw.parse("integers(low=0,high=10):int").conflict(Draw.parse("integers(low=0,high=10):float")) == "kind"


# ---- a real model: the Kokoro decoder's sine/noise source ------------------------------------------------------

def _sine_gen_forward(noise):
    """kokoro.istftnet.SineGen.forward, drawing its additive noise with `noise` (the package's draws randn_like)."""
    def forward(self, f0):
        fn = torch.multiply(f0, torch.FloatTensor([[range(1, self.harmonic_num + 2)]]).to(f0.device))
        sine_waves = self._f02sine(fn) * self.sine_amp
        uv = self._f02uv(f0)
        noise_amp = uv * self.noise_std + (1 - uv) * self.sine_amp / 3
        noise_ = noise_amp * noise(sine_waves)
        sine_waves = sine_waves * uv + noise_
        return sine_waves, uv, noise_
    return forward


def _kokoro_source(kokoro, noise=None):
    source = kokoro.build_decoder(0, stable_source=False).generator.m_source
    if noise is not None:
        gen = source.l_sin_gen
        gen.forward = _sine_gen_forward(noise).__get__(gen)
    return source


@pytest.fixture(scope="module")
def f0():
    t = torch.linspace(0, 1, 4800)
    return (110 + 110 * t).reshape(1, -1, 1)


def test_kokoro_noise_source_drawn_uniform_is_found_and_its_randn_twin_matches(kokoro, f0):
    ref_model = _kokoro_source(kokoro)
    ref = _cap(ref_model, f0, 1)
    names = [r.name for r in ref if r.kind == "rng"]
    assert "l_sin_gen/randn_like.0" in names and draw_of(ref.get("l_sin_gen/randn_like.0")).distribution == "normal"
    with pytest.warns(UserWarning, match="uniform `rand_like`"):
        bug = _cap(_kokoro_source(kokoro, torch.rand_like), f0, 2, replay_rng=ref)
    report = diff(ref, bug)
    assert report.first_divergence == "l_sin_gen/randn_like.0", report.summary
    assert _cause(report, "l_sin_gen/randn_like.0") == "own" and "noise, not by the port" not in report.summary
    twin = _cap(_kokoro_source(kokoro, lambda t: torch.randn(t.shape)), f0, 2, replay_rng=ref)
    assert diff(ref, twin).verdict == "match"
    found = isolate(ref_model, _kokoro_source(kokoro, torch.rand_like), f0, replay_rng="tensors")
    assert found.first_local == "l_sin_gen:0", found.summary()
    assert "draws uniform `rand_like` where the reference draws normal `randn_like`" in found.summary()
    same = isolate(ref_model, _kokoro_source(kokoro, lambda t: torch.randn(t.shape)), f0, replay_rng="tensors")
    assert not same.found, same.summary()


def _cause(report, name):
    return report.get(name).cause


# ---- ONNX Runtime and sweep ---------------------------------------------------------------------------------------

PORT = textwrap.dedent('''
    import torch
    from tensorprobe.sweep import Sweep


    class Noisy(torch.nn.Module):
        def __init__(self, draw="randn_like"):
            super().__init__()
            self.draw = draw

        def forward(self, x):
            n = {"randn_like": torch.randn_like, "rand_like": torch.rand_like,
                 "randn": lambda t: torch.randn(t.shape)}[self.draw](x)
            return x + 0.1 * n


    class Net(torch.nn.Module):
        def __init__(self, draw="randn_like"):
            super().__init__()
            torch.manual_seed(0)
            self.pre = torch.nn.Linear(8, 8)
            self.noise = Noisy(draw)
            self.post = torch.nn.Linear(8, 4)

        def forward(self, x):
            return self.post(self.noise(self.pre(x)))


    def inputs(seed=1):
        return (torch.randn(16, 8, generator=torch.Generator().manual_seed(seed)),)


    def export(path, draw):
        torch.onnx.export(Net(draw).eval(), inputs(), path, dynamo=False, input_names=["x"])


    def items():
        return {f"item{i}": inputs(i) for i in range(3)}


    def sweep():
        return Sweep(Net().eval(), items(), replay_rng=True)


    def uniform():
        return Net("rand_like").eval()


    def randn():
        return Net("randn").eval()
''')


@pytest.fixture()
def port(tmp_path, monkeypatch):
    (tmp_path / "draw_port.py").write_text(PORT)
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib

    import draw_port
    return importlib.reload(draw_port)


def test_onnxruntime_port_drawing_uniform_is_found_with_and_without_replay(port, tmp_path):
    pytest.importorskip("onnxruntime")
    from tensorprobe.compare import compare

    port.export(str(tmp_path / "uniform.onnx"), "rand_like")
    port.export(str(tmp_path / "randn.onnx"), "randn")          # RandomNormal, where PyTorch has randn_like
    for replay in (True, False):
        res = compare(port.Net().eval(), port.inputs(), "onnxruntime", artifact=tmp_path / "uniform.onnx",
                      out=tmp_path / f"u{replay}", replay_rng=replay)
        assert res.first_divergence == "noise/randn_like.0", res.summary
        assert "draws uniform `RandomUniformLike` where the reference draws normal `randn_like`" in res.summary
        assert "by random noise" not in res.summary
    same = compare(port.Net().eval(), port.inputs(), "onnxruntime", artifact=tmp_path / "randn.onnx",
                   out=tmp_path / "n", replay_rng=True)
    assert same.diff.verdict == "match" and same.replayed, same.summary


def test_sweep_agrees(port, tmp_path):
    from tensorprobe.sweep import ResultStore, sweep

    file = f"{port.__file__}"
    sweep(f"{file}:sweep", tmp_path / "bug", cand=f"{file}:uniform", workers=1)
    found = ResultStore(tmp_path / "bug").read()
    assert all(r["finding"] and r["first_divergence"] == "noise/randn_like.0" and r["cause"] == "own"
               for r in found.values()), json.dumps(found, default=str)[:2000]
    sweep(f"{file}:sweep", tmp_path / "twin", cand=f"{file}:randn", workers=1)
    assert not any(r["finding"] for r in ResultStore(tmp_path / "twin").read().values())


# ---- the command line: capture warns, diff and isolate exit 1 -----------------------------------------------------

CLI_TARGET = textwrap.dedent('''
    import torch


    class Net(torch.nn.Module):
        def __init__(self, draw):
            super().__init__()
            torch.manual_seed(0)
            self.draw = draw
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(x + 0.1 * self.draw(x))


    def ref():
        return Net(torch.randn_like), (torch.ones(2, 8),)


    def uniform():
        return Net(torch.rand_like), (torch.ones(2, 8),)
''')


def test_cli_capture_warns_and_diff_and_isolate_exit_1(tmp_path):
    from typer.testing import CliRunner

    from tensorprobe.cli import app

    (tmp_path / "draws.py").write_text(CLI_TARGET)
    runner = CliRunner()
    target = str(tmp_path / "draws.py")
    res = runner.invoke(app, ["capture", f"{target}:ref", "-o", str(tmp_path / "ref"), "--level", "op", "--keep", "full"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["capture", f"{target}:uniform", "-o", str(tmp_path / "cand"), "--level", "op",
                              "--keep", "full", "--replay-rng", str(tmp_path / "ref"), "--json"])
    assert res.exit_code == 0 and any("draws uniform" in w for w in json.loads(res.stdout)["warnings"]), res.output
    res = runner.invoke(app, ["diff", str(tmp_path / "ref"), str(tmp_path / "cand"), "--json"])
    doc = json.loads(res.stdout)["report"]
    assert res.exit_code == 1 and doc["first_divergence"] == "<root>/randn_like.0", doc["summary"]
    pair = next(p for p in doc["pairs"] if p["name"] == "<root>/randn_like.0")
    assert pair["cause"] == "own" and TAG_DRAW_DIFFERS in pair["tags"] and doc["rng_differs"] == []
    res = runner.invoke(app, ["isolate", f"{target}:ref", f"{target}:uniform", "--replay-rng", "tensors"])
    assert res.exit_code == 1 and "draws uniform" in " ".join(res.output.split()), res.output
