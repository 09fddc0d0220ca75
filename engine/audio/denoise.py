"""Optional denoising (`prepare --denoise`): spectral gating of a whole take.

The take is denoised once by spectral gating (noisereduce, stationary mode)
with its own pauses as the noise profile. Whether a slice keeps the denoised
version is prepare's call (engine/prepare/denoise_judge.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.audio.conditions import Background, background
from engine.audio.vad import Levels, frame_levels
from engine.core.errors import InputError

#: the pauses used as the noise profile (longer adds nothing for stationary noise)
PROFILE_S = 8.0
#: how much of the noise the gate removes (1.0 leaves audible "musical noise")
PROP_DECREASE = 0.9


def _reduce(audio: np.ndarray, sample_rate: int, noise: np.ndarray | None) -> np.ndarray:
    try:
        import noisereduce  # noqa: PLC0415
    except ImportError as exc:
        raise InputError("{prepare.denoise} needs the noisereduce package.",
                         "Install it with `pip install noisereduce==3.0.3`.") from exc
    kw: dict[str, Any] = {"y": audio.astype(np.float32), "sr": sample_rate,
                          "prop_decrease": PROP_DECREASE, "n_jobs": 1}
    if noise is not None and len(noise) >= sample_rate // 4:
        kw.update(stationary=True, y_noise=noise.astype(np.float32))
    else:
        kw.update(stationary=False)
    return np.asarray(noisereduce.reduce_noise(**kw), dtype=np.float32)


@dataclass
class Denoised:
    audio: np.ndarray
    levels: Levels
    background: Background


def denoise_take(audio: np.ndarray, sample_rate: int, levels: Levels,
                 regions: list[tuple[int, int]]) -> Denoised:
    """The whole take denoised with its own pauses as the noise profile."""
    pause = np.ones(len(audio), dtype=bool)
    for a, b in regions:
        pause[a:b] = False
    noise = audio[pause][: int(PROFILE_S * sample_rate)]
    out = _reduce(audio, sample_rate, noise if len(noise) else None)
    lv = frame_levels(out, sample_rate)
    return Denoised(out, lv, background(out, lv, regions))
