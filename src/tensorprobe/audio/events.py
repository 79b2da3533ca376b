"""Short events that whole-file figures average away: clicks in one signal, local differences between two.

A 5 ms burst or a one-sample dropout changes a second of audio by a fraction of a dB on average, yet it is
heard. Two detectors look at a few milliseconds at a time:

- `local_differences(ref, cand, ...)` (`audio diff`): 5 ms windows where the difference `cand - ref` peaks
  near or above the reference's own level there, far above how closely the two agree elsewhere in the file, and
  loud enough to hear against the file (`DiffThresholds.event_*`). The rule is relative to the file's own
  agreement, so a faithful port (rounding noise everywhere) and a candidate that differs everywhere (judged by
  the overall figures) give no event; a burst, a pulse or a dropout in otherwise matching audio does.
- `clicks(x, sample_rate, ...)` (`audio check`): samples that jump far beyond what the signal's recent
  course predicts. The prediction is a block-wise linear prediction of order 32 (the residual of a tone is
  ~0, of a voice small), and "far beyond" is `click_ratio` times the largest residual nearby on either side:
  past the prediction's own reach to 2 ms, and from 8 to 30 ms away (the 2–8 ms between are left out, so the
  other edge of a 5 ms pulse does not hide the first; a waveform whose edges repeat, a sawtooth, has its other
  edges in the window). A jump out of silence into sustained sound is an onset, and a sound that stops is an
  offset; neither is a click.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..numbers import json_number

EVENT_WINDOW_S = 0.005    # local differences are measured over 5 ms windows, half overlapping
PCM16_STEP = 2.0 ** -15   # a difference under a few steps of 16-bit PCM is rounding, whatever the level


# -------------------------------------------------------------------------------------------- shared

def windowed(x: np.ndarray, width: int, hop: int) -> np.ndarray:
    """Views of `x` in windows of `width`, every `hop` samples (the last window ends at the last sample)."""
    view = np.lib.stride_tricks.sliding_window_view(x, width)
    starts = np.arange(0, x.size - width + 1, hop)
    if starts[-1] != x.size - width:
        starts = np.append(starts, x.size - width)
    return view[starts]


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of True."""
    edges = np.diff(np.concatenate(([0], mask.astype(np.int8), [0])))
    return list(zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()))


def _db(ratio: float) -> float:
    if ratio <= 0:
        return -math.inf
    return 20 * math.log10(ratio) if math.isfinite(ratio) else math.inf


# ------------------------------------------------------------------------------- local differences

@dataclass(frozen=True)
class LocalDifference:
    """A short stretch where the candidate departs from the reference far more than elsewhere.

    Times are in the reference's time. `snr_db` is the reference's RMS in the worst 5 ms window over the
    difference's peak there (negative: the difference is louder than the reference), `typical_snr_db` the
    median of that ratio over the file's audible windows (how closely the two agree elsewhere; inf when they
    are sample-for-sample equal there), `peak_dbfs` the difference's peak, `mel_db` the mean |log-mel
    difference| of the worst spectrogram frame over it (None when the waveform rule alone found it)."""

    start_s: float
    end_s: float
    at_s: float
    peak_dbfs: float | None = None
    snr_db: float | None = None
    typical_snr_db: float | None = None
    mel_db: float | None = None

    def describe(self) -> str:
        span = (self.end_s - self.start_s) * 1000
        where = f"at t = {self.at_s:.3f} s ({self.start_s:.3f}–{self.end_s:.3f} s, {span:.0f} ms)"
        if self.snr_db is None:   # found in the spectrogram alone
            return f"{where}: the log-mel spectrogram differs by {self.mel_db:.1f} dB (mean over its bands) in that frame"
        if math.isfinite(self.snr_db):
            against = (f"{-self.snr_db:.1f} dB above the reference's level there" if self.snr_db <= 0 else
                       f"{self.snr_db:.1f} dB below the reference's level there")
        else:
            against = "where the reference is digital silence"
        elsewhere = ("elsewhere the two are sample-for-sample equal" if self.typical_snr_db == math.inf else
                     f"elsewhere the difference sits {self.typical_snr_db:.0f} dB below the reference")
        mel = f"; log-mel differs by {self.mel_db:.1f} dB in that frame" if self.mel_db is not None else ""
        return f"{where}: the difference peaks at {self.peak_dbfs:.1f} dBFS, {against} ({elsewhere}){mel}"

    def to_dict(self) -> dict[str, Any]:
        return {"start_s": json_number(self.start_s), "end_s": json_number(self.end_s), "at_s": json_number(self.at_s),
                "peak_dbfs": json_number(self.peak_dbfs), "snr_db": json_number(self.snr_db),
                "typical_snr_db": json_number(self.typical_snr_db), "mel_db": json_number(self.mel_db)}


