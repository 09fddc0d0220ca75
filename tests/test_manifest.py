"""The prepared folder's one reader (engine.layout.manifest): JSON lines, the rule for a
row without `usable` through every reader, and the one reference clip the window and
the CLI both take."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from engine.core.errors import WorkspaceError
from engine.core.jsonl import BadLine, append_jsonl, parse_jsonl, read_jsonl
from engine.layout.manifest import (
    PreparedFolder,
    prepared_folder,
    read_manifest,
    reference_clip,
    write_manifest,
)
from engine.layout.voice import create_voice

# -- JSON lines ------------------------------------------------------------------------------


def test_jsonl_strict_says_which_line_and_tolerant_skips_it(tmp_path: Path) -> None:
    text = '{"a": 1}\n\n[1, 2]\n{"b": 2}\n{"torn": \n'
    assert parse_jsonl(text) == [{"a": 1}, {"b": 2}]
    with pytest.raises(BadLine) as err:
        parse_jsonl(text, strict=True)
    assert (err.value.line_no, err.value.reason) == (3, "is not a JSON object")
    with pytest.raises(BadLine) as err:
        parse_jsonl('{"a": 1}\n{"torn": \n', strict=True)
    assert (err.value.line_no, err.value.reason) == (2, "is not valid JSON")
    path = tmp_path / "log.jsonl"
    assert read_jsonl(path) == []  # tolerant: no file reads as empty
    with pytest.raises(FileNotFoundError):
        read_jsonl(path, strict=True)
    append_jsonl(path, {"step": 1, "text": "café"})
    append_jsonl(path, {"step": 2})
    assert read_jsonl(path, strict=True) == [{"step": 1, "text": "café"}, {"step": 2}]


# -- a row without `usable` --------------------------------------------------------------------

#: (id, seconds, usable): "hand" has no `usable` at all, as a manifest made by hand or by
#: another tool; "blocked" is the longest, so a reader that counted it would show
ROWS = [("kept", 5.0, True), ("blocked", 20.0, False), ("hand", 9.0, None)]


def _voice(tmp_path: Path, rows: list[tuple[str, float, bool | None]] = ROWS,
           issues: dict[str, int] | None = None, snr: dict[str, float] | None = None) -> Path:
    """A voice whose prepared folder holds `rows` (clip files of a few bytes: no reader
    here decodes audio) and a report with each clip's SNR."""
    voice = create_voice(tmp_path / "v", "Tester").path
    folder = prepared_folder(voice)
    folder.clips_dir.mkdir(parents=True, exist_ok=True)
    manifest = []
    for clip_id, seconds, usable in rows:
        folder.clip_file(clip_id).write_bytes(f"audio of {clip_id}".encode())
        row: dict[str, Any] = {
            "id": clip_id, "path": PreparedFolder.clip_entry(clip_id),
            "text": f"what {clip_id} says", "duration_s": seconds, "sample_rate": 24000,
            "issues": [{"code": "noisy", "message": "noisy"}] * (issues or {}).get(clip_id, 0),
            "source_take": clip_id}
        if usable is not None:
            row["usable"] = usable
        manifest.append(row)
    write_manifest(voice, manifest)
    folder.report.write_text(json.dumps({"clips": [
        {"id": c, "snr_db": (snr or {}).get(c, 20.0)} for c, _, _ in rows]}))
    return voice


