"""Issue 19, through the window: every action uses the run on screen, nothing changes by
accident, the controls stay in reach, and a run's evaluation shows for the run picked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import QObject, QPoint, QPointF, Qt, QUrl, Slot
from PySide6.QtGui import QDesktopServices, QWheelEvent
from PySide6.QtWidgets import QApplication

from engine.config.train import TrainConfig
from engine.core.atomic import write_json
from gui.app import MainWindow
from gui.pages.train import TrainPage
from tests.helpers.processes import flood_program
from tests.helpers.voices import copy_voice


def _write_run(voice: Path, name: str, base: str, lr: float, every: int) -> Path:
    run = voice / "runs" / name
    run.mkdir(parents=True)
    cfg = TrainConfig()
    cfg.run.steps, cfg.optim.lr, cfg.run.checkpoint_every = 120, lr, every
    cfg.model.base = base
    write_json(run / "config.json", cfg.to_dict())
    with (run / "metrics.jsonl").open("w") as fh:
        for s in range(1, 31):
            fh.write(json.dumps({"kind": "train", "step": s, "rank": 0,
                                 "loss/train": 9 - s / 10, "total_steps": 120}) + "\n")
    (run / "checkpoint_step_0000030").mkdir()
    (run / "checkpoint_step_0000030" / "COMPLETE").write_text("")
    return run


def _wheel(widget, up: bool = True) -> None:
    pos = QPointF(widget.width() / 2, widget.height() / 2)
    ev = QWheelEvent(pos, widget.mapToGlobal(pos), QPoint(0, 0), QPoint(0, 120 if up else -120),
                     Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier,
                     Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(widget, ev)


def test_the_form_resume_and_export_follow_the_run_on_screen(
        qtbot, window: MainWindow, voice: Path) -> None:
    _write_run(voice, "2026-01-01_a", "/models/old-0.6B", 3e-5, 10)
    _write_run(voice, "2026-01-02_b", "/models/new-1.7B", 1e-5, 15)
    # the app (re)opens on the voice: the form shows the latest run's own settings
    window.resize(1100, 760)
    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    qtbot.waitUntil(lambda: page._history is None and page.store.last_step == 30,
                    timeout=10000)
    assert page.base.currentText() == "/models/new-1.7B"
    assert page.ckpt_every.value() == 15 and page.lr.text() == "1.0e-05"
    assert page.preset.currentText() == "Custom"
    args = page.train_args(resume=True)
    assert args[args.index("--run") + 1] == "2026-01-02_b"
    assert "--base" not in args  # a resume trains on the run's own base (the engine's rule)
    assert "2026-01-02_b" in page.settings.run_note.text()
    # picking the older run: Resume acts on it, with its own base
    i = page.run_picker.findData(str(voice / "runs" / "2026-01-01_a"))
    page.run_picker.setCurrentIndex(i)
    page.run_picker.activated.emit(i)
    qtbot.waitUntil(lambda: page._history is None, timeout=10000)
    args = page.train_args(resume=True)
    assert args[args.index("--run") + 1] == "2026-01-01_a"
    assert page.base.currentText() == "/models/old-0.6B" and "--base" not in args
    assert f"{float(args[args.index('--lr') + 1]):.1e}" == "3.0e-05"
    # a preset, then an edit: the preset says "Custom"
    page.preset.setCurrentIndex(1)
    assert page.preset.currentText() != "Custom"
    page.steps.setValue(777)
    assert page.preset.currentText() == "Custom" and page.steps.value() == 777
    # the wheel over an unfocused input scrolls the form, never the value
    page.ckpt_every.setValue(10)
    page.start_btn.setFocus()
    _wheel(page.ckpt_every)
    _wheel(page.settings.trainable, up=False)
    assert page.ckpt_every.value() == 10 and page.settings.trainable.currentIndex() == 0
    page.ckpt_every.setFocus()
    _wheel(page.ckpt_every)
    assert page.ckpt_every.value() == 11  # focused: the wheel is the user's choice
    # no GPU here: the memory chart says what it shows before the first figure
    assert page.charts.mem_plot.titleLabel.text == "Memory per worker (process RSS)"


def test_a_live_run_locks_the_form_and_stop_reflows_nothing(
        qtbot, window: MainWindow, voice: Path) -> None:
    run = _write_run(voice, "2026-01-03_c", "/models/tiny", 1e-5, 10)
    _write_run(voice, "2026-01-04_d", "/models/other", 1e-5, 10)
    window.resize(1100, 760)
    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    s = page.settings
    # the run controls are in view at 1100x760, whatever the form's scroll
    s.scroll.verticalScrollBar().setValue(0)
    qtbot.wait(50)
    for b in (page.start_btn, page.resume_btn, page.stop_btn, page.export_btn,
              page.evaluate_btn, page.report_btn):
        rect = b.rect().translated(b.mapTo(window, QPoint(0, 0)))
        assert window.rect().contains(rect), b.text()
        assert b.width() >= b.minimumSizeHint().width(), b.text()
    job = page.start(program=flood_program(0, forever=True, run=str(run), stop_s=1.0))
    assert job is not None
    # the picker follows the live run (not the newest folder on disk)
    qtbot.waitUntil(lambda: page.run_picker.currentData() == str(run), timeout=30000)
    assert not page.run_picker.isEnabled()
    assert all(not box.isEnabled() for box in s.boxes)
    assert not page.steps.isEnabled() and not page.base.isEnabled()
    widths = (page.stop_btn.width(), s.scroll.viewport().width())
    page.stop()
    qtbot.wait(50)
    assert page.stop_btn.text() == "Force stop"
    assert (page.stop_btn.width(), s.scroll.viewport().width()) == widths
    assert page.stop_btn.width() >= page.stop_btn.sizeHint().width()
    with qtbot.waitSignal(job.finished, timeout=60000):
        pass
    assert all(box.isEnabled() for box in s.boxes)


class _Opened(QObject):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[QUrl] = []

    @Slot(QUrl)
    def open(self, url: QUrl) -> None:
        self.urls.append(url)


def _opened_by(qtbot, button) -> list[Path]:
    """The files a click on `button` asked the desktop to open (none is opened)."""
    opened = _Opened()
    QDesktopServices.setUrlHandler("file", opened, "open")
    try:
        qtbot.mouseClick(button, Qt.MouseButton.LeftButton)
    finally:
        QDesktopServices.unsetUrlHandler("file")
    return [Path(u.toLocalFile()) for u in opened.urls]


def _evaluate_now(qtbot, page: TrainPage, voice: Path) -> dict:
    """`Evaluate now` on the picked run (short: one sentence, few frames, the offline
    recogniser); its evaluation in the quality chart and in words. The evaluation."""
    page.evaluate_extra_args = ["--asr", "pocketsphinx", "--max-frames", "10", "--sentences",
                                "Hello there.", "--device", "cpu"]
    qtbot.mouseClick(page.evaluate_btn, Qt.MouseButton.LeftButton)
    job = page.evaluate_job
    assert job is not None and not page.evaluate_btn.isEnabled()
    with qtbot.waitSignal(job.finished, timeout=300000):
        pass
    assert job.outcome == "succeeded", job.error
    data = json.loads((voice / "runs" / "r1" / "evaluation" / "evaluation.json").read_text())
    sim = page.store.series["quality/similarity"].data()
    assert list(sim[0]) == [10.0, 20.0]
    assert [round(v, 4) for v in sim[1]] == [e["mean"]["similarity"] for e in data["entries"]
                                             if e["kind"] == "checkpoint"]
    assert page.eval_note.isVisible()
    assert f"best {data['best']['label']}" in page.eval_note.text()
    assert page.report_btn.isEnabled()
    return data


def _export_best(qtbot, window: MainWindow, page: TrainPage, voice: Path, workspace: Path,
                 best: int) -> None:
    """Export asks where (the voice's exports/ is offered, named after the evaluation's
    best checkpoint), then says where and how to use it; Open folder keeps it on screen."""
    assert page.export() is None
    dlg = page.export_dialog
    assert Path(dlg.selectedFiles()[0]) == voice / "exports" / f"r1-step{best}"
    dlg.selectFile(str(workspace / "joe-model"))
    with qtbot.waitSignal(window.ctx.data_changed, timeout=300000):
        dlg.accept()
    assert page.export_job is None
    box = page.export_box
    assert box.isVisible() and str(workspace / "joe-model") in box.label.text()
    how = box.howto.toPlainText()
    assert "Exported: joe-model" in how and "voxshard-engine speak" in how
    assert "from_pretrained" in how and 'speaker="joe"' in how and "serve" in how
    assert (workspace / "joe-model" / "config.json").is_file()
    open_btn = next(b for b in box.button_box.buttons() if b.text() == "Open folder")
    assert _opened_by(qtbot, open_btn) == [workspace / "joe-model"]
    assert box.isVisible()  # Open folder leaves the how-to on screen
    box.close()


@pytest.mark.slow
def test_evaluate_now_export_and_the_evaluation_of_any_picked_run(
        qtbot, ctx, settings, trained_run: dict, tiny_model_dir: Path,
        workspace: Path) -> None:
    """The real engine: `Evaluate now` runs `voxshard-engine evaluate` on the picked run;
    its evaluation.json shows in the quality chart and in words, and again when the app
    opens the next time; `Open report` opens the run's report.html."""
    voice = copy_voice(trained_run["voice"], workspace / "joe")
    window = MainWindow(ctx)
    qtbot.addWidget(window)
    window.show()
    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    qtbot.waitUntil(lambda: page.selected_run() is not None, timeout=10000)
    assert page.selected_run().name == "r1" and page.evaluate_btn.isEnabled()
    assert not page.report_btn.isEnabled() and not page.eval_note.isVisible()
    data = _evaluate_now(qtbot, page, voice)
    assert _opened_by(qtbot, page.report_btn) == [
        voice / "runs" / "r1" / "evaluation" / "report.html"]
    # the memory plan in the page's words, not option names: the engine's own dry run
    # (in this process: the `plan` job's result is this dict; a second engine process
    # would cost the suite 15 s more)
    from engine.train.driver import train

    result = train(voice, str(tiny_model_dir), workers=1, dry_run=True)
    page._plan_done(result)
    note = page.plan_note.text()
    assert page.plan_note.isVisible() and note.startswith("Memory plan: Each CPU worker needs")
    assert "--" not in note and ("it fits." in note or "it does not fit." in note)
    _export_best(qtbot, window, page, voice, workspace, data["best"]["step"])
    window.shutdown()
    # the next start of the app shows the run's evaluation without evaluating again
    from gui.context import AppContext

    again = MainWindow(AppContext(settings))
    qtbot.addWidget(again)
    again.show()
    again.ctx.set_voice(voice)
    page = again.show_page(TrainPage)
    qtbot.waitUntil(lambda: "quality/similarity" in page.store.series, timeout=10000)
    assert page.eval_note.isVisible() and page.report_btn.isEnabled()
    again.shutdown()
    again.ctx.jobs.shutdown(10000)


