"""A take the user excludes stays on disk untouched but is left out of the clips."""

from __future__ import annotations

import json
from pathlib import Path

from engine.layout.voice import open_voice
from engine.prepare.pipeline import prepare
from tests.helpers.voices import copy_voice


def _manifest_takes(voice_dir: Path) -> set[str]:
    lines = (voice_dir / "prepared" / "manifest.jsonl").read_text().splitlines()
    return {json.loads(line)["source_take"] for line in lines if line.strip()}


def test_excluded_take_is_left_out_and_comes_back(prepared_voice: Path, tmp_path: Path) -> None:
    voice = open_voice(copy_voice(prepared_voice, tmp_path / "v"))
    take = voice.list_takes()[0]
    audio_before = take.audio_path.read_bytes()
    assert take.id in _manifest_takes(voice.path)

    voice.set_take_excluded(take.id, True)
    report = prepare(voice)
    assert take.id not in _manifest_takes(voice.path)
    assert report["rejects_by_reason"].get("excluded") == 1
    assert take.audio_path.read_bytes() == audio_before  # never modified

    voice.set_take_excluded(take.id, False)
    report = prepare(voice)
    assert take.id in _manifest_takes(voice.path)
    assert "excluded" not in report["rejects_by_reason"]
    # only the re-included take is rebuilt; every other take comes from the cache
    assert report["run"]["takes_processed"] == 1
    assert report["run"]["takes_reused"] == len(voice.list_takes()) - 1