def local_differences(ref: np.ndarray, cand: np.ndarray, sample_rate: float, *, snr_db: float, margin_db: float,
                      level_db: float, offset_s: float = 0.0, edge_s: float = 0.0) -> list[LocalDifference]:
    """Windows where `cand - ref` (aligned, same length) peaks at least `10**(-snr_db/20)` of the reference's
    RMS there, `margin_db` below the file's typical agreement, and no lower than `level_db` under the
    reference's loud level (its 95th-percentile window RMS) nor under 4 steps of 16-bit PCM; merged into events.

    `offset_s` moves the times into the reference's own time; `edge_s` at either end is not judged (a
    resampler's filter settles there)."""
    width = max(16, int(round(EVENT_WINDOW_S * sample_rate)))
    if ref.size < width:
        return []
    hop = width // 2
    err = cand - ref
    ref_rms = np.sqrt(np.mean(np.square(windowed(ref, width, hop)), axis=1))
    peak = np.abs(windowed(err, width, hop)).max(axis=1)
    loud = float(np.percentile(ref_rms, 95))
    if loud == 0:
        return []   # a silent reference: the overall figures judge whatever the candidate holds
    with np.errstate(divide="ignore", invalid="ignore"):
        snr = np.where(peak > 0, 20 * np.log10(ref_rms / peak), np.inf)
    floor = loud * 10 ** (level_db / 20)
    active = ref_rms >= floor
    typical = float(np.median(snr[active])) if active.any() else math.inf
    fire = (peak >= max(floor, 4 * PCM16_STEP)) & (snr <= snr_db) & (snr <= typical - margin_db)
    starts = np.minimum(np.arange(fire.size) * hop, ref.size - width)
    edge = int(edge_s * sample_rate)
    fire &= (starts >= edge) & (starts + width <= ref.size - edge)
    out = []
    for a, b in _runs(fire):
        lo, hi = int(starts[a]), int(starts[b - 1]) + width
        at = lo + int(np.argmax(np.abs(err[lo:hi])))
        out.append(LocalDifference(start_s=lo / sample_rate + offset_s, end_s=hi / sample_rate + offset_s,
                                   at_s=at / sample_rate + offset_s, peak_dbfs=_db(float(np.abs(err[at]))),
                                   snr_db=float(snr[a:b].min()), typical_snr_db=typical))
    return out


def spectral_frame_events(ref_db: np.ndarray, cand_db: np.ndarray, hop: int, sample_rate: float, *,
                          limit_db: float, offset_s: float = 0.0) -> tuple[list[LocalDifference], dict[str, Any]]:
    """Log-mel frames whose mean |difference| over the bands exceeds `limit_db`, merged into events (the
    waveform rule is blind where the phase differs; the spectrogram is not). Also returns the worst frame."""
    per_frame = np.abs(cand_db - ref_db).mean(axis=0)
    k = int(np.argmax(per_frame))
    worst = {"time_s": k * hop / sample_rate + offset_s, "mean_db": float(per_frame[k])}
    out = []
    for a, b in _runs(per_frame > limit_db):
        w = a + int(np.argmax(per_frame[a:b]))
        out.append(LocalDifference(start_s=max(0.0, (a - 2) * hop / sample_rate) + offset_s,
                                   end_s=(b + 1) * hop / sample_rate + offset_s, at_s=w * hop / sample_rate + offset_s,
                                   mel_db=float(per_frame[w])))
    return out, worst


