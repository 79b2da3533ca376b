"""A small FastSpeech-shaped mel predictor and training steps with planted backward-NaN faults.

The model: an encoder convolution over phoneme features, a frame-energy branch, a decoder convolution to 16
mel bins; each batch has voiced and silent frames (silent frames are exactly 0, as after a voiced mask).
Training-step TARGETs (`tensorprobe nan TARGET --backward`) return `(model, inputs, loss_fn)`:

- `masked_energy_step`: energy √(mean h²) computed on every frame and masked with torch.where: forward and
  loss finite, the gradient of sqrt at the silent frames is 0 · ∞ = NaN.
- `fixed_energy_step`: the same with the double-where fix: clean.
- `segment_norm_step`: a hand-written (x − mean) / (std + eps) over an all-silent utterance.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

N_PHONEME_FEATURES, HIDDEN, N_MELS, FRAMES = 8, 32, 16, 40


class Energy(torch.nn.Module):
    """Frame energy √(mean h²) on voiced frames; computed everywhere, then masked (the fault)."""

    def forward(self, h: torch.Tensor, voiced: torch.Tensor) -> torch.Tensor:
        power = h.pow(2).mean(dim=1, keepdim=True)
        return torch.where(voiced, torch.sqrt(power), torch.zeros_like(power))


class SafeEnergy(torch.nn.Module):
    """The double-where fix: masked frames take sqrt(1), so they never reach the singularity at 0."""

    def forward(self, h: torch.Tensor, voiced: torch.Tensor) -> torch.Tensor:
        power = h.pow(2).mean(dim=1, keepdim=True)
        return torch.where(voiced, torch.sqrt(torch.where(voiced, power, torch.ones_like(power))), 0.0)


class SegmentNorm(torch.nn.Module):
    """A hand-written normalisation over time, (x − mean) / (std + eps): NaN gradient on a constant segment."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        centred = x - x.mean(-1, keepdim=True)
        return centred / (centred.pow(2).mean(-1, keepdim=True).sqrt() + 1e-5)


class MelPredictor(torch.nn.Module):
    """Encoder conv, energy of the hidden frames, decoder conv to N_MELS bins (seeded weights)."""

    def __init__(self, energy: torch.nn.Module | None = None, norm: torch.nn.Module | None = None, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.encoder = torch.nn.Conv1d(N_PHONEME_FEATURES, HIDDEN, 3, padding=1)
        self.energy = energy if energy is not None else SafeEnergy()
        self.norm = norm if norm is not None else torch.nn.Identity()
        self.decoder = torch.nn.Conv1d(HIDDEN + 1, N_MELS, 3, padding=1)

    def forward(self, phonemes: torch.Tensor, voiced: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.encoder(phonemes) * voiced)          # silent frames are exactly zero
        return self.decoder(torch.cat([h, self.energy(h, voiced)], dim=1))


def batch(seed: int = 1, silent_from: int = 25) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    """((phonemes, voiced), target mel) for 2 utterances; the second ends in silence from `silent_from`."""
    g = torch.Generator().manual_seed(seed)
    phonemes = torch.randn(2, N_PHONEME_FEATURES, FRAMES, generator=g)
    voiced = torch.ones(2, 1, FRAMES, dtype=torch.bool)
    voiced[1, :, silent_from:] = False
    target = torch.randn(2, N_MELS, FRAMES, generator=g)
    return (phonemes, voiced), target


def mse_to(target: torch.Tensor):
    def loss_fn(mel: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(mel, target)
    return loss_fn


def masked_energy_step():
    """Training-step TARGET: the masked-sqrt energy (NaN gradient at the silent frames of row 1)."""
    inputs, target = batch()
    return MelPredictor(energy=Energy()), inputs, mse_to(target)


def fixed_energy_step():
    """Training-step TARGET: the same step with the double-where fix (clean)."""
    inputs, target = batch()
    return MelPredictor(energy=SafeEnergy()), inputs, mse_to(target)


def segment_norm_step():
    """Training-step TARGET: a hand-written std normalisation over an all-silent first utterance."""
    (phonemes, voiced), target = batch()
    phonemes[0] = 0.0
    return MelPredictor(norm=SegmentNorm()), (phonemes, torch.ones_like(voiced)), mse_to(target)


def padded_spectral_loss(target_mag: torch.Tensor, keep: torch.Tensor, n_fft: int = 256, hop: int = 64):
    """A vocoder's spectral L1 loss over a padded batch, magnitude √(re² + im²) written without an epsilon: the
    padding is masked to exactly 0, its STFT bins are 0, and the gradient of √ there is infinite."""
    window = torch.hann_window(n_fft)

    def loss_fn(audio: torch.Tensor) -> torch.Tensor:
        wav = audio.reshape(audio.shape[0], -1) * keep
        spec = torch.stft(wav, n_fft, hop, window=window, return_complex=True)
        mag = torch.sqrt(spec.real ** 2 + spec.imag ** 2)
        return (mag - target_mag).abs().mean()
    return loss_fn


def kokoro_decoder_step(seconds: float = 0.5, pad_fraction: float = 0.3):
    """Training-step TARGET: the Kokoro decoder (kokoro.istftnet, seeded random weights) under
    `padded_spectral_loss`, the last `pad_fraction` of its output masked as padding."""
    from .kokoro import build_decoder, decoder_inputs

    model = build_decoder(stable_source=False).train()
    inputs = decoder_inputs(seconds, voiced=True)
    with torch.no_grad():
        samples = model(*inputs).numel()
    keep = torch.ones(1, samples)
    keep[:, int(samples * (1 - pad_fraction)):] = 0.0
    g = torch.Generator().manual_seed(3)
    frames = samples // 64 + 1
    return model, inputs, padded_spectral_loss(torch.rand(1, 129, frames, generator=g), keep)


def train_until_nan(run_dir: str = "tensorprobe-run-example", steps: int = 160, silent_from: int = 130):
    """A worked example: train the mel predictor with the where-masked energy under a `Monitor`; the batches
    are voiced until step `silent_from`, where the first silent frames arrive and the gradient goes NaN. The
    monitor re-runs that step in backward-NaN mode. Returns the monitor (its findings)."""
    from ..train import Monitor

    model = MelPredictor(energy=Energy())
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    current: dict = {}
    torch.manual_seed(99)
    proj = torch.randn(N_MELS, N_PHONEME_FEATURES) / 3

    def diagnose():
        inputs, target = current["batch"]
        return inputs, mse_to(target)

    with Monitor(model, optimizer, run_dir, watch=["decoder"], diagnose=diagnose) as monitor:
        for step in range(steps):
            (phonemes, voiced), _ = batch(seed=step % 16, silent_from=25 if step >= silent_from else FRAMES)
            target = torch.einsum("mc,bct->bmt", proj, phonemes) * voiced
            current["batch"] = ((phonemes, voiced), target)
            loss = F.mse_loss(model(phonemes, voiced), target)
            optimizer.zero_grad()
            loss.backward()
            monitor.step(loss)
            optimizer.step()
    return monitor


if __name__ == "__main__":
    import sys

    found = train_until_nan(sys.argv[1] if len(sys.argv) > 1 else "tensorprobe-run-example").findings
    for f in found[:3]:
        print(f"step {f['step']}: {f['kind']} in {f['layer']}: {f['message']}")
        if f.get("origin_headline"):
            print(f"  origin: {f['origin_headline']}")
