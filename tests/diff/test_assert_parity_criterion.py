"""assert_parity states the criterion that failed in the same words whichever capture level made the bundles
(issue 32 item 3): module or op level, statistics or full tensors. Only the figure says how it was measured
("SNR 40.4 dB", or "SNR at most 40.7 dB (bounded by the statistics)").

Two models (a conv stack, the Silero VAD of tensorprobe.examples.silero) with one weight scaled by 1.01, under
each criterion (noise rule, min_snr, atol/rtol, min_corr); twins: the faithful candidate (passes, or cannot be
asserted from statistics), and a NaN weight (the criterion is then "NaN/Inf on one side only").
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn as nn

import tensorprobe as tp
from tensorprobe.examples.silero import SileroVAD
from tensorprobe.testing import assert_parity

CAPTURES = [("module", "stats"), ("module", "full"), ("op", "stats"), ("op", "full")]
CRITERIA = {
    "noise": ({}, "noise rule (the relative error must stay within its noise floor, "),
    "min_snr": ({"min_snr": 80}, "min_snr = 80 dB (the SNR must reach it): SNR "),
    "atol": ({"atol": 1e-3, "rtol": 0}, "atol = 0.001, rtol = 0 (every element within atol + rtol·|ref|): max abs "
                                        "error "),
    "min_corr": ({"min_corr": 0.9999999}, "min_corr = 0.9999999 (the correlation must reach it): correlation "),
}


def _conv():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), nn.Tanh(), nn.Conv1d(8, 1, 1)), (torch.randn(1, 4, 256),), "0"


def _vad():
    torch.manual_seed(0)
    return SileroVAD(), (0.1 * torch.randn(1, 512), torch.zeros(2, 1, 128)), "conv1"


def _bundles(tmp_path, model, inputs, change):
    cand = copy.deepcopy(model)
    with torch.no_grad():
        change(cand)
    out = {}
    for level, keep in CAPTURES:
        out[level, keep] = (tp.capture(model, *inputs, level=level, keep=keep, out=tmp_path / f"r-{level}-{keep}"),
                            tp.capture(cand, *inputs, level=level, keep=keep, out=tmp_path / f"c-{level}-{keep}"))
    return out


def _criterion_line(ref, cand, **options) -> str:
    with pytest.raises(AssertionError) as e:
        assert_parity(ref, cand, **options)
    lines = [x for x in str(e.value).splitlines() if x.startswith("failed criterion: ")]
    assert len(lines) == 1, str(e.value)
    return lines[0].removeprefix("failed criterion: ")


@pytest.mark.parametrize("case", [_conv, _vad], ids=["conv", "silero-vad"])
def test_the_failed_criterion_reads_the_same_at_every_capture_level(tmp_path, case):
    model, inputs, layer = case()
    bundles = _bundles(tmp_path, model, inputs, lambda m: m.get_submodule(layer).weight.mul_(1.01))
    for name, (options, words) in CRITERIA.items():
        said = {k: _criterion_line(r, c, **options) for k, (r, c) in bundles.items()}
        for (level, keep), line in said.items():
            if name == "min_corr" and keep == "stats" and not line.startswith(words):
                # statistics measure no correlation: where no record compared by values fails, the line names
                # what did fail, a weight's fingerprint, in its own fixed words
                assert line.startswith("identical weights (a weight kept as statistics is compared by its content "
                                       f"fingerprint): {layer}.weight's fingerprint differs"), line
                continue
            assert line.startswith(words), (name, level, keep, line)
            figure = line.removeprefix(words).split(": ")[-1]
            if keep == "stats" and name != "min_corr":      # a bound, said as one
                assert re.search(r"(at least|at most) [-0-9.e+]+( dB)? \(bounded by the statistics\)$", figure), \
                    (name, level, line)
            else:                                           # correlation: only values measure it
                assert "bounded" not in figure and " at least " not in figure and " at most " not in figure, line
        # what the statistics bound agrees with what the values measure (module level: the same record)
        if name == "min_snr":
            full = float(said["module", "full"].split("SNR ")[-1].split(" dB")[0])
            bound = float(said["module", "stats"].split("SNR at most ")[-1].split(" dB")[0])
            assert full <= bound + 1e-6 and full < 80


@pytest.mark.parametrize("case", [_conv, _vad], ids=["conv", "silero-vad"])
def test_a_nan_weight_is_one_criterion_in_the_same_words_and_the_faithful_port_states_none(tmp_path, case):
    model, inputs, layer = case()
    bundles = _bundles(tmp_path, model, inputs, lambda m: m.get_submodule(layer).bias.fill_(float("nan")))
    for (level, keep), (r, c) in bundles.items():
        line = _criterion_line(r, c, min_snr=80)
        assert line.startswith("NaN/Inf on one side only (no threshold passes a value against no value): "), \
            (level, keep, line)
    # the faithful candidate: no criterion fails (full tensors pass; statistics prove no failure either)
    same = _bundles(tmp_path / "same", model, inputs, lambda m: None)
    for (level, keep), (r, c) in same.items():
        try:
            assert assert_parity(r, c).passed
        except AssertionError as e:
            assert keep == "stats" and "can't be asserted" in str(e) and "failed criterion" not in str(e), str(e)
