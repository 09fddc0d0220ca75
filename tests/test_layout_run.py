"""engine.layout.run: a run on disk, and which run a command means when none is named.

The rule (`pick_run`): the run trained most recently, by when training last wrote to it
(config at every start and resume, metrics every step, its newest complete checkpoint);
a command that needs a checkpoint passes over runs without a complete one. Every
caller that picks a run goes through it, so they are checked to agree here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine import catalog
from engine.core.errors import InputError
from engine.core.storage import Location, link_run
from engine.layout.checkpoints import (
    COMPLETE,
    checkpoint_name,
    holds_checkpoints,
    keep_best,
    list_checkpoints,
    step_of,
)
from engine.layout.run import Run, list_runs, pick_run
from engine.layout.voice import create_voice, open_voice
from engine.quality.compare import _run_of
from engine.quality.evaluate import pick_run as evaluate_pick

#: a fixed clock, so which run is newer never depends on how fast the test ran
T0 = 1_800_000_000.0
HOUR = 3600.0


def _at(path: Path, t: float) -> None:
    os.utime(path, (t, t))


def _train(voice: Path, name: str, t: float, steps: list[int], torn: list[int] | None = None,
           resumed_at: float | None = None) -> Run:
    """A run as training leaves it at time `t`: its config, its metrics, its checkpoints
    (each COMPLETE written as its step ends), and `torn` folders a crash left without one.
    `resumed_at`: later, the run was resumed (config rewritten, more metrics)."""
    run = open_voice(voice).run(name)
    run.path.mkdir(parents=True)
    run.write_config({"run": {"name": name, "steps": 100}, "model": {"base": f"/m/{name}"}})
    _at(run.config_file, t)
    with run.metrics_file.open("w") as fh:
        for s in range(1, (max(steps + (torn or []), default=0)) + 1):
            fh.write(json.dumps({"kind": "train", "step": s, "rank": 0}) + "\n")
    _at(run.metrics_file, t + 60 * len(steps))
    for i, step in enumerate(steps):
        ckpt = run.path / checkpoint_name(step)
        ckpt.mkdir()
        (ckpt / COMPLETE).write_text(str(step))
        _at(ckpt / COMPLETE, t + 60 * (i + 1))
    for step in torn or []:
        (run.path / checkpoint_name(step)).mkdir()
    if resumed_at is not None:
        run.write_config(run.config())
        _at(run.config_file, resumed_at)
        with run.metrics_file.open("a") as fh:
            fh.write(json.dumps({"kind": "train", "step": 999, "rank": 0}) + "\n")
        _at(run.metrics_file, resumed_at + 30)
    return run


def _reference(voice: Path, with_checkpoint: bool) -> str | None:
    """The rule written out slowly: newest of each run's config, metrics and complete
    checkpoint markers by stat, the name breaking ties."""
    best: tuple[float, str] | None = None
    for folder in sorted((voice / "runs").iterdir()):
        markers = [p / COMPLETE for p in folder.iterdir() if step_of(p) is not None
                   and (p / COMPLETE).is_file()]
        if with_checkpoint and not markers:
            continue
        files = [f for f in [folder / "config.json", folder / "metrics.jsonl", *markers]
                 if f.exists()]
        key = (max(f.stat().st_mtime for f in files) if files else folder.stat().st_mtime,
               folder.name)
        best = key if best is None or key > best else best
    return None if best is None else best[1]


def _every_caller(voice: Path, with_checkpoint: bool) -> set[str | None]:
    """What each picker says: the layout's rule, the window's (catalog), evaluate's and
    compare's."""
    layout = pick_run(voice, with_checkpoint=with_checkpoint)
    window = catalog.latest_run(catalog.list_runs(voice), with_checkpoint=with_checkpoint)
    said = {layout.name if layout else None, window.name if window else None}
    if with_checkpoint:
        said |= {Path(evaluate_pick(open_voice(voice), None)).name, _run_of(voice).name}
    return said


def test_the_latest_run_is_the_one_trained_last_not_the_last_by_name(tmp_path: Path) -> None:
    voice = create_voice(tmp_path / "ada", "Ada").path
    # started in this order; names sort the other way round
    _train(voice, "zeta", T0, [10, 20])
    _train(voice, "alpha", T0 + HOUR, [10])
    assert [r.name for r in list_runs(voice)] == ["alpha", "zeta"]
    assert pick_run(voice).name == "alpha" == _reference(voice, False)
    assert _every_caller(voice, True) == {"alpha"}


