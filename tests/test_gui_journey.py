"""The whole journey through the window, on the real engine and the tiny model.

Create a voice, record takes through the real sound device (speech played
into a PulseAudio null sink), import files, prepare, train two CPU workers on
a local Ray cluster while the charts update, stop, resume, kill a worker and
watch the recovery, export, speak and play.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from engine import catalog
from engine.layout.checkpoints import step_of
from gui.app import MainWindow
from gui.pages.importer import ImportPage
from gui.pages.listen import ListenPage
from gui.pages.prepare import PreparePage
from gui.pages.record import RecordPage
from gui.pages.train import TrainPage
from gui.pages.voices import VoicesPage
from tests.helpers.load import busy_cores
from tests.helpers.recording import record_prompt

pytestmark = [pytest.mark.slow, pytest.mark.own_cluster]  # the window's run starts its own


def _points(curve) -> int:
    x = curve.getData()[0]
    return 0 if x is None else len(x)


def _new_voice(qtbot, window: MainWindow) -> Path:
    """1. A new voice, from the Voices page's dialog."""
    voices = window.show_page(VoicesPage)
    assert isinstance(voices, VoicesPage)
    dlg = voices.new_voice()
    dlg.speaker.setText("Journey")
    with qtbot.waitSignal(window.ctx.voice_changed, timeout=30000):
        dlg.buttons.button(dlg.buttons.StandardButton.Ok).click()
    voice = window.ctx.voice
    assert voice is not None and (voice / "voice.toml").is_file()
    return voice


def _record_import_prepare(qtbot, window: MainWindow, voice: Path, sink, piper_synth,
                           piper_sentences, tmp_path: Path) -> None:
    """2-4. Two takes recorded through the real device, every core busy as on a loaded CI
    machine (the input then begins seconds after Space: the reader waits for "speak
    now"); eight files imported with their transcripts; prepared."""
    ctx = window.ctx
    record = window.show_page(RecordPage)
    assert isinstance(record, RecordPage)
    qtbot.waitUntil(window.isActiveWindow, timeout=5000)
    with busy_cores():
        for _ in range(2):
            record_prompt(qtbot, record, sink, tmp_path, piper_synth)
    assert len(list((voice / "takes").glob("*.json"))) == 2
    importer = window.show_page(ImportPage)
    assert isinstance(importer, ImportPage)
    with qtbot.waitSignal(ctx.data_changed, timeout=60000):
        job = importer.import_paths([s["path"] for s in piper_sentences[:8]])
    assert job is not None and job.outcome == "succeeded"
    # the table refills from the background reader
    qtbot.waitUntil(lambda: importer.model.rowCount() == 10, timeout=30000)
    prepare = window.show_page(PreparePage)
    assert isinstance(prepare, PreparePage)
    with qtbot.waitSignal(ctx.data_changed, timeout=180000):
        job = prepare.run()
    assert job is not None and job.outcome == "succeeded", job.error
    report = catalog.quality_report(voice)
    assert report is not None and report["totals"]["usable_clips"] >= 8


def _train_and_stop(qtbot, train: TrainPage, voice: Path, tiny_model_dir: Path) -> int:
    """5. Two CPU workers train while the charts update; stopped once the first periodic
    checkpoint is saved. The step it stopped at."""
    train.base.setEditText(str(tiny_model_dir))
    train.workers.setValue(2)
    train.steps.setValue(12)
    train.ckpt_every.setValue(4)
    job = train.start()
    assert job is not None
    # a live run: the form is locked (its settings were fixed at the start) and the run
    # picker shows the run the engine names (issue 19)
    assert not train.steps.isEnabled() and not train.base.isEnabled()
    qtbot.waitUntil(lambda: train.run.run_dir is not None
                    and train.run_picker.currentData() == str(train.run.run_dir),
                    timeout=400000)
    states: list[str] = []
    job.state.connect(lambda s, _d: states.append(s))
    # live metrics reach the charts (not only the store)
    qtbot.waitUntil(lambda: train.store.series.get("loss/train") is not None
                    and train.store.series["loss/train"].count >= 2
                    and _points(train._curves["loss/train"]) >= 1,
                    timeout=400000)
    assert any(n.startswith("memory/") for n in train.store.series)
    # stop once the first periodic checkpoint is saved (resume needs one either way);
    # waiting on the engine's event, not polling the disk inside the measured window
    qtbot.waitUntil(lambda: "checkpoint" in states, timeout=400000)
    with qtbot.waitSignal(job.finished, timeout=180000):
        train.stop()
    qtbot.waitUntil(lambda: not train.redraw_timer.isActive(), timeout=10000)
    assert job.outcome == "cancelled", job.error
    assert train.state_label.text().startswith("Stopped")
    runs = catalog.list_runs(voice)
    assert runs and runs[-1].checkpoints
    assert train.resume_btn.isEnabled()
    assert train.steps.isEnabled()
    return step_of(runs[-1].checkpoints[-1]) or 0


