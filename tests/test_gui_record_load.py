"""The journey's Record step on a loaded machine (CI's are): every core busy while takes
are read into the page through a real sound device, and each is kept by Enter.

Before, the journey played its speech the moment Space was pressed, through the
window's own player: under load the input began up to 2 s after the key, and that
player's short buffer underflowed, so the take held a fraction of the sentence, its
verdict was "Too short", and Enter asked before keeping it instead of saving it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.layout.voice import open_voice
from gui.app import MainWindow
from gui.pages.record import RecordPage
from tests.helpers.load import busy_cores
from tests.helpers.recording import record_prompt

pytestmark = pytest.mark.slow


def test_takes_are_kept_with_every_core_busy(qtbot, sink: str, window: MainWindow,
                                             voice: Path, piper_synth, tmp_path: Path) -> None:
    window.ctx.set_voice(voice)
    page = window.show_page(RecordPage)
    assert isinstance(page, RecordPage)
    qtbot.waitUntil(window.isActiveWindow, timeout=5000)
    qtbot.waitUntil(lambda: page.prompt is not None, timeout=10000)
    with busy_cores():
        for _ in range(3):
            record_prompt(qtbot, page, sink, tmp_path, piper_synth)
    takes = open_voice(voice).list_takes()
    assert len(takes) == 3 and all(t.fills_prompt for t in takes)
