"""The Read page and a line said in parts (issue 52): the row says how many of its parts
are rendered, the line's parts are listed, and a part's takes are played, compared, used
and made anew alone."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt

from engine.core.atomic import read_json
from engine.core.events import Emitter
from engine.layout import reading
from engine.read import read
from gui.pages.read import ReadPage
from gui.placement import MINIMUM_SIZE
from tests.helpers.reading import SHORT, read_workspace, tiny_request

PARAGRAPH = ("The lamp was lit at dusk. The bay was calm all night. "
             "Nobody spoke until the morning came.")


def test_read_page_lists_a_lines_parts_and_uses_b_of_one_part(
        qtbot, window, workspace: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    read_workspace(workspace, tiny_model_dir)
    script = tmp_path / "night.txt"
    script.write_text(f"{PARAGRAPH}\n\nYes.\n", encoding="utf-8")
    request = tiny_request(script=str(script), workspace=str(workspace), voice="ada",
                           max_frames=SHORT, chunk_chars=40, retries=0)
    read(request, Emitter())
    read(request.replace(regenerate=("1.2",)), Emitter())  # a second take of part 2, used

    page = window.show_page(ReadPage)
    page.narrator.setCurrentIndex(page.narrator.findData("ada"))
    page.script.setText(str(script))
    page.refresh()
    assert page.table.item(0, 5).text() == "3 of 3 parts"
    assert page.table.item(1, 5).text() == "1"
    page.table.selectRow(0)
    assert page.part.isEnabled()
    assert [page.part.itemText(i) for i in range(page.part.count())] == [
        "1/3: The lamp was lit at dusk.", "2/3: The bay was calm all night.",
        "3/3: Nobody spoke until the morning came."]
    assert page.takes.count() == 1 and page.other.count() == 0  # part 1: one take

    # the row of a part's takes whole at the window's smallest width
    window.resize(MINIMUM_SIZE)
    again = page.again_button
    qtbot.waitUntil(lambda: again.width() >= again.sizeHint().width())
    assert again.mapTo(window, again.rect().topRight()).x() <= window.width()

    page.part.setCurrentIndex(1)
    assert page.takes.currentData() == 2
    assert [page.other.itemData(i) for i in range(page.other.count())] == [1]
    player = window.ctx.player
    with qtbot.waitSignal(player.started, timeout=10_000):
        qtbot.mouseClick(page.play_other_button, Qt.MouseButton.LeftButton)
    assert page.status.text() == "Playing line 1, part 2, take B (seed 1)"
    player.stop()
    # the whole line: its parts' takes joined, as the export joins them
    with qtbot.waitSignal(player.started, timeout=10_000):
        qtbot.mouseClick(page.play_line_button, Qt.MouseButton.LeftButton)
    assert page.status.text() == "Playing line 1 (3 parts)"
    player.stop()
    qtbot.mouseClick(page.use_other_button, Qt.MouseButton.LeftButton)
    second = page.plan.line(1).part(1)
    assert read_json(reading.chosen_file(page.plan.project, second.key)) == {"seed": 1}
    assert page.part.currentIndex() == 1, "the part shown stays shown"
    assert page.takes.currentData() == 1

    # a new take is of the part shown; a line said in one take is named by its number
    qtbot.mouseClick(page.again_button, Qt.MouseButton.LeftButton)
    assert page.job is not None
    command = page.job.command_line()
    assert command[command.index("--regenerate") + 1] == "1.2", command
    page.stop()
    qtbot.waitUntil(lambda: page.job is None, timeout=60_000)
    page.table.selectRow(1)
    assert not page.part.isEnabled() and page.part.count() == 1
