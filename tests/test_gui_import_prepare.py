"""The Import table under real clicks, and a Prepare that would leave nothing to train on
(issue 28, sections 4, 5 and 8): ticking a take's box leaves every row where it was and
updates its texts at once; a Prepare with every take unticked changes nothing on disk
and says so; the speech "in use" is the engine's one count (SpeechCount), the Prepare
report's usable minutes once prepared."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import QPoint, Qt
from PySide6.QtTest import QTest
from PySide6.QtWidgets import QMessageBox, QStyle, QStyleOptionViewItem

from engine.layout.voice import open_voice
from gui.app import MainWindow
from gui.pages.importer import ImportPage
from gui.pages.prepare import PreparePage
from gui.widgets import fmt_duration
from tests.helpers.voices import file_states

EXCLUDED = "is excluded (include it again to use it)"


def _shown(page: ImportPage) -> list[str]:
    return [page.proxy.index(r, 1).data() for r in range(page.proxy.rowCount())]


def _check_box(page: ImportPage, row: int) -> QPoint:
    """The centre of the Use check box of a row, as the view draws it."""
    index = page.proxy.index(row, 0)
    option = QStyleOptionViewItem()
    page.table.itemDelegateForIndex(index).initStyleOption(option, index)
    option.rect = page.table.visualRect(index)
    return page.table.style().subElementRect(
        QStyle.SubElement.SE_ItemViewItemCheckIndicator, option, page.table).center()


def _click_use(qtbot, window: MainWindow, page: ImportPage, voice: Path, row: int) -> str:
    """Click a row's Use box with the mouse and wait until the window has read the disk
    again (what the folder watcher does after every saved tick); returns the take's id."""
    take_id = _shown(page)[row]
    was = page.model.takes[row].excluded
    QTest.mouseClick(page.table.viewport(), Qt.MouseButton.LeftButton,
                     Qt.KeyboardModifier.NoModifier, _check_box(page, row))
    assert open_voice(voice).find_take(take_id).extra.get("excluded") is (not was)
    _reread(qtbot, window, voice)
    return take_id


def _reread(qtbot, window: MainWindow, voice: Path) -> None:
    """Wait until the pages have a snapshot of the voice read after every take's last
    change (a new one: the page's own tick also changed the cached snapshot's take)."""
    reader = window.ctx.reader
    old = reader.cached(voice)
    on_disk = {t.id: bool(t.extra.get("excluded")) for t in open_voice(voice).list_takes()}

    def fresh() -> bool:
        snap = reader.cached(voice)
        return snap is not old and snap is not None and \
            {t.id: t.excluded for t in snap.takes} == on_disk

    reader.load_voice(voice)
    qtbot.waitUntil(fresh, timeout=20000)


def _in_use(page: ImportPage) -> str:
    return page.count_label.text().rsplit(" · ", 1)[1]


def _prepare(qtbot, window: MainWindow) -> PreparePage:
    page = window.show_page(PreparePage)
    assert isinstance(page, PreparePage)
    QTest.mouseClick(page.run_btn, Qt.MouseButton.LeftButton)
    assert page.job is not None
    qtbot.waitUntil(lambda: page.job is None, timeout=120000)
    return page


def _untick(qtbot, window: MainWindow, page: ImportPage, voice: Path,
            rows: Sequence[int], counted: bool = True) -> list[str]:
    """Untick `rows` in turn, each with a click on its own row: no row moves (under Qt's
    default sort by Use, the unticked take jumped to the top and the next click hit
    another take); `counted`: the time in use changes at once. The takes left out."""
    order = _shown(page)
    left_out = []
    for row in rows:
        before = _in_use(page)
        left_out.append(_click_use(qtbot, window, page, voice, row))
        assert _shown(page) == order
        assert not counted or _in_use(page) != before
    return left_out


