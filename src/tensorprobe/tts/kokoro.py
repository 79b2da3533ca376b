"""A Kokoro-shaped TTS pipeline run through `StageChecker`: phonemes → ids → durations → decoder features →
decoder → audio, with no download.

The decoder is the real Kokoro-82M iSTFTNet decoder code with seeded random weights
(`tensorprobe.examples.kokoro`); the token embedding and the duration head are small seeded random layers in
Kokoro's shapes (178 tokens, 512 features, durations as Kokoro computes them: `round(sigmoid(logits).sum() /
speed).clamp(min=1)`). The vocabulary is Kokoro's phoneme vocabulary (IPA symbols and punctuation, ids 1–177,
0 is the pad at both ends). The audio is not speech — the weights are random — but every stage is real
enough to show each red flag:

    >>> from tensorprobe.tts.kokoro import KokoroPipeline
    >>> audio, report = KokoroPipeline().run("həlˈO wˈɜɹld")           # doctest: +SKIP
    >>> audio, report = KokoroPipeline(fault="oov-id").run("həlˈO")    # doctest: +SKIP
    >>> report.first_bad_stage                                         # doctest: +SKIP
    'ids'

Faults (`fault=`), each a failure seen in the seeds:
    unknown-symbols  the phonemizer emits symbols the vocabulary lacks (dark-l "ɫ", ARPAbet "AH0")
    oov-id           ids from another training's vocabulary (shifted by 40): ids reach past the embedding
    long-durations   durations from an unclamped exp(log-duration) head: 1000+ frames per phoneme
    pinned-durations a duration head whose logits collapsed (a conversion that lost the projection's weights,
                     bias loaded as -12): every sum of sigmoids rounds to 0 and Kokoro's clamp pins it at 1 frame
    unvoiced         an all-zero F0 contour: the random decoder's exp() path explodes (peak ~1e4-1e5)
    nan              the broken InstanceNorm lowering of seed 000 with unvoiced F0: all-NaN audio
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np

from ..errors import InputError
from .checks import ERROR
from .stages import StageChecker, StageReport

# Kokoro-82M phoneme vocabulary: symbol -> id (ids with no symbol are unused by the model).
_VOCAB_TABLE = (
    ";:,.!?", 1, "—…\"()“”", 9, " ", 16, "\u0303ʣʥʦʨᵝꭧAI", 17, "O", 31, "Q", 33, "ST", 35, "W", 39, "Y", 41,
    "ᵊabcdef", 42, "hijklmnopqrstuvwxyzɑɐɒæ", 50, "βɔɕç", 75, "ɖðʤə", 80, "ɚɛɜ", 85, "ɟ", 90, "ɡ", 92, "ɥ", 99,
    "ɨɪʝ", 101, "ɯɰŋɳɲɴø", 110, "ɸθœ", 118, "ɹ", 123, "ɾɻ", 125, "ʁɽʂʃʈʧ", 128, "ʊʋ", 135, "ʌɣɤ", 138,
    "χʎ", 142, "ʒʔ", 147, "ˈˌː", 156, "ʰ", 162, "ʲ", 164, "↓", 169, "→↗↘", 171, "ᵻ", 177,
)
KOKORO_VOCAB: dict[str, int] = {
    sym: start + i
    for symbols, start in zip(_VOCAB_TABLE[::2], _VOCAB_TABLE[1::2])
    for i, sym in enumerate(symbols)
}
N_TOKEN = 178
MAX_DUR = 50
MIN_DUR = 1   # Kokoro: `torch.round(duration).clamp(min=1)`; no upper clamp (a sum of MAX_DUR sigmoids)
DURATION_CLAMP = (MIN_DUR, None)
PAD_ID = 0
DEMO_PHONEMES = "həlˈO wˈɜɹld"
FAULTS = ("unknown-symbols", "oov-id", "long-durations", "pinned-durations", "unvoiced", "nan")


class KokoroPipeline:
    """phonemes → ids → durations → features → decoder → audio, every stage checked and timed.

    Args:
        seed: weight seed of the decoder, embedding and duration head.
        fault: one of `FAULTS` to reproduce a known failure, or None.
        speed: Kokoro's speed factor (durations are divided by it).
        max_duration_frames: the stage checker's limit for one token (Kokoro's max_dur is 50).
    """

    sample_rate = 24_000

    def __init__(self, seed: int = 0, fault: str | None = None, *, speed: float = 1.0,
                 max_duration_frames: float = 200):
        _check_fault(fault)
        import torch

        from ..examples import kokoro as example

        self.fault, self.speed, self.seed = fault, speed, seed
        self.max_duration_frames = max_duration_frames
        self._ex = example
        self._decoder = example.build_decoder(seed)  # ~5 s: build once, run many times
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed + 1)
            self.embedding = torch.nn.Embedding(N_TOKEN, example.HIDDEN_DIM)
            self.duration_head = torch.nn.Linear(example.HIDDEN_DIM, MAX_DUR)
            torch.nn.init.normal_(self.duration_head.weight, std=0.02)
            torch.nn.init.constant_(self.duration_head.bias, -2.4)  # ~4 frames (100 ms) per token
            self.style = torch.randn(1, example.STYLE_DIM)

    @property
    def vocab(self) -> dict[str, int]:
        """The vocabulary the pipeline maps with (`oov-id`: another training's, shifted by 40)."""
        return {s: i + 40 for s, i in KOKORO_VOCAB.items()} if self.fault == "oov-id" else KOKORO_VOCAB

    @contextmanager
    def _decoder_for_fault(self) -> Iterator[Any]:
        """The decoder; for `nan`, with seed 000's broken InstanceNorm swapped in for the call, then restored."""
        if self.fault != "nan":
            yield self._decoder
            return
        import torch

        originals = [(parent, name, child) for parent in self._decoder.modules()
                     for name, child in parent.named_children() if isinstance(child, torch.nn.InstanceNorm1d)]
        self._ex.inject_faulty_instance_norm(self._decoder)
        try:
            yield self._decoder
        finally:
            for parent, name, child in originals:
                setattr(parent, name, child)

    def checker(self) -> StageChecker:
        """A `StageChecker` set up for this model (Kokoro's vocabulary, embedding size and duration clamp)."""
        return StageChecker(vocab=KOKORO_VOCAB, embedding_size=N_TOKEN, max_duration_frames=self.max_duration_frames,
                            duration_clamp=DURATION_CLAMP, sample_rate=self.sample_rate)

    # ------------------------------------------------------------------ stages (each a plain function)
    def phonemize(self, phonemes: str) -> str:
        """Kokoro takes phonemes from misaki; here they are given. `unknown-symbols` adds foreign ones."""
        return phonemes + " ɫAH0" if self.fault == "unknown-symbols" else phonemes

    def to_ids(self, phonemes: str) -> Any:
        """As Kokoro's KModel: unknown symbols are dropped silently, pad id 0 at both ends."""
        import torch

        ids = [self.vocab[p] for p in phonemes if p in self.vocab]
        return torch.tensor([PAD_ID, *ids, PAD_ID], dtype=torch.long)

    def predict_durations(self, ids: Any) -> Any:
        import torch

        with torch.no_grad():
            logits = self.duration_head(self.embedding(ids))
            if self.fault == "long-durations":  # an exp(log-duration) head without its clamp
                return torch.exp(logits.mean(-1) * 0 + 7.2 + torch.rand(ids.shape, generator=self._gen()))
            if self.fault == "pinned-durations":  # the projection's weights lost, its bias loaded as -12
                logits = logits * 0 - 12
            dur = torch.sigmoid(logits).sum(-1) / self.speed
            return torch.round(dur).clamp(min=MIN_DUR).long()

    def _gen(self) -> Any:
        import torch

        return torch.Generator().manual_seed(self.seed)

    def features(self, ids: Any, durations: Any) -> Any:
        """Decoder features: token embeddings repeated by their durations, (1, 512, frames)."""
        import torch

        with torch.no_grad():
            emb = self.embedding(ids)  # (tokens, 512)
            return torch.repeat_interleave(emb, durations.long(), dim=0).T.unsqueeze(0)

    def decode(self, feats: Any) -> Any:
        import torch

        frames = feats.shape[-1]
        t = torch.linspace(0, 1, 2 * frames)
        voiced = self.fault not in ("unvoiced", "nan")
        f0 = (165 + 55 * torch.sin(2 * math.pi * 1.5 * t)).unsqueeze(0) if voiced else torch.zeros(1, 2 * frames)
        noise = torch.randn(1, 2 * frames, generator=self._gen())
        with torch.no_grad(), self._decoder_for_fault() as decoder:
            return decoder(feats, f0, noise, self.style).squeeze()

    # ------------------------------------------------------------------ the run
    def run(self, phonemes: str = DEMO_PHONEMES, checker: StageChecker | None = None, *,
            fault: str | None = "default", stop_on_error: bool = True) -> tuple[np.ndarray | None, StageReport]:
        """Run every stage through the checker. With `stop_on_error`, the pipeline stops after the first stage
        with an error finding (running the decoder on out-of-range ids or 1000-frame durations is pointless).
        `fault` overrides the pipeline's fault for this run (None: no fault).

        Returns (audio as numpy or None when stopped early, the StageReport)."""
        if fault != "default":
            _check_fault(fault)
            saved, self.fault = self.fault, fault
            try:
                return self.run(phonemes, checker, stop_on_error=stop_on_error)
            finally:
                self.fault = saved
        c = checker or self.checker()
        steps = (("phonemes", self.phonemize, "phonemes"), ("ids", self.to_ids, "ids"),
                 ("durations", None, "durations"), ("features", None, "latents"), ("decoder", self.decode, "audio"))
        value: Any = phonemes
        ids = None
        for stage, fn, kind in steps:
            if stage == "durations":
                fn, args = self.predict_durations, (ids,)
            elif stage == "features":
                fn, args = self.features, (ids, value)
            else:
                args = (value,)
            try:
                value = c.run(stage, fn, *args, check_as=kind, sample_rate=self.sample_rate)
            except Exception:
                c.stop(stage)
                return None, c.report(source="kokoro")
            if stage == "ids":
                ids = value
            if stop_on_error and c.has_errors() and stage != "decoder":
                c.stop(stage)
                return None, c.report(source="kokoro")
        return value.numpy(), c.report(source="kokoro")


def _check_fault(fault: str | None) -> None:
    if fault is not None and fault not in FAULTS:
        raise InputError(f"unknown fault {fault!r}; choose one of {', '.join(FAULTS)}")


def demo(phonemes: str = DEMO_PHONEMES, fault: str | None = None, seed: int = 0, speed: float = 1.0
         ) -> tuple[np.ndarray | None, StageReport]:
    """Run the Kokoro-shaped pipeline once (the `tensorprobe tts demo` command)."""
    return KokoroPipeline(seed, fault, speed=speed).run(phonemes)


__all__ = ["DEMO_PHONEMES", "DURATION_CLAMP", "ERROR", "FAULTS", "KOKORO_VOCAB", "KokoroPipeline", "N_TOKEN",
           "demo"]
