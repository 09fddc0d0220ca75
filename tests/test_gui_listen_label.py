"""Issue 50: Listen's "Speak with" box shows a label longer than itself ending in "…", not
cut mid-word (the open list says it whole), as the Train page's run picker does."""

from __future__ import annotations

from PySide6.QtWidgets import QStyleOptionComboBox

from gui.pages.listen import ListenPage

LONG = ("Adapter voice: lora-adapter of the run 2026-01-01_12-00-00 (step 200, the "
        "evaluation's best, similarity 0.812)")


def test_a_long_speak_with_label_ends_in_an_ellipsis(qtbot, ctx) -> None:
    listen = ListenPage(ctx)
    qtbot.addWidget(listen)
    listen.resize(1100, 700)
    listen.show()
    listen.source.insertItem(0, LONG)
    listen.source.setCurrentIndex(0)
    qtbot.waitUntil(listen.source.isVisible, timeout=5000)
    option = QStyleOptionComboBox()
    listen.source.initStyleOption(option)  # what the box paints
    shown = option.currentText
    assert shown != LONG and shown.endswith("…"), shown
    assert LONG.startswith(shown[:-1])
    assert listen.source.fontMetrics().horizontalAdvance(shown) < listen.source.width()
    assert listen.source.itemText(0) == LONG  # the list keeps it whole
