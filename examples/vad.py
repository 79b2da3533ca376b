"""The Silero VAD port (`tensorprobe.examples.silero`) with its speech probability multiplied by 1.1 in the
model's own forward, after every child module has run: the error `isolate` finds in the root's own code, for
docs/guide-isolate.md. TARGET: `examples/vad.py:scaled` (needs the silero-vad package, as the example does)."""

from __future__ import annotations

from tensorprobe.examples import silero


class ScaledVAD(silero.SileroVAD):
    def forward(self, *args, **kwargs):
        probability, state = super().forward(*args, **kwargs)
        return probability * 1.1, state


def scaled():
    model, inputs = silero.pytorch_port()
    port = ScaledVAD()
    port.load_state_dict(model.state_dict())
    return port.eval(), inputs
