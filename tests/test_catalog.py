"""engine.catalog reads what the engine's own writers wrote: runs, takes and verdicts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from engine import catalog
from engine.config.train import TrainConfig
from engine.core.atomic import write_json
from engine.core.events import Emitter
from engine.layout.checkpoints import COMPLETE, checkpoint_name, step_of
from engine.layout.voice import VERDICT_UNUSABLE, create_voice, open_voice
from engine.train.metrics_pump import MetricsPump
from tests.helpers.voices import copy_voice

ROOT = Path(__file__).resolve().parents[1]


def _write_run(run_dir: Path, cfg: TrainConfig, total_steps: int, steps: int,
               complete: list[int], torn: list[int]) -> None:
    """A run folder as the trainer leaves it: config, metrics from the pump, checkpoints."""
    run_dir.mkdir(parents=True)
    write_json(run_dir / "config.json", cfg.to_dict())
    pump = MetricsPump(None, Emitter(lambda _e: None), run_dir / "metrics.jsonl")
    for step in range(1, steps + 1):
        # rank 0 carries the loss and total_steps; rank 1 only memory and timing
        pump.handle({"kind": "train", "rank": 0, "time": float(step),
                     "values": {"step": step, "loss/train": 5.0 / step,
                                "total_steps": total_steps}})
        pump.handle({"kind": "train", "rank": 1, "time": float(step),
                     "values": {"step": step, "memory/rss_gib": 1.0}})
    pump.stop()
    for step in complete + torn:
        (run_dir / checkpoint_name(step)).mkdir()
    for step in complete:
        (run_dir / checkpoint_name(step) / COMPLETE).write_text("")


def test_a_reloaded_run_knows_its_total_steps_and_checkpoints(tmp_path: Path) -> None:
    voice = create_voice(tmp_path / "ada", "Ada").path
    # sized by epochs: config.json has run.steps = None; the total lives in the metrics
    by_epochs = TrainConfig()
    assert by_epochs.to_dict()["run"]["steps"] is None
    _write_run(voice / "runs" / "20261130-a", by_epochs, total_steps=37, steps=5,
               complete=[2, 4], torn=[5])
    # sized by steps, resumed with more: the config's run.steps is the truth
    by_steps = TrainConfig().replace(run={"steps": 60})
    _write_run(voice / "runs" / "20261130-b", by_steps, total_steps=40, steps=3,
               complete=[3], torn=[])

    a, b = catalog.list_runs(voice)
    assert (a.name, a.total_steps, a.last_step, a.checkpoint_steps) == ("20261130-a", 37, 5,
                                                                         [2, 4])
    assert (b.total_steps, b.last_step, b.checkpoint_steps) == (60, 3, [3])
    assert a.checkpoints[-1] == voice / "runs" / "20261130-a" / checkpoint_name(4)
    assert step_of(a.checkpoints[0]) == 2

    # the CLI prints the same reading
    out = subprocess.run([sys.executable, "-m", "engine.cli.main", "--json", "status",
                          str(voice)], capture_output=True, text=True, cwd=ROOT, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    runs = result["voice"]["runs"]
    assert [(r["name"], r["total_steps"], r["checkpoint_steps"]) for r in runs] == [
        ("20261130-a", 37, [2, 4]), ("20261130-b", 60, [3])]


def test_takes_carry_the_prepare_verdicts(tmp_path: Path, prepared_voice: Path) -> None:
    from engine.prepare.pipeline import prepare

    voice_dir = copy_voice(prepared_voice, tmp_path / "joe")
    voice = open_voice(voice_dir)
    silent = voice.add_take(np.zeros(24000, dtype=np.float32), "Nothing was said here.",
                            sample_rate=24000)
    report = prepare(voice)  # the engine's writer: manifest.jsonl and report.json

    takes = {t.id: t for t in catalog.list_takes(voice_dir)}
    assert set(takes) == {t.id for t in voice.list_takes()}
    assert takes[silent.id].usable is False
    assert "silent" in {i["code"] for i in takes[silent.id].issues}
    manifest = [json.loads(line) for line in
                (voice_dir / "prepared" / "manifest.jsonl").read_text().splitlines()]
    for take_id, take in takes.items():
        clips = [c for c in manifest if c["source_take"] == take_id]
        if clips:
            assert take.usable == any(c["usable"] for c in clips)
    usable_takes = sum(1 for t in takes.values() if t.usable)
    assert usable_takes >= len(takes) - 2

    snap = catalog.snapshot(voice_dir)
    assert snap.summary["prepared"]["usable_clips"] == report["totals"]["usable_clips"]
    assert snap.report is not None and snap.report["created"] == report["created"]
    assert len(snap.takes) == len(takes) and snap.speaker == "Joe"
    assert [c["id"] for c in snap.clips] == [c["id"] for c in manifest]


def test_workspace_listing_and_speaker_names(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    create_voice(ws / "b-voice", "Zoë Müller", language="german")
    create_voice(ws / "A-voice", "Al")
    (ws / "not-a-voice").mkdir()
    entries = catalog.list_voices(ws)
    assert [(e.path.name, e.speaker, e.language) for e in entries] == [
        ("A-voice", "Al", "english"), ("b-voice", "Zoë Müller", "german")]
    assert catalog.speaker_name(ws / "b-voice") == "Zoë Müller"
    status = catalog.workspace_status(ws)
    assert [v["summary"]["takes"] for v in status["voices"]] == [0, 0]


def _age(root: Path, seconds: float) -> None:
    """Date every file and folder back, as if written a while ago."""
    import os
    import time

    then = time.time() - seconds
    for p in [root, *root.rglob("*")]:
        os.utime(p, (then, then))


def test_a_snapshot_knows_when_the_disk_changed(tmp_path: Path) -> None:
    voice = create_voice(tmp_path / "ada", "Ada")
    young = catalog.snapshot(voice.path)
    assert not catalog.is_current(young)  # read moments after a write: never trusted
    _age(voice.path, 60)
    snap = catalog.snapshot(voice.path)
    assert catalog.is_current(snap)
    voice.add_take(np.full(2400, 0.1, dtype=np.float32), "Hello there.", sample_rate=24000)
    assert not catalog.is_current(snap)
    _age(voice.path, 60)
    snap = catalog.snapshot(voice.path)
    assert catalog.is_current(snap) and snap.summary["takes"] == 1
    (voice.path / "renders" / "x.wav").write_bytes(b"")
    assert not catalog.is_current(snap)


def test_a_rescan_reads_only_the_sidecars_that_changed(tmp_path: Path) -> None:
    voice = create_voice(tmp_path / "ada", "Ada")
    for text in ("One.", "Two.", "Three."):
        voice.add_take(np.full(2400, 0.1, dtype=np.float32), text, sample_rate=24000)
    _age(voice.path, 60)
    cache: dict = {}
    first, _ = voice.scan(cache)
    again, _ = voice.scan(cache)
    assert len(cache) == 3 and all(a is b for a, b in zip(first, again, strict=True))
    voice.set_take_text(first[1].id, "Two, corrected.")
    voice.delete_take(first[2].id)
    after, _ = voice.scan(cache)
    assert [t.text for t in after] == ["One.", "Two, corrected."]
    assert after[0] is first[0]  # untouched: not read again
    assert set(cache) == {f"{first[0].id}.json"}  # the fresh write is not trusted yet
    snap = catalog.snapshot(voice.path, cache)
    assert [t.text for t in snap.takes] == ["One.", "Two, corrected."]


def test_minutes_in_use_follow_one_rule(tmp_path: Path, prepared_voice: Path) -> None:
    """Issue 28: the window said "0.8 minutes recorded" where Prepare found 0.3 usable
    (silent takes and trailing silence counted). One count (SpeechCount): a take
    prepared as it is counts its usable clips, a take not prepared yet its length,
    unless its recorded verdict says it cannot train; a take left out counts nothing."""
    from engine.prepare.pipeline import prepare

    voice = open_voice(copy_voice(prepared_voice, tmp_path / "joe"))
    # a recorded take with a second of silence after the speech, and a silent one
    first = voice.list_takes()[0]
    speech, sr = sf.read(first.audio_path, dtype="float32")
    tail = voice.add_take(np.concatenate([speech, np.zeros(sr, np.float32)]), first.text,
                          sample_rate=sr)
    silent = voice.add_take(np.zeros(2 * sr, np.float32), "Nothing was said here.",
                            sample_rate=sr, extra={"verdict": VERDICT_UNUSABLE})
    before = catalog.snapshot(voice.path)
    raw = {t.id: t.duration_s for t in before.takes}
    assert {t.id: t.speech_s for t in before.takes if t.id in (tail.id, silent.id)} == \
        {tail.id: raw[tail.id], silent.id: 0.0}  # not prepared: its length, or nothing

    report = prepare(voice)
    snap = catalog.snapshot(voice.path)
    usable = report["totals"]["minutes_usable"]
    assert snap.minutes_in_use == pytest.approx(usable, abs=1e-3)
    assert snap.minutes_in_use < sum(raw.values()) / 60.0 - 2 / 60.0  # no silence counted
    by_id = {t.id: t for t in snap.takes}
    assert by_id[silent.id].speech_s == 0.0 and by_id[tail.id].speech_s < raw[tail.id] - 0.8

    # left out: nothing; left out when prepared and included since: its length
    voice.set_take_excluded(first.id, True)
    assert catalog.snapshot(voice.path).minutes_in_use == pytest.approx(
        usable - by_id[first.id].speech_s / 60.0, abs=1e-3)
    prepare(voice)
    voice.set_take_excluded(first.id, False)
    again = {t.id: t for t in catalog.snapshot(voice.path).takes}
    assert again[first.id].speech_s == raw[first.id] and again[first.id].usable is None
    assert again[first.id].issues == []  # its "is excluded" is gone with the tick
