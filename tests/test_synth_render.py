"""Joining chunk audio and writing files (no model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from engine.audio.loudness import integrated_loudness
from engine.errors import InputError
from engine.synth.render import join_chunks, match_loudness, trim_silence, write_audio

SR = 24000


def _tone(seconds: float, amp: float = 0.3, pad_s: float = 0.0) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    tone = (amp * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    pad = np.zeros(int(pad_s * SR), dtype=np.float32)
    return np.concatenate([pad, tone, pad])


def test_trim_keeps_the_sound_and_a_short_margin() -> None:
    audio = _tone(0.5, pad_s=0.4)
    trimmed = trim_silence(audio)
    assert 0.5 <= len(trimmed) / SR <= 0.5 + 2 * 0.05
    assert trim_silence(np.zeros(SR, dtype=np.float32)).size == 0


def test_join_puts_exact_pauses_between_chunks() -> None:
    a, b = _tone(0.3, pad_s=0.2), _tone(0.4, pad_s=0.2)
    joined = join_chunks([a, b], [0.5, 0.0])
    expected = len(trim_silence(a)) + int(0.5 * SR) + len(trim_silence(b))
    assert len(joined) == expected
    start = len(trim_silence(a))
    assert not np.any(joined[start:start + int(0.5 * SR)])
    # faded edges: no click where a chunk starts or ends
    assert abs(joined[0]) < 1e-3 and abs(joined[start - 1]) < 1e-2


def test_loudness_is_matched_and_peak_kept_below_ceiling() -> None:
    quiet = _tone(2.0, amp=0.01)
    out, lufs = match_loudness(quiet, -20.0)
    assert lufs == pytest.approx(-20.0, abs=0.1)
    assert integrated_loudness(out.astype(np.float64), SR) == pytest.approx(-20.0, abs=0.1)
    silent, none = match_loudness(np.zeros(SR, dtype=np.float32), -20.0)
    assert none is None and not silent.any()


@pytest.mark.parametrize("fmt,container", [("wav", "WAV"), ("flac", "FLAC"), ("ogg", "OGG")])
def test_write_audio_formats(tmp_path: Path, fmt: str, container: str) -> None:
    path = write_audio(tmp_path / f"x.{fmt}", _tone(0.5), fmt)
    info = sf.info(path)
    assert info.format == container and info.samplerate == SR and info.channels == 1
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_write_audio_refuses_a_folder_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a folder"):
        write_audio(tmp_path, _tone(0.1))
    with pytest.raises(InputError, match="not supported"):
        write_audio(tmp_path / "x.mp3", _tone(0.1), "mp3")