def _resume_through_a_killed_worker(qtbot, train: TrainPage, voice: Path,
                                    stopped_at: int) -> None:
    """Resume; kill -9 one Ray worker mid-run: the page shows the recovery, the run goes
    on to its last step."""
    run_name = catalog.list_runs(voice)[-1].name
    job = train.start(resume=True)
    assert job is not None
    # Resume acted on the run on screen, and its curve keeps the steps before the resume
    assert job.args[job.args.index("--run") + 1] == run_name
    assert "--base" not in job.args  # the run's own, the engine's rule (resume_base)
    qtbot.waitUntil(lambda: train._history is None, timeout=60000)  # read in slices
    assert train.store.series["loss/train"].data()[0].min() <= 1
    qtbot.waitUntil(lambda: "1" in train.worker_pids and train.store.last_step > stopped_at,
                    timeout=400000)
    os.kill(train.worker_pids["1"], signal.SIGKILL)
    qtbot.waitUntil(lambda: train.state_label.text().startswith(
        "Recovering from a failed worker"), timeout=300000)
    with qtbot.waitSignal(job.finished, timeout=600000):
        pass
    assert job.outcome == "succeeded", job.error
    assert train.state_label.text() == "Finished"
    last = catalog.list_runs(voice)[-1]
    assert step_of(last.checkpoints[-1]) == 12 > stopped_at


def _speak_and_play(qtbot, window: MainWindow) -> None:
    """7. Speak with the exported model; it plays as it is generated."""
    ctx = window.ctx
    listen = window.show_page(ListenPage)
    assert isinstance(listen, ListenPage)
    assert listen.source.itemText(0).startswith("Exported:")
    listen.source.setCurrentIndex(0)
    failures: list[tuple] = []
    listen.speech.failed.connect(lambda *a: failures.append(a))
    partials: list[str] = []
    listen.speech.partial.connect(lambda _rid, path: partials.append(path))
    with qtbot.waitSignal(ctx.player.started, timeout=300000):
        rid = listen.speak("Hello from the cloned voice.")
        assert rid is not None
    assert not failures
    # it played as it was generated: the file was announced while still growing
    qtbot.waitUntil(lambda: listen.request is None, timeout=300000)
    assert partials and Path(partials[0]) == listen.last_render
    assert listen.last_render is not None and listen.last_render.is_file()
    qtbot.waitUntil(lambda: listen.history.rowCount() == 1, timeout=30000)  # re-read off-thread
    if ctx.player.playing:  # a short render may have played to its end already
        with qtbot.waitSignal(ctx.player.finished, timeout=60000):
            listen.stop()


def test_clone_a_voice_end_to_end(qtbot, sink, window: MainWindow, workspace: Path,
                                  piper_synth, piper_sentences, tiny_model_dir: Path,
                                  tmp_path: Path) -> None:
    voice = _new_voice(qtbot, window)
    _record_import_prepare(qtbot, window, voice, sink, piper_synth, piper_sentences, tmp_path)
    train = window.show_page(TrainPage)
    assert isinstance(train, TrainPage)
    stopped_at = _train_and_stop(qtbot, train, voice, tiny_model_dir)
    _resume_through_a_killed_worker(qtbot, train, voice, stopped_at)
    # 6. export, to the folder the dialog offers
    with qtbot.waitSignal(window.ctx.data_changed, timeout=300000):
        job = train.export(voice / "exports" / "journey")
    assert job is not None and job.outcome == "succeeded", job.error
    exports = catalog.list_exports(voice)
    assert exports and json.loads((exports[0].path / "config.json").read_text())
    _speak_and_play(qtbot, window)
