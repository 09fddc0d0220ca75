"""A peak limiter and room tone: what lets a program sit at its loudness with its peaks
under a ceiling, and its pauses sound like the room rather than digital zero.

`limit_peaks` lowers the gain only around the samples that would pass the ceiling (5 ms
ahead of a peak, released over 50 ms), so one loud syllable no longer lowers a whole
book. It works on one take at a time: a take starts and ends in its own quiet, so no
lookahead across takes is needed and memory stays one take long.
"""

from __future__ import annotations

import numpy as np
from scipy.ndimage import minimum_filter1d, uniform_filter1d
from scipy.signal import lfilter

#: how far ahead of a peak the gain starts to fall, seconds
_ATTACK_S = 0.005
#: how long the gain takes to come back after a peak, seconds
_RELEASE_S = 0.05


def limit_peaks(audio: np.ndarray, ceiling: float, sample_rate: int) -> np.ndarray:
    """`audio` with every sample at or under `ceiling` (linear), the gain lowered smoothly
    around the peaks that passed it and left at 1 elsewhere."""
    x = np.asarray(audio, dtype=np.float32)
    magnitude = np.abs(x)
    if x.size == 0 or float(magnitude.max()) <= ceiling:
        return x
    needed = np.minimum(1.0, ceiling / np.maximum(magnitude, 1e-12))
    attack = max(1, round(_ATTACK_S * sample_rate))
    # a moving average of a minimum twice as wide never rises above any sample's need
    held = minimum_filter1d(needed, size=2 * attack + 1)
    gain = uniform_filter1d(held, size=attack)
    # the release: the gain recovers slowly (a one-pole follower on the way up only)
    release = np.exp(-1.0 / (_RELEASE_S * sample_rate))
    slow = lfilter([1 - release], [1, -release], gain - 1.0) + 1.0
    gain = np.minimum(gain, slow)
    out = (x * gain).astype(np.float32)
    return np.clip(out, -ceiling, ceiling).astype(np.float32, copy=False)


def room_tone(samples: int, level_dbfs: float, seed: int) -> np.ndarray:
    """`samples` of quiet, softly low-passed noise at `level_dbfs` RMS: the floor a
    recorded room has, the same for the same `seed`."""
    rng = np.random.default_rng(seed)
    noise = lfilter([1.0], [1.0, -0.7], rng.standard_normal(samples + 256))[256:]
    rms = float(np.sqrt(np.mean(noise * noise))) if samples else 1.0
    return (noise * (10 ** (level_dbfs / 20) / rms)).astype(np.float32)
