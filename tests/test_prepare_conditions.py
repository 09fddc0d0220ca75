"""Noise, echo and music estimates (engine/audio/conditions.py) on the offline mixtures,
and which of them a clipped take is called."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from engine.audio.checks import ClipFacts, check_clip
from engine.audio.conditions import (
    REVERB_WARN_S,
    background,
    is_music_bed,
    slice_snr,
)
from engine.audio.vad import frame_levels, silero_regions
from engine.config import PrepareConfig
from engine.layout.voice import create_voice
from engine.prepare.pipeline import prepare
from tests.helpers.mixtures import RATE, Mixture


def _estimate(m: Mixture) -> tuple[object, list[float]]:
    levels = frame_levels(m.audio, RATE)
    regions = silero_regions(m.audio, RATE)
    bg = background(m.audio, levels, regions)
    return bg, [slice_snr(levels, ((a, b),), bg.noise_power) for a, b in regions]


def test_each_condition_is_told_apart(mixtures: dict[str, Mixture]) -> None:
    clean, _ = _estimate(mixtures["clean"])
    noisy, snrs = _estimate(mixtures["white20"])
    music, _ = _estimate(mixtures["music15"])
    room, _ = _estimate(mixtures["reverb"])
    # per-slice SNR against the take's background: the mixture was made at 20 dB
    # (speech power over noise power); measured median 20.2
    assert float(np.median(snrs)) == pytest.approx(20.0, abs=3.0)
    # the synthetic room decays 60 dB in 0.6 s (measured 0.63); piper's dry offsets 0.14
    assert room.rt60_s == pytest.approx(0.6, abs=0.15)
    assert clean.rt60_s is not None and clean.rt60_s < REVERB_WARN_S
    assert is_music_bed(music) and not is_music_bed(noisy)
    assert not is_music_bed(clean) and not is_music_bed(room)


def test_the_report_words_for_each_condition() -> None:
    base = dict(duration_s=3.0, text="Some words.", text_method="whole", clipped_samples=0,
                source_samples=72000, snr_db=40.0, dc_offset=0.0, gain_shortfall_db=0.0)
    cfg = PrepareConfig()

    def codes(**kw: object) -> list[str]:
        return [i["code"] for i in check_clip(ClipFacts(**{**base, **kw}), cfg)]

    assert codes() == []
    assert codes(rt60_s=0.6) == ["reverberant"]
    assert codes(rt60_s=1.2) == ["too_reverberant"]
    assert codes(music_bed=True) == ["music_bed"]
    assert codes(snr_db=5.0) == ["low_snr"]


def test_a_heavily_clipped_take_is_called_clipped_not_music(
        tmp_path: Path, piper_synth: Callable[[str], tuple[np.ndarray, int]]) -> None:
    """Issue 28: prepare called a heavily clipped take "music under the speech" (its
    pauses read as tonal); the clipping is what to name and fix."""
    text = "Please remember to water the plants while I am away."
    speech, sr = piper_synth(text)
    rng = np.random.default_rng(0)
    audio = np.concatenate([np.zeros(sr // 2, np.float32), 7.0 * speech,
                            np.zeros(sr, np.float32)])
    audio = np.clip(audio + rng.normal(0, 0.002, len(audio)), -1.0, 1.0).astype(np.float32)
    voice = create_voice(tmp_path / "v", "a")
    voice.add_take(audio, text, sample_rate=sr)
    report = prepare(voice)
    [clip] = report["clips"]
    # the pauses measured as a music bed while the clipped speech's one-sided share of
    # the mean shifted them into a steady offset (DC removal by the median since)
    codes = [i["code"] for i in clip["issues"]]
    assert "clipping" in codes and "music_bed" not in codes  # clipping is the verdict
    assert not any("music" in a for a in report["advice"])
    assert "Some recordings clip: lower the input gain." in report["advice"]
