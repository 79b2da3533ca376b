"""Training versus inference over every value: a tensor returned as the 2nd element of a tuple or a dict
entry, a value computed in the parent's forward code between submodules, an embedding's integer indices, and
op-level records when asked; a clamp run in training only is named with its source line. Each planted fault
has a twin that keeps the truth (the same clamp in both modes, indices in the trained range) and is clean."""

from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st

from tensorprobe.train.ranges import RangeStats, check_ranges, record_ranges


class DurationPredictor(torch.nn.Module):
    """Returns (hidden, durations) or a dict: the durations are not the first tensor."""

    def __init__(self, as_dict: bool):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.dur = torch.nn.Linear(16, 1)
        self.as_dict = as_dict

    def forward(self, h):
        h = torch.tanh(self.proj(h))
        durations = torch.exp(2.0 * self.dur(h).squeeze(-1)).round()       # frames per phoneme, up to ~20
        return {"hidden": h, "durations": durations} if self.as_dict else (h, durations)


class Regulator(torch.nn.Module):
    """Expands each phoneme to its duration (FastSpeech's length regulator), mean frames per phoneme out."""

    def __init__(self):
        super().__init__()
        self.out = torch.nn.Linear(16, 8)

    def forward(self, h, durations):
        frames = torch.repeat_interleave(h[0], durations[0].long().clamp_min(0), dim=0)
        return self.out(frames)


class Acoustic(torch.nn.Module):
    def __init__(self, clamp_at_inference: bool, as_dict: bool = False, vocab: int = 50):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(vocab, 16)
        self.predictor = DurationPredictor(as_dict)
        with torch.no_grad():
            self.predictor.dur.bias.fill_(1.0)
        self.regulator = Regulator()
        self.clamp_at_inference = clamp_at_inference
        self.as_dict = as_dict

    def forward(self, tokens):
        out = self.predictor(self.embed(tokens))
        h, durations = (out["hidden"], out["durations"]) if self.as_dict else out
        if self.training or self.clamp_at_inference:
            durations = durations.clamp(1, 8)          # the parent's own code, between two submodules
        return self.regulator(h, durations)


def _tokens(seed: int, n: int = 12, high: int = 40, length: int = 20):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, high, (1, length), generator=g),) for _ in range(n)]


def test_durations_as_second_element_clamped_by_the_parent_in_training_only_are_found(tmp_path):
    model = Acoustic(clamp_at_inference=False)
    stats = RangeStats.load(record_ranges(model, _tokens(1)).save(tmp_path / "train_stats.json"))
    assert "predictor.output.1" in stats.records and "regulator.input.1" in stats.records
    report = check_ranges(model, _tokens(2, n=4), stats)
    names = [f.name for f in report.findings]
    # the predictor's own durations are in range in both modes: what leaves it is the unclamped value the
    # parent's code hands the regulator
    assert "predictor.output.1" not in names
    assert names[0] == "regulator.input.1"
    first = report.first
    assert first.train_max == 8.0 and first.infer_max > 8.0 and first.outside > 0.01
    [diff] = report.training_only
    assert diff.module == "" and diff.op == "clamp" and "test_ranges_every_output.py" in diff.source
    headline = report.headline()
    assert headline.startswith(f"{len(names)} of {report.checked} records")
    assert "regulator.input.1" in headline and "a clamp missing at inference" in headline
    assert report.to_dict()["mode_differences"][0]["only_in"] == "training"


def test_the_same_clamp_in_both_modes_is_clean():
    model = Acoustic(clamp_at_inference=True)
    report = check_ranges(model, _tokens(2, n=4), record_ranges(model, _tokens(1)))
    assert report.findings == [] and report.mode_differences == []
    assert "stays in the training range" in report.headline()


def test_a_dict_output_is_named_by_its_key():
    model = Acoustic(clamp_at_inference=False, as_dict=True)
    stats = record_ranges(model, _tokens(1))
    assert {'predictor.output["durations"]', 'predictor.output["hidden"]'} <= set(stats.records)
    report = check_ranges(model, _tokens(2, n=4), stats)
    assert report.first.name == "regulator.input.1" and len(report.training_only) == 1


def test_an_embedding_index_out_of_the_trained_range_at_inference_is_found():
    model = Acoustic(clamp_at_inference=True, vocab=60)
    stats = record_ranges(model, _tokens(1, high=40))            # the data used 40 of the 60 rows
    infer = _tokens(2, n=4, high=40)
    infer[2][0][0, 5] = 47                                       # one token past the trained rows
    report = check_ranges(model, infer, stats)
    first = report.first
    assert first.name == "embed.input.0" and first.integer
    assert first.train_max == 39 and first.infer_max == 47
    assert "never seen in training" in first.words()
    # the twin in the trained range: clean
    assert check_ranges(model, _tokens(3, n=4, high=40), stats).findings == []


@settings(max_examples=6, deadline=None)
@given(st.integers(0, 10_000), st.booleans())
def test_inference_on_training_like_data_is_clean_whichever_the_batches(seed, as_dict):
    """A faithful model (the same clamp in both modes) checked on data drawn like its training data: no
    finding, whatever the seed (the float threshold absorbs the range's sampling edge)."""
    model = Acoustic(clamp_at_inference=True, as_dict=as_dict)
    stats = record_ranges(model, _tokens(seed, n=40))
    report = check_ranges(model, _tokens(seed + 1, n=3), stats)
    assert [f.name for f in report.findings if not f.integer] == []
    assert report.training_only == []


def test_op_level_records_when_asked():
    model = Acoustic(clamp_at_inference=False)
    stats = record_ranges(model, _tokens(1), ops=True)
    assert "/clamp.0" in stats.records and "predictor/exp.0" in stats.records
    report = check_ranges(model, _tokens(2, n=4), stats)
    assert report.training_only and report.first is not None


def test_the_mel_predictor_example_against_itself_is_clean():
    """A model not built for this test (tensorprobe.examples.training), its training batch checked in eval
    mode: nothing leaves the range, nothing is clamped in one mode only."""
    from tensorprobe.examples.training import MelPredictor, batch

    model = MelPredictor()
    inputs = [batch(seed)[0] for seed in range(1, 4)]
    report = check_ranges(model, inputs, record_ranges(model, inputs))
    assert report.findings == [] and report.mode_differences == [] and report.checked > 3
