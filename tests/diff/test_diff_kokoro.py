"""The shipped Kokoro decoder with one layer perturbed by a small relative error: diff names that layer."""

import pytest
import torch

import tensorprobe as tp

pytestmark = pytest.mark.slow

TARGET = "generator.resblocks.2.convs1.1"   # a conv deep inside the generator


@pytest.fixture(scope="module")
def bundles(kokoro, tmp_path_factory):
    root = tmp_path_factory.mktemp("kokoro_diff")
    model = kokoro.build_decoder()
    inputs = kokoro.decoder_inputs(0.25)
    torch.manual_seed(0)  # the source module draws random numbers: same draws on both runs
    ref = tp.capture(model, *inputs, level="module", keep="full", out=root / "ref")

    def perturb(module, args, out):
        # 1% relative error with a fixed pattern (no random op, so nothing else changes)
        ripple = torch.sin(torch.arange(out.numel(), dtype=out.dtype) * 0.37).reshape(out.shape)
        return out * (1 + 1e-2 * ripple)

    handle = dict(model.named_modules())[TARGET].register_forward_hook(perturb)
    try:
        torch.manual_seed(0)
        cand = tp.capture(model, *inputs, level="module", keep="full", out=root / "cand")
    finally:
        handle.remove()
    return ref, cand


def test_first_divergence_is_the_perturbed_layer(bundles):
    ref, cand = bundles
    r = tp.diff(ref, cand)
    assert r.first_divergence == TARGET
    p = r.pair(TARGET)
    assert 35 < p.metric("snr_db") < 45            # 1% relative error ~ 40 dB
    assert p.gain == float("inf")                   # exact inputs, wrong output: the error enters here
    before = [q for q in r.pairs if q.order < p.order]
    assert before and all(q.passed for q in before)
    after = [q for q in r.pairs if q.order > p.order and q.module.startswith("generator.resblocks.2")
             and not q.module.endswith(".fc")]      # (the .fc layers see only the style vector)
    assert after and all(q.failed for q in after)   # downstream layers inherit it...
    assert all(q.gain < 2 for q in after)           # ...without amplifying it: no second error source
    assert "first divergence at " + TARGET in r.summary
    assert not r.ref_only and not r.cand_only


def test_identical_runs_match(bundles):
    ref, _ = bundles
    r = tp.diff(ref, ref)
    assert r.passed and r.first_divergence is None
