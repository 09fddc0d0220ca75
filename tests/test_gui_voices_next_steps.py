"""The Voices page's "Next steps" follow the voice (issue 50): a new voice is told to record
or import, a recorded one to prepare, a prepared one to train; the line once stayed the new
voice's for every voice."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from engine.layout.voice import open_voice
from engine.prepare import prepare
from gui.app import MainWindow
from gui.pages.voices import VoicesPage

TEXT = "The neighbours painted their fence a bright shade of yellow on Sunday."


def test_next_steps_follow_the_voice(qtbot, window: MainWindow, voice: Path,
                                     piper_synth: Callable[[str], tuple[np.ndarray, int]]
                                     ) -> None:
    window.ctx.set_voice(voice)
    page = window.show_page(VoicesPage)
    assert isinstance(page, VoicesPage)

    def says(word: str) -> bool:
        return page.empty_hint.text().startswith(f"Next steps: <b>{word}</b>")

    qtbot.waitUntil(lambda: says("Record"), timeout=10000)
    audio, sr = piper_synth(TEXT)
    v = open_voice(voice)
    v.add_take((0.6 * np.asarray(audio)).astype(np.float32), TEXT, sample_rate=sr)
    window.ctx.notify_changed()
    qtbot.waitUntil(lambda: says("Prepare"), timeout=10000)
    prepare(v, speakers="off", vad="energy")
    window.ctx.notify_changed()
    qtbot.waitUntil(lambda: says("Train"), timeout=10000)


def test_recorded_and_usable_minutes_agree_for_the_same_takes(
        qtbot, window: MainWindow, voice: Path) -> None:
    """Issue 50: one 9 s take read "0.1 minutes recorded" beside "0.2 usable minutes"
    (before a prepare a take counts its length toward both)."""
    sr = 48000
    t = np.arange(int(9.01 * sr)) / sr
    open_voice(voice).add_take((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32),
                               TEXT, sample_rate=sr)
    window.ctx.set_voice(voice)
    page = window.show_page(VoicesPage)
    assert isinstance(page, VoicesPage)
    qtbot.waitUntil(lambda: page.cards["takes"].value.text() == "1", timeout=10000)
    assert page.cards["recorded"].value.text() == page.cards["usable"].value.text()
