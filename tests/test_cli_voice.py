"""`voxshard-engine` voice/prompts/import/prepare, human and --json, as a user runs them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.layout.voice import create_voice

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "engine.cli.main", *map(str, args)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)


def events(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


@pytest.fixture
def speech_folder(tmp_path: Path, piper_sentences: list[dict[str, Any]]) -> Path:
    folder = tmp_path / "speech"
    folder.mkdir()
    for s in piper_sentences[:3]:
        shutil.copy(s["path"], folder)
        shutil.copy(s["path"].with_suffix(".txt"), folder)
    return folder


def test_human_workflow(tmp_path: Path, speech_folder: Path) -> None:
    voice = tmp_path / "my voice"
    r = run("voice", "new", voice, "--speaker", "Ada Lovelace", "--language", "English")
    assert r.returncode == 0, r.stderr
    assert "Created voice 'ada_lovelace' (english)" in r.stdout

    r = run("import", voice, speech_folder)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("Imported 3 file(s)")

    r = run("prepare", voice)
    assert r.returncode == 0, r.stderr
    assert "clips        3 (3 usable)" in r.stdout and "recommended" in r.stdout
    assert "prepare" in r.stderr  # progress went to stderr

    r = run("voice", "info", voice)
    assert r.returncode == 0 and "takes      3" in r.stdout and "usable" in r.stdout

    r = run("voice", "list", voice)
    assert r.returncode == 0 and r.stdout.count("\n") == 4 and "0001-sentence-00" in r.stdout

    r = run("prompts", "next", voice, "--count", "3")
    assert r.returncode == 0 and len(r.stdout.splitlines()) == 3
    assert r.stdout.startswith("ev-001  ")

    r = run("voice", "delete-take", voice, "2")
    assert r.returncode == 0 and "Deleted take 0002-sentence-01" in r.stdout
    r = run("voice", "info", voice)
    assert "out of date" in r.stdout  # prepared before the delete


def test_json_mode_streams_events_and_a_result(tmp_path: Path, speech_folder: Path) -> None:
    voice = tmp_path / "v"
    r = run("--json", "voice", "new", voice, "--speaker", "x")
    assert r.returncode == 0 and events(r.stdout)[-1]["event"] == "result"
    r = run("import", voice, speech_folder, tmp_path / "nope.wav", "--json")
    assert r.returncode == 0 and r.stderr == ""
    evs = events(r.stdout)
    assert {e["event"] for e in evs} >= {"progress", "log", "result"}
    result = evs[-1]
    assert result["event"] == "result" and len(result["imported"]) == 3
    assert result["skipped"][0]["code"] == "unreadable"
    r = run("--json", "prepare", voice)
    evs = events(r.stdout)
    assert r.returncode == 0
    assert [e for e in evs if e["event"] == "progress"][-1]["done"] == 3
    assert {e["role"] for e in evs if e["event"] == "artifact"} == {"manifest", "report"}
    assert evs[-1]["totals"]["usable_clips"] == 3
    r = run("--json", "import", voice, speech_folder)  # again: nothing new, still a success
    assert r.returncode == 0 and len(events(r.stdout)[-1]["skipped"]) == 3
    r = run("--json", "prompts", "next", voice)
    assert events(r.stdout)[-1]["prompts"][0]["id"] == "ev-001"


@pytest.mark.parametrize("args,needle", [
    (("voice", "info", "{tmp}/missing"), "There is no voice at"),
    (("voice", "new", "{tmp}/exists", "--speaker", "x"), "already a voice"),
    (("voice", "new", "{tmp}/other", "--speaker", "!!!"), "no letters or digits"),
    (("voice", "delete-take", "{tmp}/exists", "0042"), "There is no take"),
    (("prepare", "{tmp}/exists"), "has no takes yet"),
    (("import", "{tmp}/exists", "{tmp}/junk.wav"), "Nothing was imported"),
    (("import", "{tmp}/exists", "{tmp}/junk.wav", "--transcripts", "{tmp}/none.csv"),
     "does not exist"),
    (("voice", "list", "{tmp}/damaged"), "is damaged"),
    (("import", "{tmp}/exists", "{tmp}/damaged"), "No WAV, FLAC, OGG or MP3 files"),
    (("prompts", "next", "{tmp}/exists", "--count", "0"), "at least 1"),
])
def test_errors_are_one_line_without_traceback(tmp_path: Path, args: tuple[str, ...],
                                               needle: str) -> None:
    create_voice(tmp_path / "exists", "x")
    (tmp_path / "junk.wav").write_text("not audio")
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "voice.toml").write_text("[voice\n")
    argv = [a.format(tmp=tmp_path) for a in args]
    r = run(*argv)
    assert r.returncode == 1
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    # warnings and progress may come first; the error itself is one line, the last
    assert [ln for ln in lines if ln.startswith("error: ")] == [lines[-1]], r.stderr
    assert needle in lines[-1]
    assert "Traceback" not in r.stderr
    r = run("--json", *argv)
    assert r.returncode == 1
    last = events(r.stdout)[-1]
    assert last["event"] == "error" and needle in last["message"]


def test_bad_usage_exits_2(tmp_path: Path) -> None:
    r = run("voice")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    r = run("voice", "new", tmp_path / "v")  # --speaker missing
    assert r.returncode == 2 and "--speaker" in r.stderr
