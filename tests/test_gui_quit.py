"""Quitting while jobs run: the window asks, waits for the engine's own stop, never freezes."""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox

from gui.app import MainWindow
from tests.helpers.processes import flood_program


def _visible_boxes(window: MainWindow) -> list[QMessageBox]:
    return [w for w in window.findChildren(QMessageBox) if w.isVisible()]


def _answer_yes(qtbot, window: MainWindow) -> None:
    qtbot.waitUntil(lambda: bool(_visible_boxes(window)), timeout=10000)
    box = _visible_boxes(window)[0]
    assert "still running" in box.text()
    box.button(QMessageBox.StandardButton.Yes).click()


def test_quit_waits_for_the_stop_and_closes_by_itself(qtbot, window: MainWindow) -> None:
    job = window.ctx.jobs.start(["x"], "Training",
                                program=flood_program(0, forever=True, stop_s=2.0))
    qtbot.waitUntil(lambda: job.events_seen > 5, timeout=30000)
    window.close()
    assert window.isVisible()  # asked first, nothing stopped yet
    assert job.is_running() and not job.stopping
    _answer_yes(qtbot, window)
    # the window stays up and says what it waits for while the engine saves
    qtbot.waitUntil(lambda: window._quit_wait is not None and job.stopping, timeout=10000)
    assert window.isVisible()
    assert "Training (saving and stopping)" in window._quit_wait.text()
    window.close()  # a second close while waiting changes nothing
    assert window.isVisible() and job.is_running()
    # the engine finishes its stop; the window then closes without being asked again
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=60000)
    assert job.outcome == "cancelled"


def test_quit_now_kills_and_reports_the_loss(qtbot, window: MainWindow) -> None:
    job = window.ctx.jobs.start(["x"], "Training",
                                program=flood_program(0, forever=True, stop_s=600.0))
    failures: list[tuple] = []
    job.failed.connect(lambda *a: failures.append(a))
    qtbot.waitUntil(lambda: job.events_seen > 5, timeout=30000)
    window.close()
    _answer_yes(qtbot, window)
    qtbot.waitUntil(lambda: window._quit_wait is not None and job.stopping, timeout=10000)
    quit_now = next(b for b in window._quit_wait.buttons() if b.text() == "Quit now")
    quit_now.click()
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=30000)
    assert job.outcome == "failed" and failures[0][0] == "killed"


def test_keep_running_calls_off_the_quit(qtbot, window: MainWindow) -> None:
    job = window.ctx.jobs.start(["x"], "Export",
                                program=flood_program(0, forever=True, stop_s=1.0))
    qtbot.waitUntil(lambda: job.events_seen > 5, timeout=30000)
    window.close()
    _answer_yes(qtbot, window)
    qtbot.waitUntil(lambda: window._quit_wait is not None, timeout=10000)
    keep = next(b for b in window._quit_wait.buttons() if b.text() == "Keep running")
    keep.click()
    qtbot.waitUntil(lambda: not job.is_running(), timeout=30000)
    assert window.isVisible()  # the stop went on, the quit did not
    assert window._quit_wait is None


def test_every_job_can_be_cancelled_from_the_status_bar(qtbot, window: MainWindow) -> None:
    download = window.ctx.jobs.start(["x"], "Download", program=flood_program(0, forever=True))
    export = window.ctx.jobs.start(["x"], "Export",
                                   program=flood_program(0, forever=True, stop_s=600.0))
    qtbot.waitUntil(lambda: download.events_seen > 5 and export.events_seen > 5,
                    timeout=30000)
    panel = window.jobs_panel
    assert panel.isVisible() and panel.text().startswith("Running: Download, Export")
    panel.menu_.aboutToShow.emit()
    actions = {a.text(): a for a in panel.menu_.actions()}
    assert set(actions) == {"Cancel Download", "Cancel Export"}
    with qtbot.waitSignal(download.cancelled, timeout=30000):
        actions["Cancel Download"].trigger()
    actions["Cancel Export"].trigger()
    qtbot.waitUntil(lambda: export.stopping, timeout=10000)
    assert "Export (stopping)" in panel.text()
    panel.menu_.aboutToShow.emit()
    (force,) = panel.menu_.actions()
    assert force.text().startswith("Force stop Export")
    with qtbot.waitSignal(export.failed, timeout=30000):
        force.trigger()
    qtbot.waitUntil(lambda: not panel.isVisible(), timeout=10000)


def test_a_voice_a_job_writes_into_cannot_be_renamed_or_deleted(
        qtbot, window: MainWindow, voice) -> None:
    from engine.layout.voice import open_voice
    from gui.pages.voices import VoicesPage

    page = window.page(VoicesPage)
    window.ctx.set_voice(voice)
    job = window.ctx.jobs.start(["x"], "Training", program=flood_program(0, forever=True),
                                voice=voice)
    qtbot.waitUntil(lambda: job.events_seen > 5, timeout=30000)
    assert page.rename_voice(voice, "Grace") is None
    page.delete_voice(voice)
    assert voice.is_dir() and (voice / "voice.toml").is_file()
    errors = [w for w in window.findChildren(QMessageBox) if w.isVisible()]
    assert errors and "Training is writing into this voice" in errors[-1].text()
    for box in errors:
        box.close()
    with qtbot.waitSignal(job.finished, timeout=30000):
        job.cancel()
    # once the job is done: the folder and the speaker's name both change
    renamed = page.rename_voice(voice, "Grace Hopper")
    assert renamed == voice.with_name("Grace-Hopper") and not voice.exists()
    assert open_voice(renamed).display_name == "Grace Hopper"
