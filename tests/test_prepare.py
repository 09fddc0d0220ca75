"""Prepare on real piper speech: the manifest contract, slicing, the quality gate, re-runs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from engine.audio.io import TARGET_SR
from engine.audio.loudness import integrated_loudness
from engine.layout.voice import Voice, create_voice, open_voice
from engine.prepare.pipeline import prepare

MANIFEST_KEYS = {"id", "path", "text", "duration_s", "sample_rate", "usable", "issues",
                 "source_take", "style", "style_source", "style_measured"}


def _manifest(voice_path: Path) -> list[dict[str, Any]]:
    lines = (voice_path / "prepared" / "manifest.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in lines.splitlines()]


def _speech(s: dict[str, Any]) -> tuple[np.ndarray, int]:
    audio, sr = sf.read(s["path"], dtype="float32")
    return audio, sr


def test_prepared_voice_follows_the_contract(prepared_voice: Path,
                                             piper_sentences: list[dict[str, Any]]) -> None:
    entries = _manifest(prepared_voice)
    report = json.loads((prepared_voice / "prepared" / "report.json").read_text())
    metrics = {c["id"]: c for c in report["clips"]}
    assert len(entries) == len(piper_sentences)
    assert [e["text"] for e in entries] == [s["text"] for s in piper_sentences]
    for e, s in zip(entries, piper_sentences, strict=True):
        assert set(e) == MANIFEST_KEYS
        assert e["sample_rate"] == 24000 and e["usable"] and e["issues"] == []
        clip = prepared_voice / e["path"]
        assert e["path"].startswith("prepared/clips/") and clip.is_file()
        info = sf.info(clip)
        assert (info.samplerate, info.channels, info.subtype) == (24000, 1, "PCM_16")
        assert info.frames / 24000 == pytest.approx(e["duration_s"], abs=1e-3)
        # trimmed: never longer than the source, at most ~0.3 s of silence added back
        assert 1.0 <= e["duration_s"] <= s["duration_s"] + 0.01
        audio, _ = sf.read(clip, dtype="float32")
        # -23 LUFS, or less where the -1 dBFS peak ceiling held the gain back
        m = metrics[e["id"]]
        assert integrated_loudness(audio, 24000) == pytest.approx(m["loudness_lufs"], abs=0.2)
        if m["peak_limited"]:
            assert -29.0 < m["loudness_lufs"] < -23.0
        else:
            assert m["loudness_lufs"] == pytest.approx(-23.0, abs=0.01)
        assert np.max(np.abs(audio)) <= 10 ** (-1 / 20) + 1e-3
    totals = report["totals"]
    assert totals["clips"] == totals["usable_clips"] == len(piper_sentences)
    assert totals["rejected_takes"] == 0 and not totals["enough"]
    assert 0.4 < totals["minutes_usable"] < 1.0
    assert report["rejects_by_reason"] == {}
    text = (prepared_voice / "prepared" / "report.txt").read_text(encoding="utf-8")
    assert "usable" in text and "recommended" in text
    summary = open_voice(prepared_voice).summary()
    assert summary["prepared"]["stale"] is False
    assert summary["verdict"].startswith("Usable 0.6 of 10 recommended minutes")


def test_rerun_reuses_unchanged_takes(tmp_path: Path, prepared_voice: Path) -> None:
    path = Path(shutil.copytree(prepared_voice, tmp_path / "v"))
    voice = open_voice(path)
    clips = sorted((path / "prepared" / "clips").glob("*.wav"))
    mtimes = {c.name: c.stat().st_mtime_ns for c in clips}
    report = prepare(voice)
    assert report["run"]["takes_reused"] == len(clips)
    assert report["run"]["takes_processed"] == 0
    assert {c.name: c.stat().st_mtime_ns for c in clips} == mtimes
    # a corrected transcript re-processes that take only
    takes = voice.list_takes()
    voice.set_take_text(takes[0].id, "A corrected transcript for the first take.")
    report = prepare(voice)
    assert report["run"]["takes_processed"] == 1
    assert _manifest(path)[0]["text"] == "A corrected transcript for the first take."
    # a deleted take loses its clips and its cache entry
    voice.delete_take(takes[1].id)
    report = prepare(voice)
    assert report["run"]["takes_processed"] == 0
    assert takes[1].id not in {e["source_take"] for e in _manifest(path)}
    assert not list((path / "prepared" / "clips").glob(f"{takes[1].id}*"))
    assert not (path / "prepared" / "cache" / f"{takes[1].id}.json").exists()
    # a missing clip is rebuilt
    first_clip = path / _manifest(path)[0]["path"]
    first_clip.unlink()
    assert prepare(voice)["run"]["takes_processed"] == 1 and first_clip.is_file()


def _long_recording(piper_sentences: list[dict[str, Any]], texts: list[str] | None,
                    extra: list[tuple[int, np.ndarray, str]] | None = None,
                    gap_s: float = 0.7) -> tuple[np.ndarray, int, list[str]]:
    parts: list[np.ndarray] = []
    spoken: list[str] = []
    sr = 22050
    items = [(_speech(s)[0], s["text"]) for s in piper_sentences]
    for pos, audio, text in extra or []:
        items.insert(pos, (audio, text))
    for audio, text in items:
        parts += [audio, np.zeros(int(gap_s * sr), np.float32)]
        spoken.append(text)
    return np.concatenate(parts), sr, texts if texts is not None else spoken


def test_long_recording_is_sliced_one_sentence_per_clip(
        tmp_path: Path, piper_sentences: list[dict[str, Any]]) -> None:
    audio, sr, texts = _long_recording(piper_sentences[:7], None)
    assert len(audio) / sr > 25
    voice = create_voice(tmp_path / "v", "a")
    take = voice.add_take(audio, " ".join(texts), sample_rate=sr)
    report = prepare(voice)
    entries = _manifest(voice.path)
    assert [e["text"] for e in entries] == texts
    assert [e["id"] for e in entries] == [f"{take.id}_{k:02d}" for k in range(1, 8)]
    assert all(e["usable"] for e in entries)
    assert {c["text_method"] for c in report["clips"]} == {"sentences"}
    # the clips sit where the sentences are, in order
    starts = [c["start_s"] for c in report["clips"]]
    assert starts == sorted(starts)


def test_long_recording_text_grouped_by_length_is_flagged(
        tmp_path: Path, piper_synth: Any, piper_sentences: list[dict[str, Any]]) -> None:
    short, short_sr = piper_synth("Yes.")
    assert short_sr == 22050 and len(short) / short_sr < 1.0
    audio, sr, texts = _long_recording(piper_sentences[:6], None,
                                       extra=[(1, 0.7 * short, "Yes.")])
    voice = create_voice(tmp_path / "v", "a")
    voice.add_take(audio, " ".join(texts), sample_rate=sr)
    report = prepare(voice)
    entries = _manifest(voice.path)
    # "Yes." cannot be a clip of its own (< 1 s): whole sentences are grouped by length
    assert 2 <= len(entries) < len(texts)
    assert " ".join(e["text"] for e in entries) == " ".join(texts)
    assert {c["text_method"] for c in report["clips"]} == {"proportional"}
    for e in entries:
        assert [i["code"] for i in e["issues"]] == ["text_estimated"] and e["usable"]
        assert e["duration_s"] <= 15.0


def test_long_recording_with_unsplittable_text_needs_transcripts(
        tmp_path: Path, piper_sentences: list[dict[str, Any]]) -> None:
    audio, sr, _ = _long_recording(piper_sentences[:6], None)
    voice = create_voice(tmp_path / "v", "a")
    voice.add_take(audio, "one run-on transcript without any sentence ends", sample_rate=sr)
    voice.add_take(audio[: len(audio) // 2], "", sample_rate=sr)
    report = prepare(voice)
    entries = _manifest(voice.path)
    first = [e for e in entries if e["source_take"] == "0001"]
    second = [e for e in entries if e["source_take"] == "0002"]
    assert len(first) >= 2 and len(second) >= 1
    assert all(not e["usable"] and e["text"] == "" for e in entries)
    assert all("needs_transcript" in [i["code"] for i in e["issues"]] for e in first)
    assert all("empty_text" in [i["code"] for i in e["issues"]] for e in second)
    assert report["totals"]["minutes_usable"] == 0
    assert any("transcript" in a for a in report["advice"])


def test_bad_takes_are_reported_and_the_batch_goes_on(
        tmp_path: Path, piper_sentences: list[dict[str, Any]]) -> None:
    voice: Voice = create_voice(tmp_path / "v", "a")
    rng = np.random.default_rng(3)
    s0, sr = _speech(piper_sentences[0])
    s1, _ = _speech(piper_sentences[1])
    good = voice.add_take(s0, piper_sentences[0]["text"], sample_rate=sr)
    dup = voice.add_take(s1, piper_sentences[0]["text"].upper(), sample_rate=sr)
    nan = s1.copy()
    nan[1000:1010] = np.nan
    voice.add_take(nan, "nan", sample_rate=sr)
    voice.add_take(np.zeros(sr * 2, np.float32), "silent", sample_rate=sr)
    voice.add_take(rng.normal(0, 0.1, sr * 2).astype(np.float32), "hiss", sample_rate=sr)
    clipped = np.clip(s0 * 6.0, -1.0, 1.0)
    voice.add_take(clipped, "clipped", sample_rate=sr)
    noisy = s0 + rng.normal(0, 0.05, len(s0)).astype(np.float32)
    voice.add_take(noisy, "noisy", sample_rate=sr)
    short = s0[: int(0.5 * sr)]
    voice.add_take(np.concatenate([np.zeros(sr // 2, np.float32), short,
                                   np.zeros(sr // 2, np.float32)]), "short", sample_rate=sr)
    corrupt = voice.add_take(s1, "corrupt later", sample_rate=sr)
    # damage a take after import: the header survives, the samples do not
    raw = corrupt.audio_path.read_bytes()
    corrupt.audio_path.write_bytes(raw[:100] + os.urandom(len(raw) - 100))
    gone = voice.add_take(s1 * 0.5, "audio deleted", sample_rate=sr)
    gone.audio_path.unlink()

    events: list[Any] = []
    report = prepare(voice, on_event=events.append)
    by_take = {e["source_take"]: e for e in _manifest(voice.path)}
    codes = {t: [i["code"] for i in e["issues"]] for t, e in by_take.items()}
    assert by_take[good.id]["usable"] and codes[good.id] == []
    assert codes[dup.id] == ["duplicate_text"] and by_take[dup.id]["usable"]
    assert "clipping" in codes["0006"] and not by_take["0006"]["usable"]
    assert any(c in codes["0007"] for c in ("low_snr", "noisy"))
    assert "too_short" in codes["0008"] and not by_take["0008"]["usable"]
    rejected = {r["take"]: r for r in report["rejected"]}
    assert rejected["0003"]["code"] == "non_finite"
    assert rejected["0004"]["code"] == "silent"
    assert rejected["0005"]["code"] == "silent"
    assert corrupt.id not in by_take  # a corrupted WAV either fails or decodes as noise
    assert rejected.get(corrupt.id, {"code": "silent"})["code"] in ("silent", "damaged",
                                                                  "non_finite")
    assert rejected[gone.id]["code"] == "missing_audio"
    for r in report["rejected"]:
        assert "\n" not in r["reason"] and r["reason"]
    assert report["rejects_by_reason"]["silent"] >= 2
    assert report["unusable_by_reason"]["too_short"] == 1
    warnings = [e for e in events if e.kind == "log" and e.data.get("level") == "warning"]
    assert len(warnings) >= 3
    text = voice.prepared.report_text.read_text(encoding="utf-8")
    assert "non_finite" in text and "Rejected files" in text


def test_too_long_file_is_refused_before_decoding(
        tmp_path: Path, piper_sentences: list[dict[str, Any]]) -> None:
    voice = create_voice(tmp_path / "v", "a")
    s0, sr = _speech(piper_sentences[0])
    voice.add_take(s0, "fine", sample_rate=sr)
    voice.update_settings(max_file_minutes=0.01)  # 0.6 s
    report = prepare(voice)
    assert report["rejected"][0]["code"] == "too_long_file"
    assert "limit" in report["rejected"][0]["reason"]


def test_stereo_44k_mp3_take_prepares_to_24k_mono(
        tmp_path: Path, piper_sentences: list[dict[str, Any]]) -> None:
    from scipy.signal import resample_poly

    s0, _ = _speech(piper_sentences[2])
    up = resample_poly(s0, 2, 1)  # 44.1 kHz
    src = tmp_path / "stereo.mp3"
    sf.write(src, np.stack([up, up * 0.8], axis=1), 44100, format="MP3")
    voice = create_voice(tmp_path / "v", "a")
    voice.add_take(src, piper_sentences[2]["text"])
    prepare(voice)
    [entry] = _manifest(voice.path)
    info = sf.info(voice.path / entry["path"])
    assert (info.samplerate, info.channels) == (TARGET_SR, 1) and entry["usable"]
    assert entry["duration_s"] == pytest.approx(piper_sentences[2]["duration_s"], abs=0.5)


def test_cancel_keeps_finished_takes_for_next_time(
        tmp_path: Path, piper_sentences: list[dict[str, Any]]) -> None:
    from engine.core.errors import Cancelled

    voice = create_voice(tmp_path / "v", "a")
    for s in piper_sentences[:3]:
        audio, sr = _speech(s)
        voice.add_take(audio, s["text"], sample_rate=sr)
    calls = []

    def cancel_after_first() -> bool:
        calls.append(1)
        return len(calls) > 1

    with pytest.raises(Cancelled):
        prepare(voice, cancel=cancel_after_first)
    report = prepare(voice)
    assert report["run"] == {**report["run"], "takes_reused": 1, "takes_processed": 2}
    assert report["totals"]["usable_clips"] == 3


def test_check_recording_judges_a_take_in_memory(piper_sentences: list[dict[str, Any]]
                                                 ) -> None:
    from engine.prepare.check import check_recording

    audio, sr = _speech(piper_sentences[0])
    good = check_recording(audio, sr, piper_sentences[0]["text"])
    assert good["usable"] and good["issues"] == [] and good["snr_db"] > 30
    assert good["duration_s"] == pytest.approx(len(audio) / sr, abs=1e-3)
    pcm = (np.stack([audio, audio], axis=1) * 32767).astype(np.int16)  # stereo int16 works
    assert check_recording(pcm, sr, "text")["usable"]
    loud = check_recording(np.clip(audio * 5, -1, 1), sr, "text")
    assert [i["code"] for i in loud["issues"]] == ["clipping"] and not loud["usable"]
    silent = check_recording(np.zeros(sr, np.float32), sr, "text")
    assert [i["code"] for i in silent["issues"]] == ["silent"] and not silent["usable"]
    assert "empty_text" in [i["code"] for i in check_recording(audio, sr, "")["issues"]]


def test_one_prepare_at_a_time(tmp_path: Path, prepared_voice: Path) -> None:
    import subprocess
    import sys

    from engine.core.errors import WorkspaceError

    path = Path(shutil.copytree(prepared_voice, tmp_path / "v"))
    voice = open_voice(path)
    lock = path / "prepared" / ".lock"
    # a live process holds the lock: refused with a clear sentence
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        lock.write_text(str(holder.pid))
        with pytest.raises(WorkspaceError, match="Another prepare"):
            prepare(voice)
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: its stale lock is taken over, and released afterwards
    assert prepare(voice)["totals"]["usable_clips"] == 12
    assert not lock.exists()


def test_a_machine_transcript_slices_by_its_word_times(
        tmp_path: Path, piper_sentences: list[dict[str, Any]]) -> None:
    """A long recording without a transcript: the recogniser (pocketsphinx, real) fills
    it, and each slice gets exactly the words heard inside it."""
    from engine.prepare.transcribe import transcribe_takes

    audio, sr, _ = _long_recording(piper_sentences[:7], None)
    assert len(audio) / sr > 25  # longer than one clip may be
    voice = create_voice(tmp_path / "v", "a")
    take = voice.add_take(audio, "", sample_rate=sr)
    transcribe_takes(voice, asr="pocketsphinx")
    heard = voice.find_take(take.id)
    words = heard.extra["asr"]["words"]
    assert heard.text and len(words) >= 8
    report = prepare(voice)
    entries = _manifest(voice.path)
    assert len(entries) >= 2
    assert {c["text_method"] for c in report["clips"]} == {"timestamps"}
    # every word lands in exactly one slice, in order: the slices' texts add up to the take's
    assert " ".join(e["text"] for e in entries).split() == [str(w[0]) for w in words]
    for e, clip in zip(entries, report["clips"], strict=True):
        inside = [str(w[0]) for w in words
                  if clip["start_s"] <= (float(w[1]) + float(w[2])) / 2 < clip["end_s"]]
        assert e["text"].split() == inside
