"""The voice workspace on disk: create/open, takes, atomic writes, prompts."""

from __future__ import annotations

import hashlib
import json
import os
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from engine.core.atomic import write_json
from engine.core.errors import AudioError, InputError, WorkspaceError
from engine.layout.prompts import list_prompt_sets, parse_prompt_set
from engine.layout.voice import (
    create_voice,
    delete_voice,
    list_voices,
    open_voice,
    safe_speaker_name,
)
from engine.layout.voice_prompts import next_prompt, next_prompts, prompt_progress


def test_create_and_open_voice_layout(tmp_path: Path) -> None:
    voice = create_voice(tmp_path / "v", "Zoë O'Brien", "English")
    for sub in ("takes", "prepared", "runs", "exports", "renders"):
        assert (voice.path / sub).is_dir()
    cfg = tomllib.loads((voice.path / "voice.toml").read_text(encoding="utf-8"))
    assert cfg["voice"]["speaker"] == "zoe_o_brien"
    assert cfg["voice"]["display_name"] == "Zoë O'Brien"
    assert cfg["voice"]["language"] == "english"
    assert cfg["prepare"]["max_clip_s"] == 15.0
    again = open_voice(voice.path)
    assert (again.speaker, again.language) == ("zoe_o_brien", "english")
    again.rename("Zoe Two")
    again.update_settings(target_lufs=-21.5)
    third = open_voice(voice.path)
    assert third.speaker == "zoe_two" and third.prepare_settings["target_lufs"] == -21.5
    with pytest.raises(InputError):
        third.update_settings(bogus=1)


def test_speaker_names() -> None:
    assert safe_speaker_name("  Anna-Lena Müller ") == "anna_lena_muller"
    with pytest.raises(InputError):
        safe_speaker_name("🎤🎤")


def test_create_refuses_existing_and_open_explains(tmp_path: Path) -> None:
    create_voice(tmp_path / "v", "a")
    with pytest.raises(WorkspaceError, match="already a voice"):
        create_voice(tmp_path / "v", "a")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(WorkspaceError, match="not empty"):
        create_voice(tmp_path / "full", "a")
    with pytest.raises(WorkspaceError, match="no voice"):
        open_voice(tmp_path / "missing")
    with pytest.raises(WorkspaceError, match="not a voice folder"):
        open_voice(tmp_path / "full")
    (tmp_path / "v" / "voice.toml").write_text("[voice\nspeaker = ", encoding="utf-8")
    with pytest.raises(WorkspaceError, match="damaged"):
        open_voice(tmp_path / "v")
    (tmp_path / "v" / "voice.toml").write_text("[voice]\nlanguage = 'x'\n", encoding="utf-8")
    with pytest.raises(WorkspaceError, match="speaker"):
        open_voice(tmp_path / "v")


def test_recorded_take_roundtrip(tmp_path: Path) -> None:
    voice = create_voice(tmp_path / "v", "a")
    rng = np.random.default_rng(0)
    pcm = (rng.normal(0, 3000, 48000)).astype(np.int16)
    take = voice.add_take(pcm, "  Hello   there.\n", sample_rate=48000, prompt_id="ev-001")
    assert take.id == "0001" and take.audio_path.suffix == ".wav"
    data, sr = sf.read(take.audio_path, dtype="int16")
    assert sr == 48000 and np.array_equal(data, pcm)  # saved exactly as recorded
    meta = json.loads(take.meta_path.read_text(encoding="utf-8"))
    assert meta["text"] == "Hello there." and meta["prompt_id"] == "ev-001"
    assert meta["sha256"] == hashlib.sha256(take.audio_path.read_bytes()).hexdigest()
    assert meta["duration_s"] == pytest.approx(1.0)
    f32 = voice.add_take(np.zeros((2400, 2), np.float32), "two", sample_rate=24000)
    assert f32.id == "0002" and f32.channels == 2
    assert [t.id for t in voice.list_takes()] == ["0001", "0002"]
    with pytest.raises(InputError):
        voice.add_take(np.zeros(10, np.float32), "x")  # no sample rate
    with pytest.raises(InputError):
        voice.add_take(np.zeros(0, np.float32), "x", sample_rate=16000)


def test_imported_take_bytes_untouched(tmp_path: Path,
                                       piper_sentences: list[dict[str, Any]]) -> None:
    voice = create_voice(tmp_path / "v", "a")
    src = tmp_path / "clip.flac"
    audio, sr = sf.read(piper_sentences[0]["path"])
    sf.write(src, audio, sr)
    take = voice.add_take(src, "text")
    assert take.audio_path.suffix == ".flac" and take.id == "0001-clip"
    assert take.audio_path.read_bytes() == src.read_bytes()
    assert take.origin == "imported" and take.source == str(src)
    bad = tmp_path / "bad.wav"
    bad.write_text("not audio")
    with pytest.raises(AudioError, match=r"bad\.wav is not a readable audio file"):
        voice.add_take(bad, "x")
    # a refused file leaves nothing behind
    assert sorted(p.name for p in voice.takes_dir.iterdir()) == ["0001-clip.flac",
                                                                 "0001-clip.json"]


