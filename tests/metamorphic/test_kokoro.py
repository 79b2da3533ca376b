"""Metamorphic tests on the Kokoro-82M decoder (the `kokoro` package's code, seeded weights): variations that
keep the truth keep the verdict, variations that change it change it. Slow: each capture runs the decoder."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorprobe as tp
from tensorprobe.audio import check

from .variants import RENAME_RULES, Renamed, capture_in, first_cause, output_pair, with_scaled_output

pytestmark = pytest.mark.slow

SECONDS = 0.25
BUG_LAYER = "decode.1.conv1"
# checks about the level itself, absolute by design (tensorprobe.audio.check): a gain may change them
LEVEL_CHECKS = {"scale", "silence", "dc_offset", "clipping"}


@pytest.fixture(scope="module")
def decoder(kokoro):
    return kokoro.build_decoder()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("kokoro")


@pytest.fixture(scope="module")
def unvoiced(kokoro):
    return kokoro.decoder_inputs(SECONDS)


@pytest.fixture(scope="module")
def reference(decoder, unvoiced, workdir):
    # unvoiced: the stable source's random draws do not reach the output, so no seed is needed for a rerun
    return capture_in(workdir, "ref", decoder, unvoiced)


def with_weight_bug(decoder: torch.nn.Module) -> torch.nn.Module:
    """A copy whose `decode.1.conv1` weight-norm magnitude is 1% off, as a careless conversion leaves it."""
    model = copy.deepcopy(decoder)
    with torch.no_grad():
        dict(model.named_modules())[BUG_LAYER].weight_g.mul_(1.01)
    return model


def test_a_second_run_is_a_match(decoder, unvoiced, reference, workdir):
    report = tp.diff(reference, capture_in(workdir, "again", decoder, unvoiced))
    assert report.verdict == "match", report.summary
    # the source draws other noise on each run; it is multiplied by zero, and said to be random
    assert all(p.cause == "random" for p in report.pairs + report.weights if p.failed)


@pytest.mark.parametrize("factor", [1 + 1e-3, 1 - 1e-2])
def test_an_output_scaled_by_1_plus_eps_is_not_a_match(decoder, unvoiced, reference, workdir, factor):
    report = tp.diff(reference, capture_in(workdir, "scaled", with_scaled_output(copy.deepcopy(decoder), factor),
                                           unvoiced))
    assert report.verdict == "diverged" and output_pair(report).failed, report.summary


def test_a_weight_bug_is_named_at_its_layer_renamed_or_not(decoder, unvoiced, reference, workdir):
    plain = tp.diff(reference, capture_in(workdir, "bug", with_weight_bug(decoder), unvoiced))
    renamed = tp.diff(reference, capture_in(workdir, "bug-renamed", Renamed(with_weight_bug(decoder)), unvoiced),
                      rules=RENAME_RULES)
    assert first_cause(plain)[:2] == (BUG_LAYER, "weights"), plain.summary
    assert first_cause(renamed) == first_cause(plain), renamed.summary
    assert {w.name for w in renamed.weights_differ} == {w.name for w in plain.weights_differ} \
        == {f"{BUG_LAYER}.weight_g", f"{BUG_LAYER}.weight"}      # the magnitude, and the weight it makes


def test_a_nan_is_found_at_the_same_norm_when_the_decoder_is_renamed(kokoro, unvoiced):
    faulty = kokoro.build_decoder()
    kokoro.inject_faulty_instance_norm(faulty)
    plain = tp.find_first_nonfinite(faulty, *unvoiced)
    renamed = tp.find_first_nonfinite(Renamed(faulty), *unvoiced)
    assert plain.found and plain.op == renamed.op and plain.op.endswith("rsqrt.default")
    assert renamed.module == f"net.{plain.module}" and "norm" in plain.module
    assert renamed.output.stats.nonfinite_channel_idx == plain.output.stats.nonfinite_channel_idx != ()


@pytest.fixture(scope="module")
def outputs(decoder, reference, kokoro):
    """The decoder's output, unvoiced (from the reference bundle) and voiced (noise-like: random weights)."""
    with torch.no_grad():
        voiced = decoder(*kokoro.decoder_inputs(SECONDS, voiced=True)).numpy().ravel()
    return {False: reference.numpy("output").ravel(), True: voiced}


@settings(max_examples=12, deadline=None)
@given(st.floats(min_value=-2, max_value=0), st.booleans())
def test_a_gain_change_keeps_every_level_free_check(outputs, kokoro, log_gain, voiced):
    # the decoder's own output at a peak of 0 dBFS and at 10**log_gain of it (down to -40 dBFS): checks that are
    # not about the level (non-finite values, noise, stuck or constant segments, layout) must say the same
    audio = outputs[voiced]
    loud, quiet = (check(audio * gain / np.abs(audio).max(), kokoro.SAMPLE_RATE) for gain in (1.0, 10 ** log_gain))
    level_free = {v.check: v.status for v in loud.verdicts if v.check not in LEVEL_CHECKS}
    assert {v.check: v.status for v in quiet.verdicts if v.check not in LEVEL_CHECKS} == level_free
    assert loud.status == ("error" if voiced else "ok")