@pytest.mark.parametrize("network", ["hub offline", "no route to the hub"])
def test_offline_download_is_one_sentence_with_what_to_do(
        qtbot, window: MainWindow, voice: Path, monkeypatch: pytest.MonkeyPatch,
        network: str) -> None:
    """The real engine's `model download` with no network: the hub switched off (as a
    machine set up for offline use), or on but unreachable (the hub client's own
    connection error, which the window showed with "run the same command again"):
    one sentence in the window's words."""
    if network == "hub offline":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("HF_HOME", str(voice / "no-cache"))  # nothing cached
    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    page.base.setEditText("Qwen/Qwen3-TTS-12Hz-1.7B-Base")
    job = page.download()
    assert job is not None
    with qtbot.waitSignal(job.finished, timeout=60000):
        pass
    assert job.outcome == "failed"
    # the engine's sentence, with its remedy in the window's words
    assert page.model_note.text() == (
        "Model Qwen/Qwen3-TTS-12Hz-1.7B-Base is not on this machine and downloading is off. "
        "Choose a local folder." if network == "hub offline" else
        "Qwen3-TTS 1.7B is not downloaded and there is no internet connection. Choose a "
        "local folder, or connect to the internet and press Download again (it resumes).")
    assert job.error is not None and "command" not in " ".join(job.error)