def _empty_prepare_changes_nothing(qtbot, window: MainWindow, voice: Path) -> None:
    """Prepare with every take left out would leave nothing: it changes nothing on disk
    and says so, in its state and in a message box that says where to tick takes."""
    on_disk = file_states(voice / "prepared")
    assert len(list((voice / "prepared" / "clips").glob("*.wav"))) == 9
    prepare_page = _prepare(qtbot, window)
    sentence = ("Every take (12) is left out, so prepare would leave nothing to train on; "
                "nothing was changed.")
    assert prepare_page.state.text() == sentence
    boxes = [b for b in prepare_page.findChildren(QMessageBox) if b.isVisible()]
    assert [b.text() for b in boxes] == [sentence]
    assert "Use column of the Import page" in boxes[0].informativeText()
    boxes[0].accept()
    assert file_states(voice / "prepared") == on_disk
    assert prepare_page.cards["clips"].value.text() == "9 / 9"


def test_ticks_keep_rows_in_place_and_an_empty_prepare_changes_nothing(
        qtbot, window: MainWindow, workspace: Path, prepared_voice: Path) -> None:
    voice = Path(shutil.copytree(prepared_voice, workspace / "joe"))
    window.ctx.set_voice(voice)
    page = window.show_page(ImportPage)
    assert isinstance(page, ImportPage)
    qtbot.waitUntil(lambda: page.model.rowCount() == 12, timeout=10000)
    order = _shown(page)
    assert order == sorted(order)  # by take, not by Use
    report = json.loads((voice / "prepared" / "report.json").read_text())
    usable_s = report["totals"]["minutes_usable"] * 60.0
    # one count: what is in use is what the Prepare page calls usable
    assert _in_use(page) == f"{fmt_duration(usable_s)} of speech in use"

    # untick three takes, the last row first (under Qt's default sort by Use, the
    # unticked take jumped to the top and the next click hit another take)
    left_out = _untick(qtbot, window, page, voice, (11, 4, 0))
    assert left_out == [order[11], order[4], order[0]]

    prepare_page = _prepare(qtbot, window)
    assert prepare_page.state.text().startswith("Prepared in")
    report = json.loads((voice / "prepared" / "report.json").read_text())
    assert {r["take"] for r in report["rejected"]} == set(left_out)
    usable_s = report["totals"]["minutes_usable"] * 60.0
    window.show_page(ImportPage)
    qtbot.waitUntil(lambda: page.model.index(4, 5).data() == EXCLUDED, timeout=20000)
    assert _in_use(page) == f"{fmt_duration(usable_s)} of speech in use"

    # tick one again: its "is excluded" and the time in use change at once, and stay
    QTest.mouseClick(page.table.viewport(), Qt.MouseButton.LeftButton,
                     Qt.KeyboardModifier.NoModifier, _check_box(page, 4))
    back = page.model.takes[4]
    assert back.id == order[4] and not back.excluded
    assert page.model.index(4, 5).data() == "not prepared"
    expected = f"{fmt_duration(usable_s + back.duration_s)} of speech in use"
    assert _in_use(page) == expected
    _reread(qtbot, window, voice)
    assert page.model.index(4, 5).data() == "not prepared" and _in_use(page) == expected
    assert _shown(page) == order

    # untick every take, each with a click on its own row
    _untick(qtbot, window, page, voice,
            [row for row in range(12) if not page.model.takes[row].excluded], counted=False)
    assert all(t.excluded for t in page.model.takes)
    assert _in_use(page) == "0:00 of speech in use"

    _empty_prepare_changes_nothing(qtbot, window, voice)

    # a take ticked again counts at once (it read "0.0 min in use")
    window.show_page(ImportPage)
    QTest.mouseClick(page.table.viewport(), Qt.MouseButton.LeftButton,
                     Qt.KeyboardModifier.NoModifier, _check_box(page, 0))
    first = page.model.takes[0]
    assert not first.excluded and first.duration_s > 0
    assert _in_use(page) == f"{fmt_duration(first.duration_s)} of speech in use"
