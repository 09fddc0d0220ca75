"""The Serve page: start the real server from the window, a key shown once and copied, the
curl line and Python snippet it shows work as written, the live request log, stop."""

from __future__ import annotations

import asyncio
import re
import subprocess
from pathlib import Path

import soundfile as sf
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize

from tests.helpers.voices import make_voice, make_workspace


def _examples_work_as_written(qtbot, page, tmp_path: Path, monkeypatch) -> None:
    """The curl line and the Python snippet, run as shown, each write a WAV; both land in
    the request log."""
    curl = subprocess.run(["bash", "-e", "-c", page.curl.toPlainText()], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert curl.returncode == 0, curl.stderr
    assert sf.read(tmp_path / "hello.wav")[1] == 24000
    (tmp_path / "hello.wav").unlink()
    monkeypatch.chdir(tmp_path)  # the snippet runs here as written (openai is imported already)
    exec(compile(page.python.toPlainText(), "snippet", "exec"), {})
    assert sf.read(tmp_path / "hello.wav")[1] == 24000
    qtbot.waitUntil(lambda: page.log.rowCount() == 2, timeout=30000)
    assert [page.log.item(r, 1).text() for r in range(2)] == ["200", "200"]
    assert "audio s per s" in page.rate.text()


def _home_assistant_speaks(qtbot, page) -> None:
    """The address to type in, reached as the text says, in the same log."""
    found = re.search(r"Wyoming Protocol, host (\S+), port (\d+)\.$", page.wyoming_info.text())
    assert found, page.wyoming_info.text()
    # announced at loopback: only a Home Assistant on this computer can connect, and the
    # page says what lets one on another machine in
    assert page.ha_note.text().startswith(
        "Announced at 127.0.0.1: only a Home Assistant on this computer can connect. For one "
        "on another machine, set Listen on to 'Other computers too"), page.ha_note.text()
    # the address to type in, copied with one click, and the voices as Home Assistant lists
    assert page.wyoming_field.text() == f"{found.group(1)}:{found.group(2)}"
    qtbot.mouseClick(page.copy_wyoming, Qt.MouseButton.LeftButton)
    assert QGuiApplication.clipboard().text() == page.wyoming_field.text()
    assert [page.ha_voices.item(i).text() for i in range(page.ha_voices.count())] == [
        "ada (best: fine-tuned)", "ada/ada-v1 (fine-tuned)"]

    async def speak() -> None:
        async with AsyncTcpClient(found.group(1), int(found.group(2))) as client:
            await client.write_event(Synthesize(text="Hello, Home Assistant.").event())
            while (event := await client.read_event()) is not None:
                if event.type == "audio-stop":
                    return
        raise AssertionError("no audio-stop")

    asyncio.run(speak())
    qtbot.waitUntil(lambda: page.log.rowCount() == 3, timeout=30000)
    assert (page.log.item(2, 1).text(), page.log.item(2, 3).text()) == ("200", "pcm wyoming")


def test_serve_page_starts_serves_logs_and_stops(qtbot, ctx, tiny_model_dir: Path,
                                                 tmp_path: Path, monkeypatch) -> None:
    from gui.pages.serve import WORD_JOINER, ServePage

    ws = make_workspace(tmp_path, tiny_model_dir)
    ctx.set_workspace(ws)
    page = ServePage(ctx)
    qtbot.addWidget(page)
    page.show()
    page.refresh()
    assert page.chosen() == [str(ws / "ada")]
    page.port.setValue(0)
    page.use_key.setChecked(True)
    page.home_assistant.setChecked(True)
    page.wyoming_port.setValue(0)
    page.zeroconf.setChecked(True)  # announced: Home Assistant offers it as discovered
    qtbot.mouseClick(page.start_button, Qt.MouseButton.LeftButton)
    # the click returned while the engine is still starting: the window goes on
    assert page.running and page.url_field.text() == "" and not page.start_button.isEnabled()
    key_file = page._key_file
    assert key_file is not None and key_file.stat().st_mode & 0o077 == 0  # owner-only
    qtbot.waitUntil(lambda: page.url_field.text().startswith("http://127.0.0.1:"),
                    timeout=180000)
    key = page.key_field.text()
    assert len(key) >= 32 and QGuiApplication.clipboard().text() == key
    # one voice ticked, served as itself and as its export: it said "Serving 2 voice(s) at
    # http://...", which also wrapped inside the address (the URL box holds it)
    assert page.state.text().replace(WORD_JOINER, "").startswith(
        "Serving 1 voice at the URL below, as 2 names: ada, ada/ada-v1."), page.state.text()
    assert page.url not in page.state.text()
    assert key in page.curl.toPlainText() and page.url in page.python.toPlainText()

    _examples_work_as_written(qtbot, page, tmp_path, monkeypatch)
    _home_assistant_speaks(qtbot, page)

    page.stop()
    qtbot.waitUntil(lambda: not page.running, timeout=60000)
    assert page.key_field.text() == "" and page.url_field.text() == ""
    assert page.wyoming_info.text() == ""
    assert not key_file.exists() and page.start_button.isEnabled()
    # stopped: the examples again, with a placeholder, not the dead server's key
    assert page.curl.toPlainText().startswith("# Start the server first")
    assert key not in page.curl.toPlainText() + page.python.toPlainText()


def test_stopped_serve_page_shows_the_examples_it_would_serve(qtbot, ctx,
                                                               workspace: Path) -> None:
    """Stopped, the example boxes were empty: they show the examples with the address, port,
    voice and key the form would start, and say to start the server first; a running
    server's own examples stay as they are until it stops."""
    from types import SimpleNamespace

    from gui.pages.serve import ServePage

    export = make_voice(workspace) / "exports" / "ada-v1"
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    page = ServePage(ctx)
    qtbot.addWidget(page)
    page.show()
    page.refresh()
    curl, python = page.curl.toPlainText(), page.python.toPlainText()
    assert curl.startswith("# Start the server first")
    assert "curl -sS http://127.0.0.1:8000/v1/audio/speech" in curl
    assert '"voice": "ada"' in curl and "Authorization" not in curl
    assert "base_url='http://127.0.0.1:8000/v1'" in python and "voice='ada'" in python
    page.port.setValue(0)  # the server picks the port when it starts
    page.host.setCurrentIndex(1)  # other computers: a key is needed
    curl, python = page.curl.toPlainText(), page.python.toPlainText()
    assert "http://0.0.0.0:PORT/v1/audio/speech" in curl and "Bearer KEY" in curl
    assert "base_url='http://0.0.0.0:PORT/v1', api_key='KEY'" in python
    # running (a stand-in for the engine's job): the server's own examples, as written
    page.job = SimpleNamespace(outcome=None)  # type: ignore[assignment]
    page._on_event({"event": "state", "state": "serving", "url": "http://0.0.0.0:41234/v1",
                    "voices": ["ada"]})
    served = page.curl.toPlainText()
    assert served.startswith("curl -sS http://0.0.0.0:41234/v1/audio/speech")
    page.port.setValue(9000)
    assert page.curl.toPlainText() == served
    page.job.outcome = "cancelled"
    page._on_finished()
    assert page.curl.toPlainText().startswith("# Start the server first")
    assert "http://0.0.0.0:9000/v1" in page.curl.toPlainText()


def test_home_assistant_panel_lists_the_voices_in_its_order(qtbot, ctx,
                                                             workspace: Path) -> None:
    """Home Assistant's part of the page: off until ticked; then the announce switch, the
    voices in the order Home Assistant lists them (its first is a new assistant's voice,
    the plain name before its exports) and the note that a voice added while serving needs
    a reload of the integration."""
    from gui.pages.serve import RELOAD_NOTE, ServePage

    voice = make_voice(workspace)
    for name in ("ada-v1", "ada-v2"):
        (voice / "exports" / name).mkdir(parents=True)
        (voice / "exports" / name / "config.json").write_text("{}")
    page = ServePage(ctx)
    qtbot.addWidget(page)
    page.resize(1100, 760)
    page.show()
    page.refresh()
    assert not page.ha_panel.isVisible() and not page.zeroconf.isEnabled()
    page.home_assistant.setChecked(True)
    assert page.ha_panel.isVisible() and page.zeroconf.isEnabled()
    listed = [page.ha_voices.item(i).text() for i in range(page.ha_voices.count())]
    assert listed[0] == "ada (best: fine-tuned)"
    assert sorted(listed[1:]) == ["ada/ada-v1 (fine-tuned)", "ada/ada-v2 (fine-tuned)"]
    assert page.ha_note.text() == RELOAD_NOTE
    assert not page.copy_wyoming.isEnabled()  # nothing to copy until it runs
    page.home_assistant.setChecked(False)
    assert not page.ha_panel.isVisible() and not page.zeroconf.isEnabled()


def _serve_listens_voice(qtbot, ctx, listen):
    """The Serve page started (with a key) on the voice Listen has chosen; the window's
    worker lets its copy go once the server holds it."""
    from gui.pages.serve import ServePage

    speech = ctx.speech
    serve = ServePage(ctx)
    qtbot.addWidget(serve)
    serve.refresh()
    serve.port.setValue(0)
    serve.use_key.setChecked(True)  # the key travels with Listen's requests
    qtbot.mouseClick(serve.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: speech.endpoint is not None, timeout=180000)
    # the server holds the same export: the window's copy is let go
    qtbot.waitUntil(lambda: not speech.holds_model(), timeout=60000)
    assert speech.served_name(listen.voice_spec()) in ("ada", "ada/ada-v1")
    assert not speech.needs_load(listen.voice_spec())
    return serve


def test_listen_speaks_through_the_running_server(qtbot, ctx, tiny_model_dir: Path,
                                                  tmp_path: Path) -> None:
    """While the Serve page serves the source chosen on Listen, Listen's requests go to that
    server (one warm worker for the window and other programs): the window's own worker lets
    its copy go and is not started again; the render is a whole 24 kHz WAV, logged by the
    server; the server's refusal is Listen's message; after Stop, the window's own worker
    speaks again."""
    from gui.pages.listen import ListenPage

    ws = make_workspace(tmp_path, tiny_model_dir)
    ctx.set_workspace(ws)
    listen = ListenPage(ctx)
    qtbot.addWidget(listen)
    listen.show()
    ctx.set_voice(ws / "ada")
    listen.refresh()
    qtbot.waitUntil(lambda: listen.source.itemText(0) == "Exported: ada-v1", timeout=10000)
    listen.source.setCurrentIndex(0)
    speech = ctx.speech

    def spoken(text: str) -> dict:
        with qtbot.waitSignal(speech.finished, timeout=180000) as done:
            assert listen.speak(text) is not None
        qtbot.waitUntil(lambda: listen.request is None, timeout=30000)
        return done.args[1]

    # before the server: the window's own worker loads the export
    spoken("Hello from the window.")
    assert speech.holds_model() and speech.loaded == listen.voice_spec()

    serve = _serve_listens_voice(qtbot, ctx, listen)

    result = spoken("Hello through the server, shared with other programs.")
    assert speech.job is None  # the window's own worker was never started again
    assert "Serve page's server" in listen.state.text()
    out = Path(result["path"])
    audio, rate = sf.read(out)
    assert rate == 24000 and len(audio) > 0
    assert abs(len(audio) / rate - result["duration_s"]) < 1e-3  # the header's sizes are real
    assert (out.with_suffix(".json")).exists()  # in Listen's history like any render
    qtbot.waitUntil(lambda: serve.log.rowCount() == 1, timeout=30000)
    assert serve.log.item(0, 1).text() == "200"
    assert serve.log.item(0, 2).text() == result["served_by"]

    # the server's own answer to a bad request is Listen's message (4096 characters at most)
    with qtbot.waitSignal(speech.failed, timeout=60000) as refused:
        assert listen.speak("word " * 1000) is not None
    assert "4096" in refused.args[2] and "Traceback" not in refused.args[2]
    qtbot.waitUntil(lambda: listen.request is None, timeout=30000)
    assert speech.job is None and not speech.pending

    serve.stop()
    qtbot.waitUntil(lambda: not serve.running, timeout=60000)
    assert speech.endpoint is None and speech.needs_load(listen.voice_spec())
    spoken("The window's own engine again.")
    assert speech.holds_model()
    speech.unload()
