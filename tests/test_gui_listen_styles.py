"""Listen speaks in a style (issue 40): the Style field offers the styles the chosen source
was trained with (the engine says which), a style picked from its list is the instruction
the window's real speech engine speaks with (the audio differs from the plain render of
the same seed), the render's record keeps it for the History; a source trained without
styles says, as the window's words, that an instruction typed for it does little."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
from PySide6.QtCore import Qt

from engine.layout.manifest import read_manifest, write_manifest
from engine.train.export import export
from engine.train.rundata import record_data
from gui.pages.listen import ListenPage
from gui.served_speech import ServedEndpoint
from tests.helpers.gui import pick_source
from tests.helpers.runs import make_perturbed_run
from tests.helpers.serving import start_server
from tests.helpers.voices import copy_voice

TRAINED = ("Slowly, in a low whisper.", "Loud and cheerful.")
CHECKPOINT = "Checkpoint: r1 · step 1"


@pytest.fixture(scope="module")
def styled_voice(prepared_voice: Path, tiny_model_dir: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A voice whose run trained on clips described with TRAINED (one checkpoint, its data
    recorded as a starting run records it, styles included); no Ray run of its own."""
    voice = copy_voice(prepared_voice, tmp_path_factory.mktemp("styled-listen") / "joe")
    rows = read_manifest(voice, usable_only=False)
    for n, row in enumerate(rows[::2]):
        row["style"] = TRAINED[n % len(TRAINED)]
    write_manifest(voice, rows)
    record_data(make_perturbed_run(voice, tiny_model_dir, steps=(1,), export=None), voice)
    return voice


def _page(qtbot: Any, ctx: Any, voice: Path, kind: str = "checkpoint") -> ListenPage:
    """Listen at 1100x760 on `voice`, its first source of `kind` picked by clicks."""
    listen = ListenPage(ctx)
    qtbot.addWidget(listen)
    listen.resize(1100, 760)
    listen.show()
    ctx.set_voice(voice)
    listen.refresh()

    def first() -> int:
        return next((i for i in range(listen.source.count())
                     if (listen.source.itemData(i) or {}).get("kind") == kind), -1)

    qtbot.waitUntil(lambda: first() >= 0, timeout=10000)
    pick_source(qtbot, listen, listen.source.itemText(first()))
    return listen


def _offered(listen: ListenPage) -> list[str]:
    return [listen.style.itemText(i) for i in range(listen.style.count())]


def _pick_style(qtbot: Any, listen: ListenPage, style: str) -> None:
    """Open the Style list with a click on its arrow and take `style` with the keys."""
    index = listen.style.findText(style)
    assert index >= 0, _offered(listen)
    listen.style.showPopup()
    view = listen.style.view()
    qtbot.waitUntil(view.isVisible, timeout=5000)
    for _ in range(listen.style.count()):
        if view.currentIndex().row() == index:
            break
        qtbot.keyClick(view, Qt.Key.Key_Down)
    qtbot.keyClick(view, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not view.isVisible(), timeout=5000)
    assert listen.style.currentText() == style


def _speak(qtbot: Any, listen: ListenPage) -> None:
    """Click Speak and wait for the render's end (the engine stays warm)."""
    qtbot.mouseClick(listen.speak_btn, Qt.MouseButton.LeftButton)
    assert listen.request is not None
    qtbot.waitUntil(lambda: listen.request is None, timeout=240000)
    assert listen.state.text() != "Stopped."


def test_a_trained_style_is_offered_and_spoken_as_the_instruction(
        qtbot, ctx, workspace: Path, styled_voice: Path) -> None:
    voice = copy_voice(styled_voice, workspace / "joe")
    listen = _page(qtbot, ctx, voice)
    assert _offered(listen) == ["", *sorted(TRAINED)]
    assert listen.style.currentText() == ""
    listen.text.setPlainText("Hello there.")
    listen.seed.setValue(5)
    failures: list[tuple[Any, ...]] = []
    listen.speech.failed.connect(lambda *a: failures.append(a))
    try:
        _speak(qtbot, listen)
        plain = listen.last_render
        assert plain is not None and plain.exists()
        _pick_style(qtbot, listen, TRAINED[0])
        assert listen.style_note.isHidden()  # a trained style: nothing to warn about
        _speak(qtbot, listen)  # the same warm engine: a plain render and a styled one
    finally:
        listen.speech.unload()
    assert failures == []
    styled = listen.last_render
    assert styled is not None and styled != plain and styled.exists()
    a, _ = sf.read(plain, dtype="float32")
    b, _ = sf.read(styled, dtype="float32")
    assert a.shape != b.shape or not np.array_equal(a, b)
    # the record beside each render says the style, and the History shows it
    assert json.loads(styled.with_suffix(".json").read_text())["style"] == TRAINED[0]
    assert json.loads(plain.with_suffix(".json").read_text()).get("style") in (None, "")

    def models() -> list[str]:
        return [listen.history.item(r, 1).text() for r in range(listen.history.rowCount())]

    qtbot.waitUntil(lambda: sorted(models()) == [CHECKPOINT, f"{CHECKPOINT} · style: "
                                                 f"{TRAINED[0]}"], timeout=10000)


