"""One recording judged in memory as Prepare judges the clip it makes of it, without
writing anything (the Record page's question: keep this take?).

`slice_facts` is the one place a clip's facts are measured, on the clip's own span:
Prepare calls it for every slice of a take, `check_recording` for a take in memory,
so a take that Record keeps is one Prepare keeps, and one it refuses Prepare refuses.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from engine.audio.checks import ClipFacts, check_clip, is_usable, issue
from engine.audio.conditions import Background, background, is_music_bed, slice_snr
from engine.audio.io import TARGET_SR, DecodeStats, stats_of, without_dc
from engine.audio.loudness import normalize_loudness
from engine.audio.resample import resample
from engine.audio.vad import (
    MIN_SPEECH_S,
    Levels,
    Slice,
    detect_speech,
    frame_levels,
    plan_slices,
    snr_db,
    speech_seconds,
)
from engine.config import PrepareConfig


def slice_facts(sl: Slice, stats: DecodeStats, levels: Levels, bg: Background, *,
                text: str, text_method: str, gain_shortfall_db: float,
                snr: float | None = None) -> ClipFacts:
    """The facts `check_clip` judges one slice of a take by, measured on the slice's span:
    its full-scale samples between its start and end (at the source's rate) over the
    source samples it spans, and its speech over the take's background. `snr` replaces
    the measured one (a denoised slice's)."""
    start_s, end_s = sl.start / TARGET_SR, sl.end / TARGET_SR
    duration = (sl.end - sl.start) / TARGET_SR
    return ClipFacts(
        duration_s=duration, text=text, text_method=text_method,
        clipped_samples=stats.clipped_between(start_s, end_s),
        source_samples=stats.source_samples(duration),
        snr_db=slice_snr(levels, sl.regions, bg.noise_power) if snr is None else snr,
        dc_offset=stats.dc_offset, gain_shortfall_db=gain_shortfall_db,
        rt60_s=bg.rt60_s, music_bed=is_music_bed(bg),
    )


def check_recording(audio: np.ndarray, sample_rate: int, text: str = "",
                    cfg: PrepareConfig | None = None, vad: str = "energy") -> dict[str, Any]:
    """Judge one recording in memory, as Prepare judges the clip it cuts from it.

    For the Record page: right after a take, say whether to keep it. `audio` is
    (samples,) or (samples, channels), float in [-1, 1] or int16. `vad`: the speech
    detector that finds the clip's span ("energy" needs no model, as in the window).
    """
    cfg = cfg or PrepareConfig()
    x = np.asarray(audio)
    if x.dtype == np.int16:
        x = x.astype(np.float32) / 32768.0
    x2 = x.astype(np.float32, copy=False).reshape(len(x), -1)
    stats = stats_of(x2, sample_rate)
    finite = np.isfinite(x2)
    mono = resample(np.where(finite, x2, 0.0).mean(axis=1).astype(np.float32),
                    sample_rate, TARGET_SR)
    mono = without_dc(mono)  # as Prepare removes it
    out: dict[str, Any] = {
        "duration_s": round(len(x2) / sample_rate, 3),
        "peak_dbfs": round_finite(20 * math.log10(max(stats.peak, 1e-10))),
        "clipped_samples": stats.clipped, "non_finite": stats.non_finite}
    levels = frame_levels(mono, TARGET_SR)
    regions = detect_speech(mono, TARGET_SR, vad, levels)
    speech = speech_seconds(regions, TARGET_SR)
    if stats.non_finite:
        issues = [issue("non_finite", "The recording holds NaN or infinite samples.")]
    elif speech < MIN_SPEECH_S:
        issues = [issue("silent", "No speech was heard: check the microphone and its level.")]
    else:
        sl = plan_slices(regions, len(mono), TARGET_SR, 0.0, float("inf"))[0]
        norm = normalize_loudness(mono[sl.start:sl.end], TARGET_SR, cfg.target_lufs,
                                  cfg.peak_dbfs)
        shortfall = (cfg.target_lufs - norm.loudness_after
                     if math.isfinite(norm.loudness_after) else 0.0)
        facts = slice_facts(sl, stats, levels, background(mono, levels, regions), text=text,
                            text_method="whole", gain_shortfall_db=shortfall)
        issues = check_clip(facts, cfg)
        out.update({"speech_s": round(speech, 3), "snr_db": round_finite(facts.snr_db),
                    "take_snr_db": round_finite(snr_db(mono, TARGET_SR, levels, regions)),
                    "clip_s": round(facts.duration_s, 3),
                    "clip_clipped_samples": facts.clipped_samples,
                    "loudness_lufs": round_finite(norm.loudness_before)})
    out["issues"] = issues
    out["usable"] = is_usable(issues) and not stats.non_finite and speech >= MIN_SPEECH_S
    return out


def round_finite(x: float) -> float | None:
    """Rounded for a report, None where not finite (JSON has no NaN)."""
    return round(float(x), 2) if math.isfinite(x) else None
