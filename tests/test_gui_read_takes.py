"""The Read page and a line's takes (issue 52): each take's word check on the page."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from PySide6.QtCore import Qt

from engine.core.events import Emitter
from engine.layout import reading
from engine.read import read
from engine.read.project import make_plan
from gui.pages.read import ReadPage
from tests.helpers.reading import OTHER, RIGHT, SHORT, read_workspace, say_take, tiny_request


def test_read_page_shows_each_takes_word_score(
        window, workspace: Path, tiny_model_dir: Path, tmp_path: Path,
        piper_synth: Callable[[str], tuple[np.ndarray, int]]) -> None:
    read_workspace(workspace, tiny_model_dir)
    script = tmp_path / "train.txt"
    script.write_text(f"{RIGHT}\n\n{OTHER}\n", encoding="utf-8")
    request = tiny_request(script=str(script), workspace=str(workspace), voice="ada",
                           max_frames=SHORT, retries=0)
    read(request, Emitter())
    plan = make_plan(request)
    for planned in plan.lines:  # both takes say line 1: line 2's is fluent and wrong
        say_take(reading.take_audio(plan.project, planned.key, 1), RIGHT, piper_synth)
    read(request.replace(word_check=True), Emitter())

    page = window.show_page(ReadPage)
    page.narrator.setCurrentIndex(page.narrator.findData("ada"))
    page.script.setText(str(script))
    page.refresh()
    right, wrong = page.table.item(0, 5).text(), page.table.item(1, 5).text()
    assert right.startswith("1, WER 0.") and "check it" not in right, right
    assert wrong.startswith("1, WER 1.") and wrong.endswith(" - check it"), wrong
    page.table.selectRow(1)
    assert "wrong words" in page.takes.itemText(0) and "WER" in page.takes.itemText(0)
    heard = page.takes.itemData(0, Qt.ItemDataRole.ToolTipRole)
    assert heard.startswith("Heard: ") and "delayed" in heard
