"""The Read page (issue 42): a script's lines with their voices and takes, a new take of
one line and an M4B export run as the engine's `read` in its own process, a take picked,
a pronunciation added. The project is rendered first by the engine itself with short
chunks (the page keeps the project's saved settings, so its jobs render short too)."""

from __future__ import annotations

from pathlib import Path

import mutagen.mp4
from PySide6.QtCore import Qt

from engine.core.atomic import read_json
from engine.core.events import Emitter
from engine.layout import reading
from engine.read import read
from gui.pages.read import ReadPage
from tests.helpers.reading import JOB_S, SCRIPT, read_workspace, tiny_request


def test_read_page_renders_picks_and_exports(qtbot, window, workspace: Path,
                                             tiny_model_dir: Path, tmp_path: Path) -> None:
    read_workspace(workspace, tiny_model_dir)
    script = tmp_path / "book.md"
    script.write_text(SCRIPT, encoding="utf-8")
    read(tiny_request(script=str(script), workspace=str(workspace), voice="ada", max_frames=24,
                      styles=("whispering",)), Emitter())

    page = window.show_page(ReadPage)
    index = page.narrator.findData("ada")
    assert index >= 0, "the workspace's voices are offered as narrators"
    page.narrator.setCurrentIndex(index)
    page.script.setText(str(script))
    page.refresh()
    table = page.table
    assert table.rowCount() == 5
    assert [table.item(r, 2).text() for r in range(5)] == ["ada", "bob", "ada", "ada", "ada"]
    assert table.item(1, 3).text() == "whispering"
    assert table.item(2, 1).text() == "The Storm"
    assert all(table.item(r, 5).text() == "1" for r in range(5))

    # a new take of line 2, made by the engine's process, becomes the line's take
    table.selectRow(1)
    assert page.again_button.isEnabled()
    qtbot.mouseClick(page.again_button, Qt.MouseButton.LeftButton)
    assert page.job is not None and not page.render_button.isEnabled()
    assert "--regenerate" in page.job.command_line() and "--max-frames" in \
        page.job.command_line()
    qtbot.waitUntil(lambda: page.job is None, timeout=JOB_S)
    table.selectRow(1)
    assert [page.takes.itemData(i) for i in range(page.takes.count())] == [1, 2], \
        page.status.text()
    assert page.takes.currentData() == 2
    assert table.item(1, 5).text().startswith("2 (seed 2)")

    # the first take picked back: the export uses it
    page.takes.setCurrentIndex(0)
    page.takes.activated.emit(0)
    key = page.plan.line(2).key
    assert read_json(reading.chosen_file(page.plan.project, key)) == {"seed": 1}

    # the export: an M4B whose chapters a tool of its own reads back
    out = tmp_path / "out" / "book.m4b"
    page.out.setText(str(out))
    qtbot.mouseClick(page.export_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: page.job is None, timeout=JOB_S)
    assert out.is_file(), page.status.text()
    assert [c.title for c in mutagen.mp4.MP4(out).chapters] == ["The Lighthouse", "The Storm",
                                                                "The Morning"]
    # the summary with the file's measured level, whole at the window's 1100 px
    assert "wrote" in page.status.text() and "LUFS, true peak" in page.status.text()
    status = page.status

    def whole() -> bool:  # every word of it on screen, wrapped or on one line
        if status.wordWrap():
            return status.height() >= status.heightForWidth(status.width())
        return status.fontMetrics().horizontalAdvance(status.text()) <= status.width()

    qtbot.waitUntil(whole)
    assert status.width() <= window.width()

    # a pronunciation for the workspace: the line it changes needs a new take
    page.word.setText("dusk")
    page.respelling.setText("duhsk")
    page.add_word()
    assert table.item(0, 5).text() == "not rendered"
    assert table.item(0, 4).toolTip() == "Said as: The lamp was lit at duhsk."
    assert table.item(1, 5).text().startswith("2")


def test_read_page_shows_the_projects_flags(window, workspace: Path, tiny_model_dir: Path,
                                            tmp_path: Path) -> None:
    """A line flagged by an earlier render (every take of the drone voice loops) is shown
    flagged by the page, whatever run made its takes."""
    read_workspace(workspace, tiny_model_dir)
    script = tmp_path / "drone.txt"
    script.write_text("Drone: Hum along with me.\n", encoding="utf-8")
    request = tiny_request(script=str(script), workspace=str(workspace), max_frames=64,
                           retries=0)
    read(request, Emitter())
    read(request, Emitter())  # a later run, with nothing to render

    page = window.show_page(ReadPage)
    page.script.setText(str(script))
    page.refresh()
    assert page.table.item(0, 5).text() == "1 - check it"
    assert page.status.text().endswith("; lines 1 flagged")
