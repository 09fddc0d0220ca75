"""A take belongs to the voice it was started for (issue 50): opening another voice in the
Voices list while a take is recording or under review asks, as Quit does, and a take kept
is saved into its own voice with its own prompt; nothing of it reaches the other voice.
Through the real sound device (the test's own PulseAudio null sink)."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import numpy as np
import soundfile as sf
from PySide6.QtCore import Qt

from gui.app import MainWindow
from gui.pages.record import RecordPage
from gui.pages.voices import VoicesPage, folder_name_for
from tests.helpers.recording import message_box
from tests.helpers.voices import make_voice

SR = 48000


def _tone(folder: Path, sink: str, seconds: float = 1.0) -> None:
    """A tone played into the sink the page records from, waited for."""
    t = np.arange(int(seconds * SR)) / SR
    wav = folder / f"{uuid.uuid4().hex[:6]}.wav"
    sf.write(str(wav), (0.3 * np.sin(2 * np.pi * 330 * t)).astype(np.float32), SR)
    subprocess.run(["paplay", f"--device={sink}", "--latency-msec=1500", str(wav)],
                   check=True, timeout=60)


def _two_voices(qtbot, window: MainWindow, workspace: Path) -> tuple[RecordPage, Path, Path]:
    a, b = make_voice(workspace, "Ada"), make_voice(workspace, "Bea")
    window.ctx.set_workspace(workspace)
    window.ctx.set_voice(a)
    page = window.show_page(RecordPage)
    assert isinstance(page, RecordPage)
    qtbot.waitUntil(lambda: page.prompt is not None, timeout=10000)
    return page, a, b


def _pick_in_list(qtbot, window: MainWindow, voice: Path) -> VoicesPage:
    """The other voice clicked in the Voices page's list, as a person switches voices."""
    voices = window.page(VoicesPage)
    qtbot.waitUntil(lambda: voices.list.count() == 2, timeout=10000)
    item = next(voices.list.item(i) for i in range(voices.list.count())
                if voices.list.item(i).data(Qt.ItemDataRole.UserRole) == str(voice))
    voices.list.setCurrentItem(item)
    return voices


def _takes(voice: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((voice / "takes").glob("*.json"))]


def _answer(qtbot, window: MainWindow, text: str, label: str) -> None:
    box = message_box(qtbot, window, text)
    next(b for b in box.buttons() if b.text() == label).click()
    qtbot.waitUntil(lambda: not box.isVisible(), timeout=10000)


def test_a_recording_take_stays_with_its_voice(qtbot, sink: str, window: MainWindow,
                                              workspace: Path, tmp_path: Path) -> None:
    page, a, b = _two_voices(qtbot, window, workspace)
    prompt = page.prompt
    qtbot.keyClick(page, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: "speak now" in page.rec_state.text(), timeout=15000)
    _tone(tmp_path, sink)
    voices = _pick_in_list(qtbot, window, b)
    # the switch waits for the answer: the take is stopped and the page still on Ada
    box = message_box(qtbot, window, "was being recorded")
    assert "Ada" in box.text() and window.ctx.voice == a
    assert voices.list.currentItem().data(Qt.ItemDataRole.UserRole) == str(a)
    qtbot.waitUntil(lambda: page.take_audio is not None, timeout=20000)
    _answer(qtbot, window, "was being recorded", "Review it")
    assert window.ctx.voice == a and page.prompt == prompt
    # reviewing it, the other voice again: keep it for Ada and switch
    _pick_in_list(qtbot, window, b)
    _answer(qtbot, window, "not saved yet", "Keep it for Ada and switch")
    qtbot.waitUntil(lambda: window.ctx.voice == b, timeout=10000)
    assert [t["prompt_id"] for t in _takes(a)] == [prompt.id]
    assert _takes(b) == []
    # Bea starts at her own first prompt, with nothing of Ada's take
    qtbot.waitUntil(lambda: page.prompt is not None, timeout=10000)
    assert page.take_audio is None and page.take_voice is None


def test_a_take_under_review_is_kept_dropped_or_the_switch_called_off(
        qtbot, sink: str, window: MainWindow, workspace: Path, tmp_path: Path) -> None:
    page, a, b = _two_voices(qtbot, window, workspace)
    qtbot.keyClick(page, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: "speak now" in page.rec_state.text(), timeout=15000)
    _tone(tmp_path, sink)
    with qtbot.waitSignal(page.recorder.stopped, timeout=20000):
        qtbot.keyClick(page, Qt.Key.Key_Space)
    voices = _pick_in_list(qtbot, window, b)
    _answer(qtbot, window, "not saved yet", "Cancel")
    assert window.ctx.voice == a and page.take_audio is not None
    assert voices.list.currentItem().data(Qt.ItemDataRole.UserRole) == str(a)
    # the page's keys work again after the question (Space would start a new take)
    qtbot.waitUntil(lambda: window.isActiveWindow() and page.hasFocus(), timeout=10000)
    _pick_in_list(qtbot, window, b)
    _answer(qtbot, window, "not saved yet", "Discard it and switch")
    qtbot.waitUntil(lambda: window.ctx.voice == b, timeout=10000)
    assert _takes(a) == [] and _takes(b) == []
    assert page.take_audio is None


def test_renaming_the_voice_keeps_its_take_under_review(
        qtbot, sink: str, window: MainWindow, workspace: Path, tmp_path: Path) -> None:
    page, a, _b = _two_voices(qtbot, window, workspace)
    prompt = page.prompt
    qtbot.keyClick(page, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: "speak now" in page.rec_state.text(), timeout=15000)
    _tone(tmp_path, sink)
    with qtbot.waitSignal(page.recorder.stopped, timeout=20000):
        qtbot.keyClick(page, Qt.Key.Key_Space)
    voices = window.page(VoicesPage)
    assert voices.rename_voice(a, "Ada Lovelace") is None  # asks first
    assert a.is_dir()
    _answer(qtbot, window, "not saved yet", "Keep it for Ada and switch")
    renamed = a.with_name(folder_name_for("Ada Lovelace"))
    qtbot.waitUntil(lambda: window.ctx.voice == renamed, timeout=10000)
    assert [t["prompt_id"] for t in _takes(renamed)] == [prompt.id]