def test_a_source_trained_without_styles_warns_when_an_instruction_is_typed(
        qtbot, window, workspace: Path, trained_run: dict[str, Any], tmp_path: Path) -> None:
    voice = copy_voice(trained_run["voice"], workspace / "joe")
    window.resize(1100, 760)
    window.ctx.set_voice(voice)
    listen = window.show_page(ListenPage)
    assert isinstance(listen, ListenPage)
    qtbot.waitUntil(lambda: any((listen.source.itemData(i) or {}).get("kind") == "checkpoint"
                                for i in range(listen.source.count())), timeout=10000)
    pick_source(qtbot, listen, next(listen.source.itemText(i)
                                    for i in range(listen.source.count())
                                    if listen.source.itemData(i)["kind"] == "checkpoint"))
    assert _offered(listen) == [""]
    assert listen.style_note.isHidden()
    qtbot.keyClicks(listen.style.lineEdit(), "Whisper, as if telling a secret.")
    note = listen.style_note
    assert note.isVisible()
    assert "little or no effect" in note.text()
    assert "--" not in note.text()  # the window's words, no command-line flag
    # the whole warning is in view at a laptop's size, beside the field it is about
    qtbot.waitUntil(lambda: note.height() >= note.heightForWidth(note.width()), timeout=5000)
    where = note.mapTo(window, note.rect().bottomRight())
    assert window.rect().contains(where), (where, window.size())
    window.grab().save(str(tmp_path / "listen-style-warning.png"))
    print("screenshot:", tmp_path / "listen-style-warning.png")
    listen.style.lineEdit().clear()
    assert note.isHidden()
    # a zero-shot preview clones on a Base model: the instruction is ignored, and it says so
    pick_source(qtbot, listen, "Zero-shot preview (base model + a reference clip)")
    qtbot.keyClicks(listen.style.lineEdit(), "Whisper.")
    assert note.isVisible() and "take no instruction" in note.text()


def test_a_style_travels_to_the_running_server_as_its_instructions(
        qtbot, ctx, workspace: Path, styled_voice: Path, tmp_path: Path) -> None:
    """Listen's source served by the Serve page's server (here the engine's real `serve`,
    its `serving` event given to the window as the Serve page gives it): the style picked
    is the request's `instructions`, which the server's log records as applied."""
    voice = copy_voice(styled_voice, workspace / "joe")
    export(voice, voice / "exports" / "styled", run="r1")
    server = start_server(["--workspace", str(workspace), "--port", "0", "--device", "cpu",
                           "--dtype", "float32", "--timeout", "120"], tmp_path)
    try:
        ctx.speech.set_endpoint(ServedEndpoint(server.url or "", None, {
            str(k): str(v) for k, v in (server.serving.get("loads") or {}).items()}))
        listen = _page(qtbot, ctx, voice, kind="export")
        assert _offered(listen) == ["", *sorted(TRAINED)]  # an export keeps its run's styles
        assert ctx.speech.served_name(listen.voice_spec()) is not None
        _pick_style(qtbot, listen, TRAINED[1])
        listen.text.setPlainText("Hello there.")
        before = len(server.logged())
        _speak(qtbot, listen)
        assert "Serve page's server" in listen.state.text()
        [logged] = server.logged_since(before)
        assert logged["instructions"]["text"] == TRAINED[1]
        assert logged["instructions"]["applied"] is True
        assert ctx.speech.job is None  # the window's own worker never started
    finally:
        ctx.speech.set_endpoint(None)
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) in (0, 130)
