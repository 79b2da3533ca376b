"""`compare`: an output that is NaN on the candidate side only is a finding that says how many elements; NaN
the reference's output shares is a property of the model; `--replay-rng` gives the reference the runtime's
random draws, so a noisy model that is ported faithfully matches and a port bug behind the noise still shows."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")

from tensorprobe.compare import compare  # noqa: E402


class LogMagnitude(torch.nn.Module):
    """A log-magnitude front end: log(|conv(x)| + eps)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv1d(1, 4, 5, padding=2)

    def forward(self, x):
        return torch.log(self.conv(x).abs() + 1e-3)


class LogMagnitudePort(LogMagnitude):
    """The port as written: the abs is missing, so log meets the negative half of the conv's output."""

    def forward(self, x):
        return torch.log(self.conv(x) + 1e-3)


class LogConv(LogMagnitude):
    """A model that is NaN by itself on these inputs: log of a signed conv output."""

    def forward(self, x):
        return torch.log(self.conv(x))


def _export(model, x, path):
    torch.onnx.export(model, (x,), str(path), dynamo=False, input_names=["x"], output_names=["y"])
    return path


def _run_onnx(path, x):
    import onnxruntime as ort

    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]


@pytest.fixture()
def signal():
    return torch.randn(1, 1, 400, generator=torch.Generator().manual_seed(2))


def test_nan_on_the_candidate_side_only_is_a_finding_with_its_count(tmp_path, signal):
    reference = LogMagnitude().eval()
    port = _export(LogMagnitudePort().eval(), signal, tmp_path / "port.onnx")
    n = int((~np.isfinite(_run_onnx(port, signal))).sum())          # what ONNX Runtime really gives
    assert n > 0 and np.isfinite(reference(signal).detach().numpy()).all()
    res = compare(reference, (signal,), "onnxruntime", artifact=port, out=tmp_path / "cmp")
    assert res.finding and res.output == {"name": "output", "candidate_only": n, "reference_only": 0, "both": 0}
    assert f"non-finite on the candidate side: {n} elements" in res.summary
    # the same file exported from the reference itself keeps the truth: nothing non-finite, no finding
    exact = _export(reference, signal, tmp_path / "exact.onnx")
    same = compare(reference, (signal,), "onnxruntime", artifact=exact, out=tmp_path / "same")
    assert not same.finding and same.output["candidate_only"] == 0 and "non-finite" not in same.summary


def test_nan_the_reference_shares_is_a_property_of_the_model(tmp_path, signal):
    model = LogConv().eval()
    ref_out = model(signal).detach().numpy()
    both = int((~np.isfinite(ref_out)).sum())
    assert both > 0
    res = compare(model, (signal,), "onnxruntime", out=tmp_path / "cmp")
    assert res.ref_nan.found and res.output["both"] == both and res.output["candidate_only"] == 0
    assert not res.finding
    assert "fails the same check" in res.summary and "a property of the model" in res.summary


NOISY = textwrap.dedent('''
    import torch


    class Noisy(torch.nn.Module):
        def forward(self, x):
            return x + 0.1 * torch.randn_like(x)


    class Net(torch.nn.Module):
        def __init__(self, scale=1.0):
            super().__init__()
            torch.manual_seed(0)
            self.pre = torch.nn.Linear(8, 8)
            self.noise = Noisy()
            self.post = torch.nn.Linear(8, 4)
            with torch.no_grad():
                self.post.weight.mul_(scale)

        def forward(self, x):
            return self.post(self.noise(self.pre(x)))


    def inputs():
        return (torch.randn(16, 8, generator=torch.Generator().manual_seed(1)),)


    def build():
        return Net().eval(), inputs()


    def export(path, scale):
        torch.onnx.export(Net(scale).eval(), inputs(), path, dynamo=False, input_names=["x"])
''')


@pytest.fixture()
def noisy(tmp_path):
    (tmp_path / "noisy.py").write_text(NOISY)
    return tmp_path


