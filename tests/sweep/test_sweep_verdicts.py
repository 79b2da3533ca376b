"""What a sweep says about each item: a non-finite item is a result with its NaN origin on each side (never
"failed to run"), and random draws are not a finding (replayed into a PyTorch candidate; otherwise the item's
verdict is `random_draws`, with the words that make it comparable)."""

from __future__ import annotations

import textwrap

import pytest

from tensorprobe.sweep import ResultStore, sweep

TINY = textwrap.dedent('''
    import torch
    from tensorprobe.examples.kokoro import FaultyInstanceNorm1d
    from tensorprobe.sweep import Sweep

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.conv = torch.nn.Conv1d(4, 8, 3, padding=1)
            self.norm = torch.nn.InstanceNorm1d(8, affine=True)
            self.out = torch.nn.Conv1d(8, 1, 3, padding=1)

        def forward(self, x):
            return self.out(torch.tanh(self.norm(self.conv(x))))

    def port():
        """The one-pass float16 instance norm of a broken lowering (E[x^2] - E[x]^2)."""
        net = Net()
        net.norm = FaultyInstanceNorm1d(net.norm)
        return net.eval()

    def items():
        g = torch.Generator().manual_seed(3)
        out = {}
        for i in range(6):
            x = torch.randn(1, 4, 64, generator=g)
            # "flat" items: a large offset with a tiny spread, where the one-pass variance cancels
            out[f"{'flat' if i % 2 else 'lively'}-{i}"] = (x * 1e-3 + 300.0 if i % 2 else x,)
        return out

    def build():
        return Sweep(Net().eval(), items(), candidate=port())

    def faithful():
        return Sweep(Net().eval(), items(), candidate=Net().eval())
''')


@pytest.fixture()
def tiny(tmp_path):
    (tmp_path / "tiny.py").write_text(TINY)
    return tmp_path / "tiny.py"


def test_non_finite_items_are_results_with_their_origin_grouped_in_the_summary(tiny, tmp_path):
    summary = sweep(f"{tiny}:build", tmp_path / "out", workers=1)
    latest = ResultStore(tmp_path / "out").read()
    flat = {n for n in latest if n.startswith("flat")}
    nonfinite = {n for n, r in latest.items() if (r["output_nonfinite"] or {}).get("candidate_only")}
    assert summary.failed == 0 and not summary.errors                 # never "failed to run"
    assert nonfinite and nonfinite <= flat                            # the flat items, and only they, go NaN
    for name in nonfinite:
        r = latest[name]
        assert r["finding"] and r["output_snr_db"] == "-inf" and r["ref_nan"] is None
        assert r["cand_nan"]["module"] == "norm" and r["cand_nan"]["channels"]
        assert r["output_verdict"].startswith("non-finite (candidate only")
        assert "nonfinite" in {x["code"] for x in r["reasons"]}
    groups = summary.nonfinite_groups
    assert [(g["side"], g["module"], g["items"]) for g in groups] == [("candidate", "norm", len(nonfinite))]
    assert groups[0]["example"] in nonfinite
    assert f"{len(nonfinite)} item" in summary.headline() and "born at norm" in summary.headline()


def test_a_faithful_candidate_on_the_same_items_has_no_finding(tiny, tmp_path):
    summary = sweep(f"{tiny}:faithful", tmp_path / "out", workers=1)
    assert summary.done == 6 and summary.findings == 0 and not summary.nonfinite_groups and not summary.finding


def _kokoro_target(tmp_path, body: str) -> str:
    (tmp_path / "k.py").write_text(textwrap.dedent(body))
    return f"{tmp_path / 'k.py'}:build"


@pytest.mark.slow
def test_kokoro_norm_non_finite_on_unvoiced_items_only_every_one_reported_with_its_origin(tmp_path):
    """The Kokoro decoder against its port with the one-pass float16 instance norm: the unvoiced items go NaN in
    the generator's norms, the voiced ones stay finite (they diverge, finite). Every NaN item is a result with
    its origin; none failed to run. The voiced items' source noise (noise_std · uv) is replayed into the PyTorch
    candidate. (With the sine source on, `stable_source=False`, these seeds stay finite.)"""
    pytest.importorskip("kokoro")
    target = _kokoro_target(tmp_path, '''
        from tensorprobe.examples import kokoro
        from tensorprobe.sweep import Sweep

        def inputs(name):
            kind, seed = name.split("-")
            return kokoro.decoder_inputs(0.1, seed=int(seed), voiced=kind == "voiced")

        def build():
            cand = kokoro.build_decoder()
            kokoro.inject_faulty_instance_norm(cand)
            names = [f"{'voiced' if i % 2 else 'unvoiced'}-{i:03d}" for i in range(4)]
            return Sweep(kokoro.build_decoder(), names, candidate=cand.eval(), inputs=inputs,
                         sample_rate=kokoro.SAMPLE_RATE)
    ''')
    summary = sweep(target, tmp_path / "out", workers=1)
    latest = ResultStore(tmp_path / "out").read()
    assert summary.done == 4 and summary.failed == 0
    for name, r in latest.items():
        if name.startswith("unvoiced"):
            assert r["output_verdict"].startswith("non-finite (candidate only"), name
            assert ".adain" in r["cand_nan"]["module"] and r["cand_nan"]["module"].endswith(".norm")
            assert r["cand_nan"]["diagnosis"] == "negative variance", r["cand_nan"]     # float16, computed on its input
            assert r["audio"]["check"] == "error" and "non_finite" in r["audio"]["problems"]
        else:
            assert r["cand_nan"] is None and r["output_verdict"] in ("pass", "fail")
            assert r["verdict"] != "random_draws" and r["cause"] != "random"      # the draws were replayed
    assert sum(g["items"] for g in summary.nonfinite_groups) == 2
    assert all(g["side"] == "candidate" and g["diagnosis"] == "negative variance" for g in summary.nonfinite_groups)
    assert "with the candidate's output non-finite" in summary.headline() and "(negative variance" in summary.headline()


@pytest.mark.slow
def test_kokoro_faithful_export_with_random_draws_has_no_finding(tmp_path):
    """The export decoder against ONNX Runtime without --replay-rng: voiced items draw the source's noise on
    each side and part there: their verdict is `random_draws`, not a finding, and the headline says how to make
    them comparable; unvoiced items agree at the output (rounding amplified inside is the model's)."""
    pytest.importorskip("kokoro")
    pytest.importorskip("onnxruntime")
    target = _kokoro_target(tmp_path, '''
        from tensorprobe.examples.kokoro import decoder_sweep

        def build():
            return decoder_sweep(items=4, seconds=0.1)
    ''')
    summary = sweep(target, tmp_path / "out", workers=1)
    latest = ResultStore(tmp_path / "out").read()
    assert summary.done == 4 and summary.findings == 0 and not summary.finding
    voiced = [r for n, r in latest.items() if n.startswith("voiced")]
    assert all(r["verdict"] == "random_draws" and "--replay-rng" in r["random_draws"] for r in voiced)
    assert summary.random_draws == len(voiced) == 2 and "--replay-rng" in summary.headline()
