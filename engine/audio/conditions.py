"""How a recording sounds around the speech: noise, echo, a music bed.

Per slice, three estimates from what the take already has (10 ms frame levels
and the speech regions), each with a threshold and a reason in the report:

- SNR: the slice's speech power over the take's background (the quieter half
  of its pause frames), so a slice with no pause of its own still gets one.
- Reverberation: RT60 from the decay of the energy envelope after speech
  stops (the slope of the level, in dB/s, from just after the offset peak
  down to 10 dB above the background, median over the offsets): a dry room
  drops in ~100 ms, a reverberant one rings on. 60 dB / slope = RT60.
- Music or background bed: how tonal the pauses are. Noise (fans, hiss) has a
  flat spectrum; a music bed has peaks (notes). Spectral flatness (geometric
  over arithmetic mean of the power spectrum) of the pause frames under
  MUSIC_FLATNESS, with the steady floor of the pauses within BED_DB of the
  speech level, is a music bed. Measured on the mixtures: white noise 0.996,
  pink 0.53-0.55, the chord-and-drum bed 0.032, an echo's tails 0.007 (but
  their floor is 55 dB under the speech, so no bed).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.audio.vad import FRAME_S, Levels

#: RT60 above these: a warning (audible room), then unusable (the echo is part of every word)
REVERB_WARN_S = 0.45
REVERB_BLOCK_S = 0.9
#: pauses more tonal than this (flatness) are music, not noise
MUSIC_FLATNESS = 0.06
#: a bed counts only if the pauses are within this many dB of the speech
BED_DB = 35.0
#: offsets looked at after each speech region ends
DECAY_S = 0.35


@dataclass(frozen=True)
class Background:
    noise_power: float  # mean power of the take's background (the quieter half of pauses)
    rt60_s: float | None  # None: no offset clear enough to measure
    flatness: float | None  # spectral flatness of the pauses; None: no pauses
    bed_db: float | None  # speech level over the pauses' level


def _pause_mask(levels: Levels, regions: list[tuple[int, int]]) -> np.ndarray:
    speech = np.zeros(len(levels.db), dtype=bool)
    for a, b in regions:
        speech[a // levels.frame: b // levels.frame + 1] = True
    return ~speech


def _decay_rt60(levels: Levels, regions: list[tuple[int, int]], noise_db: float
                ) -> float | None:
    db = levels.db
    n = int(DECAY_S / FRAME_S)
    slopes = []
    for a, b in regions:
        fa, e = a // levels.frame, b // levels.frame
        if e - fa < 10 or e + n > len(db):
            continue
        # the VAD's end lags the voice: the offset is the last loud frame before it
        ref = float(np.percentile(db[fa:e], 90)) - 15.0
        pre = max(fa, e - 40)
        loud = np.flatnonzero(db[pre:e] >= ref)
        if not len(loud):
            continue
        tail = db[pre + int(loud[-1]):e + n]
        if tail[0] - noise_db < 25.0:
            continue  # the offset is too close to the background to show a decay
        stop = np.flatnonzero(tail < noise_db + 10.0)
        if len(stop) and stop[0] < 4:
            # gone within 40 ms: a dry room; the drop over the frames it took is the slope
            slopes.append(float(tail[0] - tail[int(stop[0])]) / (max(1, int(stop[0])) * FRAME_S))
            continue
        tail = tail[: int(stop[0]) if len(stop) else len(tail)]
        t = np.arange(len(tail)) * FRAME_S
        slope = float(np.polyfit(t, tail, 1)[0])  # dB per second, negative
        if slope < 0:
            slopes.append(-slope)
    if len(slopes) < 2:
        return None
    return float(60.0 / np.median(slopes))


def _flatness(audio: np.ndarray, mask: np.ndarray, frame: int) -> float | None:
    idx = np.flatnonzero(mask)
    if len(idx) < int(0.3 / FRAME_S):
        return None
    n = 1024
    starts = [i * frame for i in idx[:: max(1, len(idx) // 200)] if i * frame + n <= len(audio)]
    if not starts:
        return None
    win = np.hanning(n)
    spec = np.abs(np.fft.rfft(np.stack([audio[s:s + n] for s in starts]) * win, axis=1)) ** 2
    spec = spec.mean(axis=0)[4:] + 1e-20  # the lowest bins are hum and DC
    return float(np.exp(np.mean(np.log(spec))) / np.mean(spec))


def background(audio: np.ndarray, levels: Levels, regions: list[tuple[int, int]]
               ) -> Background:
    power = 10.0 ** (levels.db / 10.0)
    pauses = _pause_mask(levels, regions)
    quiet = np.sort(power[pauses])
    if len(quiet) >= int(0.1 / FRAME_S):
        noise = float(np.mean(quiet[: max(1, len(quiet) // 2)]))
    else:
        noise = float(np.percentile(power, 5)) if len(power) else 0.0
    noise_db = 10.0 * np.log10(max(noise, 1e-12))
    speech = power[~pauses]
    bed = None
    if len(quiet) and len(speech):
        # against the steady floor (the quieter half), not all pauses: an echo's tails
        # fill the pauses too, but die away
        bed = float(10.0 * np.log10(max(float(np.mean(speech)), 1e-12) / max(noise, 1e-12)))
    return Background(noise, _decay_rt60(levels, regions, noise_db),
                      _flatness(audio, pauses, levels.frame), bed)


def slice_snr(levels: Levels, regions: tuple[tuple[int, int], ...], noise_power: float
              ) -> float:
    """Speech-to-background ratio of one slice against the take's background, in dB."""
    power = 10.0 ** (levels.db / 10.0)
    frames = np.concatenate([np.arange(a // levels.frame, max(a // levels.frame + 1,
                                                                b // levels.frame))
                             for a, b in regions]) if regions else np.zeros(0, int)
    frames = frames[frames < len(power)]
    if not len(frames):
        return 0.0
    signal = float(np.mean(power[frames]))
    if noise_power <= 1e-10:
        return 100.0
    return float(np.clip(10.0 * np.log10(max(signal - noise_power, 1e-12) / noise_power),
                         -10.0, 100.0))


def is_music_bed(bg: Background) -> bool:
    return (bg.flatness is not None and bg.bed_db is not None
            and bg.flatness < MUSIC_FLATNESS and bg.bed_db < BED_DB)