def _compare_cli(cwd, *args):
    p = subprocess.run([sys.executable, "-m", "tensorprobe", "compare", "noisy.py:build", "--json", *args],
                       capture_output=True, text=True, cwd=cwd)
    return p.returncode, json.loads(p.stdout)["compare"]


def test_replay_rng_gives_the_reference_the_runtimes_draws(noisy):
    """Without replay the runtime's RandomNormalLike draws other numbers (cause random, and the summary says
    --replay-rng); with it the faithful export matches. A weight the converter scaled by 1.01 behind the noise
    still diverges with replay, at that layer and not for random reasons."""
    code, doc = _compare_cli(noisy)
    assert code == 1 and doc["first_divergence"] == "noise" and "--replay-rng" in doc["summary"]
    code, doc = _compare_cli(noisy, "--replay-rng")
    assert code == 0 and doc["diff"]["verdict"] == "match", doc["summary"]
    assert doc["replayed"] == ["noise/RandomNormalLike.0"]
    assert any("drew the runtime's random tensors (1 of 1)" in n for n in doc["notes"])
    subprocess.run([sys.executable, "-c", "import noisy; noisy.export('scaled.onnx', 1.01)"], cwd=noisy, check=True)
    code, doc = _compare_cli(noisy, "--replay-rng", "--artifact", "scaled.onnx")
    assert code == 1 and doc["first_divergence"] == "post"
    post = next(p for p in doc["diff"]["pairs"] if p["name"] == "post")
    assert post["cause"] != "random"


@pytest.mark.parametrize("replay, scale", [(True, 1.0), (True, 1.01), (False, 1.0)])
def test_diff_of_the_bundles_compare_kept_says_what_compare_said(noisy, replay, scale):
    """`tensorprobe diff OUT/ref OUT/onnxruntime` on what `compare -o OUT` kept: the same verdict, first
    divergence, counts and unmatched records (the runtime's op records were 'candidate-only' there; the draws
    the reference replayed are found again by their values)."""
    import tensorprobe as tp

    subprocess.run([sys.executable, "-c", f"import noisy; noisy.export('port.onnx', {scale})"], cwd=noisy, check=True)
    out = noisy / "kept"
    code, doc = _compare_cli(noisy, "--artifact", "port.onnx", "-o", str(out), *(["--replay-rng"] if replay else []))
    again = tp.diff(out / "ref", out / "onnxruntime")
    said = doc["diff"]
    assert (again.verdict, again.first_divergence) == (said["verdict"], said["first_divergence"])
    assert again.counts() == said["counts"] and list(again.cand_only) == said["cand_only"]
    assert [p.cause for p in again.pairs] == [p["cause"] for p in said["pairs"]]
    assert (code == 0) == (said["verdict"] == "match") and (scale == 1.0 and replay) == (code == 0)