RAY_GONE = r'''
import sys
from engine.cli.output import JsonOutput
from engine.core.events import Emitter
Emitter(JsonOutput(sys.stdout).handle).state("training", detail="step 3")
sys.stdout.flush()
# what Ray 2.x printed when another program stopped every Ray process under the run
sys.stderr.write("[2026-11-30 14:02:11,201 C 4242 4242] gcs_rpc_client.h:179: Failed to "
                 "connect to GCS within 60 seconds. GCS may have been killed. It's either GCS "
                 "is terminated by `ray stop` or is killed unexpectedly.\n")
sys.exit(1)
'''


def test_a_dead_ray_cluster_is_said_in_one_sentence_with_resume(
        qtbot, window: MainWindow, voice: Path) -> None:
    import sys

    run = _write_run(voice, "2026-01-05_e", "/models/tiny", 1e-5, 10)
    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    job = page.start(program=[sys.executable, "-c", RAY_GONE])
    assert job is not None
    with qtbot.waitSignal(job.finished, timeout=60000):
        pass
    assert job.outcome == "failed" and job.error is not None
    assert job.error[1] == ("The local Ray cluster's control process stopped during the run "
                            "(another program may have stopped Ray).")
    assert job.error[2] == "Press Resume to continue from the last checkpoint."
    assert "without saying why" not in page.log.toPlainText()
    assert page.resume_btn.isEnabled() and page.selected_run().path == run


