"""A diagnosis names a cause only when the recorded computation shows it.

The same arithmetic is moved between a submodule and the root's own forward, reshaped ([1, C, T], [B, C, T],
a mono [1, 1, T]) and read by every producer (the live search, op-level bundles with and without tensors,
an ONNX Runtime capture): a one-pass variance E[x²] − E[x]² that goes negative is named as such everywhere;
a `log` or `sqrt` of a value that is merely negative (a mono conv output, a magnitude with a sign typo in
Silero's port, Kokoro's audio) is never called a normalization, whatever its shape. Inputs are real Kokoro
activations (the input of the norm the demo breaks) and Silero VAD's trained weights.
"""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import tensorprobe as tp

EPS = 1e-5
NORM_WORDS = re.compile(r"variance|normali[sz]ation|E\[x²\]", re.IGNORECASE)


def fp16_one_pass(x: torch.Tensor) -> torch.Tensor:
    """FaultyInstanceNorm1d's arithmetic as a plain function: var = E[x²] − E[x]² in float16."""
    xh = x.half()
    mean = xh.mean(-1, keepdim=True)
    var = ((xh * xh).mean(-1, keepdim=True) - mean * mean).float()
    return (x - mean.float()) * torch.rsqrt(var + EPS)


def negative_variance_channels(x: torch.Tensor, every_row: bool = False) -> list[int]:
    """Independent ground truth: channels where fp16_one_pass's variance + eps is negative in some batch row
    (in every row: the channels whose output is entirely NaN)."""
    xh = x.half()
    var = ((xh * xh).mean(-1) - xh.mean(-1) ** 2).float()
    neg = (var + EPS) < 0
    return torch.nonzero(neg.all(0) if every_row else neg.any(0)).flatten().tolist()


class Stage(nn.Module):
    """A neutral class name: only the computation inside shows a variance."""

    def forward(self, x):
        return fp16_one_pass(x)


