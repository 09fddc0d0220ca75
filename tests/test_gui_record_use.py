"""The Record page as a speaker uses it (issue 28, section 8), through a real sound device:
each test records from its own PulseAudio null sink (so it can be suspended, and what
plays into it is this test's alone), by keyboard where the page is driven by keys."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import sounddevice as sd
import soundfile as sf
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox

from engine.core.errors import InputError
from engine.layout.prompts import get_prompt_set
from engine.layout.voice import VERDICT_UNUSABLE, open_voice
from engine.layout.voice_prompts import next_prompts
from gui.app import MainWindow
from gui.audio import NO_MICROPHONE
from gui.pages.importer import ImportPage
from gui.pages.record import SILENT, RecordPage
from tests.helpers.recording import message_box as _box

SR = 48000


def _play(sink: str, folder: Path, audio: np.ndarray) -> subprocess.Popen:
    """Sound into the sink from PulseAudio's own player (a deep buffer: no gaps under load)."""
    wav = folder / f"{uuid.uuid4().hex[:6]}.wav"
    sf.write(str(wav), audio, SR)
    return subprocess.Popen(["paplay", f"--device={sink}", "--latency-msec=1500", str(wav)])


def _tone(seconds: float, level: float = 0.5) -> np.ndarray:
    t = np.arange(int(seconds * SR)) / SR
    return (level * np.sin(2 * np.pi * 330 * t)).astype(np.float32)


def _open(qtbot, window: MainWindow, voice: Path) -> RecordPage:
    window.ctx.set_voice(voice)
    page = window.show_page(RecordPage)
    assert isinstance(page, RecordPage)
    qtbot.waitUntil(lambda: page.prompt is not None, timeout=10000)
    return page


def _record(qtbot, page: RecordPage, during=None) -> np.ndarray:
    """Space, wait for "speak now", run `during`, Space again: the take under review."""
    qtbot.keyClick(page, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: "speak now" in page.rec_state.text(), timeout=15000)
    if during is not None:
        during()
    with qtbot.waitSignal(page.recorder.stopped, timeout=20000) as blocker:
        qtbot.keyClick(page, Qt.Key.Key_Space)
    return blocker.args[0]


def _click(qtbot, box: QMessageBox, label: str) -> None:
    """Answer a question; the page's keys then work again (the offscreen platform does
    not hand the focus back to the window by itself, as a desktop does)."""
    window = box.parentWidget().window()
    next(b for b in box.buttons() if b.text() == label).click()
    if window.isVisible():
        window.activateWindow()
        qtbot.waitUntil(window.isActiveWindow, timeout=10000)


def test_takes_that_cannot_train_need_a_deliberate_keep(qtbot, sink: str, window: MainWindow,
                                                        voice: Path, tmp_path: Path) -> None:
    page = _open(qtbot, window, voice)
    first = page.prompt
    assert first is not None

    # nothing plays into the sink: a silent take, said in the warning colour
    _record(qtbot, page, lambda: qtbot.wait(800))
    assert page.rec_state.text().startswith("Silent take")
    # one Enter saves nothing: it asks, and Enter on the question re-takes
    qtbot.keyClick(page, Qt.Key.Key_Return)
    assert not list((voice / "takes").glob("*.json"))
    assert page.judgement.verdict == VERDICT_UNUSABLE and page.state_warns
    assert page.accept_btn.text() == "Keep anyway…"
    box = _box(qtbot, window, "cannot train")
    assert box.defaultButton().text() == "Re-take"
    qtbot.keyClick(box, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: page.recorder.active, timeout=10000)  # recording again
    qtbot.waitUntil(lambda: "speak now" in page.rec_state.text(), timeout=15000)
    # the page's keys work again once the question has gone (as in _click)
    assert not box.isVisible()
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=10000)
    with qtbot.waitSignal(page.recorder.stopped, timeout=20000):
        qtbot.keyClick(page, Qt.Key.Key_Space)
    assert page.judgement.verdict == VERDICT_UNUSABLE
    # kept only by its own button: saved with its verdict, and the prompt is not done
    page.accept()
    _click(qtbot, _box(qtbot, window, "cannot train"), "Keep anyway")
    metas = [json.loads(p.read_text()) for p in (voice / "takes").glob("*.json")]
    assert len(metas) == 1 and metas[0]["prompt_id"] == first.id
    assert metas[0]["extra"]["verdict"] == VERDICT_UNUSABLE
    assert metas[0]["extra"]["warnings"] == [SILENT]
    assert page.prompt is not None and page.prompt.id != first.id
    assert f"0 of {len(page.prompts.prompts)} recorded" in page.prompt_meta.text()
    # the engine offers the prompt again (the CLI's `voice prompts` reads the same rule)
    assert next_prompts(open_voice(voice))[0].id == first.id

    # a clipped take: a full-scale square wave into the sink
    second = page.prompt
    square = np.sign(_tone(1.5)).astype(np.float32)
    _record(qtbot, page, lambda: (_play(sink, tmp_path, square).wait(timeout=30),
                                  qtbot.wait(300)))
    assert page.judgement.verdict == VERDICT_UNUSABLE and page.state_warns
    qtbot.keyClick(page, Qt.Key.Key_Enter)
    _click(qtbot, _box(qtbot, window, "Clipped"), "Keep anyway")
    metas = {m["prompt_id"]: m for m in
             (json.loads(p.read_text()) for p in (voice / "takes").glob("*.json"))}
    assert metas[second.id]["extra"]["verdict"] == VERDICT_UNUSABLE
    assert metas[second.id]["extra"]["warnings"][-1].startswith("Clipped")

    # the verdicts travel to Import: both takes are counted as flagged before any Prepare
    imp = window.show_page(ImportPage)
    qtbot.waitUntil(lambda: "2 takes" in imp.count_label.text(), timeout=10000)
    assert "2 flagged" in imp.count_label.text()