class NoisyWithDeadDraw(torch.nn.Module):
    """Adds noise to its input, and draws once more for nothing (the exporter removes that draw as dead code)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.pre = torch.nn.Linear(8, 8)

    def forward(self, x):
        torch.rand_like(x)   # dead: no counterpart in the ONNX graph
        h = self.pre(x)
        return h + 0.1 * torch.randn_like(h)


def test_replay_tags_only_the_draws_the_reference_took(tmp_path):
    """With --replay-rng, a reference draw with no runtime counterpart keeps its own values and is not tagged
    "replayed"; the draw that was taken is."""
    from tensorprobe.bundle import Bundle

    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(1))
    result = compare(NoisyWithDeadDraw().eval(), (x,), "onnxruntime", out=tmp_path, replay_rng=True)
    assert result.diff.verdict == "match", result.summary
    draws = {r.op.split(".")[1]: r for r in Bundle.open(tmp_path / "ref").records if r.kind == "rng"}
    assert set(draws) == {"rand_like", "randn_like"}
    assert "replayed" in draws["randn_like"].tags and "replayed" not in draws["rand_like"].tags


# ---- bad input: one line, exit 2 ----------------------------------------------------------------------------
BAD_INPUTS = textwrap.dedent('''
    import torch
    from tensorprobe.examples import silero


    def good():
        return silero.pytorch_port()


    def float64_frame():          # a NumPy frame fed as is: float64 against float32 weights
        model, (x, state) = silero.pytorch_port()
        return model, (x.double(), state)


    def extra_dim():
        model, (x, state) = silero.pytorch_port()
        return model, (x[None], state)


    def nan_sample():
        model, (x, state) = silero.pytorch_port()
        x = x.clone()
        x[0, 100] = float("nan")
        return model, (x, state)


    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.q = torch.nn.Linear(8, 8)

        def forward(self, x, mask):
            return torch.softmax(self.q(x) @ x.transpose(-1, -2) + mask, -1) @ x


    def inf_mask():               # an additive attention mask: -inf on purpose
        mask = torch.zeros(1, 5, 5)
        mask[..., 3:] = float("-inf")
        return Masked().eval(), (torch.randn(1, 5, 8, generator=torch.Generator().manual_seed(1)), mask)
''')


@pytest.fixture()
def bad_inputs(tmp_path):
    pytest.importorskip("silero_vad")
    (tmp_path / "vad.py").write_text(BAD_INPUTS)
    return tmp_path


def _cli(cwd, *args):
    p = subprocess.run([sys.executable, "-m", "tensorprobe", "compare", *args], capture_output=True, text=True,
                       cwd=cwd)
    return p.returncode, p.stdout + p.stderr


@pytest.mark.parametrize("factory, words", [
    ("float64_frame", "the model's forward raised RuntimeError"),
    ("extra_dim", "the model's forward raised RuntimeError"),
    ("nan_sample", "model input 0 holds NaN (1 of 512 elements, first at index (0, 100))"),
])
def test_a_forward_that_raises_or_nan_inputs_are_one_line_and_exit_2(bad_inputs, factory, words):
    for extra in ((), ("--replay-rng",)):       # the runtime first: its export must not hide the error either
        code, text = _cli(bad_inputs, f"vad.py:{factory}", *extra)
        assert code == 2 and words in text and len(text.strip().splitlines()) == 1, text
        assert "Traceback" not in text and "(None)" not in text and "\x1b" not in text


def test_inputs_the_model_takes_are_compared_an_inf_mask_included(bad_inputs):
    res = compare(*_target(bad_inputs, "good"), "onnxruntime")   # the same port, the right inputs: it runs
    assert res.output is not None and not res.ref_nan.found
    code, text = _cli(bad_inputs, "vad.py:inf_mask")
    assert code == 0 and "The model inputs hold ±Inf (input.1)" in text, text
    assert "PyTorch itself produces" not in text and "(None)" not in text


def _target(cwd, factory):
    from tensorprobe.targets import load_target

    t = load_target(f"{cwd / 'vad.py'}:{factory}")
    return t.model, t.args


class DropoutKeptOn(torch.nn.Module):
    """Dropout left on at inference on purpose (MC dropout): the model's own eval() is not the user's."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.front = torch.nn.Conv1d(4, 8, 3, padding=1)
        self.drop = torch.nn.Dropout(0.2)
        self.head = torch.nn.Conv1d(8, 1, 1)

    def forward(self, x):
        return self.head(self.drop(torch.tanh(self.front(x))))


@pytest.mark.parametrize("replay", [False, True])
def test_compare_leaves_the_users_training_flags_and_captures_the_model_as_given(tmp_path, replay):
    """The export runs in eval mode; the reference is the user's model as handed over. With dropout kept on, the
    export has no dropout: the reference's draws have no counterpart and the run diverges, with or without
    replay (replay was a match at 136 dB: the export had left the model in eval mode). The same model put in
    eval mode by its user matches."""
    x = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(3))
    model = DropoutKeptOn().eval()
    model.drop.train()
    res = compare(model, [x], "onnxruntime", replay_rng=replay, out=tmp_path / "on")
    assert model.drop.training and not model.training and not model.front.training
    assert res.diff.verdict == "diverged", res.diff.summary
    model.drop.eval()
    assert compare(model, [x], "onnxruntime", replay_rng=replay, out=tmp_path / "off").diff.verdict == "match"
