"""Import: each clip's style description is shown and edited in the table (issue 40), through
the engine's own function (`voice style`): an edit lands in the prepared set's description
that training reads, and 'Measured style' gives the measured words back."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QLineEdit

from engine.layout.manifest import prepared_folder, read_manifest
from engine.layout.voice import open_voice
from engine.prepare.styles import BY_YOU, MEASURED
from engine.train.rundata import data_fingerprint
from gui.app import MainWindow
from gui.pages.importer import ImportPage
from tests.helpers.voices import copy_voice

STYLE = 6  # the table's Style column


def test_a_clip_style_edited_on_import_is_what_training_reads(
        qtbot, window: MainWindow, workspace: Path, prepared_voice: Path) -> None:
    voice = copy_voice(prepared_voice, workspace / "joe")
    rows = read_manifest(voice, usable_only=False)
    assert rows and all(r["style_source"] == MEASURED for r in rows)
    window.resize(1100, 760)
    window.ctx.set_voice(voice)
    page = window.show_page(ImportPage)
    assert isinstance(page, ImportPage)
    qtbot.waitUntil(lambda: page.proxy.rowCount() == len(rows) and bool(page.model.clips),
                    timeout=20000)
    assert page.model.COLUMNS[STYLE] == "Style"

    # where no one described a clip, the measured description shows, in italics (these
    # clips are spoken as the speaker usually speaks: plain)
    def cell(take: str) -> object:
        r = next(i for i in range(page.proxy.rowCount())
                 if page.proxy.index(i, 1).data() == take)
        return page.proxy.index(r, STYLE)

    for row in rows:
        assert cell(row["source_take"]).data() == (row["style_measured"] or "(plain)")
        assert cell(row["source_take"]).data(Qt.ItemDataRole.EditRole) == row["style_measured"]
    clip = rows[0]
    index = cell(clip["source_take"])
    assert index.data(Qt.ItemDataRole.FontRole).italic()
    assert "measured" in index.data(Qt.ItemDataRole.ToolTipRole)

    # edited as a transcript is: double click, type, Enter (in the active window: the
    # offscreen platform does not activate it by itself)
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=10000)
    page.table.scrollTo(index)
    rect = page.table.visualRect(index)
    for click in (qtbot.mouseClick, qtbot.mouseDClick):  # a person's press comes first
        click(page.table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    editor = page.table.viewport().findChild(QLineEdit)
    assert editor is not None and editor.isVisible()
    editor.selectAll()
    qtbot.keyClicks(editor, "Whisper.")
    qtbot.keyClick(editor, Qt.Key.Key_Return)  # the view commits it on its next turn
    qtbot.waitUntil(lambda: page.table.state() == QAbstractItemView.State.NoState,
                    timeout=5000)
    after = {r["id"]: r for r in read_manifest(voice, usable_only=False)}
    assert (after[clip["id"]]["style"], after[clip["id"]]["style_source"]) == ("Whisper.",
                                                                               BY_YOU)
    assert prepared_folder(voice).styles.is_file()
    assert data_fingerprint(voice)["styles"] == ["Whisper."]  # what a run trains with
    assert "Whisper." in open_voice(voice).styles
    assert cell(clip["source_take"]).data() == "Whisper."
    assert not cell(clip["source_take"]).data(Qt.ItemDataRole.FontRole)
    # the window's re-read of the voice shows the same
    qtbot.waitUntil(lambda: any(c.get("style") == "Whisper." for c in getattr(
        window.ctx.reader.cached(voice), "clips", [])), timeout=10000)
    assert cell(clip["source_take"]).data() == "Whisper."

    # back to the measured words, for the selected take
    page.table.selectRow(cell(clip["source_take"]).row())
    page.measured_btn.click()
    back = {r["id"]: r for r in read_manifest(voice, usable_only=False)}[clip["id"]]
    assert (back["style"], back["style_source"]) == (clip["style_measured"], MEASURED)
    assert data_fingerprint(voice)["styles"] == []  # every clip plain again
    assert cell(clip["source_take"]).data() == (clip["style_measured"] or "(plain)")
    assert cell(clip["source_take"]).data(Qt.ItemDataRole.FontRole).italic()

    # the button and the column read in full at 1100x760
    qtbot.wait(100)
    for w in (page.measured_btn, page.count_label):
        assert w.isVisible() and w.width() >= w.sizeHint().width(), w
        right = w.mapTo(window, w.rect().bottomRight())
        assert right.x() <= window.width()
    window.grab().save(str(workspace / "import-styles.png"))