def merge_events(wave: list[LocalDifference], spectral: list[LocalDifference]) -> list[LocalDifference]:
    """Waveform events, each given the log-mel figure of a spectral event overlapping it; spectral events no
    waveform event covers are kept as they are."""
    out, used = [], set()
    for e in wave:
        over = [i for i, s in enumerate(spectral) if s.start_s <= e.end_s and e.start_s <= s.end_s]
        used.update(over)
        mel = max((spectral[i].mel_db for i in over), default=None)
        out.append(LocalDifference(e.start_s, e.end_s, e.at_s, e.peak_dbfs, e.snr_db, e.typical_snr_db, mel))
    out += [s for i, s in enumerate(spectral) if i not in used]
    return sorted(out, key=lambda e: e.start_s)


# -------------------------------------------------------------------------------------------- clicks

@dataclass(frozen=True)
class Click:
    """A sample far from what the signal's recent course predicts: `jump` (unit scale) is its distance from
    the prediction, `ratio` that distance over the largest the signal makes nearby."""

    channel: int
    frame: int
    time_s: float
    jump: float
    ratio: float

    def describe(self) -> str:
        return (f"t = {self.time_s:.4f} s (frame {self.frame}, channel {self.channel}): a jump of {self.jump:.3g} "
                f"({_db(self.jump):.1f} dBFS), {self.ratio:.0f}× the largest the signal makes nearby")

    def to_dict(self) -> dict[str, Any]:
        return {"channel": self.channel, "frame": self.frame, "time_s": json_number(self.time_s),
                "jump": json_number(self.jump), "jump_dbfs": json_number(_db(self.jump)), "ratio": json_number(self.ratio)}


LPC_BLOCK_S = 0.02   # the predictor is fitted on 40 ms around each 20 ms block


PREDICTION_ORDER = 32


def prediction_order(sample_rate: float) -> int:
    """32 at every rate: a speech coder's sr/1000 + 2 (10 at 8 kHz) can't follow a voice whose harmonics fill
    the band, and a dropout then hides in the residual (1x the largest nearby, against 46x at order 32)."""
    return PREDICTION_ORDER


