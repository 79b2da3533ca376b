"""Rendering of audio findings: `AudioReport` and `AudioDiff` as rich tables, `AudioDiff` as one HTML page.

The HTML page is self-contained (plots are embedded as data URIs; no network), every user-supplied name
is escaped by jinja2's autoescape.

    >>> from tensorprobe.report.audio import write_diff_html
    >>> write_diff_html(d, "diff.html")          # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..numbers import fmt_number
from ..audio.check import AudioReport
from ..audio.compare import AudioDiff
from ..bundle import atomic_write_bytes

_STATUS_STYLE = {"error": "bold red", "warning": "yellow", "ok": "green", "skipped": "dim", "finding": "bold red"}


fmt = fmt_number   # one rule for printing numbers (tensorprobe.numbers)


def _figure_cell(v: Any, unit: str) -> str:
    if unit == "share" and isinstance(v, float):
        return f"{v:.3%}"
    return f"{fmt(v)} {unit}" if v is not None else "–"


def render_audio_report(console: Console, report: AudioReport) -> None:
    """One headline with the overall status, then a table with one row per check."""
    style = _STATUS_STYLE[report.status]
    f = report.figures
    console.print(f"[bold]{escape(report.source)}[/]  [{style}]{report.status.upper()}[/]  "
                  f"{report.duration_s:.3f} s, {report.sample_rate:g} Hz, {report.channels} ch, {escape(report.dtype)}"
                  + (f", peak {fmt(f.get('peak'))} ({fmt(f.get('peak_dbfs'), 3)} dBFS)" if "peak" in f else ""))
    if report.frames == 0 and report.verdict("length").status == "error":
        # one line, not a table of checks all skipped for want of samples
        console.print(f"  [bold red]error[/]: {escape(report.verdict('length').message)} (the other checks need "
                      f"samples)")
        return
    table = Table(show_edge=False, box=None, pad_edge=False)
    for col in ("check", "status", "figure", "threshold", "finding"):
        table.add_column(col, overflow="fold")
    for v in report.verdicts:
        st = _STATUS_STYLE[v.status]
        table.add_row(v.check, f"[{st}]{v.status}[/]", escape(_figure_cell(v.figure, v.unit)),
                      escape(fmt(v.threshold)), escape(v.message))
    console.print(table)
    for note in report.notes:
        console.print(f"  [dim]note: {escape(note)}[/]")


def render_audio_diff(console: Console, d: AudioDiff) -> None:
    """The verdict and its reasons, then the figures (those that could be measured)."""
    style = "bold red" if d.status == "finding" else "bold green"
    console.print(f"[bold]{escape(d.names[0])}[/] vs [bold]{escape(d.names[1])}[/]: [{style}]{escape(d.label)}[/]")
    for r in d.reasons:
        console.print(f"  • {escape(r)}")
    table = Table(show_edge=False, box=None, show_header=False, pad_edge=False)
    table.add_column("figure", style="bold")
    table.add_column("value")
    for k, v in _diff_rows(d):
        table.add_row(k, escape(v))
    console.print(table)
    for note in d.notes:
        console.print(f"  [dim]note: {escape(note)}[/]")


def _diff_rows(d: AudioDiff) -> list[tuple[str, str]]:
    length = ("length", f"reference {d.ref_frames / d.sample_rate:.3f} s, candidate "
                        f"{d.cand_frames / d.sample_rate:.3f} s ({d.length_diff_frames:+d} samples)")
    if not d.mel:   # a side too short to measure: no other figure
        return [length]
    m, wr, wb = d.mel, d.mel["worst_region"], d.mel["worst_band"]
    return [
        ("lag", f"{d.lag_frames} samples ({d.lag_s * 1000:.2f} ms)"),
        length,
        ("waveform correlation", f"{fmt(d.corr_before)} before alignment, {fmt(d.corr_after)} after"),
        ("SNR", f"{fmt(d.snr_db)} dB"),
        ("level (cand − ref RMS)", f"{fmt(d.level_db)} dB"),
        ("log-mel |difference|", f"mean {m['mean_db']:.3f} dB, median {m['median_db']:.3f} dB, max {m['max_db']:.2f} dB"),
        ("log-mel correlation", fmt(m["corr"])),
        ("worst mel band", f"{wb['hz'][0]:.0f}–{wb['hz'][1]:.0f} Hz: {wb['mean_db']:.2f} dB"),
        ("worst region", f"{wr['time_s'][0]:.2f}–{wr['time_s'][1]:.2f} s × {wr['hz'][0]:.0f}–{wr['hz'][1]:.0f} Hz: "
                         f"{wr['mean_db']:.2f} dB"),
        ("MR-STFT", f"spectral convergence {fmt(d.mrstft['spectral_convergence'])}, "
                    f"log-magnitude {fmt(d.mrstft['log_magnitude'])}"),
    ]


# ------------------------------------------------------------------------------------------------ HTML

def _spectrogram_plots(d: AudioDiff) -> list[tuple[str, str]]:
    from .plots import figure_to_data_uri, new_figure

    a = d.arrays
    assert a is not None
    dur = a.ref.size / d.sample_rate
    extent = (0.0, dur, 0.0, float(a.ref_db.shape[0]))
    vmax = float(a.ref_db.max())
    out = []
    for title, img, kw in ((f"reference: {d.names[0]}", a.ref_db, dict(cmap="magma", vmin=vmax - 80, vmax=vmax)),
                           (f"candidate: {d.names[1]}", a.cand_db, dict(cmap="magma", vmin=vmax - 80, vmax=vmax)),
                           ("difference (candidate − reference), dB", a.cand_db - a.ref_db,
                            dict(cmap="RdBu_r", vmin=-_sym(a), vmax=_sym(a)))):
        fig, ax = new_figure(9.0, 2.8)
        im = ax.imshow(img, origin="lower", aspect="auto", extent=extent, interpolation="nearest", **kw)
        _mel_ticks(ax, a.mel_hz, img.shape[0])
        ax.set_xlabel("time (s)")
        ax.set_title(title, fontsize=10, loc="left")
        fig.colorbar(im, ax=ax, label="dB")
        out.append((title, figure_to_data_uri(fig)))
    return out


def _sym(a: Any) -> float:
    return max(1.0, float(np.percentile(np.abs(a.cand_db - a.ref_db), 99.5)))


def _mel_ticks(ax: Any, hz: np.ndarray, n: int) -> None:
    idx = np.linspace(0, n - 1, 6).astype(int)
    ax.set_yticks(idx + 0.5)
    ax.set_yticklabels([f"{hz[i + 1]:.0f}" for i in idx])
    ax.set_ylabel("mel band (Hz)")


def _waveform_plot(d: AudioDiff) -> str:
    from .plots import figure_to_data_uri, new_figure

    a = d.arrays
    assert a is not None
    step = max(1, a.ref.size // 20000)  # keep the PNG light on long files
    t = np.arange(0, a.ref.size, step) / d.sample_rate
    fig, ax = new_figure(9.0, 2.8)
    ax.plot(t, a.ref[::step], lw=0.6, label=f"reference: {d.names[0]}", color="#1f77b4")
    ax.plot(t, a.cand[::step], lw=0.6, alpha=0.7, label=f"candidate: {d.names[1]} (aligned)", color="#d62728")
    ax.set_xlabel("time (s)")
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title("waveforms overlaid (after alignment)", fontsize=10, loc="left")
    return figure_to_data_uri(fig)


def render_diff_html(d: AudioDiff) -> str:
    """The diff as one self-contained HTML page (string)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("tensorprobe.report", "templates"),
                             autoescape=jinja2.select_autoescape(["html"]))
    tpl = env.get_template("audio_diff.html")
    plotted = d.arrays is not None   # a side too short to measure has no figures to plot
    return tpl.render(d=d, fig=d.to_dict(), fmt=fmt, spectrograms=_spectrogram_plots(d) if plotted else [],
                      waveform=_waveform_plot(d) if plotted else None)


def write_diff_html(d: AudioDiff, path: str | Path) -> Path:
    """Write the HTML page atomically; returns its path."""
    atomic_write_bytes(path, render_diff_html(d).encode("utf-8"))
    return Path(path)
