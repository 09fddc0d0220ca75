"""Integrated loudness per ITU-R BS.1770-4 (mono) and loudness normalisation.

The meter is pyloudnorm's (BS.1770-4 gating), with its "DeMan" K-weighting
filter: measured on the standard's own 997 Hz test tone at 0.1 amplitude
(-23.01 LUFS by definition), pyloudnorm's default filter reads -23.05 at
48 kHz and -23.06 / -23.07 / -23.08 at 24 / 22.05 / 16 kHz, because it
re-derives the filters from rounded prototype values; "DeMan" reads -23.010
at 48 kHz and agrees with the filters below to 1e-10 LU at every rate.
pyloudnorm rounds its block count, so a signal whose length is not a whole
number of 100 ms steps gets one more block that runs past the end, its
missing part counted as silence: a 3 s clip of piper speech read 0.15 LU
low. The signal is cut to its last whole block before it is measured (the
samples cut are in no full block, which is what the standard gates).

The filters below stay for signals shorter than one 400 ms gating block,
which pyloudnorm refuses (a single short block is measured whole).
K-weighting is two biquads: a high shelf (+4 dB above ~1.7 kHz, the head's
acoustic effect) and a high-pass (~38 Hz, the "RLB" curve). The standard
lists coefficients for 48 kHz only; they are derived here for any rate from
the analog prototype through the bilinear transform, which reproduces the
48 kHz table to ~1e-8. Gating: 400 ms blocks with 75 % overlap, an absolute
gate at -70 LUFS and a relative gate 10 LU below the ungated level.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.signal import resample_poly, sosfilt

ABS_GATE_LUFS = -70.0
REL_GATE_LU = -10.0
BLOCK_S = 0.4
STEP_S = 0.1

# analog prototype parameters of the two K-weighting stages
_SHELF_F0 = 1681.974450955533
_SHELF_GAIN_DB = 3.999843853973347
_SHELF_Q = 0.7071752369554196
_HP_F0 = 38.13547087602444
_HP_Q = 0.5003270373238773


def k_weighting_sos(sample_rate: int) -> np.ndarray:
    """Second-order sections (2 x 6) of the K-weighting filter at `sample_rate`."""
    # stage 1: high shelf
    k = math.tan(math.pi * _SHELF_F0 / sample_rate)
    vh = 10.0 ** (_SHELF_GAIN_DB / 20.0)
    vb = vh ** 0.4996667741545416
    a0 = 1.0 + k / _SHELF_Q + k * k
    shelf = [
        (vh + vb * k / _SHELF_Q + k * k) / a0,
        2.0 * (k * k - vh) / a0,
        (vh - vb * k / _SHELF_Q + k * k) / a0,
        1.0,
        2.0 * (k * k - 1.0) / a0,
        (1.0 - k / _SHELF_Q + k * k) / a0,
    ]
    # stage 2: high-pass; the standard keeps an un-normalised [1, -2, 1] numerator
    k = math.tan(math.pi * _HP_F0 / sample_rate)
    a0 = 1.0 + k / _HP_Q + k * k
    highpass = [1.0, -2.0, 1.0, 1.0, 2.0 * (k * k - 1.0) / a0, (1.0 - k / _HP_Q + k * k) / a0]
    return np.array([shelf, highpass], dtype=np.float64)


def _block_powers(weighted: np.ndarray, sample_rate: int) -> np.ndarray:
    n = len(weighted)
    block = round(BLOCK_S * sample_rate)
    step = round(STEP_S * sample_rate)
    if n < block:
        # shorter than one gating block: the whole signal is the only block
        return np.array([float(np.mean(weighted.astype(np.float64) ** 2))]) if n else np.zeros(0)
    csum = np.concatenate([[0.0], np.cumsum(weighted.astype(np.float64) ** 2)])
    starts = np.arange(0, n - block + 1, step)
    return (csum[starts + block] - csum[starts]) / block


_meters: dict[int, Any] = {}


def _meter(sample_rate: int) -> Any:
    import pyloudnorm  # noqa: PLC0415

    if sample_rate not in _meters:
        _meters[sample_rate] = pyloudnorm.Meter(sample_rate, filter_class="DeMan",
                                                block_size=BLOCK_S)
    return _meters[sample_rate]


def integrated_loudness(audio: np.ndarray, sample_rate: int) -> float:
    """Gated loudness of a mono signal in LUFS; -inf for silence."""
    x = np.asarray(audio, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError("integrated_loudness expects a mono signal")
    block, step = round(BLOCK_S * sample_rate), round(STEP_S * sample_rate)
    if len(x) > block:
        whole = block + (len(x) - block) // step * step
        with np.errstate(divide="ignore"):
            return float(_meter(sample_rate).integrated_loudness(x[:whole]))
    weighted = sosfilt(k_weighting_sos(sample_rate), x)
    return gated_loudness(_block_powers(weighted, sample_rate))


def gated_loudness(z: np.ndarray) -> float:
    """BS.1770's integrated loudness of K-weighted block powers `z`: an absolute gate at
    -70 LUFS, then a relative one 10 LU under what passed; -inf when nothing passes."""
    if z.size == 0:
        return float("-inf")
    with np.errstate(divide="ignore"):
        levels = -0.691 + 10.0 * np.log10(z)
    keep = levels > ABS_GATE_LUFS
    if not keep.any():
        return float("-inf")
    rel_gate = -0.691 + 10.0 * math.log10(float(z[keep].mean())) + REL_GATE_LU
    keep &= levels > rel_gate
    return -0.691 + 10.0 * math.log10(float(z[keep].mean()))


@dataclass(frozen=True)
class Normalized:
    audio: np.ndarray
    loudness_before: float
    loudness_after: float
    gain_db: float
    #: the gain was lowered to keep the peak under the ceiling
    peak_limited: bool


def loudness_gain_db(loudness: float, peak: float, target_lufs: float,
                     peak_dbfs: float = -1.0) -> tuple[float, bool]:
    """The gain (dB) from `loudness` to `target_lufs` that keeps the sample `peak` at or
    under `peak_dbfs`, and whether the ceiling lowered it (a plain gain, no limiter)."""
    gain_db = target_lufs - loudness
    if peak > 0:
        over = 20.0 * math.log10(peak) + gain_db - peak_dbfs
        if over > 0:
            return gain_db - over, True
    return gain_db, False


def normalize_loudness(audio: np.ndarray, sample_rate: int, target_lufs: float = -23.0,
                       peak_dbfs: float = -1.0) -> Normalized:
    """Scale to `target_lufs`, but never push the sample peak above `peak_dbfs`.

    A plain gain (no limiter): a clip whose peak would pass the ceiling ends up
    quieter than the target, which is reported rather than hidden.
    """
    before = integrated_loudness(audio, sample_rate)
    if not math.isfinite(before):
        return Normalized(audio.astype(np.float32), before, before, 0.0, False)
    peak = float(np.max(np.abs(audio))) if len(audio) else 0.0
    gain_db, limited = loudness_gain_db(before, peak, target_lufs, peak_dbfs)
    out = (audio.astype(np.float64) * 10.0 ** (gain_db / 20.0)).astype(np.float32)
    return Normalized(out, before, before + gain_db, gain_db, limited)


#: the true-peak meter's grid (BS.1770-4 Annex 2: 4x at 48 kHz; at 24 kHz the same
#: 192 kHz grid is 8x)
_TRUE_PEAK_RATE = 192_000
#: samples on each side an upsampled piece takes from its neighbours, so the
#: interpolation filter sees what is really there
_TRUE_PEAK_CONTEXT = 256
#: samples gathered before they are upsampled
_TRUE_PEAK_BATCH = 1 << 16


class LoudnessMeter:
    """Integrated loudness (BS.1770-4, the gating of `integrated_loudness`) and true peak
    of a mono signal fed in pieces of any size, in memory that does not grow with the
    signal: the K-weighting filter keeps its state across pieces, and what is kept is one
    sum of squares per 100 ms step (a 400 ms block is four of them, 75 % overlap), a few
    hundred kilobytes for a ten-hour book.
    """

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = sample_rate
        self._sos = k_weighting_sos(sample_rate)
        self._zi = np.zeros((self._sos.shape[0], 2))
        self._step = round(STEP_S * sample_rate)
        self._steps = array("d")
        self._open_sum = 0.0
        self._open_n = 0
        self.samples = 0
        #: the largest sample magnitude seen
        self.sample_peak = 0.0
        self._factor = max(1, round(_TRUE_PEAK_RATE / sample_rate))
        self._true_peak = 0.0
        #: the samples whose true peak waits for their right-hand context
        self._held = np.zeros(0)
        self._left = np.zeros(0)

    def push(self, audio: np.ndarray) -> None:
        x = np.asarray(audio, dtype=np.float64).reshape(-1)
        if x.size == 0:
            return
        self.samples += x.size
        self.sample_peak = max(self.sample_peak, float(np.max(np.abs(x))))
        weighted, self._zi = sosfilt(self._sos, x, zi=self._zi)
        squares = weighted * weighted
        at = 0
        if self._open_n:  # finish the step the last piece left open
            take = min(self._step - self._open_n, x.size)
            self._open_sum += float(squares[:take].sum())
            self._open_n += take
            at = take
            if self._open_n == self._step:
                self._steps.append(self._open_sum)
                self._open_sum, self._open_n = 0.0, 0
        whole = (x.size - at) // self._step
        if whole:
            sums = squares[at:at + whole * self._step].reshape(whole, self._step).sum(axis=1)
            self._steps.extend(sums.tolist())
            at += whole * self._step
        if at < x.size:
            self._open_sum += float(squares[at:].sum())
            self._open_n += x.size - at
        self._peak_pieces(x, final=False)

    def _peak_pieces(self, x: np.ndarray, final: bool) -> None:
        if self._factor == 1:
            self._true_peak = self.sample_peak
            return
        pending = np.concatenate([self._held, x])
        if not final and pending.size < _TRUE_PEAK_BATCH:  # upsampled in batches: a
            self._held = pending  # decoder's frames are a few hundred samples each
            return
        right = 0 if final else min(_TRUE_PEAK_CONTEXT, pending.size)
        ready = pending[:pending.size - right]
        if ready.size:
            context = np.concatenate([self._left, pending])
            up = resample_poly(context, self._factor, 1)
            begin = self._left.size * self._factor
            inner = up[begin:begin + ready.size * self._factor]
            self._true_peak = max(self._true_peak, float(np.max(np.abs(inner))))
            self._left = np.concatenate([self._left, ready])[-_TRUE_PEAK_CONTEXT:]
        self._held = pending[pending.size - right:]

    def loudness(self) -> float:
        """Gated integrated loudness in LUFS of what was pushed; -inf for silence."""
        per_block = round(BLOCK_S / STEP_S)
        steps = np.frombuffer(self._steps, dtype=np.float64)
        if steps.size < per_block:  # shorter than one gating block: measured whole
            total = float(steps.sum()) + self._open_sum
            z = np.array([total / self.samples]) if self.samples else np.zeros(0)
        else:
            csum = np.concatenate([[0.0], np.cumsum(steps)])
            z = (csum[per_block:] - csum[:-per_block]) / (per_block * self._step)
        return gated_loudness(z)

    def true_peak_dbtp(self) -> float:
        """The true peak in dBTP (a 192 kHz grid, BS.1770-4 Annex 2); -inf for silence."""
        if self._held.size:
            self._peak_pieces(np.zeros(0), final=True)
        peak = max(self._true_peak, self.sample_peak)
        return 20.0 * math.log10(peak) if peak > 0 else float("-inf")


def true_peak_dbtp(audio: np.ndarray, sample_rate: int) -> float:
    """The signal's true peak in dBTP: its largest magnitude between samples too, as a
    decoder's reconstruction reaches it; -inf for silence."""
    meter = LoudnessMeter(sample_rate)
    meter.push(audio)
    return meter.true_peak_dbtp()
