"""The Prepare page's line beside its bar says what the bar shows (issue 50): it once kept
"Starting…" over a full bar. The real engine prepares a voice of two piper takes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from engine.layout.voice import open_voice
from gui.app import MainWindow
from gui.pages.prepare import PreparePage

TEXTS = ("The neighbours painted their fence a bright shade of yellow on Sunday.",
         "A small boat drifted slowly across the quiet lake at dawn.")


def test_the_state_line_follows_the_bar(qtbot, window: MainWindow, voice: Path,
                                        piper_synth: Callable[[str], tuple[np.ndarray, int]]
                                        ) -> None:
    v = open_voice(voice)
    for text in TEXTS:
        audio, sr = piper_synth(text)
        v.add_take((0.6 * np.asarray(audio)).astype(np.float32), text, sample_rate=sr)
    window.ctx.set_voice(voice)
    page = window.show_page(PreparePage)
    assert isinstance(page, PreparePage)
    seen: list[tuple[str, int, int]] = []
    QTest.mouseClick(page.run_btn, Qt.MouseButton.LeftButton)
    assert page.job is not None
    # after the page's own handler: what a person sees at each step
    page.job.progress.connect(lambda *_: seen.append(
        (page.state.text(), page.progress.value(), page.progress.maximum())))
    qtbot.waitUntil(lambda: page.job is None, timeout=120000)
    assert seen and seen[-1][1] == seen[-1][2] == len(TEXTS), seen
    for text, value, most in seen:
        assert text != "Starting…", seen
        assert (value == most) == text.startswith("Writing"), seen