@pytest.mark.parametrize("fmt,head", [("mp3", None), ("opus", b"OggS"), ("flac", b"fLaC")])
def test_save_as_writes_the_chosen_format_with_its_suffix(
        qtbot, window: MainWindow, voice: Path, tmp_path: Path, fmt: str,
        head: bytes | None) -> None:
    import numpy as np
    import soundfile as sf

    from gui.pages.listen import SAVE_FILTERS, ListenPage

    window.ctx.set_voice(voice)
    page = window.show_page(ListenPage)
    assert isinstance(page, ListenPage)
    render = tmp_path / "render.wav"
    t = np.arange(24000) / 24000
    sf.write(str(render), (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), 24000)
    page.last_render = render
    page.save_as()
    dlg = page.save_dialog
    assert SAVE_FILTERS[fmt] in dlg.nameFilters() and len(dlg.nameFilters()) == 4
    dlg.setDirectory(str(tmp_path))
    dlg.selectNameFilter(SAVE_FILTERS[fmt])
    dlg.selectFile(str(tmp_path / "hello"))
    dlg.accept()
    out = tmp_path / f"hello.{fmt}"
    qtbot.waitUntil(out.is_file, timeout=10000)
    data = out.read_bytes()
    assert data[:4] != b"RIFF"
    if head is not None:
        assert data[:4] == head
    else:
        assert data[:3] == b"ID3" or data[0] == 0xFF  # an MPEG frame or its tag
    info = sf.info(str(out))
    assert abs(info.duration - 1.0) < 0.1  # codec padding, not a different clip


