"""A voice prepared in the window before any base model is chosen speaks its instant voice
in Listen (issue 45): the natural order, Prepare, then Listen with the Base field naming a
model and no run. The instant voice speaks on that base, and records it, so the voice
then speaks on it everywhere (a server lists it)."""

from __future__ import annotations

from pathlib import Path

import soundfile as sf
from PySide6.QtCore import Qt

from engine.layout.tiers import read_instant
from gui.app import MainWindow
from gui.pages.listen import ListenPage
from gui.pages.prepare import PreparePage
from tests.helpers.gui import pick_source, speak_and_wait
from tests.helpers.voices import copy_voice

INSTANT = "Instant voice on the Base model (no training)"


def test_prepare_then_listen_speaks_the_instant_voice_on_the_base_field(
        qtbot, window: MainWindow, workspace: Path, prepared_voice: Path,
        tiny_model_dir: Path) -> None:
    voice = copy_voice(prepared_voice, workspace / "joe")
    window.ctx.set_voice(voice)
    prepare = window.show_page(PreparePage)
    assert isinstance(prepare, PreparePage)
    qtbot.mouseClick(prepare.run_btn, Qt.MouseButton.LeftButton)
    assert prepare.job is not None
    qtbot.waitUntil(lambda: prepare.job is None, timeout=180000)
    instant = read_instant(voice)
    assert instant is not None and instant.base is None  # no base was chosen: none known

    listen = window.show_page(ListenPage)
    assert isinstance(listen, ListenPage)
    qtbot.waitUntil(lambda: listen.source.findText(INSTANT) >= 0, timeout=20000)
    listen.base.setEditText(str(tiny_model_dir))
    pick_source(qtbot, listen, INSTANT)
    listen.text.setPlainText("Hello there.")
    listen.seed.setValue(1)
    failures = speak_and_wait(qtbot, listen)
    assert not failures, failures
    assert listen.last_render is not None
    audio, rate = sf.read(listen.last_render)
    assert rate == 24000 and len(audio) > 0
    # the base it spoke on is the instant voice's from now on
    recorded = read_instant(voice)
    assert recorded is not None and recorded.base == str(tiny_model_dir)
