"""The Read page and a line's takes (issue 52): each take's word check on the page, the
settings of how lines are cut and checked, and two takes of a line compared."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from PySide6.QtCore import Qt

from engine.core.atomic import read_json
from engine.core.events import Emitter
from engine.layout import reading
from engine.read import read
from engine.read.project import make_plan
from gui.pages.read import ReadPage
from gui.placement import MINIMUM_SIZE
from tests.helpers.reading import (
    JOB_S,
    OTHER,
    RIGHT,
    SHORT,
    read_workspace,
    say_take,
    tiny_request,
)


def test_read_page_checks_the_takes_words_and_shows_each_takes_score(
        qtbot, window, workspace: Path, tiny_model_dir: Path, tmp_path: Path,
        piper_synth: Callable[[str], tuple[np.ndarray, int]]) -> None:
    """Takes rendered with the check off; turned on at the page, its job scores them (no
    render: retries 0) and the page shows each take's word error rate."""
    read_workspace(workspace, tiny_model_dir)
    script = tmp_path / "train.txt"
    script.write_text(f"{RIGHT}\n\n{OTHER}\n", encoding="utf-8")
    request = tiny_request(script=str(script), workspace=str(workspace), voice="ada",
                           max_frames=SHORT, retries=0)
    read(request, Emitter())
    plan = make_plan(request)
    for planned in plan.lines:  # both takes say line 1: line 2's is fluent and wrong
        say_take(reading.take_audio(plan.project, planned.key, 1), RIGHT, piper_synth)

    page = window.show_page(ReadPage)
    page.narrator.setCurrentIndex(page.narrator.findData("ada"))
    page.script.setText(str(script))
    page.refresh()
    assert page.table.item(1, 5).text() == "1"  # not checked yet
    check = page.fields["word_check"].widget
    assert not check.isChecked()
    check.setChecked(True)
    qtbot.mouseClick(page.render_button, Qt.MouseButton.LeftButton)
    assert page.job is not None and "--word-check" in page.job.command_line()
    said: list[str] = []
    page.job.event.connect(lambda _event: said.append(page.status.text()))
    qtbot.waitUntil(lambda: page.job is None, timeout=JOB_S)
    assert "Checking the words of the takes made before: 2 of 2 takes" in said, said
    assert page.status.text().endswith("lines 2 flagged"), page.status.text()
    right, wrong = page.table.item(0, 5).text(), page.table.item(1, 5).text()
    assert right.startswith("1, WER 0.") and "check it" not in right, right
    assert wrong.startswith("1, WER 1.") and wrong.endswith(" - check it"), wrong
    page.table.selectRow(1)
    assert "wrong words" in page.takes.itemText(0) and "WER" in page.takes.itemText(0)
    heard = page.takes.itemData(0, Qt.ItemDataRole.ToolTipRole)
    assert heard.startswith("Heard: ") and "delayed" in heard


def test_read_page_sets_chunk_length_frame_cap_retries_and_word_check(
        qtbot, window, workspace: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    """The project's settings the page could not set: shown as the project saved them,
    set on the page, sent to the engine's job and kept with the project."""
    read_workspace(workspace, tiny_model_dir)
    script = tmp_path / "lamp.txt"
    script.write_text("The lamp was lit at dusk.\n", encoding="utf-8")
    read(tiny_request(script=str(script), workspace=str(workspace), voice="ada",
                      max_frames=SHORT, retries=1, chunk_chars=120), Emitter())

    page = window.show_page(ReadPage)
    page.narrator.setCurrentIndex(page.narrator.findData("ada"))
    page.script.setText(str(script))
    page.refresh()
    fields = page.fields
    assert {name: f.value() for name, f in fields.items()} == {
        "chunk_chars": 120, "max_frames": SHORT, "retries": 1, "word_check": False,
        "wer_max": 0.7}
    assert page.table.item(0, 5).text() == "1"
    # the row whole at the window's smallest width: every field's words on screen
    window.resize(MINIMUM_SIZE)
    check = fields["word_check"].widget
    qtbot.waitUntil(lambda: check.width() >= check.sizeHint().width())
    right = fields["wer_max"].widget
    assert right.mapTo(window, right.rect().topRight()).x() <= window.width()

    fields["max_frames"].widget.setValue(20)
    fields["retries"].widget.setValue(0)
    fields["chunk_chars"].widget.setValue(100)
    fields["wer_max"].widget.setValue(0.5)
    fields["chunk_chars"].widget.editingFinished.emit()
    # cut otherwise, the line is another take: not rendered yet
    assert page.table.item(0, 5).text() == "not rendered"

    qtbot.mouseClick(page.render_button, Qt.MouseButton.LeftButton)
    assert page.job is not None
    command = " ".join(page.job.command_line())
    for flag in ("--max-frames 20", "--retries 0", "--chunk-chars 100", "--wer-max 0.5",
                 "--no-word-check"):
        assert flag in command, command
    qtbot.waitUntil(lambda: page.job is None, timeout=JOB_S)
    assert page.table.item(0, 5).text() == "1", page.status.text()
    saved = read_json(page.plan.project / reading.PROJECT_FILE)
    assert (saved["max_frames"], saved["retries"], saved["chunk_chars"], saved["wer_max"],
            saved["word_check"]) == (20, 0, 100, 0.5, False)
    record = page.plan.line(1).record(page.plan.project, 1)
    assert all(chunk["max_frames"] <= 20 for chunk in record["chunks"]), record


def test_read_page_compares_two_takes_of_a_line_and_uses_b(
        qtbot, window, workspace: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    read_workspace(workspace, tiny_model_dir)
    script = tmp_path / "lamp.txt"
    script.write_text("The lamp was lit at dusk.\n\nThe bay was calm.\n", encoding="utf-8")
    request = tiny_request(script=str(script), workspace=str(workspace), voice="ada",
                           max_frames=SHORT)
    read(request, Emitter())
    read(request.replace(regenerate=(1,)), Emitter())  # a second take of line 1, used

    page = window.show_page(ReadPage)
    page.narrator.setCurrentIndex(page.narrator.findData("ada"))
    page.script.setText(str(script))
    page.refresh()
    page.table.selectRow(0)
    assert page.takes.currentData() == 2
    assert [page.other.itemData(i) for i in range(page.other.count())] == [1]
    assert page.play_other_button.isEnabled() and page.use_other_button.isEnabled()
    player = window.ctx.player
    with qtbot.waitSignal(player.started, timeout=10_000):
        qtbot.mouseClick(page.play_other_button, Qt.MouseButton.LeftButton)
    assert page.status.text() == "Playing line 1, take B (seed 1)"
    with qtbot.waitSignal(player.started, timeout=10_000):
        qtbot.mouseClick(page.play_button, Qt.MouseButton.LeftButton)
    assert page.status.text() == "Playing line 1, take A (seed 2)"
    player.stop()

    qtbot.mouseClick(page.use_other_button, Qt.MouseButton.LeftButton)
    key = page.plan.line(1).key
    assert read_json(reading.chosen_file(page.plan.project, key)) == {"seed": 1}
    assert page.takes.currentData() == 1
    assert [page.other.itemData(i) for i in range(page.other.count())] == [2]
    # a line of one take has nothing to compare
    page.table.selectRow(1)
    assert page.other.count() == 0 and not page.play_other_button.isEnabled()
