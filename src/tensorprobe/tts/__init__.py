"""TTS pipeline health: check what each stage produced (text → phonemes → ids → durations → mel/latents →
audio) for seed 002's red flags, and time every stage.

    >>> from tensorprobe.tts import StageChecker
    >>> c = StageChecker(vocab={"a": 1, "b": 2}, embedding_size=3)
    >>> [f.check for f in c.ids([0, 1, 7])]
    ['out_of_range']

`check_stages(path)` does the same for a recorded run (`save_stages` writes one; naming in
`tensorprobe.tts.bundle`); `tensorprobe.tts.kokoro.KokoroPipeline` is a Kokoro-shaped pipeline to try it on.
"""

from .bundle import check_stages, load_stages, save_stages
from .checks import StageFinding
from .stages import StageChecker, StageReport, StageTiming

__all__ = ["StageChecker", "StageFinding", "StageReport", "StageTiming", "check_stages", "load_stages",
           "save_stages"]