def test_resuming_an_old_run_makes_it_the_latest(tmp_path: Path) -> None:
    voice = create_voice(tmp_path / "ada", "Ada").path
    _train(voice, "run-1", T0, [10], resumed_at=T0 + 5 * HOUR)
    _train(voice, "run-2", T0 + HOUR, [10, 20])
    assert pick_run(voice).name == "run-1" == _reference(voice, False)
    assert _every_caller(voice, True) == {"run-1"}
    # ... and evaluating the other one does not (it writes evaluation/, not training files)
    other = Run(voice / "runs" / "run-2")
    other.evaluation_dir.mkdir()
    other.evaluation_file.write_text(json.dumps({"best": {"step": 20}}))
    assert other.keep_best(other.path / checkpoint_name(20)) is not None
    _at(other.path, T0 + 9 * HOUR)
    assert pick_run(voice).name == "run-1"


def test_a_run_without_checkpoints_is_latest_only_for_what_needs_none(tmp_path: Path) -> None:
    voice = create_voice(tmp_path / "ada", "Ada").path
    _train(voice, "done", T0, [10, 20])
    # crashed before its first save, and one torn mid-save: neither has a checkpoint
    _train(voice, "crashed", T0 + HOUR, [])
    _train(voice, "torn", T0 + 2 * HOUR, [], torn=[10])
    assert holds_checkpoints(voice / "runs" / "torn") and not Run(voice / "runs" / "torn"
                                                                  ).checkpoints()
    # resume and watch continue what was trained last; speak, compare, evaluate and
    # export need a checkpoint and use the newest run that has one
    assert pick_run(voice).name == "torn" == _reference(voice, False)
    assert pick_run(voice, with_checkpoint=True).name == "done" == _reference(voice, True)
    assert _every_caller(voice, False) == {"torn"}
    assert _every_caller(voice, True) == {"done"}
    # a torn checkpoint newer than a complete one is not the run's latest
    torn_later = _train(voice, "mixed", T0 + 3 * HOUR, [10], torn=[20])
    assert step_of(torn_later.latest()) == 10 and torn_later.checkpoint(20) is None
    assert pick_run(voice, with_checkpoint=True).name == "mixed"


def test_runs_active_in_the_same_instant_go_by_name(tmp_path: Path) -> None:
    voice = create_voice(tmp_path / "ada", "Ada").path
    _train(voice, "run-20260101-100000", T0, [10])
    _train(voice, "run-20260101-090000", T0, [10])
    assert pick_run(voice).name == "run-20260101-100000" == _reference(voice, False)


def test_a_folder_with_nothing_in_it_counts_from_its_own_time(tmp_path: Path) -> None:
    voice = create_voice(tmp_path / "ada", "Ada").path
    _train(voice, "old", T0, [10])
    empty = voice / "runs" / "just-created"
    empty.mkdir()
    _at(empty, T0 + HOUR)
    assert pick_run(voice).name == "just-created" == _reference(voice, False)
    _at(empty, T0 - HOUR)
    assert pick_run(voice).name == "old" == _reference(voice, False)


def test_a_named_run_and_no_run(tmp_path: Path) -> None:
    voice = create_voice(tmp_path / "ada", "Ada").path
    assert pick_run(voice) is None and pick_run(voice, with_checkpoint=True) is None
    (voice / "runs").rmdir()
    assert pick_run(voice) is None and list_runs(voice) == []
    _train(voice, "a", T0, [])
    _train(voice, "b", T0 + HOUR, [10])
    # a name wins over recency, checkpoints or not (the caller says what is missing)
    assert pick_run(voice, "a", with_checkpoint=True).name == "a"
    assert pick_run(voice, str(voice / "runs" / "a")).path == voice / "runs" / "a"
    assert pick_run(voice, "nope") is None
    # a run in a shared folder this machine cannot see: said so, not "no such run"
    (voice / "runs" / "shared").symlink_to(tmp_path / "unmounted" / "shared")
    with pytest.raises(InputError, match="cannot see"):
        pick_run(voice, "shared")


