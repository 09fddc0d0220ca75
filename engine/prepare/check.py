"""One recording judged in memory as prepare would judge it, without writing anything
(the record screen's question: keep this take?).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.audio.checks import ClipFacts, check_clip, is_usable, issue
from engine.audio.io import TARGET_SR, clipped_per_sample
from engine.audio.loudness import normalize_loudness
from engine.audio.resample import resample
from engine.audio.vad import (
    MIN_SPEECH_S,
    frame_levels,
    plan_slices,
    snr_db,
    speech_regions,
    speech_seconds,
)
from engine.config import PrepareConfig


def check_recording(audio: np.ndarray, sample_rate: int, text: str = "",
                    cfg: PrepareConfig | None = None) -> dict[str, Any]:
    """Judge one recording in memory, as prepare would, without writing anything.

    For the record screen: right after a take, say whether to keep it. `audio`
    is (samples,) or (samples, channels), float in [-1, 1] or int16.
    """
    cfg = cfg or PrepareConfig()
    x = np.asarray(audio)
    if x.dtype == np.int16:
        x = x.astype(np.float32) / 32768.0
    x = x.astype(np.float32, copy=False)
    x2 = x.reshape(len(x), -1)
    finite = np.isfinite(x2)
    if not finite.all():
        x2 = np.where(finite, x2, 0.0).astype(np.float32)
    clipped = int(clipped_per_sample(np.abs(x2)).sum())
    mono = x2.mean(axis=1)
    dc = float(mono.mean()) if len(mono) else 0.0
    mono = resample(mono, sample_rate, TARGET_SR)
    mono = mono - np.float32(dc)
    out: dict[str, Any] = {"duration_s": round(len(x2) / sample_rate, 3),
                           "peak_dbfs": round_finite(20 * math.log10(max(float(np.abs(x2).max(
                               initial=0.0)), 1e-10))),
                           "clipped_samples": clipped, "non_finite": int((~finite).sum())}
    levels = frame_levels(mono, TARGET_SR)
    regions = speech_regions(mono, TARGET_SR, levels)
    speech = speech_seconds(regions, TARGET_SR)
    if out["non_finite"]:
        issues = [issue("non_finite", "The recording holds NaN or infinite samples.")]
    elif speech < MIN_SPEECH_S:
        issues = [issue("silent", "No speech was heard: check the microphone and its level.")]
    else:
        sl = plan_slices(regions, len(mono), TARGET_SR, 0.0, float("inf"))[0]
        seg = mono[sl.start:sl.end]
        snr = snr_db(mono, TARGET_SR, levels, regions)
        norm = normalize_loudness(seg, TARGET_SR, cfg.target_lufs, cfg.peak_dbfs)
        facts = ClipFacts(
            duration_s=len(seg) / TARGET_SR, text=text, text_method="whole",
            clipped_samples=clipped, source_samples=x2.size, snr_db=snr, dc_offset=dc,
            gain_shortfall_db=cfg.target_lufs - norm.loudness_after,
        )
        issues = check_clip(facts, cfg)
        out.update({"speech_s": round(speech, 3), "snr_db": round_finite(snr),
                    "loudness_lufs": round_finite(norm.loudness_before)})
    out["issues"] = issues
    out["usable"] = is_usable(issues) and not out["non_finite"] and speech >= MIN_SPEECH_S
    return out


def round_finite(x: float) -> float | None:
    """Rounded for a report, None where not finite (JSON has no NaN)."""
    return round(float(x), 2) if math.isfinite(x) else None
