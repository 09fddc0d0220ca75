"""Listen says when the runaway guard cut a render short (issue 33): a voice of the tiny
model forced into a drone by its own weights (tests/test_synth_runaway.py's), picked and
spoken by clicks, is spoken by the window's real speech engine; the engine's result names
the cut ("loop") and the page says it in one plain sentence after its summary."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import soundfile as sf
from PySide6.QtCore import Qt

from gui.pages.listen import ListenPage, cut_sentence
from tests.helpers.gui import pick_source
from tests.helpers.voices import DRONE, copy_voice, forced_export


def test_the_sentence_names_each_reason_once_and_nothing_without_a_cut() -> None:
    assert cut_sentence([]) == cut_sentence(None) == ""
    assert cut_sentence(["silence"]) == ("The speech was cut short where it stayed silent; "
                                         "you hear it up to there.")
    assert "repeating itself and where it stayed silent;" in cut_sentence(["loop", "silence"])


def test_listen_says_where_the_runaway_guard_cut_the_render(
        qtbot, ctx, workspace: Path, trained_run: dict[str, Any], tiny_model_dir: Path) -> None:
    voice = copy_voice(trained_run["voice"], workspace / "joe")
    forced_export(tiny_model_dir, voice / "exports" / "drone", DRONE)
    listen = ListenPage(ctx)
    qtbot.addWidget(listen)
    listen.show()
    ctx.set_voice(voice)
    listen.refresh()
    qtbot.waitUntil(lambda: listen.source.findText("Exported: drone") >= 0, timeout=10000)
    pick_source(qtbot, listen, "Exported: drone")
    listen.text.setPlainText("The kettle started to whistle just as the phone rang.")
    results: list[dict[str, Any]] = []
    failures: list[tuple[Any, ...]] = []
    listen.speech.finished.connect(lambda rid, r: results.append(r)
                                   if not rid.startswith("load-") else None)
    listen.speech.failed.connect(lambda *a: failures.append(a))
    try:
        qtbot.mouseClick(listen.speak_btn, Qt.MouseButton.LeftButton)
        assert listen.request is not None
        qtbot.waitUntil(lambda: listen.request is None, timeout=180000)
    finally:
        listen.speech.unload()
    assert not failures, failures
    assert results and results[-1]["runaway"] == ["loop"]
    # the audio up to the cut (the guard's 4 s window), not the length cap's
    audio, rate = sf.read(listen.last_render)
    assert rate == 24000 and 0 < len(audio) < 10 * rate
    summary = str(results[-1].get("summary") or f"Saved {listen.last_render.name}")
    assert listen.state.text().startswith(summary)
    assert listen.state.text().endswith(
        "The speech was cut short where it kept repeating itself; you hear it up to there.")