def test_listen_reference_sampling_and_the_checkpoints_to_compare(
        qtbot, window: MainWindow, workspace: Path, prepared_voice: Path) -> None:
    from engine.cli.main import build_parser
    from engine.config.speak import SpeakOptions
    from gui.pages.listen import ListenPage

    voice = copy_voice(prepared_voice, workspace / "joe")
    run = _write_run(voice, "2026-01-06_f", "/models/tiny-0.6B", 1e-5, 10)
    for step in (10, 20):
        (run / f"checkpoint_step_{step:07d}").mkdir()
        (run / f"checkpoint_step_{step:07d}" / "COMPLETE").write_text("")
    window.ctx.set_voice(voice)
    page = window.show_page(ListenPage)
    assert isinstance(page, ListenPage)
    qtbot.waitUntil(lambda: page.reference.count() > 0 and page.compare_pick.count() == 3,
                    timeout=10000)
    # Base is the voice's own (its run trained /models/tiny-0.6B), not a 1.7B download
    assert page.base.currentText() == "/models/tiny-0.6B"
    # the reference clip: the best one by default, any prepared clip by choice
    page.source.setCurrentIndex(page.source.count() - 1)  # zero-shot preview
    assert page.reference.count() >= 8
    page.reference.setCurrentIndex(page.reference.count() - 1)
    chosen = page.reference.currentData()
    assert page.voice_spec()["reference"] == chosen and Path(chosen).is_file()
    # sampling: only what the user set, in the engine's own option names
    assert page.sampling() == {}
    page.temperature.setValue(0.7)
    page.top_k.setValue(30)
    page.seed.setValue(1234)
    opts = SpeakOptions.from_dict(page.sampling())
    assert (opts.temperature, opts.top_k, opts.seed) == (0.7, 30, 1234)
    # Compare: the ticked checkpoints only
    page.compare_pick.item(1).setCheckState(Qt.CheckState.Unchecked)  # step 20
    job = page.compare()
    assert job is not None
    args = build_parser().parse_args(job.args)
    assert args.checkpoints == ["10", "30"]
    with qtbot.waitSignal(job.finished, timeout=60000):
        job.cancel()


def test_new_voice_with_an_empty_name_stays_open_and_says_why(qtbot, window: MainWindow) -> None:
    from PySide6.QtWidgets import QDialogButtonBox

    from gui.pages.voices import VoicesPage

    page = window.show_page(VoicesPage)
    assert isinstance(page, VoicesPage)
    dlg = page.new_voice()
    assert dlg is not None
    qtbot.waitExposed(dlg)
    dlg.speaker.setText("   ")
    qtbot.mouseClick(dlg.buttons.button(QDialogButtonBox.StandardButton.Ok),
                     Qt.MouseButton.LeftButton)
    assert dlg.isVisible() and dlg.reason.isVisible()
    assert "Type the speaker's name" in dlg.reason.text()
    dlg.speaker.setText("Ada")
    qtbot.mouseClick(dlg.buttons.button(QDialogButtonBox.StandardButton.Ok),
                     Qt.MouseButton.LeftButton)
    assert not dlg.isVisible()
    qtbot.waitUntil(lambda: window.ctx.voice is not None and window.ctx.voice.name == "Ada",
                    timeout=30000)


def test_import_f2_space_and_the_speech_engine_is_not_a_users_job(
        qtbot, pulse, window: MainWindow, workspace: Path, prepared_voice: Path) -> None:
    from PySide6.QtWidgets import QAbstractItemView

    from gui.pages.importer import ImportPage

    voice = copy_voice(prepared_voice, workspace / "joe")
    window.ctx.set_voice(voice)
    page = window.show_page(ImportPage)
    assert isinstance(page, ImportPage)
    qtbot.waitUntil(lambda: page.proxy.rowCount() > 0, timeout=10000)
    page.table.setFocus()
    page.table.setCurrentIndex(page.proxy.index(0, 1))  # the Take cell
    qtbot.keyClick(page.table, Qt.Key.Key_F2)
    assert page.table.state() == QAbstractItemView.State.EditingState
    assert page.table.currentIndex().column() == 4  # the transcript, from any cell
    qtbot.keyClick(page.table.focusWidget(), Qt.Key.Key_Escape)
    page.table.setFocus()
    qtbot.keyClick(page.table, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: window.ctx.player.playing, timeout=10000)
    take = page.selected_take()
    assert page.count_label.text() == f"▶ Playing {take.id} (Space stops it)"
    assert page.play_btn.text() == "Stop"
    qtbot.keyClick(page.table, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: not window.ctx.player.playing, timeout=10000)
    assert page.play_btn.text() == "Play" and "Playing" not in page.count_label.text()
    # the warm speech engine (a real serve-speech process) is the window's, not a job
    job = window.ctx.speech._ensure()
    qtbot.waitUntil(job.is_running, timeout=30000)
    assert job in window.ctx.jobs.running()
    assert window.jobs_panel.user_jobs() == [] and not window.jobs_panel.isVisible()
