"""One collapse, one finding: a conv vocoder fed silent (all-zero) mels outputs the same waveform for every item of
the batch from step 0 (std across the batch 0 against the target's 0.066) for the whole run, while it learns the
targets' position-dependent mean, so its loss keeps falling in spells. It was reported 7 times in 80 steps ('since
step 0' each time), the episode ending whenever the loss's trend flickered; it ends now only when the prediction's
spread recovers. A run that recovers and collapses again is still reported twice."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tensorprobe.train import Monitor


class ConvVocoder(torch.nn.Module):
    """mel (B, 16, T) -> waveform (B, 1, 4T): conv, transposed-conv upsampling, residual conv, output conv."""

    def __init__(self, seed: int):
        super().__init__()
        torch.manual_seed(seed)
        self.pre = torch.nn.Conv1d(16, 32, 5, padding=2)
        self.up = torch.nn.ConvTranspose1d(32, 16, 4, stride=4)
        self.res = torch.nn.Conv1d(16, 16, 3, padding=1)
        self.post = torch.nn.Conv1d(16, 1, 7, padding=3)

    def forward(self, mel):
        h = F.leaky_relu(self.pre(mel), 0.1)
        h = F.leaky_relu(self.up(h), 0.1)
        h = h + F.leaky_relu(self.res(h), 0.1)
        return torch.tanh(self.post(h))


def batches(silent):
    teacher = ConvVocoder(seed=7).eval()

    def get(k: int):
        mel = torch.randn(4, 16, 32, generator=torch.Generator().manual_seed(2000 + k))
        with torch.no_grad():
            y = teacher(mel)
        return (torch.zeros_like(mel) if silent(k) else mel), y
    return get


def run(tmp_path, silent, steps=80):
    model = ConvVocoder(seed=1)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    get = batches(silent)
    mon = Monitor(model, opt, run_dir=tmp_path / "run")
    for k in range(steps):
        x, y = get(k)
        pred = model(x)
        loss = F.mse_loss(pred, y)
        opt.zero_grad()
        loss.backward()
        mon.step(loss, outputs=pred, targets=y)
        opt.step()
    mon.close()
    return [f for f in mon.findings if f["kind"] == "output_collapse"]


def test_a_collapse_that_lasts_the_whole_run_is_one_finding(tmp_path):
    found = run(tmp_path, silent=lambda k: True)
    assert [(f["step"], f["since"], f["value"]) for f in found] == [(29, 0, 0.0)]


def test_a_collapse_that_ends_and_comes_back_is_reported_again(tmp_path):
    found = run(tmp_path, silent=lambda k: k < 40 or k >= 60, steps=100)   # real mels on steps 40..59
    assert [f["since"] for f in found][:2] == [0, 60], [(f["step"], f["since"]) for f in found]
