"""A take the user excludes stays on disk untouched but is left out of the clips; a
prepare that would leave nothing to train on changes nothing, and one that removes a
clip something still names says which (issue 28)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine.cli.main import main as cli_main
from engine.config.speak import SpeakOptions
from engine.core.errors import InputError
from engine.core.events import Event
from engine.layout.manifest import (
    LISTEN_REFERENCE,
    clip_references,
    read_manifest,
    reference_clip,
)
from engine.layout.run import Run
from engine.layout.voice import open_voice
from engine.prepare.pipeline import prepare
from engine.quality.evaluate import EvaluateRequest, evaluate
from tests.helpers.voices import copy_voice, file_states


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


def test_a_prepare_with_every_take_left_out_changes_nothing(
        prepared_voice: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 28: unticking every clip and preparing emptied prepared/clips (12 -> 0)."""
    voice = open_voice(copy_voice(prepared_voice, tmp_path / "v"))
    before = file_states(voice.prepared.path)
    assert len([f for f in before if f.startswith("clips/")]) == 12
    for take in voice.list_takes():
        voice.set_take_excluded(take.id, True)
    with pytest.raises(InputError) as refused:
        prepare(voice)
    assert refused.value.message == ("Every take (12) is left out, so prepare would leave "
                                     "nothing to train on; nothing was changed.")
    assert file_states(voice.prepared.path) == before
    # the command line: exit 1, the same sentence, still nothing changed
    assert cli_main(["prepare", str(voice.path)]) == 1
    assert "Every take (12) is left out" in capsys.readouterr().err
    assert file_states(voice.prepared.path) == before


def test_a_prepare_that_would_leave_nothing_usable_keeps_the_prepared_set(
        prepared_voice: Path, tmp_path: Path) -> None:
    """Every take processed again and every clip unusable: the usable set is kept."""
    voice = open_voice(copy_voice(prepared_voice, tmp_path / "v"))
    before = file_states(voice.prepared.path)
    voice.update_settings(min_clip_s=14.0)  # every sentence is shorter: all too short
    events: list[Event] = []
    with pytest.raises(InputError) as refused:
        prepare(voice, on_event=events.append)
    assert refused.value.message == ("None of the 12 takes in use gave a usable clip (12 too "
                                     "short), so the 12 usable prepared clips were left as "
                                     "they were.")
    assert file_states(voice.prepared.path) == before  # no staging left behind either
    # the takes were really judged again (not refused up front)
    assert [e for e in events if e.kind == "progress"][-1].data["done"] == 12


def test_removing_a_clip_something_names_says_which(
        trained_run: dict[str, Any], tmp_path: Path) -> None:
    """Listen's reference, the run's speaker and its evaluation's clips named: leaving
    their takes out says which clip went and who named it, and what Listen uses now."""
    voice = open_voice(copy_voice(trained_run["voice"], tmp_path / "joe"))
    evaluate(EvaluateRequest(voice, checkpoints=[], sentences=["One short sentence."],
                             asr="pocketsphinx", export=False, references=2,
                             options=SpeakOptions(max_frames=10), device="cpu"))
    listen = reference_clip(voice.path)
    assert listen is not None
    evaluation = json.loads(Run(voice.path / "runs" / "r1").evaluation_file.read_text())
    held_out = [c["id"] for c in evaluation["reference"]["clips"]]
    named = {listen.stem: [LISTEN_REFERENCE, "run r1's speaker", "run r1's evaluation"],
             **{c: ["run r1's evaluation"] for c in held_out if c != listen.stem}}
    assert Run(voice.path / "runs" / "r1").recorded_reference() == listen.stem
    assert {c: sorted(w) for c, w in clip_references(voice.path).items()} == \
        {c: sorted(w) for c, w in named.items()}
    by_clip = {e["id"]: e["source_take"] for e in read_manifest(voice.path)}
    gone = [listen.stem, next(c for c in held_out if c != listen.stem)]
    for clip in gone:
        voice.set_take_excluded(by_clip[clip], True)
    events: list[Event] = []
    report = prepare(voice, on_event=events.append)
    removed = {r["clip"]: r for r in report["removed_references"]}
    assert set(removed) == set(gone)
    now = reference_clip(voice.path)
    assert now is not None and now.is_file() and now.stem not in gone
    first = removed[listen.stem]["message"]
    assert first == (f"Clip {listen.stem} is no longer prepared, and Listen's reference clip, "
                     f"run r1's speaker and run r1's evaluation named it. Listen now uses "
                     f"clip {now.stem}.")
    assert removed[gone[1]]["message"] == (f"Clip {gone[1]} is no longer prepared, and run "
                                           "r1's evaluation named it.")
    warnings = [e.data["message"] for e in events
                if e.kind == "log" and e.data.get("level") == "warning"]
    assert first in warnings and first in report["advice"]
    assert first in voice.prepared.report_text.read_text(encoding="utf-8")
