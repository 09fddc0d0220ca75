"""Recording through the Record page as a person does, into a PulseAudio null sink.

- `record_prompt`: read the page's prompt aloud (piper speech played into the sink the
  page records from) and keep the take by keyboard.
- `message_box`: the page's question or message that is showing with the given text.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QMessageBox, QWidget

from engine.layout.voice import VERDICT_UNUSABLE


def record_prompt(qtbot: Any, page: Any, sink: str, folder: Path,
                  piper_synth: Callable[[str], tuple[np.ndarray, int]]) -> None:
    """Read the page's prompt aloud as a person does: Space, wait for "speak now" (the
    input may begin seconds after the key on a busy machine: what is said before it is
    not recorded), speak the prompt into `sink` (the page records from its monitor),
    Space, then Enter keeps the take.

    The speaker is PulseAudio's own player, in its own process with a 1.5 s buffer: the
    window's player, with its short device buffer, underflows under load and the null
    sink then loses much of what it played, so the take is judged on audio that never
    reached the input (seen in CI: "Too short for the sentence", and Enter asks)."""
    # as a person waits to see the sentence: a voice just opened shows its first prompt
    # once its snapshot is read, off the window's thread
    qtbot.waitUntil(lambda: page.prompt is not None, timeout=15000)
    prompt = page.prompt
    assert prompt is not None
    audio, sr = piper_synth(prompt.text)
    pad = np.zeros(int(0.3 * sr), dtype=np.float32)
    wav = folder / f"spoken-{prompt.id}.wav"
    sf.write(str(wav), np.concatenate([pad, 0.6 * audio, pad]).astype(np.float32), sr)
    # as a person waits for the last take's "Finishing…" to end before the next one
    qtbot.waitUntil(lambda: not page.recorder.stopping and page.rec_btn.isEnabled(),
                    timeout=30000)
    failures: list[str] = []

    def failed(why: str) -> None:
        failures.append(why)

    page.recorder.failed.connect(failed)
    try:
        qtbot.keyClick(page, Qt.Key.Key_Space)
    finally:
        page.recorder.failed.disconnect(failed)
    assert page.recorder.active, (failures, page.rec_state.text(), page.has_mic)
    qtbot.waitUntil(lambda: "speak now" in page.rec_state.text(), timeout=30000)
    mouth = subprocess.Popen(["paplay", f"--device={sink}", "--latency-msec=1500", str(wav)])
    try:
        qtbot.waitUntil(lambda: mouth.poll() is not None, timeout=60000)
    finally:
        if mouth.poll() is None:
            mouth.kill()
            mouth.wait(timeout=10)
    assert mouth.returncode == 0
    with qtbot.waitSignal(page.recorder.stopped, timeout=30000):
        qtbot.keyClick(page, Qt.Key.Key_Space)
    assert page.take_audio is not None and float(np.max(np.abs(page.take_audio))) > 0.2
    assert page.judgement.verdict != VERDICT_UNUSABLE, page.judgement.warnings
    qtbot.keyClick(page, Qt.Key.Key_Return)
    assert page.take_audio is None  # accepted and saved


def message_box(qtbot: Any, window: QWidget, text: str) -> QMessageBox:
    """The visible question or message of `window` whose text holds `text` (waited for)."""
    def find() -> QMessageBox | None:
        return next((b for b in window.findChildren(QMessageBox)
                     if b.isVisible() and text in b.text()), None)
    qtbot.waitUntil(lambda: find() is not None, timeout=10000)
    box = find()
    assert box is not None
    return box