class OnePassInSubmodule(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.stage = Stage()
        self.mix = nn.Conv1d(channels, channels, 1)

    def forward(self, x):
        return self.mix(self.stage(x))


class OnePassInRoot(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.mix = nn.Conv1d(channels, channels, 1)

    def forward(self, x):
        return self.mix(fp16_one_pass(x))


class LogOfMonoConv(nn.Module):
    """`log` of a conv with one output channel: [1, 1, T], the usual shape of an audio model's output."""

    def __init__(self, channels: int, out: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(channels, out, 3, padding=1)

    def forward(self, x):
        return torch.log(self.conv(x))


class LogInSubmodule(nn.Module):
    def __init__(self, channels: int, out: int = 1):
        super().__init__()
        self.head = LogOfMonoConv(channels, out)

    def forward(self, x):
        return self.head(x)


@pytest.fixture(scope="module")
def norm_input(kokoro):
    """The input of the Kokoro decoder's generator.noise_res.0.adain1.0.norm on 0.3 s of the factory's input:
    real activations, [1, 256, 240], some channels with mean far above their spread."""
    model, inputs = kokoro.decoder(0.3)
    seen = []
    norm = model.get_submodule("generator.noise_res.0.adain1.0.norm")
    h = norm.register_forward_hook(lambda mod, a, o: seen.append(a[0].detach().clone()))
    with torch.no_grad():
        model(*inputs)
    h.remove()
    return seen[0]


def _shapes(x: torch.Tensor) -> dict[str, torch.Tensor]:
    bad = negative_variance_channels(x)
    return {"1CT": x, "BCT": torch.cat([x, x.roll(1, dims=1)]), "11T": x[:, bad[0]:bad[0] + 1]}


def _origins(model, x, tmp_path):
    """The same run as each producer reads it: live, op-level bundle with tensors, op-level statistics only."""
    yield "live", tp.find_first_nonfinite(model, x)
    for keep in ("full", "stats"):
        b = tp.capture(model, x, level="op", keep=keep, out=tmp_path / keep)
        yield f"op/{keep}", tp.find_nonfinite_in_bundle(b)


@pytest.mark.parametrize("shape", ["1CT", "BCT", "11T"])
@pytest.mark.parametrize("where", ["submodule", "root"])
def test_a_one_pass_variance_is_named_wherever_it_runs_and_whatever_its_shape(norm_input, tmp_path, where, shape):
    x = _shapes(norm_input)[shape]
    anywhere, entirely = negative_variance_channels(x), negative_variance_channels(x, every_row=True)
    assert anywhere, "the Kokoro activation must break the float16 one-pass variance"
    torch.manual_seed(0)
    model = (OnePassInSubmodule if where == "submodule" else OnePassInRoot)(x.shape[1])
    for producer, o in _origins(model, x, tmp_path):
        assert o.found and o.cause in ("op", "record"), producer
        assert o.module == ("stage" if where == "submodule" else "") and o.op == "aten.rsqrt.default", producer
        st = o.output.stats
        if shape == "11T":     # the one channel, entirely
            assert st.finite_frac == 0.0, producer
        else:
            assert list(st.nonfinite_channel_idx) == entirely[:64], producer
            assert st.nonfinite_channels + st.partial_nonfinite_channels == len(anywhere), producer
        text = " ".join(o.diagnosis)
        assert "a one-pass variance E[x²] − E[x]²" in text and "variance came out negative" in text, (producer, text)
        assert "mean → sub" in text, text                      # the op chain it was read from
        if where == "root":
            assert "in the model's own forward (OnePassInRoot.forward, " in o.headline(), o.headline()


@pytest.mark.parametrize("shape", ["1CT", "BCT"])
@pytest.mark.parametrize("where", ["submodule", "root"])
def test_log_of_a_conv_output_is_not_called_a_normalization_in_any_shape(norm_input, tmp_path, where, shape):
    x = _shapes(norm_input)[shape]
    torch.manual_seed(0)
    out = 1 if shape == "1CT" else 4       # [1, 1, T]: the shape the old rule took for a per-channel statistic
    model = (LogInSubmodule if where == "submodule" else LogOfMonoConv)(x.shape[1], out)
    with torch.no_grad():   # the bias put at the median of the conv's output: half of it negative
        conv = model.head.conv if where == "submodule" else model.conv
        conv.bias -= conv(x).transpose(0, 1).flatten(1).median(dim=1).values
        pre = conv(x)
    assert pre.min() < 0 < pre.max()
    for producer, o in _origins(model, x, tmp_path):
        assert o.found and o.op == "aten.log.default", producer
        assert o.module == ("head" if where == "submodule" else ""), producer
        assert o.output.shape == tuple(pre.shape)
        text = " ".join(o.diagnosis)
        assert not NORM_WORDS.search(text.replace("a variance or another statistic", "")), (producer, text)
        assert "made by convolution" in text and "log is defined for x > 0" in text, text
        low, high = re.search(r"ranges over \[(\S+), (\S+)\]", text).groups()
        assert float(low) == pytest.approx(float(pre.min()), rel=1e-3), text
        assert float(high) == pytest.approx(float(pre.max()), rel=1e-3), text
        assert o.source and o.source.split(":")[0].endswith("test_diagnose.py")   # the line that did it


def test_the_same_log_fed_a_one_pass_variance_is_named_a_variance(norm_input):
    """Keep the op and the shape, change how its input was made: the verdict follows the computation."""

    class LogVariance(nn.Module):
        def forward(self, x):
            xh = x.half()
            mean = xh.mean(-1, keepdim=True)
            return torch.log(((xh * xh).mean(-1, keepdim=True) - mean * mean).float() + EPS)

    o = tp.find_first_nonfinite(LogVariance(), norm_input)
    assert o.op == "aten.log.default" and o.module == ""
    assert "a one-pass variance E[x²] − E[x]²" in " ".join(o.diagnosis)


# ---- Silero VAD's port, trained weights: two port bugs in the root's own forward -------------------------

def _silero_forward(self, x, state, magnitude, head):
    x = nn.functional.pad(x, (0, self.pad), mode="reflect").unsqueeze(1)
    x = self.stft_conv(x)
    x = magnitude(x[:, :self.cutoff], x[:, self.cutoff:])
    x = self.conv1(x).relu()
    x = self.conv2(x).relu()
    x = self.conv3(x).relu()
    x = self.conv4(x).relu().squeeze(-1)
    h, c = self.lstm_cell(x, (state[0], state[1]))
    x = head(self.final_conv(h.unsqueeze(-1).relu()))
    return x.squeeze(1).mean(dim=1, keepdim=True), torch.stack([h, c])


def _silero_variant(magnitude, head):
    from tensorprobe.examples import silero

    class Port(silero.SileroVAD):
        def forward(self, x, state):
            return _silero_forward(self, x, state, magnitude, head)

    model = Port()
    model.load_state_dict(silero.weights_from_onnx())
    return model.eval(), silero.pytorch_port()[1]


@pytest.fixture
def silero_pkg():
    pytest.importorskip("silero_vad", reason="silero-vad is not installed (the [test] extra installs it)")
    pytest.importorskip("onnx", reason="the port's weights are read from the package's ONNX file")


def test_silero_magnitude_with_a_sign_typo_is_a_negative_value_not_a_variance(silero_pkg, tmp_path):
    # sqrt(re² − im²) for sqrt(re² + im²): a difference of squares, of no mean; whole channels go NaN
    model, inputs = _silero_variant(lambda re, im: (re ** 2 - im ** 2).sqrt(), torch.sigmoid)
    o = tp.find_first_nonfinite(model, *inputs)
    assert o.record == "<root>/sqrt.0" and "in the model's own forward (Port.forward, " in o.headline()
    text = " ".join(o.diagnosis)
    assert "pow → sub" in text and not NORM_WORDS.search(text.replace("a variance or another statistic", ""))
    assert o.output.stats.nonfinite_channels > 0          # whole channels, and still not a normalization
    # the faithful magnitude (keep the truth): no NaN at all
    clean, inputs = _silero_variant(lambda re, im: (re ** 2 + im ** 2).sqrt(), torch.sigmoid)
    assert not tp.find_first_nonfinite(clean, *inputs).found


def test_silero_log_of_its_mono_output_conv_is_a_negative_logit(silero_pkg, tmp_path):
    # log(final_conv(h)) where log-sigmoid was meant: the conv's one output is [1, 1, 1]
    model, inputs = _silero_variant(lambda re, im: (re ** 2 + im ** 2).sqrt(), torch.log)
    for producer, o in [("live", tp.find_first_nonfinite(model, *inputs)),
                        ("op/full", tp.find_nonfinite_in_bundle(tp.capture(model, *inputs, level="op", keep="full",
                                                                           out=tmp_path / "b")))]:
        assert o.record == "<root>/log.0" and o.output.shape == (1, 1, 1), producer
        text = " ".join(o.diagnosis)
        assert "relu → convolution" in text and not NORM_WORDS.search(text.replace("a variance or another statistic",
                                                                                  "")), (producer, text)


# ---- the Kokoro decoder: its audio is [1, 1, N] -----------------------------------------------------------

@pytest.mark.slow
def test_log_of_kokoro_audio_in_the_root_is_named_at_the_root_with_its_class(kokoro, tmp_path):
    class LogAudio(nn.Module):
        def __init__(self):
            super().__init__()
            self.decoder = kokoro.build_decoder()

        def forward(self, *args):
            return torch.log(self.decoder(*args))      # log-magnitude meant: the audio is signed

    model, inputs = LogAudio().eval(), kokoro.decoder_inputs(0.3)
    o = tp.find_first_nonfinite(model, *inputs)
    assert o.op == "aten.log.default" and o.module == "" and o.output.shape == (1, 1, 7200)
    assert o.headline().startswith("NaN/Inf born at aten.log.default in the model's own forward (LogAudio.forward, ")
    assert not NORM_WORDS.search(" ".join(o.diagnosis).replace("a variance or another statistic", ""))
    # the module-level bundle of the same run: the root's own record, named with its class everywhere
    m = tp.find_nonfinite_in_bundle(tp.capture(model, *inputs, level="module", out=tmp_path / "m"))
    assert m.record == "<root>" and m.module == "" and m.module_type == "LogAudio"
    assert "born in <root> (LogAudio)" in m.headline()
    assert all("decoder" not in d for d in m.diagnosis), m.diagnosis
    assert "<root> (LogAudio)" in " ".join(m.diagnosis)


@pytest.mark.slow
def test_kokoro_faulty_norm_at_module_level_is_named_by_its_class(kokoro, tmp_path):
    model, inputs = kokoro.faulty_decoder(0.3)
    o = tp.find_nonfinite_in_bundle(tp.capture(model, *inputs, level="module", out=tmp_path / "m"))
    assert o.record == "generator.noise_res.0.adain1.0.norm" and o.module_type == "FaultyInstanceNorm1d"
    text = " ".join(o.diagnosis)
    assert "variance came out negative" in text and "Evidence: it runs in FaultyInstanceNorm1d" in text
    # the same module renamed to a class that says nothing: the evidence is gone, and so is the claim
    renamed = type("Stage", (kokoro.FaultyInstanceNorm1d,), {})
    for mod in model.modules():
        if isinstance(mod, kokoro.FaultyInstanceNorm1d):
            mod.__class__ = renamed
    o = tp.find_nonfinite_in_bundle(tp.capture(model, *inputs, level="module", out=tmp_path / "r"))
    assert o.record == "generator.noise_res.0.adain1.0.norm" and o.module_type == "Stage"
    assert "variance" not in " ".join(o.diagnosis) and "--level op" in " ".join(o.diagnosis)
    # ... and op level reads it from the ops instead
    o = tp.find_first_nonfinite(model, *inputs)
    assert "a one-pass variance E[x²] − E[x]²" in " ".join(o.diagnosis)


@pytest.mark.slow
def test_kokoro_half_precision_norm_at_module_level_is_a_negative_variance_in_exactly_its_nan_channels(kokoro, tmp_path):
    """A module-level capture does not record the norm's ops, but it holds the norm's input: computing the
    one-pass variance on it in float16 gives negative values in exactly the NaN channels (float32 does not), so
    the sweep's label is "negative variance", not "made inside FaultyInstanceNorm1d". A norm that is NaN for
    another reason (a two-pass float32 variance minus a constant: an eps sign typo) is not called that."""
    from tensorprobe.sweep.item import diagnosis_label

    class EpsTypo(kokoro.FaultyInstanceNorm1d):
        def forward(self, x):
            mean = x.mean(-1, keepdim=True)
            var = ((x - mean) ** 2).mean(-1, keepdim=True)
            return (x - mean) * torch.rsqrt(var - 0.05) * self.weight[:, None] + self.bias[:, None]

    for seed, norm in ((0, None), (3, None), (0, EpsTypo)):
        model = kokoro.build_decoder()
        kokoro.inject_faulty_instance_norm(model)
        for mod in model.modules():
            if norm is not None and isinstance(mod, kokoro.FaultyInstanceNorm1d):
                mod.__class__ = norm
        inputs = kokoro.decoder_inputs(0.1, seed=seed, voiced=False)
        o = tp.find_nonfinite_in_bundle(tp.capture(model.eval(), *inputs, level="module", keep="full",
                                                   out=tmp_path / f"{seed}{norm}"))
        half = [d for d in o.diagnosis if "rounded to float16" in d]
        if norm is None:
            bad = ", ".join(map(str, o.output.stats.nonfinite_channel_idx))
            assert o.record == "generator.noise_res.0.adain1.0.norm" and half, o.diagnosis
            assert f"({bad}) and rsqrt of it is NaN" in half[0] and "exactly the NaN channels" in half[0]
            assert diagnosis_label(o) == "negative variance"
        else:
            assert o.module_type == "EpsTypo" and not half and diagnosis_label(o) != "negative variance"


# ---- module level: what a bundle without ops can say about the root ---------------------------------------

class LogThenPost(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(8, 8, 3, padding=1)
        self.post = nn.Conv1d(8, 1, 1)

    def forward(self, x):
        return self.post(torch.log(self.conv(x)))


def test_module_level_nan_born_in_the_roots_own_code_is_not_pinned_on_the_next_submodule(tmp_path):
    model, x = LogThenPost(), torch.randn(1, 8, 200)
    o = tp.find_nonfinite_in_bundle(tp.capture(model, x, level="module", out=tmp_path / "m"))
    assert o.record == "post" and o.or_born_in == "the model's own forward (LogThenPost.forward)"
    assert o.headline().startswith("NaN/Inf first seen in the output of post: born inside it, or in the code of "
                                   "the model's own forward (LogThenPost.forward)")
    assert o.to_dict()["or_born_in"] == "the model's own forward (LogThenPost.forward)"
    # with the module inputs recorded the bundle can tell: post's input already holds it
    o = tp.find_nonfinite_in_bundle(tp.capture(model, x, level="module", record_inputs=True, out=tmp_path / "i"))
    assert o.record == "post:in0" and o.module == "" and o.module_type == "LogThenPost"
    assert o.headline().startswith("NaN/Inf born in the model's own forward (LogThenPost.forward), before it called post")
    # the NaN moved into post itself (keep the layers, change where it is born): post is named, without doubt
    class LogInPost(LogThenPost):
        def __init__(self):
            super().__init__()
            self.post = LogOfMonoConv(8)

        def forward(self, x):
            return self.post(self.conv(x))

    torch.manual_seed(0)
    o = tp.find_nonfinite_in_bundle(tp.capture(LogInPost(), x, level="module", out=tmp_path / "p"))
    assert o.record == "post" and o.or_born_in is None and o.headline().startswith("NaN/Inf born in post")


# ---- another producer: ONNX Runtime ------------------------------------------------------------------------

@pytest.mark.parametrize("keep", ["full", "stats"])
def test_onnx_runtime_records_carry_the_same_evidence(tmp_path, keep):
    pytest.importorskip("onnxruntime", reason="needs the onnx extra")
    from tensorprobe.runtimes import get_runtime

    class OnePass32(nn.Module):          # float32 one-pass variance in the root, then a conv
        def __init__(self):
            super().__init__()
            self.mix = nn.Conv1d(16, 16, 1)

        def forward(self, x):
            mean = x.mean(-1, keepdim=True)
            var = (x * x).mean(-1, keepdim=True) - mean * mean
            return self.mix((x - mean) * torch.rsqrt(var + EPS))

    g = torch.Generator().manual_seed(0)
    x = 100 + torch.logspace(-3, 0, 16)[None, :, None] * torch.randn(1, 16, 400, generator=g)
    ort = get_runtime("onnxruntime")
    o = tp.find_nonfinite_in_bundle(ort.capture(OnePass32(), (x,), out=tmp_path / "v", keep=keep))
    assert o.found and o.op == "Sqrt" and o.module == ""     # ONNX's rsqrt: Sqrt, then Reciprocal
    assert "a one-pass variance E[x²] − E[x]²" in " ".join(o.diagnosis), o.diagnosis
    torch.manual_seed(0)
    o = tp.find_nonfinite_in_bundle(ort.capture(LogOfMonoConv(16), (torch.randn(1, 16, 64),), out=tmp_path / "l",
                                                keep=keep))
    assert o.op == "Log" and o.output.shape == (1, 1, 64)
    text = " ".join(o.diagnosis)
    assert "Log of" in text and not NORM_WORDS.search(text.replace("a variance or another statistic", "")), text


# ---- the backward search names the root as a module, never as the loss -----------------------------------

def test_backward_origin_in_the_roots_forward_is_the_root_and_in_the_loss_is_the_loss():
    from tensorprobe.nan.backward import find_first_nonfinite_backward

    class Root(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            h = self.lin(x)
            return torch.where(h > 0, torch.sqrt(h.clamp(min=0)), torch.zeros_like(h))

    x = torch.randn(8, 4)
    o = find_first_nonfinite_backward(Root(), (x,), lambda y: y.pow(2).mean())
    assert o.found and o.module == "" and o.record == "<root>/sqrt.0"
    assert "of aten.sqrt.default in the model's own forward (Root.forward, " in o.headline() and "the loss (" not in o.headline()

    def loss(y):
        return torch.sqrt(y - y).sum()

    o = find_first_nonfinite_backward(nn.Linear(4, 4), (x,), loss)
    assert o.module == "loss" and "of aten.sqrt.default in the loss (loss/sqrt.0)" in o.headline()


def test_diagnose_record_gives_a_caller_the_same_evidence_for_a_record_it_names(tmp_path):
    from tensorprobe.errors import BundleError
    from tensorprobe.nan import diagnose_record

    torch.manual_seed(0)
    b = tp.capture(LogThenPost(), torch.randn(1, 8, 200), level="op", keep="full", out=tmp_path / "b")
    first = tp.find_nonfinite_in_bundle(b)
    named = diagnose_record(b, first.record)
    assert named.record == first.record == "<root>/log.0" and named.diagnosis == first.diagnosis
    later = diagnose_record(b, "post/convolution.0")          # inherits NaN: its own ops, its own words
    assert later.record == "post/convolution.0" and "log" not in " ".join(later.diagnosis)
    with pytest.raises(BundleError, match="no record named 'nope'"):
        diagnose_record(b, "nope")


def test_a_half_precision_module_output_at_the_edge_of_its_range_is_an_overflow_at_module_level(tmp_path):
    """CREPE tiny converted to fp16 behind a wrapper that casts its input: on loud input, conv1's output holds
    ±Inf with finite values at 65504. A module-level capture does not record the input (the wrapper's own
    code made it), yet its statistics say overflow (the sweep's label: 'overflow', was 'undiagnosed'). A
    float16 division by zero, whose finite values stay small, is not called an overflow."""
    from tensorprobe.examples import crepe
    from tensorprobe.sweep.item import diagnosis_label

    class Half(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m.half()

        def forward(self, x):
            return self.m(x.half()).float()

    class Reciprocal(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv1d(1, 2, 3, padding=1).half()
            self.inv = Inv()

        def forward(self, x):
            return self.inv(self.conv(x.half()))

    class Inv(nn.Module):
        def forward(self, x):
            return 1.0 / (x * 0)

    loud = crepe.frames(220.0, n_frames=4, seed=1) * 1000.0
    o = tp.find_nonfinite_in_bundle(tp.capture(Half(crepe.model("tiny")).eval(), loud, level="module",
                                               out=tmp_path / "loud"))
    assert o.record == "m.conv1" and diagnosis_label(o) == "overflow"
    assert o.diagnosis[0].startswith("m.conv1 overflowed the float16 range")
    quiet = crepe.frames(220.0, n_frames=4, seed=1)
    assert not tp.find_nonfinite_in_bundle(tp.capture(Half(crepe.model("tiny")).eval(), quiet, level="module",
                                                      out=tmp_path / "quiet")).found
    o = tp.find_nonfinite_in_bundle(tp.capture(Reciprocal().eval(), torch.randn(1, 1, 16), level="module",
                                               out=tmp_path / "inv"))
    assert o.record == "inv" and diagnosis_label(o) != "overflow" and "overflowed" not in " ".join(o.diagnosis)


class _NoEpsNorm(nn.Module):
    """A layer norm written by hand, its eps outside the square root (or none): 0/0 on a constant row."""

    def __init__(self, eps_inside: float = 0.0):
        super().__init__()
        self.eps_inside = eps_inside

    def forward(self, x):
        m = x.mean(-1, keepdim=True)
        return (x - m) / (((x - m) ** 2).mean(-1, keepdim=True) + self.eps_inside).sqrt()


class _Frames(nn.Module):
    def __init__(self, eps_inside: float = 0.0):
        super().__init__()
        torch.manual_seed(0)
        self.norm, self.proj = _NoEpsNorm(eps_inside), nn.Linear(8, 4)

    def forward(self, x):
        return self.proj(self.norm(x))


@pytest.mark.parametrize("keep", ["full", "stats"])
def test_a_float16_norm_over_a_silent_frame_is_zero_variance_not_overflow(tmp_path, keep):
    """fp16 frames, three of them silent (constant): the hand-written norm makes 0/0 there. With the input
    kept, the sweep's label names the zero variance and counts the constant rows; from statistics alone, a
    negative or zero variance. Never 'overflow' (the float16 context sentence mentions overflow). The same norm
    with eps inside the square root makes no NaN."""
    from tensorprobe.sweep.item import diagnosis_label

    x = torch.randn(1, 6, 8, generator=torch.Generator().manual_seed(1))
    x[0, [1, 3, 4]] = 0.25                              # three silent frames
    o = tp.find_nonfinite_in_bundle(tp.capture(_Frames().half().eval(), x.half(), level="module", keep=keep,
                                               out=tmp_path / "nan"))
    assert o.record == "norm" and o.output.stats.nan == 24
    if keep == "full":
        assert diagnosis_label(o) == "zero variance (0/0)" and "3 rows of its input are constant" in o.diagnosis[0]
    else:
        assert diagnosis_label(o) == "negative variance"
    fixed = tp.capture(_Frames(eps_inside=1e-3).half().eval(), x.half(), level="module", keep=keep,
                       out=tmp_path / "fixed")
    assert not tp.find_nonfinite_in_bundle(fixed).found
