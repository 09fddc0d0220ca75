"""The Serve page: start the real server from the window, a key shown once and copied, the
curl line and Python snippet it shows work as written, the live request log, stop."""

from __future__ import annotations

import subprocess
from pathlib import Path

import soundfile as sf
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from tests.test_gui_support import *  # noqa: F403 (fixtures: ctx, workspace...)
from tests.test_serve import make_workspace


def test_serve_page_starts_serves_logs_and_stops(qtbot, ctx, tiny_model_dir: Path,
                                                 tmp_path: Path, monkeypatch) -> None:
    from gui.pages.serve import ServePage

    ws = make_workspace(tmp_path, tiny_model_dir)
    ctx.set_workspace(ws)
    page = ServePage(ctx)
    qtbot.addWidget(page)
    page.show()
    page.refresh()
    assert page.chosen() == [str(ws / "ada")]
    page.port.setValue(0)
    page.use_key.setChecked(True)
    qtbot.mouseClick(page.start_button, Qt.MouseButton.LeftButton)
    # the click returned while the engine is still starting: the window goes on
    assert page.running and page.url_field.text() == "" and not page.start_button.isEnabled()
    key_file = page._key_file
    assert key_file is not None and key_file.stat().st_mode & 0o077 == 0  # owner-only
    qtbot.waitUntil(lambda: page.url_field.text().startswith("http://127.0.0.1:"),
                    timeout=180000)
    key = page.key_field.text()
    assert len(key) >= 32 and QGuiApplication.clipboard().text() == key
    assert key in page.curl.toPlainText() and page.url in page.python.toPlainText()

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

    page.stop()
    qtbot.waitUntil(lambda: not page.running, timeout=60000)
    assert page.key_field.text() == "" and page.url_field.text() == ""
    assert not key_file.exists() and page.start_button.isEnabled()
