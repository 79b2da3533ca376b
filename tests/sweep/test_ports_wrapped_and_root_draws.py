"""Faithful ports the sweep once called findings (issue 30 validation): a PyTorch fp16 port that wraps the
model to cast its inputs (its module names sit under the wrapper's attribute), and an ONNX Runtime port of a
model drawing its noise in its own forward (no module holds the sum of signal and noise). Each is checked with
one change that keeps the truth and one that changes it."""

from __future__ import annotations

import textwrap

import pytest

from tensorprobe.sweep import ResultStore, sweep

TARGETS = textwrap.dedent('''
    import sys
    import torch
    from torch import nn
    from tensorprobe.examples import crepe
    from tensorprobe.sweep import Sweep

    sys.path.insert(0, EXAMPLES)
    import norm_port

    class Half(nn.Module):
        """The fp16 conversion of a PyTorch candidate: .half(), inputs cast, output back to float32."""
        def __init__(self, m):
            super().__init__()
            self.m = m.half()

        def forward(self, x):
            return self.m(x.half()).float()

    def crepe_items(name):
        kind, i = name.split("-")
        x = crepe.frames([110.0, 165.0, 220.0, 330.0][int(i) % 4], n_frames=4, seed=int(i))
        return (x * (1000.0 if kind == "L" else 1.0),)       # loud items overflow float16 in conv1

    def fp16_quiet():
        return Sweep(crepe.model("tiny"), [f"q-{i}" for i in range(4)], inputs=crepe_items,
                     candidate=Half(crepe.model("tiny")))

    def fp16_loud():
        return Sweep(crepe.model("tiny"), ["q-0", "L-1", "q-2", "L-3"], inputs=crepe_items,
                     candidate=Half(crepe.model("tiny")))

    def block():
        torch.manual_seed(0)
        return norm_port.Block().eval()

    def zero_mean(name):
        return (torch.randn(1, 16, 400, generator=torch.Generator().manual_seed(int(name[2:]))),)

    def noisy_ort():
        return Sweep(block(), [f"z-{i}" for i in range(3)], inputs=zero_mean, candidate="onnxruntime")

    class Prenet(nn.Module):
        """Tacotron's prenet: dropout kept on at inference, exported as ONNX Dropout (its own mask)."""
        def __init__(self):
            super().__init__(); torch.manual_seed(1); self.fc = nn.Conv1d(16, 16, 1)
        def forward(self, x):
            return nn.functional.dropout(torch.relu(self.fc(x)), 0.5, training=True)

    def dropout_ort():
        return Sweep(Prenet().eval(), [f"z-{i}" for i in range(2)], inputs=zero_mean, candidate="onnxruntime")
''')


@pytest.fixture()
def targets(tmp_path):
    from pathlib import Path

    examples = Path(__file__).resolve().parents[2] / "examples"
    path = tmp_path / "ports.py"
    path.write_text(f"EXAMPLES = {str(examples)!r}\n" + TARGETS)
    return str(path)


def test_a_wrapped_fp16_port_is_matched_by_its_module_names_and_found_only_where_it_overflows(targets, tmp_path):
    quiet = sweep(f"{targets}:fp16_quiet", tmp_path / "quiet", workers=1)
    assert quiet.done == 4 and quiet.findings == 0           # was 4 of 4 'diverged at <root>, amplified'
    # no plain run that could only fail float32's ceiling: each item says why it went to tier 2
    assert {r["tier1"] for r in ResultStore(tmp_path / "quiet").read().values()} == {
        "a float16 candidate: tier 1 judges float32 ports only"}
    loud = sweep(f"{targets}:fp16_loud", tmp_path / "loud", workers=1)
    latest = ResultStore(tmp_path / "loud").read()
    assert {n for n, r in latest.items() if r["finding"]} == {"L-1", "L-3"}
    for name in ("L-1", "L-3"):
        assert latest[name]["cand_nan"]["module"] == "m.conv1"              # the wrapped model's own layer
        assert latest[name]["first_divergence"] == "conv1"                  # paired with the reference's


def test_noise_drawn_in_the_models_own_forward_is_random_draws_and_replay_makes_it_a_match(targets, tmp_path):
    pytest.importorskip("onnxruntime")
    drawn = sweep(f"{targets}:noisy_ort", tmp_path / "drawn", workers=1)
    latest = ResultStore(tmp_path / "drawn").read()
    assert drawn.done == 3 and drawn.findings == 0                          # was 3 of 3 'post, cause own'
    assert all(r["verdict"] == "random_draws" and r["first_divergence"] == "<root>/randn_like.0"
               for r in latest.values())
    replayed = sweep(f"{targets}:noisy_ort", tmp_path / "replayed", workers=1, replay_rng=True)
    latest = ResultStore(tmp_path / "replayed").read()
    assert replayed.findings == 0 and all(r["verdict"] == "match" for r in latest.values())


@pytest.mark.parametrize("replay", [False, True])
def test_a_runtime_dropout_replay_cannot_feed_is_random_draws_and_the_advice_is_not_to_do_what_was_done(
        targets, tmp_path, replay):
    """ONNX Runtime's Dropout draws its own mask. Without replay the advice is --replay-rng; with replay on (it
    was done, and cannot feed that op) the advice is to export the noise as a model input."""
    pytest.importorskip("onnxruntime")
    summary = sweep(f"{targets}:dropout_ort", tmp_path / "out", workers=1, replay_rng=replay)
    latest = ResultStore(tmp_path / "out").read()
    assert summary.findings == 0 and summary.random_draws == 2
    assert summary.random_draws_replayed == (2 if replay else 0)
    for r in latest.values():
        assert r["verdict"] == "random_draws" and r["rng_replayed"] is replay
        assert ("Rerun with --replay-rng" in r["random_draws"]) is not replay, r["random_draws"]
    assert ("Rerun with --replay-rng" in summary.headline()) is not replay
    assert "record_random" in summary.headline()
