"""Joining chunk audio and writing files (no model)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from engine.audio.loudness import integrated_loudness
from engine.core.errors import InputError
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


@pytest.mark.parametrize("fmt,container,subtype", [
    ("wav", "WAV", "PCM_16"), ("flac", "FLAC", "PCM_16"), ("ogg", "OGG", "VORBIS"),
    ("opus", "OGG", "OPUS"), ("mp3", "MP3", "MPEG_LAYER_III")])
def test_write_audio_formats(tmp_path: Path, fmt: str, container: str, subtype: str) -> None:
    from engine.config.speak import available_formats

    if fmt not in available_formats():
        pytest.skip(f"this libsndfile ({sf.__libsndfile_version__}) does not write {fmt}")
    path = write_audio(tmp_path / f"x.{fmt}", _tone(0.5), fmt)
    info = sf.info(path)
    assert info.format == container and info.subtype == subtype
    assert info.samplerate == SR and info.channels == 1
    back, _ = sf.read(path, dtype="float32")
    assert abs(len(back) - len(_tone(0.5))) < 0.1 * SR  # codecs may pad a little
    assert not list(tmp_path.glob(".*"))  # no temporary file left behind


def test_written_audio_gets_the_users_normal_permissions(tmp_path: Path) -> None:
    import os
    import stat

    old = os.umask(0o022)
    try:
        path = write_audio(tmp_path / "shared.wav", _tone(0.1))
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        os.umask(0o002)
        path = write_audio(tmp_path / "group.flac", _tone(0.1), "flac")
        assert stat.S_IMODE(path.stat().st_mode) == 0o664
    finally:
        os.umask(old)


def test_write_audio_refuses_a_folder_and_unknown_format(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is a folder"):
        write_audio(tmp_path, _tone(0.1))
    with pytest.raises(InputError, match="not supported"):
        write_audio(tmp_path / "x.aiff", _tone(0.1), "aiff")
