"""Untranscribed imports become usable: `import --transcribe` and `transcribe VOICE` fill
missing transcripts (marked machine-made), flag a mislabelled clip, skip an unreadable
one with its reason, and prepare then accepts the machine-made text."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from engine.core.errors import InputError


@pytest.fixture
def recordings(tmp_path: Path, piper_sentences: list[dict[str, Any]]) -> Path:
    """Two WAVs with no transcript, one correctly labelled, one mislabelled."""
    folder = tmp_path / "recordings"
    folder.mkdir()
    for i in range(4):
        shutil.copy(piper_sentences[i]["path"], folder / f"clip_{i}.wav")
    (folder / "clip_2.txt").write_text(piper_sentences[2]["text"], encoding="utf-8")
    # clip 3 says sentence 3, but its transcript is another sentence entirely
    (folder / "clip_3.txt").write_text(piper_sentences[9]["text"], encoding="utf-8")
    return folder


def _takes(voice: Path) -> dict[str, dict[str, Any]]:
    return {json.loads(p.read_text())["source"].rsplit("/", 1)[-1]: json.loads(p.read_text())
            for p in sorted((voice / "takes").glob("*.json"))}


def test_cli_import_transcribe_fills_flags_and_prepare_accepts(
        recordings: Path, tmp_path: Path, piper_sentences: list[dict[str, Any]],
        capsys: pytest.CaptureFixture[str]) -> None:
    from engine.asr.wer import wer
    from engine.cli.main import main
    from engine.layout.voice import Take, open_voice
    from engine.prepare.transcribe import is_machine_made

    voice = tmp_path / "voice"
    assert main(["voice", "new", str(voice), "--speaker", "Joe"]) == 0
    code = main(["import", str(voice), str(recordings), "--transcribe", "--asr",
                 "pocketsphinx"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "Transcribed 2 take(s) without a transcript and checked 2" in out.out
    assert "have no transcript" not in out.out
    assert "doubtful" in out.out and "mislabelled" in out.out
    takes = _takes(voice)
    for name, i in (("clip_0.wav", 0), ("clip_1.wav", 1)):
        t = takes[name]
        assert t["extra"]["transcript_source"] == "asr"
        assert wer(piper_sentences[i]["text"], t["text"]) < 0.6
        assert t["extra"]["asr"]["words"] and t["extra"]["asr"]["backend"] == "pocketsphinx"
        assert not t["extra"]["asr"]["doubtful"]
    assert takes["clip_2.wav"]["text"] == piper_sentences[2]["text"]  # a person's text stays
    assert takes["clip_2.wav"]["extra"]["asr"]["wer"] < 0.6
    assert not takes["clip_2.wav"]["extra"]["asr"]["doubtful"]
    assert takes["clip_3.wav"]["extra"]["asr"]["doubtful"]
    assert takes["clip_3.wav"]["extra"]["asr"]["wer"] > 0.75
    assert "transcript_source" not in takes["clip_3.wav"]["extra"]

    v = open_voice(voice)
    machine = [t for t in v.list_takes() if is_machine_made(t)]
    assert len(machine) == 2
    # a person who corrects the text makes it theirs
    edited = v.set_take_text(machine[0].id, piper_sentences[0]["text"])
    assert not is_machine_made(Take.from_meta(edited.meta_path))

    # untranscribed recordings are now usable
    assert main(["prepare", str(voice)]) == 0
    capsys.readouterr()
    manifest = [json.loads(x) for x in (voice / "prepared" / "manifest.jsonl")
                .read_text().splitlines() if x.strip()]
    assert len(manifest) == 4 and all(m["text"] for m in manifest)
    assert sum(m["usable"] for m in manifest) >= 3


def test_api_transcribe_reuses_checked_takes_and_skips_unreadable(
        recordings: Path, tmp_path: Path) -> None:
    from engine import api
    from engine.core.events import Event

    voice = api.create_voice(tmp_path / "v2", speaker="Joe")
    api.import_files(voice, [recordings / "clip_0.wav", recordings / "clip_2.wav"])
    # a take whose audio was damaged after import
    broken = api.import_files(voice, [recordings / "clip_1.wav"])["imported"][0]["take"]
    take = voice.find_take(broken)
    take.audio_path.write_bytes(b"RIFF\x00\x00\x00\x00WAVEgarbage")
    events: list[Event] = []
    result = api.transcribe(voice, "pocketsphinx", on_event=events.append)
    assert result["filled"] == 1 and result["checked"] == 1 and result["doubtful"] == 0
    assert [s["take"] for s in result["skipped"]] == [broken]
    assert "skipped" in result["summary"] and broken in result["summary"]
    warnings = [e.data["message"] for e in events
                if e.kind == "log" and e.data.get("level") == "warning"]
    assert any(broken in w for w in warnings)
    per_take = [e.data for e in events if e.kind == "progress" and "doubtful" in e.data]
    assert {d["take"] for d in per_take} == {r["take"] for r in result["takes"]}
    again = api.transcribe(voice, "pocketsphinx")
    assert all(r["reused"] for r in again["takes"]) and again["filled"] == 0


def test_transcribe_an_empty_voice_says_what_to_do(tmp_path: Path) -> None:
    from engine import api

    voice = api.create_voice(tmp_path / "empty", speaker="X")
    with pytest.raises(InputError, match="no takes to transcribe") as info:
        api.transcribe(voice, "pocketsphinx")
    assert "import" in (info.value.hint or "")