def prediction_residual(x: np.ndarray, sample_rate: float, weights: np.ndarray | None = None,
                        sounds: list[tuple[int, int]] | None = None) -> np.ndarray:
    """`x` minus its block-wise linear prediction from the `prediction_order` samples before (autocorrelation
    method on Hann-windowed 40 ms around each 20 ms block, all blocks solved at once by Levinson-Durbin).

    Each window is centred on its block but kept inside the stretch of sound (`sounds`, [start, end) between
    digital silences; default the whole file) that holds the block's centre: where sound starts or stops is a
    step from nothing, and a window reaching across it fits that step instead of the audio. The predictors are
    fitted on `x * weights` when given (0 leaves a sample out, with a fade so that no step is made): a click
    inside a window would flatten that block's predictor and raise the residual of every sample around it. The
    first `order` samples have nothing to be predicted from and get residual 0 (an onset is judged apart)."""
    n, p = x.size, prediction_order(sample_rate)
    block = int(min(max(4 * p, LPC_BLOCK_S * sample_rate), max(n, 4 * p)))
    blocks = -(-n // block)
    width = min(2 * block, n)
    starts = _window_starts(np.arange(blocks) * block, block, width, sounds or [(0, n)], n)
    index = starts[:, None] + np.arange(width)[None, :]
    segments = (x if weights is None else x * weights)[index] * np.hanning(width)[None, :]
    nfft = 1 << int(math.ceil(math.log2(2 * width)))
    spectrum = np.fft.rfft(segments, nfft, axis=1)
    ac = np.fft.irfft(np.abs(spectrum) ** 2, nfft, axis=1)[:, : p + 1]
    ac[:, 0] = ac[:, 0] * (1 + 1e-9) + 1e-300   # white-noise correction: keeps the recursion stable at silence
    a = _levinson(ac, p)
    which = np.minimum(np.arange(n) // block, blocks - 1)
    e = x.copy()
    for k in range(1, p + 1):
        e[k:] += a[which[k:], k] * x[:-k]
    e[:p] = 0.0
    return e


def _window_starts(block_starts: np.ndarray, block: int, width: int, sounds: list[tuple[int, int]],
                   n: int) -> np.ndarray:
    """Start of each block's analysis window: centred on the block, moved inside the stretch of sound that
    overlaps the block most, and inside the file. A stretch shorter than a window gets the window centred on
    it (the taper's edges would otherwise weigh the whole stretch at almost nothing)."""
    lo = np.array([a for a, _ in sounds])
    hi = np.array([b for _, b in sounds])
    ends = block_starts + block
    first = np.searchsorted(hi, block_starts, side="right")   # stretches overlapping [start, end): first..last-1
    last = np.searchsorted(lo, ends, side="left")
    k = np.minimum(first, lo.size - 1)
    for b in np.flatnonzero(last - first > 1).tolist():
        cands = np.arange(first[b], last[b])
        overlap = np.minimum(hi[cands], ends[b]) - np.maximum(lo[cands], block_starts[b])
        k[b] = cands[int(np.argmax(overlap))]
    inside = np.minimum(np.maximum(block_starts - block // 2, lo[k]), np.maximum(lo[k], hi[k] - width))
    start = np.where(hi[k] - lo[k] >= width, inside, (lo[k] + hi[k]) // 2 - width // 2)
    return np.clip(start, 0, n - width)


def _levinson(ac: np.ndarray, p: int) -> np.ndarray:
    """Prediction-error filters [1, a1, ..., ap] of each row of autocorrelations (rows solved together)."""
    a = np.zeros((ac.shape[0], p + 1))
    a[:, 0] = 1.0
    err = ac[:, 0].copy()
    for i in range(1, p + 1):
        k = -(ac[:, i] + np.sum(a[:, 1:i] * ac[:, i - 1:0:-1], axis=1)) / err
        a[:, 1:i] = a[:, 1:i] + k[:, None] * a[:, i - 1:0:-1]
        a[:, i] = k
        err = np.maximum(err * (1 - k * k), 1e-300)
    return a


def sliding_max(a: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """For every n, the max of `a` (non-negative) over [n + lo, n + hi), zero outside `a`. O(n) (van Herk)."""
    width = hi - lo
    pad = max(abs(lo), abs(hi)) + width
    p = np.pad(a, (pad, pad + (-(a.size + 2 * pad)) % width))
    blocks = p.reshape(-1, width)
    prefix = np.maximum.accumulate(blocks, axis=1).ravel()
    suffix = np.maximum.accumulate(blocks[:, ::-1], axis=1)[:, ::-1].ravel()
    start = np.arange(a.size) + pad + lo
    return np.maximum(suffix[start], prefix[start + width - 1])


def _ms(ms: float, sample_rate: float) -> int:
    return max(1, int(round(min(ms * sample_rate / 1000, 2.0 ** 62))))


@dataclass(frozen=True)
class _Scales:
    """Sample counts of the click rule at one sample rate."""

    guard: int     # a click's own residual spreads over the prediction order's samples after it
    near: int      # 2 ms: how far the near window reaches past the guard
    gap: int       # 8 ms: the nearby maximum leaves out 2-8 ms, where a pulse's other edge sits
    far: int       # 30 ms
    sustain: int   # 20 ms: how long a sound must go on after an onset
    pair: int      # 10 ms: suspects closer than this are one event (a pulse's two edges)

    @classmethod
    def at(cls, sample_rate: float, n: int) -> "_Scales":
        """At `sample_rate`, for `n` samples: no window longer than the audio (an absurd rate stays finite)."""
        def ms(v: float) -> int:
            return int(min(n, _ms(v, sample_rate)))

        gap = ms(8)
        return cls(prediction_order(sample_rate), ms(2), gap, max(gap + 1, ms(30)), ms(20), ms(10))


def clicks(x: np.ndarray, sample_rate: float, *, ratio: float, level_db: float, step: float = 0.0,
           channel: int = 0) -> list[Click]:
    """Clicks in one channel (finite samples at unit scale): samples whose prediction residual is above `ratio`
    times the largest residual within 2 ms and from 8 to 30 ms on either side, and no lower than `level_db`
    under the channel's peak nor under 4 steps of its encoding (`step`, 0 for float).

    Two passes: samples above half the ratio are suspects (onsets and offsets included); the predictors are
    refitted with isolated suspects faded out of their windows, and the nearby maximum leaves them out (a
    pulse's two edges and the plateau between them as one), so that neither a click's flattening of its
    block's predictor nor a pulse's plateau hides it. Where sound meets digital silence is left out from the
    start (`_sounds`). Onsets (a jump out of silence into sound that goes on) and offsets (the reverse) are
    not clicks, nor is anything in the first and last 20 ms of a sound next to digital silence, or in the
    first and last 2 ms (plus the prediction order) of the file, which have no neighbours on one side."""
    if x.size < 64 or sample_rate <= 0:
        return []
    sc = _Scales.at(sample_rate, x.size)
    floor = max(float(np.abs(x).max()) * 10 ** (level_db / 20), 4 * step)
    sounds = _sounds(x, sc)
    edges = [(max(0, i - sc.guard), i + sc.guard + 1) for a, b in sounds for i in (a, b) if 0 < i < x.size]
    residual = np.abs(prediction_residual(x, sample_rate, sounds=sounds))
    suspects = _spans([i for _, i, _ in _events(x, residual, _masked(residual, edges), ratio / 2, floor, sc)], sc)
    if suspects:
        weights = _faded_out(x.size, suspects, sc.guard)
        residual = np.abs(prediction_residual(x, sample_rate, weights, sounds))
    background = _masked(residual, suspects + edges)
    nearby = _nearby(background, sc)
    return [Click(channel, first, first / sample_rate, float(residual[i]),
                  float(residual[i] / nearby[i]) if nearby[i] > 0 else math.inf)
            for first, i, edge in _events(x, residual, background, ratio, floor, sc)
            if not edge and not _at_a_sounds_ends(first, sounds, x.size, sc)]


def _nearby(e: np.ndarray, sc: _Scales) -> np.ndarray:
    """The largest `e` within 2 ms past the guard, and from 8 to 30 ms away, on either side. Where the guard
    and the 2 ms reach past 4 ms (the guard is 4 ms at 8 kHz) the near window is the one sample past the
    guard: a 5 ms pulse's other edge must stay out of it."""
    near = sc.guard + sc.near if sc.guard + sc.near <= sc.gap // 2 else sc.guard + 1
    return np.maximum.reduce([sliding_max(e, -near, -sc.guard), sliding_max(e, sc.guard + 1, near + 1),
                              sliding_max(e, -sc.far, -sc.gap), sliding_max(e, sc.gap + 1, sc.far + 1)])


def _events(x: np.ndarray, residual: np.ndarray, background: np.ndarray, ratio: float, floor: float,
            sc: _Scales) -> list[tuple[int, int, bool]]:
    """(first, strongest, onset or offset) samples of each stretch where `residual` exceeds `ratio` times the
    nearby maximum of `background` and `floor`, away from the file's ends. The first is where the click
    starts; its residual keeps ringing for up to the prediction order's samples after. Onsets and offsets are
    kept (flagged): they are no clicks, but their residual must not set the scale for the samples around."""
    judged = np.zeros(x.size, dtype=bool)
    judged[sc.guard + sc.near: x.size - sc.guard - sc.near] = True
    hits = np.flatnonzero((residual > ratio * _nearby(background, sc)) & (residual >= floor) & judged)
    events: list[list[int]] = []   # [first, strongest, last]
    for i in hits.tolist():   # hits closer than the guard are one click's residual
        if events and i - events[-1][2] <= sc.guard:
            events[-1][2] = i
            if residual[i] > residual[events[-1][1]]:
                events[-1][1] = i
            continue
        events.append([i, i, i])
    return [(first, strongest, _onset_or_offset(x, first, sc) or _onset_or_offset(x, last, sc))
            for first, strongest, last in events]


def _spans(suspects: list[int], sc: _Scales) -> list[tuple[int, int]]:
    """[start, end) around each isolated suspect (± the guard) and each pair closer than 10 ms (a pulse's
    two edges and the plateau between them). Three or more within 10 ms are a noisy stretch (a plosive's
    burst, a fricative), whose samples are the scale the ones around them are judged by: left as they are."""
    groups: list[list[int]] = []
    for i in suspects:
        if groups and i - groups[-1][-1] <= sc.pair:
            groups[-1].append(i)
        else:
            groups.append([i])
    return [(max(0, g[0] - sc.guard), g[-1] + sc.guard + 1) for g in groups if len(g) <= 2]


def _sounds(x: np.ndarray, sc: _Scales) -> list[tuple[int, int]]:
    """[start, end) of each stretch of sound between runs of digital silence (exact zeros, longer than the
    guard). Where sound meets silence the residual is the sound predicted from nothing, or silence predicted
    from the sound: no click (the onset rule says so), and not the scale for a click within 30 ms of it."""
    silences = [(a, b) for a, b in _runs(x == 0) if b - a > sc.guard]
    bounds = [0] + [i for a, b in silences for i in (a, b)] + [x.size]
    sounds = [(a, b) for a, b in zip(bounds[::2], bounds[1::2]) if b > a]
    return sounds or [(0, x.size)]


def _masked(e: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """`e` with the spans set to 0: what the nearby maximum is taken over."""
    y = e.copy()
    for a, b in spans:
        y[a:b] = 0.0
    return y


def _faded_out(n: int, spans: list[tuple[int, int]], fade: int) -> np.ndarray:
    """Weights: 0 in each span, 1 away from them, a Hann ramp over `fade` samples on either side."""
    w = np.ones(n)
    down = 0.5 + 0.5 * np.cos(np.pi * np.arange(1, fade + 1) / (fade + 1))   # from ~1 to ~0
    for a, b in spans:
        w[a:b] = 0.0
        lo, hi = max(0, a - fade), min(n, b + fade)
        w[lo:a] = np.minimum(w[lo:a], down[fade - (a - lo):])
        w[b:hi] = np.minimum(w[b:hi], down[::-1][: hi - b])
    return w


def _at_a_sounds_ends(i: int, sounds: list[tuple[int, int]], n: int, sc: _Scales) -> bool:
    """Within 20 ms after a sound starts out of digital silence or before it stops into it: part of the
    onset (a plosive's burst before its vowel) or the offset, judged by no click rule. Only for a sound that
    goes on (40 ms or more): a 5 ms pulse between two silences is a click."""
    return any((0 < a <= i < a + sc.sustain) or (b - sc.sustain <= i < b < n)
               for a, b in sounds if b - a >= 2 * sc.sustain)


def _onset_or_offset(x: np.ndarray, i: int, sc: _Scales) -> bool:
    """Sound starting (the 20 ms before at least 20 dB under the 20 ms after, and the sound after going on:
    its median |sample| at least a tenth of its RMS) or stopping (mirrored): not a click. A 5 ms pulse in
    silence does not go on (most of the 20 ms after it is silent), so it stays a click."""
    before = x[max(0, i - sc.guard - sc.sustain): max(0, i - sc.guard)]
    after = x[i + sc.guard: i + sc.guard + sc.sustain]

    def level(v: np.ndarray) -> tuple[float, float]:
        return (float(np.median(np.abs(v))), float(np.sqrt(np.mean(v * v)))) if v.size else (0.0, 0.0)

    (median_b, rms_b), (median_a, rms_a) = level(before), level(after)
    starts = rms_b <= 0.1 * rms_a and median_a >= 0.1 * rms_a > 0
    stops = rms_a <= 0.1 * rms_b and median_b >= 0.1 * rms_b > 0
    return starts or stops