def test_speak_now_waits_for_the_input_and_the_take_ends_at_stop(
        qtbot, sink: str, window: MainWindow, voice: Path, tmp_path: Path) -> None:
    page = _open(qtbot, window, voice)
    # the input begins late: the sink is suspended, so its monitor delivers nothing yet
    subprocess.run(["pactl", "suspend-sink", sink, "1"], check=True, timeout=10)
    try:
        qtbot.keyClick(page, Qt.Key.Key_Space)
        mouth = _play(sink, tmp_path, _tone(12.0))  # sounds once the sink runs
        qtbot.wait(2500)  # well past the pre-roll
        assert page.rec_state.text() == "Get ready…"
        assert page.recorder.active and page.recorder.seconds() == 0.0
    finally:
        subprocess.run(["pactl", "suspend-sink", sink, "0"], check=True, timeout=10)
    qtbot.waitUntil(lambda: "speak now" in page.rec_state.text(), timeout=15000)
    assert page.recorder.seconds() > 0
    spoke_at = time.monotonic()
    qtbot.wait(1500)
    with qtbot.waitSignal(page.recorder.stopped, timeout=20000) as blocker:
        stopped_at = time.monotonic()
        qtbot.keyClick(page, Qt.Key.Key_Space)
    mouth.kill()
    mouth.wait(timeout=10)
    audio, sr = blocker.args
    spoken_s = stopped_at - spoke_at
    # the take holds what came after "speak now", up to Stop and the 0.3 s hold; cut
    # by frames counted from the stream's start it ran 2.5 s past Stop (the late start)
    assert spoken_s - 0.2 <= len(audio) / sr <= spoken_s + 0.3 + 0.6, (len(audio) / sr,
                                                                        spoken_s)
    assert float(np.sqrt(np.mean(audio[-int(0.2 * sr):] ** 2))) > 0.2  # the tone, to the end