def test_checkpoints_of_a_run_linked_or_kept_in_an_object_store(tmp_path: Path) -> None:
    voice = create_voice(tmp_path / "ada", "Ada").path
    # a shared folder: listed through the link, so a checkpoint still knows its voice
    shared = tmp_path / "shared" / "ada" / "linked"
    link_run(voice / "runs" / "linked", str(shared))
    (shared / checkpoint_name(5)).mkdir()
    (shared / checkpoint_name(5) / COMPLETE).write_text("5")
    run = Run(voice / "runs" / "linked")
    assert run.checkpoints() == [voice / "runs" / "linked" / checkpoint_name(5)]
    assert Run(run.checkpoints()[0].parent).voice_dir == voice
    # an object store: Locations, found through the run folder's pointer
    uri = f"memory://vox/{tmp_path.name}/ada/remote"
    link_run(voice / "runs" / "remote", uri)
    remote = Location(uri) / checkpoint_name(7)
    remote.mkdir(parents=True, exist_ok=True)
    (remote / COMPLETE).write_text("7")
    (Location(uri) / checkpoint_name(8)).mkdir(parents=True, exist_ok=True)  # torn
    found = list_checkpoints(voice / "runs" / "remote")
    assert found == [remote] and isinstance(found[0], Location)
    assert Run(voice / "runs" / "remote").checkpoint(7) == remote
    assert {r.name for r in list_runs(voice) if r.checkpoints()} == {"linked", "remote"}


def test_a_checkpoint_by_step_name_path_or_latest(tmp_path: Path) -> None:
    voice = create_voice(tmp_path / "ada", "Ada").path
    run = _train(voice, "r", T0, [10, 20], torn=[30])
    assert [step_of(c) for c in run.checkpoints()] == [10, 20]
    assert run.find_checkpoint(None) == run.find_checkpoint("latest") == run.latest()
    assert step_of(run.find_checkpoint("10")) == 10
    assert step_of(run.find_checkpoint(checkpoint_name(10))) == 10
    assert run.find_checkpoint(str(run.path / checkpoint_name(20))) == run.checkpoint(20)
    with pytest.raises(InputError, match="Available steps: 10, 20"):
        run.find_checkpoint("30")
    assert run.base_model() == "/m/r" and run.voice_dir == voice
    assert [m["step"] for m in run.metrics()] == list(range(1, 31))
    assert [m["step"] for m in run.recent_metrics(max_bytes=100)][-1] == 30


def test_the_voice_reaches_its_runs(tmp_path: Path) -> None:
    v = create_voice(tmp_path / "ada", "Ada")
    assert v.runs_dir == v.path / "runs" and v.runs_dir.is_dir()
    assert v.run("x").path == v.runs_dir / "x" and v.runs() == []
    _train(v.path, "x", T0, [1])
    assert v.runs() == [Run(v.runs_dir / "x")]


def test_best_checkpoint_is_the_evaluations_while_it_exists(tmp_path: Path) -> None:
    run = Run(tmp_path / "run")
    for step in (10, 20):
        (run.path / checkpoint_name(step)).mkdir(parents=True)
        (run.path / checkpoint_name(step) / COMPLETE).write_text("")
    assert run.best() is None  # never evaluated
    run.evaluation_dir.mkdir()
    run.evaluation_file.write_text(json.dumps({"best": {"step": 10}}))
    assert run.best() == run.path / "checkpoint_step_0000010"
    run.evaluation_file.write_text(json.dumps({"best": {"step": 30}}))
    assert run.best() is None  # pruned (or never complete): not offered


def test_the_best_checkpoint_survives_pruning(tmp_path: Path) -> None:
    import shutil

    run = Run(tmp_path / "run")
    for step in (10, 20, 30):
        ckpt = run.path / checkpoint_name(step)
        (ckpt / "sub").mkdir(parents=True)
        (ckpt / "__0_0.distcp").write_bytes(bytes([step]) * 1000)
        (ckpt / "sub" / "trainer.json").write_text(json.dumps({"step": step}))
        (ckpt / COMPLETE).write_text("")
    run.evaluation_dir.mkdir()
    run.evaluation_file.write_text(json.dumps({"best": {"step": 10}}))
    original = run.path / "checkpoint_step_0000010"
    kept = run.keep_best(original)
    assert kept == run.path / "best" / "checkpoint_step_0000010"
    # hard links: the same bytes on disk, no copy
    assert (kept / "__0_0.distcp").stat().st_ino == (original / "__0_0.distcp").stat().st_ino
    shutil.rmtree(original)  # what training's pruning does to old checkpoints
    assert run.best() == kept
    assert (kept / "__0_0.distcp").read_bytes() == bytes([10]) * 1000
    assert json.loads((kept / "sub" / "trainer.json").read_text()) == {"step": 10}
    # a new best replaces the kept one
    run.evaluation_file.write_text(json.dumps({"best": {"step": 30}}))
    assert keep_best(run.path, run.path / "checkpoint_step_0000030") == run.path / "best" / \
        "checkpoint_step_0000030"
    assert not kept.exists() and run.best() == run.path / "checkpoint_step_0000030"
    assert keep_best(run.path, run.path / "no_such_checkpoint") is None