def test_take_exists_only_once_its_json_is_written(tmp_path: Path) -> None:
    voice = create_voice(tmp_path / "v", "a")
    voice.add_take(np.zeros(2400, np.float32), "one", sample_rate=24000)
    # a crash between audio and metadata leaves an orphan audio file: not a take
    sf.write(voice.takes_dir / "0002.wav", np.zeros(100), 24000)
    assert [t.id for t in voice.list_takes()] == ["0001"]
    # and the next id skips it rather than overwriting it
    nxt = voice.add_take(np.zeros(2400, np.float32), "three", sample_rate=24000)
    assert nxt.id == "0003"
    # a damaged sidecar is reported, not fatal
    (voice.takes_dir / "0003.json").write_text("{broken", encoding="utf-8")
    assert [t.id for t in voice.list_takes()] == ["0001"]
    assert voice.problems()[0]["code"] == "damaged_metadata"
    (voice.takes_dir / "0001.wav").unlink()
    assert {p["code"] for p in voice.problems()} == {"damaged_metadata", "missing_audio"}


def test_delete_and_find_and_retext(tmp_path: Path) -> None:
    voice = create_voice(tmp_path / "v", "a")
    for i in range(3):
        voice.add_take(np.zeros(2400, np.float32), f"take {i}", sample_rate=24000)
    assert voice.find_take("2").id == "0002"
    fixed = voice.set_take_text("0002", "corrected")
    assert fixed.text == "corrected"
    voice.delete_take("0002")
    assert [t.id for t in voice.list_takes()] == ["0001", "0003"]
    assert not (voice.takes_dir / "0002.wav").exists()
    with pytest.raises(InputError, match="no take"):
        voice.delete_take("0002")
    summary = voice.summary()
    assert summary["takes"] == 2
    assert summary["minutes_recorded"] == pytest.approx(0.2 / 60, abs=1e-3)
    assert summary["prepared"] is None


def test_atomic_write_keeps_old_file_on_failure(tmp_path: Path) -> None:
    voice = create_voice(tmp_path / "v", "a")
    before = voice.voice_file.read_bytes()
    # a value TOML cannot hold fails while the text is built: the file is untouched
    voice.config["voice"]["bad"] = float("nan")
    with pytest.raises(ValueError):
        voice._save_config()
    assert voice.voice_file.read_bytes() == before
    # a failure mid-write (here: a value JSON cannot encode) leaves the old file and no temp
    target = tmp_path / "v" / "x.json"
    write_json(target, {"a": 1})

    class Boom:
        def __str__(self) -> str:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        write_json(target, {"a": Boom()})
    assert json.loads(target.read_text()) == {"a": 1}
    assert sorted(os.listdir(tmp_path / "v")) == ["exports", "prepared", "renders", "runs",
                                                  "takes", "voice.toml", "x.json"]


def test_prompt_sets_and_next_prompt(tmp_path: Path) -> None:
    sets = list_prompt_sets()
    english = next(s for s in sets if s.name == "english")
    assert len(english) >= 300 and len(english.groups) >= 8
    assert len({p.id for p in english.prompts}) == len(english)
    assert len({p.text for p in english.prompts}) == len(english)
    for p in english.prompts:
        assert 5 <= len(p.text.split()) <= 20, p
    voice = create_voice(tmp_path / "v", "a")
    first = next_prompt(voice)
    assert first is not None and first.id == english.prompts[0].id
    voice.add_take(np.zeros(2400, np.float32), first.text, sample_rate=24000,
                   prompt_id=first.id)
    assert next_prompts(voice, 2)[0].id == english.prompts[1].id
    progress = prompt_progress(voice)
    assert progress["recorded"] == 1 and progress["remaining"] == len(english) - 1


def test_prompt_format_errors() -> None:
    ps = parse_prompt_set("@name t\n[g]\na-1 | One two three four five.\n", "x")
    assert ps.name == "t" and ps.prompts[0].group == "g" and ps.prompts[0].set_name == "t"
    with pytest.raises(InputError, match="line 2"):
        parse_prompt_set("a-1 | ok sentence here\nno separator\n", "x")
    with pytest.raises(InputError, match="repeats"):
        parse_prompt_set("a | one\na | two\n", "x")