def test_skip_discard_play_and_back(qtbot, sink: str, window: MainWindow, voice: Path,
                                    tmp_path: Path) -> None:
    page = _open(qtbot, window, voice)
    speak = lambda: (_play(sink, tmp_path, _tone(1.0, 0.3)).wait(timeout=30),  # noqa: E731
                     qtbot.wait(200))
    _record(qtbot, page, speak)
    assert page.take_audio is not None and page.accept_btn.isEnabled()
    # Skip: the new prompt shows no verdict and no trace of the old waveform
    skipped = page.prompt
    qtbot.keyClick(page, Qt.Key.Key_S)
    assert page.prompt is not None and page.prompt.id != skipped.id
    assert page.rec_state.text() == "Ready: Space to record" and not page.state_warns
    assert page.clip_label.text() == "" and not page.accept_btn.isEnabled()
    assert page.wave._fill.path().isEmpty() and page.wave.empty_text.isVisible()

    # Delete drops a take without starting another recording
    _record(qtbot, page, speak)
    qtbot.keyClick(page, Qt.Key.Key_Delete)
    assert page.take_audio is None and not page.recorder.active
    assert page.rec_state.text().startswith("Discarded") and not page.play_btn.isEnabled()

    # P plays the take and says so until it ends
    _record(qtbot, page, speak)
    review = page.rec_state.text()
    qtbot.keyClick(page, Qt.Key.Key_P)
    assert page.playing and page.play_btn.text() == "Stop"
    assert page.rec_state.text().startswith("▶ Playing")
    qtbot.waitUntil(lambda: not page.playing, timeout=20000)
    assert page.play_btn.text() == "Play" and page.rec_state.text() == review

    # accept it, go back: the saved take can be heard, and is not offered for saving
    kept = page.prompt
    page.judgement.verdict = "good"  # a tone is "too short" for a sentence: keep it anyway
    qtbot.keyClick(page, Qt.Key.Key_Return)
    assert page.prompt.id != kept.id
    qtbot.keyClick(page, Qt.Key.Key_B)
    assert page.prompt.id == kept.id and page.existing is not None
    assert page.rec_state.text().startswith("Recorded already: P plays its take")
    assert page.play_btn.isEnabled() and not page.accept_btn.isEnabled()
    assert abs(len(page.existing[0]) - len(sf.read(next((voice / "takes").glob("*.wav")))[0])) \
        == 0
    qtbot.keyClick(page, Qt.Key.Key_P)
    assert page.playing and page.rec_state.text().startswith("▶ Playing")
    qtbot.keyClick(page, Qt.Key.Key_P)  # P again stops it
    assert not page.playing
    assert "B: back" in page.subtitle and "Delete: discard" in page.subtitle  # not a tooltip


def test_quit_asks_before_a_take_is_lost(qtbot, sink: str, window: MainWindow, voice: Path,
                                         tmp_path: Path) -> None:
    page = _open(qtbot, window, voice)
    prompt = page.prompt
    _record(qtbot, page, lambda: (_play(sink, tmp_path, _tone(1.0, 0.3)).wait(timeout=30),
                                  qtbot.wait(200)))
    window.close()
    box = _box(qtbot, window, "not saved yet")
    assert window.isVisible()
    _click(qtbot, box, "Save it and quit")
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=10000)
    metas = [json.loads(p.read_text()) for p in (voice / "takes").glob("*.json")]
    assert [m["prompt_id"] for m in metas] == [prompt.id]


def test_quit_while_recording_asks(qtbot, sink: str, window: MainWindow, voice: Path) -> None:
    page = _open(qtbot, window, voice)
    qtbot.keyClick(page, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: page.recorder.seconds() > 0, timeout=15000)
    window.close()
    box = _box(qtbot, window, "was being recorded")
    assert window.isVisible()
    qtbot.waitUntil(lambda: not page.recorder.active, timeout=20000)  # stopped as it asks
    _click(qtbot, box, "Review it")  # the quit is called off, the take comes up for review
    qtbot.waitUntil(lambda: page.take_audio is not None, timeout=20000)
    assert window.isVisible()
    window.close()
    _click(qtbot, _box(qtbot, window, "not saved yet"), "Discard it and quit")
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=10000)
    assert not list((voice / "takes").glob("*.json"))


