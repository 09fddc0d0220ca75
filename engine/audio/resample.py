"""Sample-rate conversion: one polyphase resampler for every rate change in the engine."""

from __future__ import annotations

from math import gcd

import numpy as np


def resample(audio: np.ndarray, from_rate: int, to_rate: int) -> np.ndarray:
    """`audio` (samples along axis 0) at `to_rate`, as float32; unchanged when the rates match.

    Polyphase (scipy's `resample_poly`, a Kaiser-windowed FIR): exact for the
    integer ratios between the rates used here (16, 22.05, 24, 44.1, 48 kHz).
    """
    x = np.asarray(audio, dtype=np.float32)
    if from_rate == to_rate or x.shape[0] == 0:
        return x
    # scipy.signal takes about half a second to import: only when a rate changes
    from scipy.signal import resample_poly  # noqa: PLC0415

    g = gcd(int(from_rate), int(to_rate))
    return resample_poly(x, to_rate // g, from_rate // g, axis=0).astype(np.float32)