def test_light_modules_import_no_torch_or_qt() -> None:
    # the GUI imports these directly: they must stay free of torch, ray and Qt
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import engine.layout.voice, engine.layout.prompts, engine.layout.voice_prompts\n"
        "import engine.audio.io, engine.audio.loudness\n"
        "import engine.audio.vad, engine.audio.checks, engine.prepare.transcripts\n"
        "import engine.prepare.importer, engine.prepare.pipeline, engine.cli.cmd_voice\n"
        "heavy = ('torch', 'ray', 'transformers', 'qwen_tts', 'PySide6', 'pyqtgraph')\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    root = Path(__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_list_and_delete_voices(tmp_path: Path) -> None:
    a = create_voice(tmp_path / "b_voice", "b")
    create_voice(tmp_path / "a_voice", "a")
    (tmp_path / "not_a_voice").mkdir()
    assert [p.name for p in list_voices(tmp_path)] == ["a_voice", "b_voice"]
    assert "No takes yet" in a.summary()["verdict"]
    a.add_take(np.zeros(2400, np.float32), "x", sample_rate=24000)
    assert "Not prepared" in a.summary()["verdict"]
    with pytest.raises(WorkspaceError):
        delete_voice(tmp_path / "not_a_voice")
    assert (tmp_path / "not_a_voice").is_dir()
    delete_voice(a.path)
    assert [p.name for p in list_voices(tmp_path)] == ["a_voice"]
    assert list_voices(tmp_path / "missing") == []


def test_open_sweeps_what_a_killed_import_left(tmp_path: Path) -> None:
    import subprocess
    import sys
    import time

    voice = create_voice(tmp_path / "v", "a")
    src = tmp_path / "song.flac"
    sf.write(src, 0.1 * np.sin(np.linspace(0, 900, 24000)), 24000)
    # the engine's own import, killed after the audio was copied and before its JSON
    code = ("import os, sys\nimport engine.layout.voice as ws\n"
            "ws.write_json = lambda *a, **k: os._exit(9)\n"
            "ws.Voice(ws.Path(sys.argv[1]), {'voice': {'speaker': 'a'}}).add_take(sys.argv[2])\n")
    killed = subprocess.run([sys.executable, "-c", code, str(voice.path), str(src)],
                            cwd=Path(__file__).resolve().parents[1])
    assert killed.returncode == 9
    takes = voice.takes_dir
    assert [p.name for p in takes.iterdir()] == ["0001-song.flac"]
    # an id reserved but never filled, and the temporary of its interrupted copy
    (takes / "0002-cut.mp3").write_bytes(b"")
    (takes / ".0002-cut.mp3.k3j2h1.mp3").write_bytes(b"ID3 partial")
    then = time.time() - 3600
    for p in takes.iterdir():
        os.utime(p, (then, then))
    # an import running right now in another process: its files are young, left alone
    (takes / "0003-live.wav").write_bytes(b"")
    (takes / ".0003-live.wav.a1b2c3.wav").write_bytes(b"RIFF")
    (takes / "notes.txt").write_text("mine")  # not a take file: never touched

    again = open_voice(voice.path)
    names = sorted(p.name for p in takes.iterdir())
    assert names == [".0003-live.wav.a1b2c3.wav", "0001-song.flac", "0001-song.json",
                     "0003-live.wav", "notes.txt"]
    (take,) = again.list_takes()
    assert take.id == "0001-song" and take.text == "" and take.origin == "imported"
    assert take.duration_s == pytest.approx(1.0, abs=1e-3)
    assert take.sha256 == hashlib.sha256(src.read_bytes()).hexdigest()
    assert take.extra["recovered"]
    # swept once: opening again changes nothing
    assert again.sweep() == {"recovered": [], "removed": []}


def test_every_offered_language_has_its_own_prompt_set(tmp_path: Path) -> None:
    from engine.layout.prompts import languages_with_prompts, prompt_set_for_language

    langs = languages_with_prompts()
    assert langs == ["english", "french", "german"]
    for lang in langs:
        ps = next(p for p in list_prompt_sets() if p.name == prompt_set_for_language(lang))
        assert ps.language == lang and len(ps) >= 100
        assert len({p.text for p in ps.prompts}) == len(ps)  # no sentence twice
    german = create_voice(tmp_path / "g", "Greta", language="german")
    assert german.prompt_set == "german"
    first = next_prompt(german)
    assert first is not None and first.id == "al-001" and "Wasserkocher" in first.text
    # a language without its own set still records, from the English one
    assert create_voice(tmp_path / "j", "Jun", language="japanese").prompt_set == "english"
    assert prompt_set_for_language("japanese") is None


def test_atomic_writes_get_the_users_usual_permissions(tmp_path: Path) -> None:
    import os
    import stat

    from engine.core.atomic import write_json

    old = os.umask(0o027)
    try:
        path = write_json(tmp_path / "a.json", {"x": 1})
        assert stat.S_IMODE(path.stat().st_mode) == 0o640  # not mkstemp's owner-only 0600
        os.umask(0o002)
        path = write_json(tmp_path / "b.json", {"x": 1})
        assert stat.S_IMODE(path.stat().st_mode) == 0o664
    finally:
        os.umask(old)
