"""Issue 45: the Record page has its keys back after each of its dialogs, through a real
X server (Xvfb, Qt's xcb platform; without a window manager, and with openbox where it is
installed, which hands the focus around as a desktop does): real key presses and clicks from
xdotool, the window in its own process recording from the test's PulseAudio null sink.
Once, Space pressed after a dialog went to another button (About) while a take ran on.

Run as a script, this file is the window's side."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtWidgets import QMessageBox

from gui.app import MainWindow
from gui.pages.record import RecordPage
from tests.helpers.voices import make_voice
from tests.helpers.x_window import XDriver, open_window

ROOT = Path(__file__).resolve().parents[1]


def _start_window_manager(display: str) -> subprocess.Popen:
    """openbox on `display`, once it has taken the screen (_NET_SUPPORTING_WM_CHECK)."""
    if not shutil.which("openbox") or not shutil.which("xprop"):
        pytest.skip("openbox or xprop is missing (apt-get install openbox x11-utils)")
    env = {**os.environ, "DISPLAY": display}
    wm = subprocess.Popen(["openbox", "--sm-disable"], env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while "window id" not in subprocess.run(
            ["xprop", "-root", "_NET_SUPPORTING_WM_CHECK"], env=env, capture_output=True,
            text=True, timeout=10).stdout:
        if wm.poll() is not None or time.monotonic() > deadline:
            wm.kill()
            pytest.fail("openbox did not take the screen")
        time.sleep(0.1)
    return wm


@pytest.mark.parametrize("manager", ["none", "openbox"])
def test_space_works_after_every_dialog_on_a_real_x_server(
        laptop_xvfb: str, sink: str, tmp_path: Path, manager: str) -> None:
    if not shutil.which("xdotool"):
        pytest.skip("xdotool is missing (apt-get install xdotool)")
    wm = _start_window_manager(laptop_xvfb) if manager == "openbox" else None
    try:
        _run_window(laptop_xvfb, tmp_path)
    finally:
        if wm is not None:
            wm.terminate()
            wm.wait(10)


def _run_window(laptop_xvfb: str, tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    make_voice(workspace)
    out = tmp_path / "seen.json"
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
    env.update(DISPLAY=laptop_xvfb, QT_QPA_PLATFORM="xcb", HOME=str(tmp_path),
               XDG_CONFIG_HOME=str(tmp_path / "config"), PYTHONPATH=str(ROOT))
    # the sound server as this process reaches it (its address and cookie live under the
    # real home, which the window's process does not have)
    info = subprocess.run(["pactl", "info"], capture_output=True, text=True, timeout=10).stdout
    server = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                   if line.startswith("Server String:")), "")
    if server and "PULSE_SERVER" not in env:
        env["PULSE_SERVER"] = server
    cookie = Path.home() / ".config" / "pulse" / "cookie"
    if cookie.is_file() and "PULSE_COOKIE" not in env:
        env["PULSE_COOKIE"] = str(cookie)
    child = subprocess.run([sys.executable, __file__, str(workspace), str(out)], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    seen = json.loads(out.read_text())
    assert seen == {"stopped_as_quit_asks": True, "space_after_quit": True,
                    "space_after_retake": True, "space_after_keep": True,
                    "about_opened": False}, seen


# -- the window's side (run as a script under Xvfb) -------------------------------------

def _box(drv: XDriver, window: MainWindow, text: str) -> QMessageBox | None:
    """The visible message box that says `text`, once it shows (None after 10 s)."""
    found: list[QMessageBox] = []
    drv.wait(lambda: found.extend(b for b in window.findChildren(QMessageBox)
                                  if b.isVisible() and text in b.text()) or found, 10)
    return found[0] if found else None


def _click(drv: XDriver, dialog: QMessageBox | None, label: str) -> None:
    """A real click on the dialog's button `label`; the dialog closes."""
    if dialog is None:
        raise SystemExit(f"no dialog for {label!r}")
    button = next(b for b in dialog.buttons() if b.text() == label)
    drv.point_at(button)
    drv.xdotool("click", 1)
    drv.wait(lambda: not dialog.isVisible(), 10)
    drv.wait(lambda: False, 0.3)


def _drive(workspace: Path, out: Path) -> int:
    app, window = open_window(workspace, out)
    drv = XDriver(app)
    page = window.show_page(RecordPage)
    assert isinstance(page, RecordPage)
    if not drv.wait(lambda: window.isVisible() and page.prompt is not None, 60):
        raise SystemExit("the Record page did not open its voice")
    window.activateWindow()
    drv.wait(lambda: app.focusWindow() is not None, 30)
    seen: dict[str, bool] = {}
    drv.key("space")
    if not drv.wait(lambda: "speak now" in page.rec_state.text()):
        raise SystemExit(f"Space did not start a take: {page.rec_state.text()!r}")
    drv.key("ctrl+q")  # Quit, during the take
    quit_box = _box(drv, window, "was being recorded")
    seen["stopped_as_quit_asks"] = drv.wait(lambda: page.take_audio is not None, 10) \
        and quit_box is not None and quit_box.isVisible()
    _click(drv, quit_box, "Review it")
    drv.key("space")  # a new take of the same prompt
    seen["space_after_quit"] = drv.wait(lambda: "speak now" in page.rec_state.text(), 10)
    drv.key("space")
    drv.wait(lambda: page.take_audio is not None, 10)
    drv.key("Return")  # silent: it cannot train, Enter asks
    _click(drv, _box(drv, window, "This take cannot train"), "Re-take")
    drv.wait(lambda: "speak now" in page.rec_state.text(), 10)
    drv.key("space")
    seen["space_after_retake"] = drv.wait(lambda: page.take_audio is not None
                                          and not page.recorder.active, 10)
    drv.key("Return")
    _click(drv, _box(drv, window, "This take cannot train"), "Keep anyway")
    drv.key("space")
    seen["space_after_keep"] = drv.wait(lambda: "speak now" in page.rec_state.text(), 10)
    drv.key("space")
    drv.wait(lambda: not page.recorder.active, 10)
    seen["about_opened"] = window._about is not None
    out.write_text(json.dumps(seen))
    page.discard()
    window.shutdown()
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(_drive(Path(sys.argv[1]), Path(sys.argv[2])))
