"""The Record page, keyboard first (issue 45): after every dialog the page has its keys
back (Space records and stops, never a button the window focused meanwhile), Quit during a
take stops the take when it asks, silence around a take is cut and said, each voice opens
at its own prompt and state, a prompt set in another language asks before the voice
changes language, and Help names every key the page answers. Recorded through a private
PulseAudio null sink; dialogs are answered with a click and nothing else (no test-side
re-activation of the window)."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import numpy as np
import soundfile as sf
from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QApplication, QMessageBox

from engine.layout.prompts import get_prompt_set
from engine.layout.voice import create_voice, open_voice
from gui.app import MainWindow
from gui.pages.help import SHORTCUTS
from gui.pages.record import TRIM_KEEP_S, RecordPage, trim_take
from tests.helpers.recording import message_box as _box

SR = 48000


def _open(qtbot, window: MainWindow, voice: Path) -> RecordPage:
    window.ctx.set_voice(voice)
    page = window.show_page(RecordPage)
    assert isinstance(page, RecordPage)
    qtbot.waitUntil(lambda: page.prompt is not None, timeout=10000)
    return page


def _press(qtbot, window: MainWindow, key: Qt.Key) -> None:
    """A key where the application sends the user's keys: its focused widget, else the
    active window (a window that is not active gets none, as on a desktop)."""
    target = QApplication.focusWidget() or QApplication.activeWindow()
    if target is None:
        return
    qtbot.keyClick(target, key)


def _answer(qtbot, box: QMessageBox, label: str) -> None:
    next(b for b in box.buttons() if b.text() == label).click()
    qtbot.waitUntil(lambda: not box.isVisible(), timeout=5000)


def _space_records_and_stops(qtbot, window: MainWindow, page: RecordPage) -> None:
    """Space starts a take and Space stops it, through the keys the user presses."""
    qtbot.wait(100)
    _press(qtbot, window, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: page.recorder.active, timeout=5000)
    qtbot.waitUntil(lambda: "speak now" in page.rec_state.text(), timeout=15000)
    with qtbot.waitSignal(page.recorder.stopped, timeout=20000):
        _press(qtbot, window, Qt.Key.Key_Space)
    assert window._about is None  # Space went to the page, not to the About button


def test_the_page_has_its_keys_after_every_dialog(qtbot, sink: str, window: MainWindow,
                                                  voice: Path) -> None:
    page = _open(qtbot, window, voice)
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5000)
    # Quit during a take: the question, answered "Review it", gives the keys back
    _press(qtbot, window, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: "speak now" in page.rec_state.text(), timeout=15000)
    window.close()
    _answer(qtbot, _box(qtbot, window, "was being recorded"), "Review it")
    qtbot.waitUntil(lambda: page.take_audio is not None, timeout=20000)
    _space_records_and_stops(qtbot, window, page)
    # Quit with a take under review, Cancel
    window.close()
    _answer(qtbot, _box(qtbot, window, "not saved yet"), "Cancel")
    assert window.isVisible()
    _space_records_and_stops(qtbot, window, page)
    # nothing was played: a silent take, which cannot train. Enter asks; Re-take records
    _press(qtbot, window, Qt.Key.Key_Return)
    _answer(qtbot, _box(qtbot, window, "This take cannot train"), "Re-take")
    qtbot.waitUntil(lambda: "speak now" in page.rec_state.text(), timeout=15000)
    with qtbot.waitSignal(page.recorder.stopped, timeout=20000):
        _press(qtbot, window, Qt.Key.Key_Space)
    # Enter asks again; "Keep anyway" saves it, and Space records the next prompt
    first = page.prompt
    _press(qtbot, window, Qt.Key.Key_Return)
    _answer(qtbot, _box(qtbot, window, "This take cannot train"), "Keep anyway")
    qtbot.waitUntil(lambda: page.take_audio is None, timeout=5000)
    assert list((voice / "takes").glob("*.json")) and page.prompt != first
    _space_records_and_stops(qtbot, window, page)
    page.discard()


def _tone(seconds: float, level: float = 0.4) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    # a warble, not a steady tone: the level detector calls a constant tone a floor
    return (level * np.sin(2 * np.pi * 330 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
            ).astype(np.float32)


def test_quit_during_a_take_stops_it_while_it_asks(qtbot, sink: str, window: MainWindow,
                                                  voice: Path, tmp_path: Path) -> None:
    page = _open(qtbot, window, voice)
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5000)
    _press(qtbot, window, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: "speak now" in page.rec_state.text(), timeout=15000)
    wav = tmp_path / f"{uuid.uuid4().hex[:6]}.wav"
    sf.write(str(wav), _tone(1.5), SR)
    subprocess.run(["paplay", f"--device={sink}", "--latency-msec=1500", str(wav)],
                   timeout=60, check=True)
    window.close()  # Ctrl+Q's action
    box = _box(qtbot, window, "was being recorded")
    # the take stops when the question opens, not when it is answered
    qtbot.waitUntil(lambda: page.take_audio is not None, timeout=20000)
    assert box.isVisible() and not page.recorder.active
    taken = len(page.take_audio)
    qtbot.wait(2500)  # the user reads the question
    _answer(qtbot, box, "Review it")
    assert window.isVisible() and page.take_audio is not None
    # none of the time the question was open joined the take: its samples did not grow
    assert len(page.take_audio) == taken, (len(page.take_audio), taken)
    window.close()
    _answer(qtbot, _box(qtbot, window, "not saved yet"), "Discard it and quit")
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=10000)


def test_silence_around_a_take_is_cut_and_said(piper_synth, qtbot, ctx, voice: Path
                                                ) -> None:
    speech, sr = piper_synth("The neighbours painted their fence a bright shade of yellow.")
    speech = 0.6 * np.asarray(speech, dtype=np.float32)
    take = np.concatenate([np.zeros(3 * sr, np.float32), speech,
                           np.zeros(7 * sr, np.float32)])
    trimmed, cut = trim_take(take, sr)
    assert 9.0 <= cut <= 10.0 + 0.1, cut
    assert len(speech) / sr <= len(trimmed) / sr <= len(speech) / sr + 2 * TRIM_KEEP_S + 0.05
    # a take with little silence around it is left as it is
    same, little = trim_take(trimmed, sr)
    assert little < 0.1 and len(same) >= len(trimmed) - 0.1 * sr
    # the page says it cut the silence
    page = RecordPage(ctx)
    qtbot.addWidget(page)
    ctx.set_voice(voice)
    page._stopped(take, sr)
    assert len(page.take_audio) == len(trimmed)
    # news under a good take, not a warning: in the state line, in its own colour
    said = page.rec_state.text()
    assert "trimmed 9." in said or "trimmed 10." in said, said
    assert said.startswith("✓ Good take") and not page.state_warns
    assert "rimmed" not in page.clip_label.text()  # the warning colour's line
    page.shutdown()


def test_each_voice_opens_at_its_own_prompt_and_state(qtbot, sink: str, window: MainWindow,
                                                      workspace: Path) -> None:
    ada = create_voice(workspace / "ada", "Ada", "english").path
    bob = create_voice(workspace / "bob", "Bob", "english").path
    page = _open(qtbot, window, ada)
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5000)
    first = page.prompt
    _press(qtbot, window, Qt.Key.Key_S)
    assert page.prompt is not None and page.prompt.id != first.id
    _space_records_and_stops(qtbot, window, page)
    _press(qtbot, window, Qt.Key.Key_Delete)
    assert page.rec_state.text().startswith("Discarded")
    window.ctx.set_voice(bob)
    qtbot.waitUntil(lambda: page.prompt is not None and page.voice == bob, timeout=10000)
    qtbot.wait(300)
    assert page.prompt.id == first.id  # Bob's own first prompt, not Ada's second
    assert not page.rec_state.text().startswith("Discarded"), page.rec_state.text()
    assert page.take_audio is None and not page.clip_label.text()


def test_a_prompt_set_in_another_language_asks(qtbot, window: MainWindow, voice: Path) -> None:
    page = _open(qtbot, window, voice)
    german = get_prompt_set("german")
    assert german.language == "german" and open_voice(voice).language == "english"
    i = page.set_combo.findData("german")
    page.set_combo.setCurrentIndex(i)
    page.set_combo.activated.emit(i)
    box = _box(qtbot, window, "These sentences are in German")
    # kept: nothing changes, the picker shows the set still read
    _answer(qtbot, box, "Keep English")
    v = open_voice(voice)
    assert (v.prompt_set, v.language) == ("english", "english")
    assert page.set_combo.currentData() == "english"
    page.set_combo.setCurrentIndex(i)
    page.set_combo.activated.emit(i)
    _answer(qtbot, _box(qtbot, window, "These sentences are in German"), "Change to German")
    v = open_voice(voice)
    assert (v.prompt_set, v.language) == ("german", "german")
    assert page.prompt is not None and page.prompt.id == german.prompts[0].id


def test_help_names_every_key_the_page_answers(qtbot, ctx) -> None:
    page = RecordPage(ctx)
    qtbot.addWidget(page)
    named = " ".join(keys for where, keys, _what in SHORTCUTS if where == "Record")
    words = {"Return": "Enter", "Del": "Delete"}
    for sc in page.shortcuts:
        key = sc.key().toString(QKeySequence.SequenceFormat.PortableText)
        assert words.get(key, key) in named.split(), key
    enter = next(what for where, keys, what in SHORTCUTS if (where, keys) == ("Record", "Enter"))
    assert "cannot train asks" in enter
    page.shutdown()


def test_voices_and_record_say_the_same_minutes(qtbot, window: MainWindow,
                                                workspace: Path) -> None:
    """One count of usable speech (the engine's SpeechCount): the Voices page said "—"
    where Record counted minutes."""
    from gui.pages.voices import VoicesPage

    v = create_voice(workspace / "counted", "Counted", "english")
    rate = 24000
    tone = (0.3 * np.sin(2 * np.pi * 220 * np.arange(30 * rate) / rate)).astype(np.float32)
    v.add_take(tone, "Thirty seconds of sound.", sample_rate=rate, prompt_id="p1")
    v.add_take(np.zeros(30 * rate, dtype=np.float32), "Thirty seconds of nothing.",
               sample_rate=rate, prompt_id="p2", extra={"verdict": "unusable"})
    window.ctx.set_voice(v.path)
    record = window.show_page(RecordPage)
    assert isinstance(record, RecordPage)
    qtbot.waitUntil(lambda: "usable speech" in record.progress_label.text(), timeout=20000)
    said = record.progress_label.text().split(" minutes")[0]
    voices = window.show_page(VoicesPage)
    assert isinstance(voices, VoicesPage)
    qtbot.waitUntil(lambda: voices.cards["usable"].value.text() != "—", timeout=20000)
    assert voices.cards["usable"].value.text() == said == "0.5"
