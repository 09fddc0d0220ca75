"""Listen switches among the voices of one base without loading the model again (issue
30): two adapter voices and the instant voice of one base, picked and spoken by clicks on
the page, are spoken by the window's real speech engine (`serve-speech`, one process) with
one model load, and each sounds as itself; a full voice after them loads its own model.
The seconds from a click on Speak to the voice ready are printed for each switch."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
from PySide6.QtCore import Qt

from engine.prepare.instant import make_instant_voice
from engine.train.export import export
from gui.pages.listen import ListenPage
from tests.helpers.gui import pick_source
from tests.helpers.voices import copy_voice

VOICES = ("Adapter voice: lora-adapter", "Adapter voice: step1-adapter",
          "Instant voice (its reference clip, no training)")
#: a full voice (an official model folder of its own) after them: that one loads a model
FULL = "Exported: joe-step2"


def test_listen_switches_voices_of_one_base_with_one_model_load(
        qtbot, ctx, workspace: Path, lora_run: dict[str, Any], tiny_model_dir: Path) -> None:
    voice = copy_voice(lora_run["voice"], workspace / "joe")  # with the run's lora-adapter
    export(voice, voice / "exports" / "step1-adapter", run="lora", step=1, adapter=True)
    make_instant_voice(voice, str(tiny_model_dir))
    shutil.copytree(lora_run["export"], voice / "exports" / "joe-step2")
    listen = ListenPage(ctx)
    qtbot.addWidget(listen)
    listen.show()
    ctx.set_voice(voice)
    listen.refresh()
    qtbot.waitUntil(lambda: all(listen.source.findText(v) >= 0 for v in (*VOICES, FULL)),
                    timeout=10000)
    listen.text.setPlainText("Hello there, one voice of many.")
    listen.seed.setValue(1)
    states: list[str] = []
    loaded: list[dict[str, Any]] = []
    failures: list[tuple[Any, ...]] = []
    listen.speech.state.connect(lambda _rid, state: states.append(state))
    # the page's words per Speak click: right after it, and when the engine loads a model
    said: list[list[str]] = []
    listen.speech.state.connect(lambda _rid, state: said[-1].append(listen.state.text())
                                if state == "loading_model" and said else None)
    took: list[float] = []  # from the click on Speak to the voice loaded or swapped in
    clicked = [0.0]

    def on_finished(rid: str, result: dict[str, Any]) -> None:
        if rid.startswith("load-"):
            loaded.append(result["loaded"])
            took.append(time.monotonic() - clicked[0])

    listen.speech.finished.connect(on_finished)
    listen.speech.failed.connect(lambda *a: failures.append(a))
    heard = {}
    try:
        for label in (*VOICES, FULL):
            pick_source(qtbot, listen, label)
            clicked[0] = time.monotonic()
            qtbot.mouseClick(listen.speak_btn, Qt.MouseButton.LeftButton)
            assert listen.request is not None
            said.append([listen.state.text()])
            qtbot.waitUntil(lambda: listen.request is None, timeout=180000)
            assert not failures, failures
            assert listen.last_render is not None
            audio, rate = sf.read(listen.last_render)
            assert rate == 24000 and len(audio) > 0
            heard[label] = audio
    finally:
        listen.speech.unload()
    # four voices asked of the engine, two models loaded: the first voice's base, then
    # the full voice's own; the other voices of the base swapped in place
    assert [s["kind"] for s in loaded] == ["adapter", "adapter", "zero_shot", "custom_voice"]
    assert [s["label"] for s in loaded][:2] == ["lora-adapter", "step1-adapter"]
    assert states.count("loading_model") == 2, states
    # a switch within the base is no model load, and the page does not say it is one
    loading, switching = "Loading the model…", "Switching voice…"
    assert said == [[loading, loading], [switching], [switching], [switching, loading]], said
    print(f"\nListen, voice to voice on the tiny model (CPU), click to voice ready: "
          f"adapter -> adapter {took[1]:.2f} s, adapter -> instant {took[2]:.2f} s, "
          f"-> full voice (a model load) {took[3]:.2f} s; first load {took[0]:.2f} s")
    # each voice is heard as itself: the same seed and text, other speech
    a, b, c = (heard[v] for v in VOICES)
    for x, y in ((a, b), (a, c), (b, c)):
        assert len(x) != len(y) or not np.allclose(x, y)
