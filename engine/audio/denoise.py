"""Optional denoising (`prepare --denoise`), kept only where it does not make things worse.

The take is denoised once by spectral gating (noisereduce, stationary mode)
with its own pauses as the noise profile. Each noisy slice is then judged
both ways: SNR (against the background of the same version of the take),
speaker similarity to the target, and, where the slice has a transcript, the
word error rate of the offline recogniser (pocketsphinx). The denoised slice
is used only if none of the three got worse; the report gives all of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.audio.conditions import Background, background, slice_snr
from engine.audio.vad import Levels, Slice, frame_levels
from engine.core.errors import InputError

#: the pauses used as the noise profile (longer adds nothing for stationary noise)
PROFILE_S = 8.0
#: how much of the noise the gate removes (1.0 leaves audible "musical noise")
PROP_DECREASE = 0.9


def _reduce(audio: np.ndarray, sample_rate: int, noise: np.ndarray | None) -> np.ndarray:
    try:
        import noisereduce
    except ImportError as exc:
        raise InputError("--denoise needs the noisereduce package.",
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


def _wer(recognizer: Any, audio: np.ndarray, sample_rate: int, text: str) -> float | None:
    from engine.asr.wer import wer
    from engine.prepare.speakers import to_16k

    if not text.strip() or recognizer is None:
        return None
    return float(wer(text, recognizer.transcribe(to_16k(audio, sample_rate)).text))


def judge_slice(orig: np.ndarray, den: Denoised, levels: Levels, noise_power: float,
                sl: Slice, sample_rate: int, text: str, target: np.ndarray | None,
                recognizer: Any, encoder: Any = None) -> dict[str, Any]:
    """Both versions of one slice measured; "applied" says whether to use the denoised one."""
    from engine.prepare.speakers import embed_clip

    before_seg, after_seg = orig[sl.start:sl.end], den.audio[sl.start:sl.end]
    snr = [slice_snr(levels, sl.regions, noise_power),
           slice_snr(den.levels, sl.regions, den.background.noise_power)]
    sim: list[float | None] = [None, None]
    if target is not None and np.any(target):
        sim = [float(embed_clip(before_seg, sample_rate, encoder) @ target),
               float(embed_clip(after_seg, sample_rate, encoder) @ target)]
    err = [_wer(recognizer, before_seg, sample_rate, text),
           _wer(recognizer, after_seg, sample_rate, text)]
    worse = snr[1] < snr[0] or (sim[0] is not None and sim[1] < sim[0]) or (
        err[0] is not None and err[1] > err[0])
    return {"applied": not worse,
            "snr_db": [round(x, 1) for x in snr],
            "similarity": [None if x is None else round(x, 3) for x in sim],
            "wer": [None if x is None else round(x, 3) for x in err]}


def describe(d: dict[str, Any]) -> str:
    parts = [f"SNR {d['snr_db'][0]:.0f} -> {d['snr_db'][1]:.0f} dB"]
    if d["similarity"][0] is not None:
        parts.append(f"similarity {d['similarity'][0]:.2f} -> {d['similarity'][1]:.2f}")
    if d["wer"][0] is not None:
        parts.append(f"word errors {d['wer'][0]:.2f} -> {d['wer'][1]:.2f}")
    return ", ".join(parts)