def test_a_row_without_usable_is_training_data_for_every_reader(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    from engine import catalog
    from engine.data.codes import _plan
    from engine.train.plan import FRAME_RATE, typical_lengths
    from engine.train.resolve import data_summary
    from engine.train.rundata import data_fingerprint

    voice = _voice(tmp_path)
    want = ["kept", "hand"]
    assert [c["id"] for c in read_manifest(voice)] == want
    assert [c["id"] for c in read_manifest(voice, usable_only=False)] == [r[0] for r in ROWS]
    # code extraction (what the dataset then trains on)
    assert [c["id"] for c in _plan(voice, tiny_model_dir).clips] == want
    # the training summary (presets, the too-little-data check, the validation split)
    summary = data_summary(voice)
    assert list(summary.ids) == want and summary.seconds == pytest.approx(14.0)
    # the memory plan sizes micro-batches by the longest usable clip: "hand", not "blocked"
    assert typical_lengths(voice, 10_000)[1] == math.ceil(9.0 * FRAME_RATE)
    assert data_fingerprint(voice)["clips"] == 2
    # the window: the prepare verdict of each clip's take, and the reference candidates
    snap = catalog.snapshot(voice)
    assert snap.reference is not None and snap.reference.stem in want


def test_a_damaged_manifest_is_one_sentence_for_training_and_empty_for_the_window(
        tmp_path: Path) -> None:
    from engine import catalog

    voice = _voice(tmp_path)
    manifest = prepared_folder(voice).manifest
    manifest.write_text(manifest.read_text() + "{not json\n")
    with pytest.raises(WorkspaceError, match="line 4 is not valid JSON"):
        read_manifest(voice)
    assert [c["id"] for c in catalog.prepared_clips(voice)] == [r[0] for r in ROWS]
    manifest.unlink()
    with pytest.raises(WorkspaceError, match="has no prepared clips"):
        read_manifest(voice)
    assert catalog.prepared_clips(voice) == [] and reference_clip(voice) is None


# -- the reference clip ------------------------------------------------------------------------

#: where the window's old rule (the longest usable clip of 3-12 s) and the engine's
#: (fewest warnings, then SNR, then nearest 8 s) disagree: "long" is 11.5 s with a
#: warning, "clean" 8 s without one
DISAGREE = [("long", 11.5, True), ("clean", 8.0, True), ("short", 2.0, True),
            ("blocked", 10.0, False)]


def _old_window_rule(voice: Path) -> str:
    clips = [c for c in read_manifest(voice, usable_only=False) if c.get("usable")]
    good = [c for c in clips if 3.0 <= float(c["duration_s"]) <= 12.0] or clips
    return str(max(good, key=lambda c: float(c["duration_s"]))["id"])


def _trained_run(voice: Path, base: Path) -> Path:
    """A run folder as training leaves it, for path logic: its config and one complete
    checkpoint (no weights: nothing here loads them)."""
    run = voice / "runs" / "2026-01-01_a"
    ckpt = run / "checkpoint_step_0000010"
    ckpt.mkdir(parents=True)
    (ckpt / "COMPLETE").write_text("")
    (run / "config.json").write_text(json.dumps({"model": {"base": str(base),
                                                           "speaker_name": "tester"}}))
    return run


def test_the_window_and_the_cli_take_the_same_reference_clip(
        qtbot: Any, window: Any, tmp_path: Path, tiny_model_dir: Path) -> None:
    from engine import catalog
    from engine.quality.compare import CompareRequest, plan_comparison
    from engine.synth.voice import resolve_source
    from gui.pages.listen import ListenPage

    voice = _voice(tmp_path, DISAGREE, issues={"long": 1}, snr={"long": 25.0, "clean": 22.0})
    run = _trained_run(voice, tiny_model_dir)
    clean = prepared_folder(voice).clip_file("clean")
    assert _old_window_rule(voice) == "long"  # the voice tells the two rules apart
    # the CLI: `compare`'s zero-shot preview (its default reference), and what it says
    zero_shot = plan_comparison(CompareRequest(voice, tmp_path / "ab"))[0]
    assert zero_shot.kind == "zero_shot" and zero_shot.reference == clean
    assert zero_shot.reference_text == "what clean says"
    # the window: the Listen page's default reference, and what its compare passes on
    window.ctx.set_voice(voice)
    page = window.show_page(ListenPage)
    qtbot.waitUntil(lambda: page.reference.count() == 3, timeout=10000)  # usable clips only
    assert Path(page.reference.currentData()) == clean
    assert page._engine_reference() == clean
    # the base model of a zero-shot preview: the run's, read the engine's way, both sides
    assert page.base.currentText() == str(tiny_model_dir)
    assert resolve_source(voice, reference=clean).model_dir == tiny_model_dir
    # training recorded another clip as the speaker's: both follow it
    codes = prepared_folder(voice).codes_dir
    codes.mkdir()
    prepared_folder(voice).codes_index.write_text(json.dumps({"reference_clip": "long"}))
    long = prepared_folder(voice).clip_file("long")
    assert plan_comparison(CompareRequest(run, tmp_path / "ab"))[0].reference == long
    assert catalog.snapshot(voice).reference == long
    # ...unless that clip is no longer usable (prepared again since): the rule again
    prepared_folder(voice).codes_index.write_text(json.dumps({"reference_clip": "blocked"}))
    assert reference_clip(voice) == clean == catalog.snapshot(voice).reference
