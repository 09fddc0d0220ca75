"""Silero VAD (prepare's detector) against the energy fallback, and word-safe cuts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.audio.vad import (
    Slice,
    detect_speech,
    merge_by_words,
    out_of_words,
    plan_slices,
    silero_regions,
)


def _speech_in_noise(piper_sentences: list[dict[str, Any]], snr_db: float
                     ) -> tuple[np.ndarray, int, tuple[int, int]]:
    import soundfile as sf

    audio, sr = sf.read(piper_sentences[1]["path"], dtype="float32")
    lead = np.zeros(sr, np.float32)
    x = np.concatenate([lead, audio, lead])
    speech = np.flatnonzero(np.abs(audio) > 0.01)
    truth = (sr + int(speech[0]), sr + int(speech[-1]))
    power = float(np.mean(audio[speech[0]:speech[-1]] ** 2))
    noise = np.random.default_rng(3).standard_normal(len(x)).astype(np.float32)
    x = x + noise * np.float32(np.sqrt(power / 10 ** (snr_db / 10)))
    return x.astype(np.float32), sr, truth


def test_silero_finds_speech_edges_in_noise(piper_sentences: list[dict[str, Any]]) -> None:
    x, sr, (a, b) = _speech_in_noise(piper_sentences, 10.0)
    regions = silero_regions(x, sr)
    assert regions, "Silero heard no speech"
    # edges within 150 ms of the true first and last sample of speech (the 30 ms pad
    # and the 32 ms window of the network are inside that)
    assert abs(regions[0][0] - a) / sr < 0.15
    assert abs(regions[-1][1] - b) / sr < 0.15
    # pure noise is not speech
    noise_only = x[: sr // 2 + sr // 4].copy()
    assert silero_regions(np.tile(noise_only, 4), sr) == []


def test_detectors_are_named(piper_sentences: list[dict[str, Any]]) -> None:
    x, sr, _ = _speech_in_noise(piper_sentences, 30.0)
    assert detect_speech(x, sr, "energy") and detect_speech(x, sr, "silero")
    with pytest.raises(ValueError, match="silero"):
        detect_speech(x, sr, "webrtc")


def test_a_word_the_vad_split_is_never_cut() -> None:
    sr = 1000
    # the VAD heard a pause from 1.0 s to 1.4 s; the recogniser heard "tomato" across it
    regions = [(0, 1000), (1400, 2500), (3500, 4000)]
    words = [{"word": "a", "start": 0.1, "end": 0.3},
             {"word": "tomato", "start": 0.9, "end": 1.6},
             {"word": "end", "start": 3.45, "end": 4.05}]
    merged = merge_by_words(regions, words, sr)
    assert merged == [(0, 2500), (3450, 4050)]
    for sl in plan_slices(merged, 5000, sr, min_s=0.5, max_s=3.0):
        for w in words:
            ws, we = w["start"] * sr, w["end"] * sr
            assert not (ws < sl.start < we or ws < sl.end < we), (sl, w)


def test_a_cut_at_a_speaker_change_leaves_a_word_out_whole() -> None:
    sr = 1000
    words = [{"word": "so", "start": 0.5, "end": 0.8}, {"word": "anyway", "start": 1.9,
                                                         "end": 2.4}]
    # the speaker changed at 2.1 s, in the middle of "anyway"; the next slice starts there
    cut = out_of_words([Slice(0, 2100, 1.5, ((0, 2100),)), Slice(2100, 3000, 0.9,
                                                               ((2100, 3000),))], words, sr)
    assert (cut[0].start, cut[0].end) == (0, 1900)
    assert (cut[1].start, cut[1].end) == (2400, 3000)


def test_prepare_names_its_detector(piper_sentences: list[dict[str, Any]],
                                    tmp_path: Path) -> None:
    from engine.core.errors import InputError
    from engine.layout.voice import create_voice
    from engine.prepare.importer import import_files
    from engine.prepare.pipeline import prepare

    voice = create_voice(tmp_path / "v", "Joe", "english")
    import_files(voice, [piper_sentences[0]["path"]])
    assert prepare(voice)["settings"].get("vad", "silero") == "silero"
    energy = prepare(voice, vad="energy")
    assert energy["settings"]["vad"] == "energy" and energy["totals"]["usable_clips"] == 1
    assert energy["run"]["takes_processed"] == 1  # another detector: not the cached result
    with pytest.raises(InputError, match="voice activity detector"):
        prepare(voice, vad="webrtc")
