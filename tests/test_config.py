"""The one config tree: defaults valid, round trip exact, bad values named."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import PrepareConfig, VoxshardConfig
from engine.core.errors import InputError
from engine.layout.voice import create_voice


def test_tree_round_trips_exactly() -> None:
    cfg = VoxshardConfig()
    d = cfg.to_dict()
    assert set(d) == {"prepare", "train", "speak"}
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
