"""Record shows which styles still need takes (issue 40): the engine counts a voice's takes
per style against its prompt set, the page shows the count in one line at 1100x760 and
jumps to the next prompt of a style still needing takes. A take is made cheaply: piper
speech handed to the page as a stopped recording, kept through the page's own save."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from PySide6.QtCore import Qt

from engine.layout.prompts import get_prompt_set
from engine.layout.voice import open_voice
from engine.layout.voice_prompts import style_progress
from gui.app import MainWindow
from gui.pages.help import SHORTCUTS
from gui.pages.record import RecordPage


def test_a_style_take_counts_for_its_style_and_next_style_jumps(
        qtbot, window: MainWindow, voice: Path,
        piper_synth: Callable[[str], tuple[np.ndarray, int]]) -> None:
    styled = [p for p in get_prompt_set("english").prompts if p.style]
    groups = list(dict.fromkeys(p.group for p in styled))
    assert groups == ["slow", "fast", "whisper", "loud", "happy"]
    window.resize(1100, 760)
    window.ctx.set_voice(voice)
    page = window.show_page(RecordPage)
    assert isinstance(page, RecordPage)
    qtbot.waitUntil(lambda: page.prompt is not None, timeout=10000)
    assert page.prompt.style == ""  # the plain prompts come first
    assert page.style_label.text() == "Styles: slow 0/3 · fast 0/3 · whisper 0/3 · " \
        "loud 0/3 · happy 0/3"

    # Next style: the first prompt of each style still needing takes, in turn
    seen = []
    for _ in groups:
        page.style_btn.click()
        seen.append(page.prompt.id)
    assert seen == [f"st-{g}-01" for g in groups]
    while page.prompt.group != "whisper":
        page.style_btn.click()
    assert "read it this way: Whisper." in page.prompt_meta.text()

    speech, sr = piper_synth(page.prompt.text)
    page._stopped((0.6 * np.asarray(speech)).astype(np.float32), sr)
    assert page.accept()
    takes = open_voice(voice).list_takes()
    assert [(t.prompt_id, t.extra.get("style")) for t in takes] == [("st-whisper-01",
                                                                     "Whisper.")]
    counts = {c.group: (c.recorded, c.total, c.next_id) for c in style_progress(
        open_voice(voice))}
    assert counts["whisper"] == (1, 3, "st-whisper-02") and counts["slow"] == (0, 3,
                                                                                "st-slow-01")
    assert "whisper 1/3" in page.style_label.text()
    # the voice read again from disk says the same, without what the page remembers
    qtbot.waitUntil(lambda: any(t.prompt_id == "st-whisper-01" for t in getattr(
        window.ctx.reader.cached(voice), "takes", [])), timeout=10000)
    page.accepted.clear()
    page.refresh()
    assert "· whisper 1/3 ·" in page.style_label.text() and "slow 0/3" in \
        page.style_label.text()
    # after the whisper prompt saved, Next style goes on to the next style's prompt
    page.prompt = next(p for p in page.prompts.prompts if p.id == "st-whisper-02")
    page.style_btn.click()
    assert page.prompt.id == "st-loud-01"
    # N is its key, said in Help and in the page's line of keys
    qtbot.keyClick(page, Qt.Key.Key_N)
    assert page.prompt.id == "st-happy-01"
    assert "N: next style" in page.subtitle
    assert any(where == "Record" and "N" in key.split(" / ") and "next style" in what
               for where, key, what in SHORTCUTS)

    # every line and key of it reads in full in the window
    qtbot.wait(100)
    for w in (page.style_label, page.style_btn, page.progress_label):
        assert w.isVisible() and w.width() >= w.sizeHint().width(), w
        right = w.mapTo(window, w.rect().bottomRight())
        assert right.x() <= window.width() and right.y() <= window.height()
    window.grab().save(str(voice.parent / "record-styles.png"))


def test_style_prompts_are_cued_in_the_sets_language(qtbot, window: MainWindow,
                                                      workspace: Path) -> None:
    """Issue 50: the German and French style prompts showed English reading cues; the
    takes still train with the one English description of each style."""
    from engine.layout.voice import create_voice

    for language, group, cue, style in (
            ("german", "fluestern", "Flüstern.", "Whisper."),
            ("french", "chuchote", "Chuchotez.", "Whisper.")):
        voice = create_voice(workspace / language, language.title(), language).path
        window.ctx.set_voice(voice)
        page = window.show_page(RecordPage)
        assert isinstance(page, RecordPage)
        qtbot.waitUntil(lambda v=voice, p=page: p.prompt is not None and p.voice == v,
                        timeout=10000)
        while page.prompt.group != group:
            qtbot.keyClick(page, Qt.Key.Key_N)
        assert f"read it this way: {cue}" in page.prompt_meta.text()
        assert page.prompt.style == style  # what the take trains with
