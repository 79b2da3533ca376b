"""`tensorprobe audio check FILE...` and `tensorprobe audio diff REF CAND`: thin wrappers over
`tensorprobe.audio.check_file` and `tensorprobe.audio.diff`.

Exit codes: 0 clean (warnings allowed), 1 an error-level verdict (check; audio with no samples is one) or a
real difference (diff; NaN/Inf samples, no samples, or lengths differing beyond the tolerance are one), 2 bad
input (missing, 0-byte or unreadable file, bad --threshold).
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.markup import escape

from ..errors import EXIT_BAD_INPUT, EXIT_FINDING, EXIT_OK, InputError, TensorprobeError
from ._common import JsonOption, app, console, emit_json, err_console, fail

audio_app = typer.Typer(help="Check audio files for silent failures; compare two audios.", no_args_is_help=True)
app.add_typer(audio_app, name="audio")


@audio_app.command("check")
def check_cmd(
    files: List[Path] = typer.Argument(..., help="Audio files (WAV, FLAC, OGG; PCM or float)."),
    threshold: Optional[List[str]] = typer.Option(
        None, "--threshold", "-t", metavar="NAME=VALUE",
        help="Override a threshold, e.g. -t silence_peak_dbfs=-50 (repeatable; names in docs/guide-audio-tts.md)."),
    json_out: bool = JsonOption,
) -> None:
    """Health-check audio files: NaN, silence, clipping, clicks, absurd scale, DC offset, noise, length, layout.

    Exits 1 if any file has an error-level verdict (so it can gate CI), 2 on unreadable input."""
    from ..audio import Thresholds, check_file
    from ..audio.check import parse_threshold_options
    from ..report.audio import render_audio_report

    try:
        thresholds = Thresholds().with_overrides(parse_threshold_options(threshold))
    except TensorprobeError as e:
        fail(str(e))
    reports, bad = [], []
    for f in files:
        try:
            reports.append(check_file(f, thresholds))
        except TensorprobeError as e:
            bad.append({"file": str(f), "error": str(e)})
    code = EXIT_BAD_INPUT if bad else EXIT_FINDING if any(not r.ok for r in reports) else EXIT_OK
    if json_out:
        status = "error" if bad else "finding" if code == EXIT_FINDING else "ok"
        emit_json("audio check", status, {"files": [r.to_dict() for r in reports], "errors": bad})
    else:
        for r in reports:
            render_audio_report(console, r)
            console.print()
    for b in bad:
        err_console.print(f"[bold red]error:[/] {escape(b['error'])}", highlight=False)
    raise typer.Exit(code)


@audio_app.command("diff")
def diff_cmd(
    ref: Path = typer.Argument(..., help="Reference audio file."),
    cand: Path = typer.Argument(..., help="Candidate audio file (the port, the new build, ...)."),
    html: Optional[Path] = typer.Option(None, "--html", help="Also write a self-contained HTML page here."),
    max_lag: float = typer.Option(1.0, "--max-lag", help="Search alignment lags within ±this many seconds."),
    wave_corr: Optional[float] = typer.Option(None, "--wave-corr",
                                              help="Aligned waveform correlation that counts as a waveform match "
                                                   "(default 0.95)."),
    mel_mean_db: Optional[float] = typer.Option(None, "--mel-mean-db",
                                                help="Mean |log-mel difference| (dB) that still counts as a "
                                                     "magnitude match (default 1.0)."),
    length_tolerance: Optional[float] = typer.Option(None, "--length-tolerance", metavar="SECONDS",
                                                     help="Lengths differing by more than this are a difference "
                                                          "(default 0.02)."),
    json_out: bool = JsonOption,
) -> None:
    """Compare CAND with REF: lag, correlation, SNR, log-mel and multi-resolution STFT differences, and a
    verdict that tells a phase-only difference from a real one. Exits 1 on a real difference (a local one, such
    as a 5 ms burst or a dropout, with its time; NaN/Inf samples, an empty side and a length difference above
    --length-tolerance are one too)."""
    from ..audio import DiffThresholds, diff, load
    from ..report.audio import render_audio_diff, write_diff_html

    try:
        r, c = load(ref), load(cand)
        d = diff(r.data, c.data, r.sample_rate, cand_sample_rate=c.sample_rate, max_lag_s=max_lag,
                 thresholds=_diff_thresholds(DiffThresholds, wave_corr=wave_corr, mel_mean_db=mel_mean_db,
                                             length_tolerance_s=length_tolerance), names=(str(ref), str(cand)))
        if html is not None:
            write_diff_html(d, html)
    except TensorprobeError as e:
        fail(str(e))
    except OSError as e:
        fail(f"can't write {html}: {e.strerror or e}")
    if json_out:
        emit_json("audio diff", d.status, {"diff": d.to_dict(), "html": str(html) if html else None})
    else:
        render_audio_diff(console, d)
        if html is not None:
            console.print(f"HTML report: {html}")
    raise typer.Exit(EXIT_FINDING if d.status == "finding" else EXIT_OK)


def _diff_thresholds(cls, **options: float | None):
    if (options.get("length_tolerance_s") or 0) < 0:
        raise InputError(f"--length-tolerance must be >= 0 seconds, got {options['length_tolerance_s']:g}")
    return cls(**{k: v for k, v in options.items() if v is not None})
