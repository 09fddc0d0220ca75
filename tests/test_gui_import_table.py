"""The Import table (issue 45): its rows are selected whole, so no cell draws a focus frame
of its own; beside the first row's tick one read as an empty second box to tick."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from engine.layout.voice import create_voice
from gui.app import MainWindow
from gui.pages.importer import ImportPage


def test_no_empty_box_beside_the_first_tick(qtbot, window: MainWindow, workspace: Path
                                            ) -> None:
    voice = create_voice(workspace / "ada", "Ada", "english")
    tone = (0.3 * np.sin(np.arange(2 * 24000) / 10)).astype(np.float32)
    for i in range(3):
        voice.add_take(tone, f"Sentence {i}.", sample_rate=24000)
    window.resize(1100, 760)
    window.ctx.set_voice(voice.path)
    page = window.show_page(ImportPage)
    assert isinstance(page, ImportPage)
    qtbot.waitUntil(lambda: page.proxy.rowCount() == 3, timeout=20000)
    table = page.table
    table.setFocus()
    qtbot.waitUntil(table.hasFocus, timeout=5000)
    first = page.proxy.index(0, 0)
    assert table.currentIndex() == first  # the table's current cell: the first tick's
    qtbot.wait(100)
    image = table.viewport().grab().toImage()
    cell = table.visualRect(first)
    # right of the tick, the cell is one colour: no frame drawn around it
    colours = {image.pixel(x, y) for x in range(cell.left() + 24, cell.right() - 1)
               for y in range(cell.top() + 2, cell.bottom() - 1)}
    assert len(colours) == 1, [hex(c) for c in sorted(colours)][:6]
