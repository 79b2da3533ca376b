"""Small models the guides in docs/ run (tests/docs runs every guide as written, from a copy of this folder).

- `tiny_tts.py`: a FastSpeech-shaped toy with a log-mel clamp on the training path only (guide-training).
- `noisy.py`: a random noise source; the same model under two seeds, and a port that draws uniform (guide-rng,
  guide-python).
- `transformer_port.py`: a TransformerEncoder and a port with one attention output projection transposed
  (guide-isolate, guide-python).
- `vad.py`: the Silero VAD port scaled by 1.1 in its own forward (guide-isolate; needs silero-vad).
- `my_port.py`: a post-net whose log goes NaN (guide-nan, guide-python).
- `masked.py`: a deliberate -inf mask before a softmax, and the same mask reaching the output (guide-nan).
- `sine.py`: a sine source (sin of a cumulative phase) and the same model fed a 0.1% frequency error (guide-diff).
- `norm_port.py`: an instance norm of near-constant channels with a weight-normed conv and a noise source, and a
  one-pass norm that is NaN in float32 already (guide-preflight).
- `my_sweep.py`: a SWEEP_TARGET, a vocoder head over 8 utterances of rising loudness, and a port that clips the
  loud ones (guide-sweep).
- `compiled_net.py`: a conv/norm net to compile, the same net whose norm reduces in float16 on the compiled path
  only, and one with a custom op whose Inductor decomposition is wrong (guide-compile).

A regular package (this file), so `from examples import noisy` finds this folder from the repository's root
whatever else is installed.
"""
