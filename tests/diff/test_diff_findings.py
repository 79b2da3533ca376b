"""diff on real captures of small models: the findings a user hunts for, asserted."""

import math

import pytest
import torch
import torch.nn as nn

import tensorprobe as tp
from tensorprobe.diff import diff


class SineSource(nn.Module):
    """The shape of Kokoro's sine generator: sin of a cumulative phase."""

    def forward(self, f0):
        phase = torch.cumsum(2 * math.pi * f0 / 24000, dim=-1)
        return 0.1 * torch.sin(phase)


class SineModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.src = SineSource()
        self.post = nn.Conv1d(1, 1, 3, padding=1)

    def forward(self, f0):
        return self.post(self.src(f0))


def test_sin_of_cumulative_phase_is_the_strongest_amplifier(tmp_path):
    m = SineModel().eval()
    f0 = torch.full((1, 1, 24000), 220.0)
    ref = tp.capture(m, f0, level="op", keep="full", out=tmp_path / "ref")
    cand = tp.capture(m, f0 * 1.001, level="op", keep="full", out=tmp_path / "cand")  # 0.1% frequency error
    r = diff(ref, cand, min_snr=80)
    assert r.first_divergence == "input.0"
    amp = r.strongest_amplifier
    assert amp.name == "src/sin.0" and amp.gain > 100
    assert amp.input_rel_err == pytest.approx(1e-3, rel=0.01)
    assert r.pair("src/cumsum.0").gain == pytest.approx(1.0, abs=0.01)  # the cumsum passes error through
    assert r.output_persists is True
    assert "Strongest amplifier: src/sin.0" in r.summary and "persists to the output" in r.summary


class Step(nn.Module):
    """One Euler step's velocity field; the candidate's goes wrong from call `bad_from` on."""

    def __init__(self, bad_from=None):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.bad_from = bad_from
        self.calls = 0

    def forward(self, x):
        v = torch.tanh(self.lin(x))
        if self.bad_from is not None and self.calls >= self.bad_from:
            v = v * 1.01
        self.calls += 1
        return v


class Solver(nn.Module):
    def __init__(self, bad_from=None):
        super().__init__()
        self.step = Step(bad_from)

    def forward(self, x):
        for _ in range(6):
            x = x + 0.1 * self.step(x)
        return x


def test_looped_module_names_the_step_where_error_enters(tmp_path):
    torch.manual_seed(0)
    ref_m = Solver().eval()
    cand_m = Solver(bad_from=3).eval()
    cand_m.load_state_dict(ref_m.state_dict())
    x = torch.randn(4, 16)
    ref = tp.capture(ref_m, x, level="module", keep="full", out=tmp_path / "ref")
    cand = tp.capture(cand_m, x, level="module", keep="full", out=tmp_path / "cand")
    r = diff(ref, cand)
    assert r.first_divergence == "step@3"
    series = next(s for s in r.call_series if s.key == "step")
    assert series.calls == (0, 1, 2, 3, 4, 5)
    assert series.passed == (True, True, True, False, False, False)
    assert series.first_failing_call == 3
    assert "step runs 6 times; error enters at call 3" in r.summary