def _checkpoint(run: Path, step: int, size: int = 1000) -> Path:
    ckpt = run / checkpoint_name(step)
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "__0_0.distcp").write_bytes(bytes([step]) * size)
    (ckpt / "sub" / "trainer.json").write_text(json.dumps({"step": step}))
    (ckpt / COMPLETE).write_text("")
    return ckpt


def test_a_step_kept_only_as_the_best_is_found_by_every_reader(tmp_path: Path) -> None:
    """Issue 28 §2: the best (step 10) lives only under best/ once training pruned it;
    the step means that copy for export, speak, evaluate and compare alike."""
    import shutil

    from engine.layout.checkpoints import checkpoint_at, run_of

    voice = create_voice(tmp_path / "ada", "Ada").path
    run = _train(voice, "r", T0, [20, 30])
    _checkpoint(run.path, 10)
    run.evaluation_dir.mkdir()
    run.evaluation_file.write_text(json.dumps({"best": {"step": 10}}))
    kept = run.keep_best(run.path / checkpoint_name(10))
    shutil.rmtree(run.path / checkpoint_name(10))  # training's pruning
    assert kept is not None and [step_of(c) for c in run.checkpoints()] == [20, 30]
    assert run.checkpoint(10) == checkpoint_at(run.path, 10) == kept == run.best()
    assert run.find_checkpoint("10") == run.find_checkpoint(checkpoint_name(10)) == kept
    assert run.find_checkpoint(str(kept)) == kept
    assert run.steps() == [10, 20, 30]
    # a kept copy belongs to the run above best/ (speak and compare read its config there)
    assert run_of(kept) == run.path and _run_of(kept).path == run.path
    with pytest.raises(InputError, match="Available steps: 10, 20, 30") as err:
        run.find_checkpoint("40")
    assert "--" not in (err.value.window_hint or "-")
    assert run.checkpoint(40) is None


def test_a_held_checkpoint_survives_pruning_and_a_pruned_one_is_not_held(
        tmp_path: Path) -> None:
    """Issue 28 §3: the evaluation holds what it is about to measure (hard links), so
    training's pruning to the newest two does not take it away; a checkpoint no longer
    among the newest `keep` may already be half deleted, so it is not held."""
    from engine.train.checkpoint import Checkpointer

    run = Run(tmp_path / "run")
    run.path.mkdir()
    run.write_config({"run": {"keep_checkpoints": 2}})
    trainer = Checkpointer(run.path, rank=0, world_size=1, keep=2)
    _checkpoint(run.path, 1)
    held = run.hold(run.path / checkpoint_name(1))
    assert held == run.path / "held" / checkpoint_name(1)
    assert (held / "__0_0.distcp").stat().st_ino == \
        (run.path / checkpoint_name(1) / "__0_0.distcp").stat().st_ino
    for step in (2, 3):
        _checkpoint(run.path, step)
        trainer.prune()
    assert [step_of(c) for c in run.checkpoints()] == [2, 3]  # 1 is gone from the run
    assert (held / COMPLETE).is_file() and (held / "__0_0.distcp").read_bytes() == b"\x01" * 1000
    assert json.loads((held / "sub" / "trainer.json").read_text()) == {"step": 1}
    # the held copy is no checkpoint of the run: not listed, not what a step means
    assert run.checkpoint(1) is None and step_of(run.latest()) == 3
    _checkpoint(run.path, 4)  # not pruned yet, but 2 is no longer among the newest two
    assert run.hold(run.path / checkpoint_name(2)) is None
    assert not (run.path / "held" / checkpoint_name(2)).exists()
    run.release(checkpoint_name(1))
    assert not held.exists()
    assert run.hold(run.path / "no_such_checkpoint") is None
