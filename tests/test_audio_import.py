"""Import: files and folders, transcripts in every form, and every kind of bad input."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

import psutil
import pytest
import soundfile as sf

from engine.core.errors import InputError
from engine.layout.voice import Voice, create_voice
from engine.prepare.importer import import_files
from engine.prepare.transcripts import load_transcripts


@pytest.fixture
def voice(tmp_path: Path) -> Voice:
    return create_voice(tmp_path / "voice", "tester")


def _copy_audio(src: Path, dst: Path, fmt: str | None = None) -> Path:
    audio, sr = sf.read(src, dtype="float32")
    dst.parent.mkdir(parents=True, exist_ok=True)
    sf.write(dst, audio, sr, format=fmt)
    return dst


def test_import_files_and_folders_with_sidecar_text(
        voice: Voice, tmp_path: Path, piper_sentences: list[dict[str, Any]]) -> None:
    folder = tmp_path / "in"
    for i, s in enumerate(piper_sentences[:3]):
        _copy_audio(s["path"], folder / "sub" / f"s{i}.ogg")
        (folder / "sub" / f"s{i}.txt").write_text(s["text"], encoding="utf-8")
    (folder / "notes.txt").write_text("not audio")
    loose = _copy_audio(piper_sentences[3]["path"], tmp_path / "loose.mp3")
    events: list[Any] = []
    result = import_files(voice, [folder, loose], on_event=events.append)
    assert [r["source"] for r in result["imported"]] == [
        str(folder / "sub" / f"s{i}.ogg") for i in range(3)] + [str(loose)]
    assert [r["text"] for r in result["imported"][:3]] == [s["text"] for s in
                                                           piper_sentences[:3]]
    assert result["imported"][3]["text"] == ""  # no transcript anywhere
    takes = voice.list_takes()
    assert [t.audio_path.suffix for t in takes] == [".ogg", ".ogg", ".ogg", ".mp3"]
    assert takes[3].audio_path.read_bytes() == loose.read_bytes()
    progress = [e for e in events if e.kind == "progress"]
    assert progress[-1].data["done"] == progress[-1].data["total"] == 4
    # importing the same files again adds nothing
    again = import_files(voice, [folder])
    assert again["imported"] == [] and {s["code"] for s in again["skipped"]} == {
        "already_imported"}


def test_ljspeech_metadata(voice: Voice, tmp_path: Path,
                           piper_sentences: list[dict[str, Any]]) -> None:
    root = tmp_path / "LJ"
    lines = []
    for i, s in enumerate(piper_sentences[:3]):
        _copy_audio(s["path"], root / "wavs" / f"LJ001-{i:04d}.wav")
        # column 3 is the normalised text: it is the one to read
        lines.append(f"LJ001-{i:04d}|raw {i}|{s['text']}")
    (root / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    # found automatically next to wavs/ ...
    result = import_files(voice, [root / "wavs"])
    assert [r["text"] for r in result["imported"]] == [s["text"] for s in piper_sentences[:3]]
    assert all(r["text_from"] == "sidecar" for r in result["imported"])
    # ... and given explicitly
    index = load_transcripts(root / "metadata.csv")
    assert index.lookup(root / "wavs" / "LJ001-0001.wav") == piper_sentences[1]["text"]


def test_csv_and_jsonl_lists(voice: Voice, tmp_path: Path,
                             piper_sentences: list[dict[str, Any]]) -> None:
    a = _copy_audio(piper_sentences[0]["path"], tmp_path / "data" / "a.flac")
    b = _copy_audio(piper_sentences[1]["path"], tmp_path / "data" / "b.wav")
    (tmp_path / "data" / "a.txt").write_text("the sidecar loses to the list")
    csv_file = tmp_path / "list.csv"
    csv_file.write_text('file,text\ndata/a.flac,"Hello, first one."\nb,Second one.\n',
                        encoding="utf-8")
    result = import_files(voice, [a, b], transcripts=csv_file)
    assert [r["text"] for r in result["imported"]] == ["Hello, first one.", "Second one."]
    assert all(r["text_from"] == "list" for r in result["imported"])

    other = create_voice(tmp_path / "v2", "x")
    jsonl = tmp_path / "list.jsonl"
    jsonl.write_text(json.dumps({"audio_filepath": str(a), "text": "Json one."}) + "\n\n"
                     + json.dumps({"path": "b.wav", "transcript": "Json two."}) + "\n",
                     encoding="utf-8")
    result = import_files(other, [tmp_path / "data"], transcripts=jsonl)
    texts = {Path(r["source"]).name: r["text"] for r in result["imported"]}
    assert texts == {"a.flac": "Json one.", "b.wav": "Json two."}

    tsv = tmp_path / "list.tsv"
    tsv.write_text("filename\ttranscription\nb.wav\tTab two.\n", encoding="utf-8")
    assert load_transcripts(tsv).lookup(b) == "Tab two."
    for bad, match in (("x,y\n1,2\n", "no header"), ("", "lists no")):
        f = tmp_path / "bad.csv"
        f.write_text(bad)
        with pytest.raises(InputError, match=match):
            load_transcripts(f)
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    with pytest.raises(InputError, match="line 1"):
        load_transcripts(tmp_path / "bad.jsonl")


def _sparse_wav(path: Path, size: int, rate: int = 8000) -> None:
    """A PCM WAV whose header declares `size` bytes of data, stored sparsely on disk."""
    data = size - 44
    with open(path, "wb") as fh:
        fh.write(b"RIFF" + struct.pack("<I", min(size - 8, 0xFFFFFFFF)) + b"WAVE")
        fh.write(b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16))
        fh.write(b"data" + struct.pack("<I", min(data, 0xFFFFFFFF)))
        fh.truncate(size)


def test_bad_inputs_are_skipped_with_one_line_reasons(
        voice: Voice, tmp_path: Path, piper_sentences: list[dict[str, Any]]) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    good = _copy_audio(piper_sentences[0]["path"], bad / "good.wav")
    (bad / "empty.wav").write_bytes(b"")
    (bad / "text.mp3").write_text("this is not audio at all\n" * 40)
    (bad / "text.wav").write_text("RIFF? no, just words\n" * 40)
    (bad / "truncated.wav").write_bytes(good.read_bytes()[:30])
    (bad / "broken_link.flac").symlink_to(bad / "nowhere.flac")
    _sparse_wav(bad / "huge.wav", 9 << 30)          # over the 8 GiB limit
    _sparse_wav(bad / "long.wav", 1 << 30)          # 18 hours at 8 kHz: over 60 min
    io = psutil.Process().io_counters
    read_before = io().read_chars
    result = import_files(voice, [bad, tmp_path / "missing.txt"])
    # nothing huge was read (bytes counted by the kernel) or copied
    assert io().read_chars - read_before < 64 << 20
    assert sum(f.stat().st_size for f in (voice.path / "takes").iterdir()) < 64 << 20
    reasons = {Path(s["path"]).name: (s["code"], s["reason"]) for s in result["skipped"]}
    assert [r["source"] for r in result["imported"]] == [str(good)]
    assert reasons["empty.wav"][0] == "empty"
    assert reasons["text.mp3"][0] == "not_audio"
    assert reasons["text.wav"][0] == "not_audio"
    assert reasons["truncated.wav"][0] in ("damaged", "not_audio")
    assert reasons["broken_link.flac"][0] == "unreadable"
    assert reasons["huge.wav"][0] == "too_large"
    assert reasons["long.wav"][0] == "too_long_file"
    assert reasons["missing.txt"][0] == "missing"
    for code, reason in reasons.values():
        assert reason and "\n" not in reason and len(reason) < 200, (code, reason)
    assert len(voice.list_takes()) == 1
    assert sorted(p.name for p in voice.takes_dir.iterdir()) == ["0001-good.json",
                                                                 "0001-good.wav"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_is_skipped(voice: Voice, tmp_path: Path,
                                    piper_sentences: list[dict[str, Any]]) -> None:
    f = _copy_audio(piper_sentences[0]["path"], tmp_path / "locked.wav")
    f.chmod(0)
    result = import_files(voice, [f])
    assert result["skipped"][0]["reason"] == "cannot be read: permission denied"


def test_odd_unicode_and_undecodable_names(voice: Voice, tmp_path: Path,
                                           piper_sentences: list[dict[str, Any]]) -> None:
    names = ["Zoë – naïve 日本語 🎤.wav", "e\u0301te\u0301 (NFD).flac", "line\nbreak.wav"]
    folder = tmp_path / "odd"
    for n, s in zip(names, piper_sentences[2:], strict=False):
        _copy_audio(s["path"], folder / n)
    # a name that is not valid UTF-8 at all
    raw = os.fsencode(folder) + b"/caf\xe9.wav"
    os.rename(_copy_audio(piper_sentences[1]["path"], folder / "tmp.wav"), raw)
    (folder / "Zoë – naïve 日本語 🎤.txt").write_text("Unicode text ✓", encoding="utf-8")
    result = import_files(voice, [folder])
    assert len(result["imported"]) == 4, result["skipped"]
    takes = voice.list_takes()
    for t in takes:
        assert t.id.isascii() and t.audio_path.is_file()
        json.dumps(t.to_dict())  # every field is JSON-safe
    assert "Unicode text ✓" in [t.text for t in takes]
    assert any("\ufffd" in (t.source or "") for t in takes)  # shown, not crashed on
    assert all("\n" not in (t.source or "") for t in takes)