class Other(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Linear(5, 7)
        self.dec = nn.GRU(7, 3, batch_first=True)

    def forward(self, x):
        return self.dec(self.enc(x))[0]


def test_bundle_of_another_model_reports_unmatched_records(tmp_path):
    ref = tp.capture(SineModel().eval(), torch.full((1, 1, 100), 220.0), level="module", keep="full",
                     out=tmp_path / "ref")
    cand = tp.capture(Other().eval(), torch.randn(1, 4, 5), level="module", keep="full", out=tmp_path / "cand")
    r = diff(ref, cand)
    assert "src" in r.ref_only and "post" in r.ref_only
    assert "enc" in r.cand_only and "dec:0" in r.cand_only
    assert not r.passed
    assert "Unmatched" in r.summary or "Nothing compared" in r.summary


class Noisy(nn.Module):
    def forward(self, x):
        return torch.tanh(x + 0.1 * torch.randn_like(x))


def test_divergence_at_a_random_op_says_replay(tmp_path):
    x = torch.randn(2, 64)
    torch.manual_seed(1)
    ref = tp.capture(Noisy(), x, level="op", keep="full", out=tmp_path / "ref")
    torch.manual_seed(2)
    cand = tp.capture(Noisy(), x, level="op", keep="full", out=tmp_path / "cand")
    r = diff(ref, cand)
    assert r.first_divergence == "<root>/randn_like.0"
    assert r.rng_note.startswith("random op <root>/randn_like.0 was not replayed; use --replay-rng")
    assert "use --replay-rng" in r.summary


def test_divergence_right_after_an_unstored_random_op(make_bundle):
    x, n = torch.randn(64), torch.randn(64)
    ref = make_bundle([("x", x, {"kind": "model_input"}), ("noise/randn.0", n, {"kind": "rng", "module": "noise"}),
                       ("mix/add.0", x + n, {"inputs": ("x", "noise/randn.0"), "module": "mix"})])
    n2 = torch.randn(64)
    cand = make_bundle([("x", x, {"kind": "model_input"}), ("noise/randn.0", n2, {"kind": "rng", "module": "noise"}),
                        ("mix/add.0", x + n2, {"inputs": ("x", "noise/randn.0"), "module": "mix"})])
    r = diff(ref, cand)
    assert r.first_divergence == "noise/randn.0"
    assert "random op noise/randn.0 was not replayed; use --replay-rng" in r.rng_note


class Phase(nn.Module):
    def forward(self, theta):
        return torch.atan2(torch.sin(theta), torch.cos(theta))


def test_angles_compared_modulo_2pi_and_flips_explain_the_divergence(tmp_path):
    # Phases just below the branch cut at ±π: an error of 2e-9 rad pushes them across (as F0 error does
    # to Kokoro's STFT phase); modulo 2π they still agree to 2e-9.
    cut = torch.tensor([(2 * k + 1) * math.pi - 1e-9 for k in range(-3, 3)], dtype=torch.float64)
    theta = torch.cat([torch.linspace(-20, 20, 2001, dtype=torch.float64), cut])
    ref = tp.capture(Phase(), theta, level="op", keep="full", out=tmp_path / "ref")
    cand = tp.capture(Phase(), theta + 2e-9, level="op", keep="full", out=tmp_path / "cand")
    r = diff(ref, cand, min_snr=100)
    p = r.pair("<root>/atan2.0")
    assert "angle" in p.tags
    assert p.angle.flips == 6 and p.angle.explained and p.status == "pass"
    assert p.angle.raw_max_abs_err == pytest.approx(2 * math.pi, rel=1e-3)
    assert any("branch-cut flips" in n and "explains" in n for n in r.notes)


def test_stats_only_bundles_compare_by_statistics_and_outputs_element_wise(tmp_path):
    m = SineModel().eval()
    f0 = torch.full((1, 1, 50), 220.0)
    ref = tp.capture(m, f0, level="module", keep="stats", out=tmp_path / "ref")
    r = diff(ref, ref)
    inner = [p for p in r.pairs if p.kind == "output"]
    # statistics that show no difference prove none: those pairs are "not proven", never "pass"
    assert inner and {p.method for p in inner} == {"statistics"} and all(p.status == "not_proven" for p in inner)
    assert r.get("output").method == "elementwise"  # the model's own output is stored whatever `keep` is
    assert r.verdict == "match" and r.counts()["statistics"] == len(inner) == r.counts()["not_proven"]
    assert "not proven" in r.summary


def test_random_draw_is_not_ranked_as_amplifier(tmp_path):
    """A re-drawn random tensor has no inputs: its error is made, not amplified (no gain, no amplifier)."""

    class Noisy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.lin(x) + 1e-3 * torch.rand_like(x)

    torch.manual_seed(0)
    model, x = Noisy(), torch.randn(4, 8)
    torch.manual_seed(1)
    ref = tp.capture(model, x, keep="full", out=tmp_path / "ref")
    torch.manual_seed(2)
    cand = tp.capture(model, x, keep="full", out=tmp_path / "cand")
    report = tp.diff(ref, cand)
    rng = report.pair("<root>/rand_like.0")
    assert rng.failed and rng.gain is None
    assert all(a.name != rng.name for a in report.amplifiers)


class _OnePassInstanceNorm(nn.Module):
    """InstanceNorm1d as a port's kernel computes it: variance as E[x²] − E[x]² in float32 (seed 000)."""

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = (x * x).mean(-1, keepdim=True) - mean * mean
        return (x - mean) * torch.rsqrt(var + 1e-5)


class _NoiseResBlock(nn.Module):
    """Kokoro's noise_res shape: conv of a near-silent source, instance norm, affine, conv, norm, conv."""

    def __init__(self):
        super().__init__()
        self.source = nn.Conv1d(1, 16, 1)
        self.norm1 = nn.InstanceNorm1d(16)
        self.conv1 = nn.Conv1d(16, 16, 3, padding=1)
        self.norm2 = nn.InstanceNorm1d(16)
        self.post = nn.Conv1d(16, 1, 3, padding=1)

    def forward(self, x):
        h = 1.5 * self.norm1(self.source(x)) + 0.1
        return self.post(self.norm2(self.conv1(torch.relu(h))))


def test_nan_made_by_a_one_pass_norm_is_the_first_divergence_and_what_follows_inherits_it(tmp_path):
    torch.manual_seed(0)
    ref_model = _NoiseResBlock().eval()
    with torch.no_grad():
        ref_model.source.bias.copy_(torch.linspace(20.0, 60.0, 16))   # near-constant channels: mean² ≫ variance
    port = _NoiseResBlock().eval()
    port.load_state_dict(ref_model.state_dict())
    port.norm1, port.norm2 = _OnePassInstanceNorm(), _OnePassInstanceNorm()
    x = 1e-4 * torch.randn(1, 1, 4096)
    ref = tp.capture(ref_model, x, level="module", keep="full", out=tmp_path / "ref")
    cand = tp.capture(port, x, level="module", keep="full", out=tmp_path / "cand")
    born = cand["norm1"].stats
    assert 0 < born.nonfinite_channels < 16 and ref["norm1"].stats.all_finite   # the port made NaN in some channels
    assert cand["conv1"].stats.nonfinite_channels == 16                       # and the conv spread it to all

    r = diff(ref, cand)
    assert r.verdict == "diverged" and r.first_divergence == "norm1"
    first = r.get("norm1")
    assert first.cause == "own" and "non-finite on the candidate side: 24,576 elements" in " ".join(first.reasons)
    assert first.metric("snr_db") == float("-inf") and "born here, on the candidate side" in first.explanation
    for later in ("conv1", "norm2", "post"):      # all NaN in the port: inherited from norm1, not errors of their own
        p = r.get(later)
        assert p.failed and p.cause == "inherited" and p.origin == "norm1", (later, p.cause, p.origin)
    assert "first divergence at norm1" in r.summary and "its inputs are finite and agree" in r.summary
