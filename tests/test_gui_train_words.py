"""The Train page's own words, as a person reads them at 1100x760 (issue 28 section 6):
the export how-to never cut at the dialog's edge, and a log that follows new lines."""

from __future__ import annotations

from pathlib import Path

from gui.app import MainWindow
from gui.pages.listen import ListenPage
from gui.pages.train.page import TrainPage


def test_the_export_how_to_wraps_a_long_path_inside_the_dialog(
        qtbot, window: MainWindow, workspace: Path) -> None:
    window.resize(1100, 760)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    out = workspace / ("a-rather-long-folder-name-for-exports-" * 3) / "joe-r1-step107"
    box = page._exported(out, "run-20261202-120000", 107, {"speaker": "joe"})
    qtbot.waitUntil(box.isVisible, timeout=10000)
    try:
        assert box.width() <= 1100
        text = box.howto
        assert str(out) in text.toPlainText() and "voxshard-engine speak" in text.toPlainText()
        # every line fits the view's width: wrapped, not cut (and no sideways scrolling)
        assert text.document().size().width() <= text.viewport().width()
        assert text.horizontalScrollBar().maximum() == 0
        assert str(out) in box.label.text()
    finally:
        box.close()


def test_the_log_follows_new_lines_also_those_that_came_while_it_was_hidden(
        qtbot, window: MainWindow) -> None:
    window.resize(1100, 760)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    charts = page.charts
    log_tab = charts.indexOf(page.log)
    charts.setCurrentIndex(0)  # the loss chart in front, as during a run
    for i in range(300):
        page._append_log("info", f"line {i}")
    charts.setCurrentIndex(log_tab)  # a look at the log: it shows the newest line
    bar = page.log.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum(), timeout=5000)
    window.show_page(ListenPage)  # away from the page while the run goes on
    for i in range(300, 400):
        page._append_log("state", f"line {i}")
    window.show_page(TrainPage)
    qtbot.waitUntil(lambda: bar.value() == bar.maximum(), timeout=5000)
    assert page.log.toPlainText().rstrip().endswith("line 399")
