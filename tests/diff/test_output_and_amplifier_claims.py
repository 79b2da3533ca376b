"""Issue 29 items 2-3 on the real Kokoro-82M decoder (the `kokoro` package's code, seeded weights): a small F0
error is amplified by the sine source's phase accumulation (cumsum, then sin) and that is what diff names, with
figures; its exact twin claims no amplifier. A weight bug in a renamed block is never a match, while the faithful
rename stays one."""

from __future__ import annotations

import copy

import pytest
import torch

import tensorprobe as tp

pytestmark = pytest.mark.slow

SECONDS = 0.1
SINE = "generator.m_source.l_sin_gen/sin.0"


def _capture(model, inputs, out, level, hook=None):
    handle = model.generator.f0_upsamp.register_forward_hook(hook) if hook is not None else None
    torch.manual_seed(0)   # the source draws noise: the same draws on both runs
    try:
        return tp.capture(model, *inputs, level=level, keep="full", out=out)
    finally:
        if handle is not None:
            handle.remove()


@pytest.fixture(scope="module")
def sine_ports(kokoro, tmp_path_factory):
    """Op-level captures of the decoder with its sine source on: the reference, a port whose upsampled F0 is
    off by 0.1% (a float16 or int8 F0 path errs by that much), and an exact twin (the same hook, factor 1)."""
    root = tmp_path_factory.mktemp("sine")
    model = kokoro.build_decoder(stable_source=False)
    inputs = kokoro.decoder_inputs(SECONDS, voiced=True)
    ref = _capture(model, inputs, root / "ref", "op")
    off = _capture(model, inputs, root / "off", "op", lambda m, a, o: o * 1.001)
    exact = _capture(model, inputs, root / "exact", "op", lambda m, a, o: o * 1.0)
    return ref, off, exact


def test_a_small_f0_error_names_the_phase_accumulation_with_figures(sine_ports):
    ref, off, _ = sine_ports
    r = tp.diff(ref, off)
    amp = r.strongest_amplifier
    assert r.verdict == "diverged" and amp is not None and amp.name == SINE, r.summary
    assert amp.gain > 100 and amp.input_rel_err == pytest.approx(1e-3, rel=0.05)
    words = amp.explanation
    assert "phase accumulation" in words and "cumsum" in words and "rad" in words and "decorrelates" in words
    assert f"Strongest amplifier: {SINE}" in r.summary
    out = r.get(r.output)
    assert out.failed and any("output criterion" in x for x in out.reasons), r.summary
    assert "output passes" not in r.summary


def test_the_exact_twin_claims_no_amplifier(sine_ports):
    ref, _, exact = sine_ports
    r = tp.diff(ref, exact)
    assert r.verdict == "match", r.summary
    assert not r.amplifiers and "amplifier" not in r.summary


def _renamed_decoder(decoder, bug: bool):
    """The decoder whose `decode` list is called `blocks` (a port's own naming), optionally with a 1% weight-norm
    magnitude error in blocks.1.conv1."""
    base = type(decoder)

    class Blocks(base):
        def forward(self, asr, F0_curve, N, s):   # Decoder.forward with self.decode renamed self.blocks
            F0 = self.F0_conv(F0_curve.unsqueeze(1))
            N = self.N_conv(N.unsqueeze(1))
            x = self.encode(torch.cat([asr, F0, N], axis=1), s)
            asr_res, res = self.asr_res(asr), True
            for block in self.blocks:
                if res:
                    x = torch.cat([x, asr_res, F0, N], axis=1)
                x = block(x, s)
                res = res and block.upsample_type == "none"
            return self.generator(x, s, F0_curve)

    model = copy.deepcopy(decoder)
    if bug:
        with torch.no_grad():
            model.decode[1].conv1.weight_g.mul_(1.01)
    model.__class__ = Blocks
    model.blocks = model._modules.pop("decode")
    return model


@pytest.fixture(scope="module")
def renamed_ports(kokoro, tmp_path_factory):
    root = tmp_path_factory.mktemp("renamed")
    model = kokoro.build_decoder()
    inputs = kokoro.decoder_inputs(SECONDS)
    ref = _capture(model, inputs, root / "ref", "module")
    bug = _capture(_renamed_decoder(model, True), inputs, root / "bug", "module")
    same = _capture(_renamed_decoder(model, False), inputs, root / "same", "module")
    return ref, bug, same


def test_a_weight_bug_in_a_renamed_block_is_not_a_match(renamed_ports):
    ref, bug, _ = renamed_ports
    r = tp.diff(ref, bug)      # no --map: the renamed block's records are unpaired
    assert r.verdict == "diverged", r.summary
    assert {w.name for w in r.weights_differ} == {"decode.1.conv1.weight_g", "decode.1.conv1.weight"}
    assert "Weights differ: decode.1.conv1.weight" in r.summary and "rename suggested" in r.summary


def test_the_faithful_rename_stays_a_match(renamed_ports):
    ref, _, same = renamed_ports
    r = tp.diff(ref, same)
    assert r.verdict == "match", r.summary
    assert not r.weights_differ and "try --map" in r.summary