def test_no_microphone_is_said_with_what_to_do(qtbot, ctx, voice: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # PortAudio started where no sound server answers: no device at all
    sd._terminate()
    monkeypatch.setenv("PULSE_SERVER", "unix:/nonexistent/voxshard-test")
    sd._initialize()
    try:
        assert sd.default.device[0] == -1
        page = RecordPage(ctx)
        qtbot.addWidget(page)
        ctx.set_voice(voice)
        page.show()
        page.shown()
        qtbot.waitUntil(lambda: page.prompt is not None, timeout=10000)
        assert page.input_combo.currentText() == "No microphone found"
        assert page.rec_state.text() == NO_MICROPHONE and page.state_warns
        assert not page.rec_btn.isEnabled() and not page.test_btn.isEnabled()
        qtbot.keyClick(page, Qt.Key.Key_Space)
        assert not page.recorder.active and page.rec_state.text() == NO_MICROPHONE
        # the recorder says the same to any caller
        said: list[str] = []
        page.recorder.failed.connect(said.append)
        assert not page.recorder.start(None)
        assert said == [NO_MICROPHONE]
        page.shutdown()
    finally:
        sd._terminate()
        monkeypatch.delenv("PULSE_SERVER")
        sd._initialize()


def test_the_prompt_set_and_groups_are_chosen_on_the_page(qtbot, window: MainWindow,
                                                          voice: Path) -> None:
    page = _open(qtbot, window, voice)
    assert page.prompts.set_name == "english" and page.groups_btn.text() == "Groups: all"
    # another set: stored in voice.toml, its first prompt shown
    i = page.set_combo.findData("german")
    assert i >= 0
    page.set_combo.setCurrentIndex(i)
    page.set_combo.activated.emit(i)
    # another language's sentences: the voice reads German from now on, if the user agrees
    _click(qtbot, _box(qtbot, window, "These sentences are in German"), "Change to German")
    german = get_prompt_set("german")
    assert open_voice(voice).prompt_set == "german"
    assert page.prompt is not None and page.prompt.id == german.prompts[0].id
    # only some groups: untick all but one
    keep = german.groups[1]
    for act in list(page.groups_menu.actions()):
        if act.text() != keep:
            act.setChecked(False)
    assert open_voice(voice).prompt_groups == [keep]
    assert page.prompt is not None and page.prompt.group == keep
    assert page.groups_btn.text() == f"Groups: 1 of {len(german.groups)}"
    total = sum(1 for p in german.prompts if p.group == keep)
    assert f"0 of {total} recorded" in page.prompt_meta.text()
    assert next_prompts(open_voice(voice))[0].group == keep  # the engine reads the same
    # the last group cannot be unticked: nothing would be left to read
    next(a for a in page.groups_menu.actions() if a.text() == keep).setChecked(False)
    assert open_voice(voice).prompt_groups == [keep] and page.state_warns
    # a restart shows the same choice
    page.prompt = None
    page.refresh()
    assert page.prompt.group == keep and page.set_combo.currentData() == "german"


def test_voice_prompt_choice_is_checked_and_stored(voice: Path) -> None:
    v = open_voice(voice)
    with pytest.raises(InputError) as bad:
        v.set_prompts("english", ["everyday", "sailing"])
    assert bad.value.message == "The prompt set 'english' has no group 'sailing'."
    assert bad.value.hint.startswith("Choose from: everyday, nature")
    every = get_prompt_set("english").groups
    v.set_prompts("english", every)  # every group is the same as none chosen
    assert "prompt_groups" not in (voice / "voice.toml").read_text()
    v.set_prompts("english", ["numbers", "food"])
    assert open_voice(voice).prompt_groups == ["food", "numbers"]  # in set order


def test_the_progress_counts_what_prepare_would_count_not_the_raw_length(
        qtbot, window: MainWindow, workspace: Path) -> None:
    """A silent take saved through its confirm counts nothing toward the recommendation
    (it cannot train), so the Record page and Prepare say the same minutes (issue 28 §8:
    "0.8 minutes recorded" against Prepare's "0.3 usable minutes")."""
    from engine.layout.voice import create_voice

    v = create_voice(workspace / "counted", "Counted", "english")
    rate = 24000
    tone = (0.3 * np.sin(2 * np.pi * 220 * np.arange(30 * rate) / rate)).astype(np.float32)
    v.add_take(tone, "Thirty seconds of sound.", sample_rate=rate, prompt_id="p1")
    v.add_take(np.zeros(30 * rate, dtype=np.float32), "Thirty seconds of nothing.",
               sample_rate=rate, prompt_id="p2", extra={"verdict": VERDICT_UNUSABLE})
    window.ctx.set_voice(v.path)
    page = window.show_page(RecordPage)
    assert isinstance(page, RecordPage)
    qtbot.waitUntil(lambda: "usable speech" in page.progress_label.text(), timeout=20000)
    assert page.progress_label.text().startswith("0.5 minutes of usable speech recorded")
