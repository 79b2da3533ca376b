"""A FastSpeech-shaped toy for docs/guide-training.md ("Training versus inference"): phoneme embedding,
encoder, duration predictor, length regulator, decoder to 16 log-mel bins. Training feeds the true durations
(teacher forcing), inference the predicted ones; the decoder's output is clamped to the training data's
log-mel range on the training path only — the fault `check_ranges` finds.

    python -c "from examples.tiny_tts import *; print(TinyTTS()(*inference_inputs()[0]).shape)"
"""

from __future__ import annotations

import torch


class TinyTTS(torch.nn.Module):
    def __init__(self, clamp_at_inference: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(40, 32)
        self.encoder = torch.nn.Conv1d(32, 32, 3, padding=1)
        self.duration_proj = torch.nn.Conv1d(32, 1, 1)
        self.decoder = torch.nn.Conv1d(32, 16, 3, padding=1)
        with torch.no_grad():                      # a log-mel scale: values around -5, spread ~ ±10
            self.decoder.weight.mul_(25.0)
            self.decoder.bias.fill_(-5.0)
        self.clamp_at_inference = clamp_at_inference

    def forward(self, phonemes: torch.Tensor, durations: torch.Tensor | None = None) -> torch.Tensor:
        h = torch.relu(self.encoder(self.embed(phonemes).transpose(1, 2)))
        log_dur = self.duration_proj(h).squeeze(1)
        if durations is None:                      # inference: the predicted durations
            durations = torch.exp(log_dur).round().clamp(1, 12).long()
        frames = torch.repeat_interleave(h[0], durations[0], dim=-1)[None]
        mel = self.decoder(frames)
        if self.training or self.clamp_at_inference:
            mel = mel.clamp(-11.5, 0.0)            # the fault: the log-mel range is enforced in training only
        return mel


def train_batches(n: int = 24):
    """(phonemes, true durations) batches, as a teacher-forced training loop feeds them."""
    g = torch.Generator().manual_seed(1)
    for _ in range(n):
        yield torch.randint(0, 40, (1, 30), generator=g), torch.randint(1, 8, (1, 30), generator=g)


def inference_inputs(n: int = 6) -> list[tuple[torch.Tensor]]:
    """Phonemes alone: the model predicts the durations."""
    g = torch.Generator().manual_seed(2)
    return [(torch.randint(0, 40, (1, 30), generator=g),) for _ in range(n)]