def _norm_step(mean: float, std: float):
    from tensorprobe.record import Record
    from tensorprobe.stats import TensorStats

    def rec(name, op, m, s):
        return Record(name=name, module=name, op=op, order=0, shape=(1, 8, 64), dtype="float32",
                      stats=TensorStats(numel=512, mean=m, std=s, min=m - 3 * s, max=m + 3 * s,
                                        absmax=abs(m) + 3 * s))
    return rec("n", "module:InstanceNorm1d", 0.0, 1.0), [rec("x", "module:Conv1d", mean, std)]


def test_a_norm_is_called_near_constant_only_when_its_input_is():
    """The sentence on a normalisation's gain says "near-constant values" and the mean-subtraction factor only when
    the input's rms is well above its std; an input with mean 0.095 against std 0.67 (the compile guide's first
    example, factor ~1.01 beside a gain of x2.9) gets the per-channel sentence instead."""
    from tensorprobe.diff.explain import explain

    rec, inputs = _norm_step(0.0951, 0.672)
    said = explain(rec, inputs, 2.9, 1.6e-4, 4.5e-4)
    assert "near-constant values" not in said and "its own spread" in said and "x2.9" in said
    rec, inputs = _norm_step(50.0, 0.5)
    said = explain(rec, inputs, 90.0, 1e-7, 9e-6)
    assert said.startswith("normalisation of near-constant values") and "~100" in said


def test_a_floor_above_100_percent_says_it_judges_nothing(tmp_path):
    """A bfloat16 port 3,000 ops deep: its deepest records' modelled floor passes 1 (any value would pass it). The
    match sentence says so and names what judges the port; a shallow port's floor (0.28) gets no such words."""
    import copy

    def port(blocks: int, out):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[m for _ in range(blocks) for m in (torch.nn.Linear(32, 32), torch.nn.Tanh())])
        x = torch.randn(8, 32)
        ref = tp.capture(model.eval(), x, keep="full", out=out / "ref")
        cand = tp.capture(copy.deepcopy(model).to(torch.bfloat16), x.to(torch.bfloat16), keep="full",
                          out=out / "bf16")
        return tp.diff(ref, cand)

    deep = port(1500, tmp_path / "deep")
    assert deep.verdict == "match" and deep.get(deep.worst).floor > 1.0
    assert "above 100%, too wide to judge this record by" in deep.summary
    shallow = port(2, tmp_path / "shallow")
    assert shallow.verdict == "match" and "above 100%" not in shallow.summary


class _Residual(torch.nn.Module):
    """A residual block; with `pre_norm` a scale-invariant LayerNorm first, so that the first record a scaled input
    changes is the second norm, whose input `x + self.mix(...)` the block's own code makes (no record)."""

    def __init__(self, pre_norm: bool):
        super().__init__()
        self.pre_norm = torch.nn.LayerNorm(16) if pre_norm else None
        self.mix, self.norm, self.out = torch.nn.Linear(16, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 16)

    def forward(self, x):
        x = x + self.mix(self.pre_norm(x) if self.pre_norm is not None else x)
        return x + self.out(self.norm(x))


class _ScaledBetween(torch.nn.Module):
    """Two blocks; compiled, the value between them is scaled by `scale` (code of the root, no record)."""

    def __init__(self, scale: float, pre_norm: bool):
        super().__init__()
        self.scale = scale
        self.blocks = torch.nn.ModuleList([_Residual(pre_norm), _Residual(pre_norm)])

    def forward(self, x):
        h = self.blocks[0](x)
        if torch.compiler.is_compiling():
            h = h * self.scale
        return self.blocks[1](h)


@pytest.mark.parametrize("pre_norm", [False, True])
def test_an_error_made_between_records_is_not_called_identical_inputs_or_amplified_rounding(pre_norm, tmp_path):
    """The value between two blocks is scaled only when compiled (code of the root, no record). Without a
    pre-norm the first record to show it is blocks.1.mix, whose recorded input blocks.0 is identical: not "its
    inputs are identical" but the reference feeding it blocks.0 and the candidate a value no record shows. With a
    scale-invariant pre-norm it is blocks.1.norm, whose input the block's own code makes: its gain over the
    records before it is put to that code or to the norm, not called amplified rounding. Without the scale: a
    match."""
    torch.manual_seed(0)
    x = torch.randn(2, 6, 16)
    for scale, verdict in ((1.05, "diverged"), (1.0, "match")):
        model = _ScaledBetween(scale, pre_norm).eval()
        ref = tp.capture(model, x, keep="full", out=tmp_path / f"e{scale}")
        cand = tp.capture(model, x, keep="full", compile=True, backend="aot_eager", out=tmp_path / f"c{scale}")
        report = tp.diff(ref, cand)
        assert report.verdict == verdict, report.summary
        if verdict == "match":
            continue
        assert "differ only by rounding noise" not in report.summary
        assert "inputs are identical" not in report.summary
        if pre_norm:
            assert report.first_divergence == "blocks.1.norm"
            assert "its input is made by blocks.1's own code, which no record shows" in report.summary
        else:
            assert report.first_divergence == "blocks.1.mix"
            assert "the reference feeds it blocks.0, the candidate a value made by code no record shows" \
                in report.summary
