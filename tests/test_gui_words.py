"""Issue 28 §6, what the window says and whether it can be read: counts in words, every
bad file's reason, the prepare report's long messages, a log that follows, a report that
no program can open, and a window placed on the screen it is on."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import soundfile as sf
from PySide6.QtCore import QRect, QSize, Qt
from PySide6.QtWidgets import QMessageBox, QStyle, QTabWidget, QWidget

from engine.core.atomic import write_json
from engine.layout.manifest import prepared_folder
from gui import placement
from gui.app import MainWindow
from gui.pages.importer import ImportPage
from gui.pages.listen import ListenPage
from gui.pages.prepare import PreparePage
from gui.widgets import LogView, open_in_desktop
from gui.words import count


def _boxes(parent: QWidget) -> list[QMessageBox]:
    return [w for w in parent.findChildren(QMessageBox) if w.isVisible()]


def test_counts_read_as_words(qtbot, window: MainWindow, voice: Path) -> None:
    assert (count(1, "sentence"), count(3, "model"), count(0, "file")) == \
        ("1 sentence", "3 models", "0 files")
    # a comparison of one sentence by three models, as compare writes its index
    folder = voice / "comparisons" / "c1"
    folder.mkdir(parents=True)
    (folder / "index.json").write_text(json.dumps({
        "sentences": ["Hello there."],
        "entries": [{"label": name, "files": [{"sentence": 0, "path": f"{name}.wav",
                                               "duration_s": 1.0}]}
                    for name in ("step 10", "step 20", "zero-shot")]}))
    window.ctx.set_voice(voice)
    page = window.show_page(ListenPage)
    assert isinstance(page, ListenPage)
    page.show_comparison(folder)
    assert page.compare_note.text().startswith("1 sentence × 3 models,")  # "1 sentences"


def test_every_bad_file_says_why(qtbot, window: MainWindow, voice: Path,
                                 tmp_path: Path) -> None:
    """Two bad files: both reasons show (the second hid behind "(and 1 more)"), whether
    nothing was imported (the job fails) or a good file came with them (it succeeds)."""
    junk = tmp_path / "junk.wav"
    junk.write_text("not audio")
    short = tmp_path / "empty.flac"
    short.write_bytes(b"fLaC")
    window.ctx.set_voice(voice)
    page = window.show_page(ImportPage)
    assert isinstance(page, ImportPage)
    with qtbot.waitSignal(window.ctx.data_changed, timeout=60000):
        job = page.import_paths([junk, short])
        assert job is not None
    assert job.outcome == "failed"
    qtbot.waitUntil(lambda: bool(_boxes(page)), timeout=10000)
    text = _boxes(page)[0].text()
    assert "junk.wav" in text and "empty.flac" in text and "more" not in text, text
    for box in _boxes(page):
        box.close()

    good = tmp_path / "good.wav"
    t = np.arange(24000 * 2) / 24000
    sf.write(good, 0.3 * np.sin(2 * np.pi * 220 * t), 24000)
    with qtbot.waitSignal(window.ctx.data_changed, timeout=60000):
        job = page.import_paths([good, junk, short])
        assert job is not None
    assert job.outcome == "succeeded"
    qtbot.waitUntil(lambda: bool(_boxes(page)), timeout=10000)
    box = _boxes(page)[0]
    assert box.text() == "Imported 1 file; 2 files could not be used:"
    lines = box.informativeText().splitlines()
    assert len(lines) == 2 and "junk.wav" in lines[0] and "empty.flac" in lines[1], lines
    box.close()


def test_a_long_report_message_reads_in_full(qtbot, window: MainWindow, voice: Path) -> None:
    message = ("is excluded (include it again to use it: tick Use on the Import page, then "
               "prepare again; the clip stays on disk and nothing else refers to it)")
    report = {"totals": {"clips": 1, "usable_clips": 0}, "advice": [], "rejected": [],
              "clips": [{"id": "0001-a", "usable": False,
                         "issues": [{"code": "excluded_by_you", "message": message}]}]}
    write_json(prepared_folder(voice).report, report)  # as prepare leaves it
    window.resize(1100, 760)
    window.ctx.set_voice(voice)
    page = window.show_page(PreparePage)
    assert isinstance(page, PreparePage)
    tree = page.tree
    qtbot.waitUntil(lambda: tree.topLevelItemCount() == 1
                    and tree.topLevelItem(0).childCount() == 1, timeout=10000)
    item = tree.topLevelItem(0).child(0)
    assert item.toolTip(1) == message  # the whole text on hover
    # wrapped in its row: the row is as tall as the message at its column's width
    width = tree.columnWidth(1) - 2 * (tree.style().pixelMetric(
        QStyle.PixelMetric.PM_FocusFrameHMargin) + 1)
    needed = tree.fontMetrics().boundingRect(QRect(0, 0, width, 10000),
                                             Qt.TextFlag.TextWordWrap, message).height()
    assert needed > tree.fontMetrics().lineSpacing()  # longer than a line at 1100 px
    qtbot.waitUntil(lambda: tree.visualItemRect(item).height() >= needed, timeout=5000)


def test_the_log_follows_new_lines_unless_scrolled_up(qtbot) -> None:
    tabs = QTabWidget()
    qtbot.addWidget(tabs)
    log = LogView(max_lines=200)
    tabs.addTab(QWidget(), "Loss")
    tabs.addTab(log, "Log")
    tabs.resize(500, 300)
    tabs.show()
    bar = log.verticalScrollBar()
    for i in range(400):  # while another tab is shown: QPlainTextEdit stopped following
        log.append_line(f"line {i}")
    tabs.setCurrentWidget(log)
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum(), timeout=5000)
    log.append_line("line 400")
    qtbot.waitUntil(lambda: bar.value() == bar.maximum(), timeout=5000)
    assert log.toPlainText().endswith("line 400")
    bar.setValue(bar.maximum() // 2)  # the user reads an older line: it stays
    held = bar.value()
    for i in range(5):
        log.append_line(f"more {i}")
    qtbot.wait(30)
    assert bar.value() <= held and bar.value() < bar.maximum()
    bar.setValue(bar.maximum())  # back at the end: following again
    log.append_line("last")
    qtbot.waitUntil(lambda: bar.value() == bar.maximum(), timeout=5000)


def test_a_report_no_program_can_open_says_so(qtbot, tmp_path: Path, monkeypatch) -> None:
    # no browser and no xdg-open can start: an empty PATH
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    report = tmp_path / "run" / "report.html"
    report.parent.mkdir()
    report.write_text("<html></html>")
    parent = QWidget()
    qtbot.addWidget(parent)
    parent.show()
    assert open_in_desktop(parent, report, "report") is False
    box = _boxes(parent)[0]
    assert str(report) in box.text() and box.windowTitle() == "Could not open the report"
    folder = next(b for b in box.buttons() if b.text() == "Open folder")
    folder.click()
    assert box.isVisible() and str(report.parent) in box.informativeText()
    assert not folder.isEnabled()
    box.close()


def test_the_window_is_placed_on_the_screen_it_opens_on(qtbot, settings) -> None:
    laptop = QRect(0, 0, 1100, 760)
    first = placement.fit(None, laptop)
    assert laptop.contains(first) and first.size() == QSize(1100, 728)
    big = QRect(0, 0, 1920, 1080)
    assert placement.fit(None, big).size() == placement.DEFAULT_SIZE
    # a place from a larger monitor: onto this one, as large as it allows
    moved = placement.fit(QRect(1500, 900, 1400, 900), laptop)
    assert laptop.contains(moved) and moved.width() == 1100
    # a small screen: the minimum shrinks with it, so the window still fits
    small = QRect(0, 0, 1000, 600)
    assert small.contains(placement.fit(None, small))
    assert placement.minimum_for(small) == QSize(1000, 600)
    # remembered through the settings, maximized or not
    placement.remember(settings, QRect(30, 20, 1040, 690), True)
    assert placement.saved_place(settings) == (QRect(30, 20, 1040, 690), True)
