"""Issue 28 §5 and §6 on the Train page: what the page says is true.

- A stop says "Stopping" until the engine process has ended, whoever asked for it (the
  Stop button, the status bar, Quit), even after the workers reported their last step;
  the ETA stops with the run.
- A run trained to its end cannot be resumed from the page, and the engine refuses such
  a resume in one sentence before starting Ray.
- A base folder that is not a model is refused when picked; a start that fails before it
  names a run leaves the run on screen as it was.
- One number for one fact: the run selector, the step card and elapsed come from the run's
  folder (engine.layout.run.ProgressReader), live and after a restart alike; elapsed adds
  up the first start and every resume.
- At the smallest window every chart tab is in reach, the selector's text fits it, and a
  long state stays on one line.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from PySide6.QtWidgets import QStyle, QStyleOptionComboBox

from engine.config.train import TrainConfig
from engine.core.atomic import write_json
from engine.layout.run import Run
from gui.app import MainWindow
from gui.pages.train import TrainPage
from gui.placement import MINIMUM_SIZE
from gui.theme import ThemeManager
from gui.widgets import fmt_duration
from tests.helpers.processes import flood_program
from tests.helpers.voices import copy_voice

ROOT = Path(__file__).resolve().parents[1]


def _page(window: MainWindow, voice: Path) -> TrainPage:
    window.ctx.set_voice(voice)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    return page


def _run_on_disk(voice: Path, name: str, starts: list[tuple[int, int]], total: int) -> Path:
    """A run trained in `starts` (first step, last step), 2 s a step; each start's first
    record carries a 10 s model build, as the trainer writes it."""
    run = voice / "runs" / name
    run.mkdir(parents=True)
    cfg = TrainConfig()
    cfg.run.steps, cfg.model.base = total, "/models/tiny"
    write_json(run / "config.json", cfg.to_dict())
    t = 1.7e9
    with (run / "metrics.jsonl").open("w") as fh:
        for first, last in starts:
            t += 3600.0  # an hour between a stop and its resume: not training time
            for s in range(first, last + 1):
                lead = {"perf/build_s": 10.0, "perf/step_s": 2.0} if s == first else {}
                fh.write(json.dumps({"kind": "train", "step": s, "rank": 0, "time": t,
                                     "loss/train": 9 - s / 100, "total_steps": total,
                                     **lead}) + "\n")
                t += 2.0
    last = starts[-1][1]
    (run / f"checkpoint_step_{last:07d}").mkdir()
    (run / f"checkpoint_step_{last:07d}" / "COMPLETE").write_text("")
    return run


def test_a_stop_says_stopping_until_the_engine_has_stopped(qtbot, window: MainWindow,
                                                           voice: Path) -> None:
    page = _page(window, voice)
    page.steps.setValue(100000)
    job = page.start(program=flood_program(0, forever=True, stop_s=3.0))
    assert job is not None
    qtbot.waitUntil(lambda: page.store.last_step > 50 and page.run.eta_s() is not None,
                    timeout=30000)
    # the way Quit stops every job (the status bar's Cancel is the same call)
    window.ctx.jobs.stop_all()
    assert page.stop_btn.text() == "Force stop"
    assert page.state_label.text().startswith("Stopping")
    assert "Training (stopping)" in window.jobs_panel.text()
    # the workers' last word arrives; the engine still shuts the cluster down
    qtbot.waitUntil(lambda: "step" in page.state_label.text(), timeout=30000)
    assert job.is_running()
    assert page.state_label.text().startswith("Stopping: step "), page.state_label.text()
    assert page.run.eta_s() is None
    page.redraw()
    assert "left" not in page.stats.progress.format()
    with qtbot.waitSignal(job.finished, timeout=30000):
        pass
    assert page.state_label.text() == "Stopped" and page.stop_btn.text() == "Stop"


def test_worker_placement_is_logged_in_words(qtbot, window: MainWindow, voice: Path) -> None:
    page = _page(window, voice)
    job = page.start(program=flood_program(40, ranks=2))
    assert job is not None
    with qtbot.waitSignal(job.finished, timeout=30000):
        pass
    log = page.log.toPlainText()
    assert "Worker 1 runs on " in log and "Worker node" not in log


def test_a_finished_run_cannot_be_resumed(qtbot, window: MainWindow, workspace: Path,
                                          trained_run: dict, tiny_model_dir: Path) -> None:
    voice = copy_voice(trained_run["voice"], workspace / "joe")
    page = _page(window, voice)
    qtbot.waitUntil(lambda: page._history is None and page.selected_run() is not None,
                    timeout=10000)
    assert page.stat_labels["step"].text() == "20 / 20"
    assert not page.resume_btn.isEnabled()
    assert "trained all its 20 steps" in page.settings.run_note.text()
    page.steps.setValue(30)  # more steps: now there is something to resume
    assert page.resume_btn.isEnabled()
    page.steps.setValue(20)
    assert not page.resume_btn.isEnabled()
    # the engine: one sentence, before any cluster starts
    proc = subprocess.run(
        [sys.executable, "-m", "engine.cli.main", "--json", "train", str(voice), "--base",
         str(tiny_model_dir), "--resume", "--run", "r1", "--steps", "20"],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    events = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert proc.returncode == 1, events[-3:]
    assert events[-1]["event"] == "error"
    assert "already trained all its 20 steps" in events[-1]["message"]
    assert not any(e.get("state") == "starting_cluster" for e in events)


def test_a_bad_base_is_refused_when_picked_and_a_failed_start_keeps_the_run(
        qtbot, window: MainWindow, voice: Path, tmp_path: Path) -> None:
    run = _run_on_disk(voice, "2026-01-01_done", [(1, 40)], total=40)
    page = _page(window, voice)
    qtbot.waitUntil(lambda: page._history is None and page.store.last_step == 40,
                    timeout=10000)

    def screen() -> tuple:
        return (page.run_picker.currentData(), page.stat_labels["step"].text(),
                page.stat_labels["elapsed"].text(), page.stat_labels["loss"].text(),
                len(page.charts.curves["loss/train"].getData()[0]))

    before = screen()
    assert before == (str(run), "40 / 40", "1:30", "8.6000", 40)
    empty = tmp_path / "empty-model"
    empty.mkdir()
    # the folder picker refuses it at once and says why; the form keeps its model
    assert not page.settings.pick_base(str(empty))
    assert page.base.currentText() == "/models/tiny"
    assert "is not a model folder" in page.model_note.text()
    # typed in instead: Start refuses it, nothing starts, nothing on screen changes
    page.base.setEditText(str(empty))
    assert page.start() is None and page.job is None
    assert page.state_label.text().startswith("Not started: ")
    assert screen() == before
    # a start the engine refuses before it names a run (a hub model, offline, not
    # downloaded): the run shown before is shown again, as it was
    page.base.setEditText("Qwen/Qwen3-TTS-12Hz-0.6B-Base")
    job = page.start(env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert job is not None
    with qtbot.waitSignal(job.finished, timeout=120000):
        pass
    assert job.outcome == "failed"
    qtbot.waitUntil(lambda: page._history is None, timeout=10000)
    page.redraw()
    assert page.state_label.text().startswith("Not started: "), page.state_label.text()
    assert screen() == before


def test_selector_cards_and_elapsed_say_one_number(qtbot, window: MainWindow,
                                                  voice: Path, ctx) -> None:
    page = _page(window, voice)
    page.steps.setValue(400)
    run = voice / "runs" / "2026-02-01_live"
    run.mkdir(parents=True)
    cfg = TrainConfig()
    cfg.run.steps = 400
    write_json(run / "config.json", cfg.to_dict())
    job = page.start(program=flood_program(400, ranks=1, rate=100, run=str(run),
                                           build_s=30.0, first_step=1))
    assert job is not None
    # the first run is starting: the selector says so (it said "No runs yet")
    assert page.run_picker.currentText() == "New run (starting…)"
    assert page.settings.run_note.text() == "A new run is starting…"
    qtbot.waitUntil(lambda: page.store.last_step >= 150, timeout=60000)
    # live: the selector names the step the card shows (it said "step 0/400")
    page.redraw()
    card = page.stat_labels["step"].text()
    step = card.split(" / ")[0]
    assert f"(step {step}/400" in page.run_picker.currentText(), (card,
                                                                  page.run_picker.currentText())
    with qtbot.waitSignal(job.finished, timeout=60000):
        pass
    qtbot.waitUntil(lambda: not page.redraw_timer.isActive(), timeout=10000)
    # the model's 30 s build counts, as it does for the run read back
    on_disk = Run(run).progress()
    assert on_disk.elapsed_s is not None and on_disk.elapsed_s >= 30.0
    assert page.stat_labels["elapsed"].text() == fmt_duration(on_disk.elapsed_s)
    assert "(step 400/400" in page.run_picker.currentText()
    # the same run after a restart: the same figures
    window2 = MainWindow(ctx)
    qtbot.addWidget(window2)
    try:
        again = _page(window2, voice)
        qtbot.waitUntil(lambda: again._history is None and again.store.last_step == 400,
                        timeout=10000)
        for key in ("step", "elapsed"):
            assert again.stat_labels[key].text() == page.stat_labels[key].text(), key
        assert again.run_picker.currentText() == page.run_picker.currentText()
    finally:
        window2.shutdown()


def test_elapsed_adds_up_every_start_and_goes_on_at_a_resume(qtbot, window: MainWindow,
                                                              voice: Path) -> None:
    # trained 1-50, stopped, resumed 51-80: two builds of 10 s, 2 s a step
    run = _run_on_disk(voice, "2026-01-02_resumed", [(1, 50), (51, 80)], total=200)
    page = _page(window, voice)
    qtbot.waitUntil(lambda: page._history is None and page.store.last_step == 80,
                    timeout=10000)
    # (49 * 2 + 12) + (29 * 2 + 12): the hour between them is not training
    assert page.stat_labels["elapsed"].text() == fmt_duration(180.0) == "3:00"
    assert Run(run).progress().elapsed_s == 180.0
    # a resume goes on from 3:00 (it restarted at 0:03)
    job = page.start(resume=True, program=flood_program(0, forever=True, ranks=1, rate=50,
                                                        run=str(run), first_step=81))
    assert job is not None
    qtbot.waitUntil(lambda: page.store.last_step >= 100, timeout=60000)
    page.redraw()
    minutes, seconds = page.stat_labels["elapsed"].text().split(":")
    assert int(minutes) * 60 + int(seconds) >= 180, page.stat_labels["elapsed"].text()
    with qtbot.waitSignal(job.finished, timeout=30000):
        page.stop()


def test_the_smallest_window_keeps_every_tab_and_the_run_in_view(
        qtbot, qapp, window: MainWindow, voice: Path) -> None:
    sheet, palette = qapp.styleSheet(), qapp.palette()
    ThemeManager(qapp, "dark").apply()  # the app's paddings, as a user sees them
    try:
        _run_on_disk(voice, "run-20260101-120000", [(1, 200)], total=200)
        page = _page(window, voice)
        # the window's own minimum (a smaller screen, as offscreen's, lowers it)
        window.resize(MINIMUM_SIZE)
        qtbot.waitUntil(lambda: page._history is None, timeout=10000)
        qtbot.wait(50)
        bar = page.charts.tabBar()
        assert not page.charts.usesScrollButtons()
        for i in range(bar.count()):  # every tab in the bar, none behind an arrow
            assert bar.tabRect(i).right() <= bar.width(), bar.tabText(i)
        # the closed selector paints a text that fits its field (it read "2 che")
        option = QStyleOptionComboBox()
        page.run_picker.initStyleOption(option)
        field = page.run_picker.style().subControlRect(
            QStyle.ComplexControl.CC_ComboBox, option, QStyle.SubControl.SC_ComboBoxEditField,
            page.run_picker)
        assert page.run_picker.fontMetrics().horizontalAdvance(option.currentText) \
            <= field.width()
        assert option.currentText.startswith("run-20260101-120000")
        # a long state stays on one line: the cards and tabs below never move
        tabs_at = page.charts.mapTo(window, page.charts.rect().topLeft())
        height = page.state_label.height()
        page.state_label.setText("Stopping: step 107 saved, shutting down the cluster; "
                                 "the evaluator measures the last checkpoint first")
        qtbot.wait(50)
        assert page.state_label.height() == height
        assert page.charts.mapTo(window, page.charts.rect().topLeft()) == tabs_at
        assert page.state_label.toolTip().endswith("last checkpoint first")
    finally:
        qapp.setStyleSheet(sheet)
        qapp.setPalette(palette)


def test_quit_names_the_users_jobs_in_a_sentence(qtbot, window: MainWindow) -> None:
    """It asked "Speech engine, Training is still running": the window's own speech engine
    is no job of the user's."""
    from PySide6.QtWidgets import QMessageBox

    jobs = window.ctx.jobs
    speech = jobs.start(["x"], "Speech engine", background=True, kill_after_s=2.0,
                        program=flood_program(0, forever=True))
    train = jobs.start(["x"], "Training", program=flood_program(0, forever=True, stop_s=1.0))
    qtbot.waitUntil(lambda: speech.events_seen > 5 and train.events_seen > 5, timeout=30000)
    window.close()
    boxes = [w for w in window.findChildren(QMessageBox) if w.isVisible()]
    assert [b.text() for b in boxes] == ["Training is still running. Stop it and quit?"]
    boxes[0].button(QMessageBox.StandardButton.Yes).click()
    qtbot.waitUntil(lambda: window._quit_wait is not None, timeout=10000)
    assert window._quit_wait.text() == "Waiting for Training (saving and stopping) to stop…"
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=60000)
