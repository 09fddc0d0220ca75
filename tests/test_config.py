"""The one config tree: defaults valid, round trip exact, bad values named."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import VAD_CHOICES, PrepareConfig, VoxshardConfig
from engine.config.speak import SpeakOptions, audio_format
from engine.core.errors import InputError
from engine.layout.voice import create_voice, open_voice


def test_tree_round_trips_exactly() -> None:
    cfg = VoxshardConfig()
    d = cfg.to_dict()
    assert set(d) == {"prepare", "train", "speak", "reinforce", "evaluate"}
    assert VoxshardConfig.from_dict(d).to_dict() == d


@pytest.mark.parametrize(("field", "value", "words"), [
    ("target_lufs", -3.0, "target_lufs"),
    ("min_clip_s", 20.0, "min_clip_s"),
    ("max_clip_s", 60.0, "max_clip_s"),
    ("min_snr_db", float("nan"), "finite"),
])
def test_bad_prepare_values_name_the_field(field: str, value: float, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        PrepareConfig(**{field: value})


def test_unknown_keys_are_errors_not_silently_ignored() -> None:
    with pytest.raises(ValueError, match="unknown"):
        VoxshardConfig.from_dict({"prepare": {"target_lufz": -20}})
    with pytest.raises(ValueError, match="unknown section"):
        VoxshardConfig.from_dict({"trian": {}})


def test_voice_settings_are_validated_by_the_tree(tmp_path: Path) -> None:
    voice = create_voice(tmp_path / "v", "Ada")
    voice.update_settings(target_lufs=-20.0)
    assert voice.prepare_settings["target_lufs"] == -20.0
    with pytest.raises(InputError, match="target_lufs"):
        voice.update_settings(target_lufs=5.0)
    # a refused change leaves the saved settings as they were
    assert voice.prepare_settings["target_lufs"] == -20.0


def test_options_are_validated_with_clear_messages() -> None:
    with pytest.raises(InputError, match="temperature"):
        SpeakOptions(temperature=0)
    with pytest.raises(InputError, match="top_p"):
        SpeakOptions(top_p=1.5)
    with pytest.raises(InputError, match="Unknown speech option"):
        SpeakOptions.from_dict({"temprature": 0.5})
    assert SpeakOptions.from_dict({"seed": 3}).seed == 3
    assert audio_format("x.flac", None) == "flac"
    assert audio_format("x.oga", None) == "ogg"
    assert audio_format("x", None) == "wav"
    assert audio_format("x.opus", None) == "opus"  # Opus, not Vorbis under an .opus name
    assert audio_format("x.wav", "mp3") == "mp3"
    with pytest.raises(InputError, match="not supported"):
        audio_format("x.wav", "aiff")
    # an extension that names no format is refused, not written as WAV under that name
    for name in ("out.txt", "out.wv", "dir.d/out.mp4"):
        with pytest.raises(InputError, match="not an audio format") as info:
            audio_format(name, None)
        assert info.value.hint and ".mp3" in info.value.hint
    assert audio_format("dir.d/out", None) == "wav"


def test_prepare_config_holds_vad_and_denoise(tmp_path: Path) -> None:
    cfg = PrepareConfig()
    assert (cfg.vad, cfg.denoise) == ("silero", False) and cfg.vad in VAD_CHOICES
    with pytest.raises(ValueError, match=r"prepare\.vad"):
        PrepareConfig(vad="webrtc")
    with pytest.raises(ValueError, match=r"prepare\.denoise"):
        PrepareConfig(denoise="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"prepare\.min_snr_db"):
        PrepareConfig(min_snr_db=True)  # a bool is not a number here
    voice = create_voice(tmp_path / "v", speaker="V")
    voice.update_settings(vad="energy", denoise=True)
    again = open_voice(voice.path)
    assert (again.prepare_config.vad, again.prepare_config.denoise) == ("energy", True)
