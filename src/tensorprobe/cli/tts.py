"""`tensorprobe tts check RUN` and `tensorprobe tts demo`: thin wrappers over `tensorprobe.tts.check_stages`
and `tensorprobe.tts.kokoro.demo`. Exit codes: 0 clean, 1 an error finding, 2 bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from ..errors import EXIT_FINDING, EXIT_OK, InputError, TensorprobeError
from ._common import JsonOption, app, console, emit_json, fail

tts_app = typer.Typer(help="Check every stage of a TTS pipeline (text → phonemes → ids → durations → mel → audio).",
                      no_args_is_help=True)
app.add_typer(tts_app, name="tts")


def _finish(report, json_out: bool, command: str, extra: dict | None = None, finding: str | None = None) -> None:
    """Print the report (and `finding`, a line about what the report's errors led to); exit 1 on either."""
    from ..report.tts import render_stage_report

    found = bool(report.errors) or finding is not None
    if json_out:
        emit_json(command, "finding" if found else "ok", {"report": report.to_dict(), **(extra or {})})
    else:
        render_stage_report(console, report)
        if finding is not None:
            console.print(f"[bold red]{escape(finding)}[/]", highlight=False)
    raise typer.Exit(EXIT_FINDING if found else EXIT_OK)


@tts_app.command("check")
def check_cmd(
    run: Path = typer.Argument(..., help="A recorded run: .npz, .safetensors or bundle dir whose tensor names are "
                                         "stage names (text, phonemes, vocab, ids, durations, mel, latents, audio, "
                                         "sample_rate; see docs/guide-audio-tts.md)."),
    vocab: Optional[Path] = typer.Option(None, "--vocab", help="JSON vocabulary {symbol: id}, or a model config "
                                                               "with a \"vocab\" key (Kokoro's config.json)."),
    embedding_size: Optional[int] = typer.Option(None, "--embedding-size", help="Rows of the model's token embedding."),
    sample_rate: Optional[float] = typer.Option(None, "--sample-rate", help="Hz of the audio stage."),
    mel_min: float = typer.Option(-11.5, "--mel-min", help="Expected log-mel minimum."),
    mel_max: float = typer.Option(0.0, "--mel-max", help="Expected log-mel maximum."),
    max_duration: float = typer.Option(200, "--max-duration", help="Frames per token above which it is extreme."),
    duration_clamp: Optional[str] = typer.Option(None, "--duration-clamp", metavar="MIN[:MAX]",
                                                 help="The duration predictor's clamp, e.g. 1 for Kokoro "
                                                      "(round then clamp(min=1)), 1:50, or :50: durations pinned "
                                                      "at a known bound are an error."),
    reference: Optional[Path] = typer.Option(None, "--reference", metavar="TRAIN_STATS", help="Training statistics "
                                             "(tensorprobe.train.ranges.record_ranges(...).save): the mel range (and "
                                             "duration bound) seen in training replace --mel-min/--mel-max."),
    reference_mel: Optional[str] = typer.Option(None, "--reference-mel", help="The record of TRAIN_STATS that is "
                                                "the mel (default: mel, mel_out or output)."),
    threshold: Optional[List[str]] = typer.Option(
        None, "--threshold", "-t", metavar="NAME=VALUE",
        help="Override a threshold of the audio stage's check, as in `audio check`, e.g. -t min_speech_s=0.005 "
             "(repeatable; names in docs/guide-audio-tts.md)."),
    json_out: bool = JsonOption,
) -> None:
    """Check a recorded TTS run stage by stage; exit 1 on any error finding."""
    try:
        opts: dict = {"mel_range": (mel_min, mel_max), "max_duration_frames": max_duration}
        if threshold:
            from ..audio.check import Thresholds, parse_threshold_options

            opts["audio_thresholds"] = Thresholds().with_overrides(parse_threshold_options(threshold))
        if duration_clamp is not None:
            opts["duration_clamp"] = _parse_clamp(duration_clamp)
        if reference is not None:
            from ..train.ranges import RangeStats, stage_options

            opts.update(stage_options(RangeStats.load(reference), mel=reference_mel))
        if vocab is not None:
            opts["vocab"] = _read_vocab(vocab)
        if embedding_size is not None:
            opts["embedding_size"] = embedding_size
        if sample_rate is not None:
            opts["sample_rate"] = sample_rate
        from ..tts import check_stages

        report = check_stages(run, **opts)
    except TensorprobeError as e:
        fail(str(e))
    _finish(report, json_out, "tts check")


def _parse_clamp(text: str) -> tuple[float | None, float | None]:
    """`MIN`, `MIN:MAX` or `:MAX` as (min, max), either None."""
    lo, _, hi = text.partition(":")
    try:
        bounds = tuple(float(b) if b.strip() else None for b in (lo, hi))
    except ValueError:
        raise InputError(f"--duration-clamp expects MIN, MIN:MAX or :MAX (numbers), got {text!r}") from None
    if bounds == (None, None):
        raise InputError("--duration-clamp needs at least one bound: MIN, MIN:MAX or :MAX")
    return bounds  # type: ignore[return-value]


def _read_vocab(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: not a JSON vocabulary ({e})") from None
    if isinstance(data, dict) and isinstance(data.get("vocab"), dict):
        data = data["vocab"]
    if not isinstance(data, dict) or not all(isinstance(v, int) for v in data.values()):
        raise InputError(f"{path}: expected a JSON object {{symbol: integer id}} (or a config with a \"vocab\" key)")
    return data


@tts_app.command("demo")
def demo_cmd(
    phonemes: str = typer.Argument("həlˈO wˈɜɹld", help="Kokoro phonemes (IPA) to synthesise."),
    fault: Optional[str] = typer.Option(None, "--fault", help="Reproduce a failure: unknown-symbols, oov-id, "
                                                              "long-durations, pinned-durations, unvoiced, nan."),
    out: Optional[Path] = typer.Option(None, "--out", help="Write the audio here (tensorprobe.audio.save)."),
    seed: int = typer.Option(0, "--seed", help="Weight seed."),
    json_out: bool = JsonOption,
) -> None:
    """Run a Kokoro-shaped pipeline (the Kokoro-82M decoder with random weights, no download) through the
    stage checker; exit 1 on any error finding. With --out, audio holding NaN/Inf is not written (the report
    says where it went wrong, and one line says why the file is missing)."""
    try:
        from ..tts.kokoro import demo

        audio, report = demo(phonemes, fault=fault, seed=seed)
        saved, not_written = None, None
        if out is not None and audio is not None:
            not_written = _unwritable(out, audio)
            if not_written is None:
                from ..audio import save

                saved = save(out, audio, 24_000, normalize=True, repair_nonfinite=False)
    except TensorprobeError as e:
        fail(str(e))
    if saved is not None and not json_out:
        console.print(f"wrote {out}: {'; '.join(saved.notes)}")
    _finish(report, json_out, "tts demo", {"out": str(out) if saved is not None else None, "not_written": not_written},
            finding=not_written)


def _unwritable(out: Path, audio) -> str | None:
    """Why `out` is not written, when the audio itself is the reason (NaN/Inf samples): that is a finding of
    the pipeline, which the stage report locates, not bad input."""
    import numpy as np

    bad = ~np.isfinite(np.asarray(audio))
    if not bad.any():
        return None
    return (f"{out} was not written: {int(bad.sum())} of {bad.size} samples are non-finite (first at sample "
            f"{int(np.argmax(bad))}); a WAV can't hold them, and the stage report above says where they come from")
