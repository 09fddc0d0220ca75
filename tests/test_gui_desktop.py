"""The app on a real X server: Xvfb with Qt's xcb platform, not only offscreen.

Starts `voxshard` as a user would (its own process, `-platform xcb`), waits until
the X server reports its mapped main window, takes a screenshot through a
second X client, and quits it with SIGTERM (which closes the window cleanly).
Needs the `xvfb` fixture (tests/helpers/xserver.py) and the xcb libraries Qt's xcb
plugin loads; `.ci/run` installs them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _windows(display: str) -> str:
    return subprocess.run(["xwininfo", "-root", "-tree", "-display", display],
                          capture_output=True, text=True, timeout=10).stdout


def _main_windows(display: str) -> list[str]:
    """X windows titled Voxshard at least the app's minimum size (Qt also maps 1x1 helpers)."""
    found = []
    for line in _windows(display).splitlines():
        if '"Voxshard"' not in line:
            continue
        size = line.split(")")[-1].split()[0].split("+")[0]
        width, height = (int(v) for v in size.split("x"))
        if width >= 1024 and height >= 680:
            found.append(line.strip())
    return found


GRAB = """
import sys
from PySide6.QtGui import QGuiApplication
app = QGuiApplication([sys.argv[0], "-platform", "xcb"])
shot = app.primaryScreen().grabWindow(0)
print(shot.width(), shot.height(), shot.save(sys.argv[1]))
"""


def test_app_starts_on_a_real_x_server(xvfb: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
    env.update(DISPLAY=xvfb, QT_QPA_PLATFORM="xcb", HOME=str(tmp_path),
               XDG_CONFIG_HOME=str(tmp_path / "config"), XDG_DATA_HOME=str(tmp_path / "data"),
               PYTHONPATH=str(ROOT))
    app = subprocess.Popen([sys.executable, "-m", "gui.app"], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (big := _main_windows(xvfb)):
            if app.poll() is not None:
                pytest.fail(f"the app exited with {app.returncode}: {app.stderr.read()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail("no Voxshard window appeared on the X server in 120 s")
            time.sleep(0.25)
        assert len(big) == 1, big  # one main window, at its real size

        # the screenshot shows the window: many distinct colours, not a blank root. A
        # window is mapped before its first paint reaches the server (on a loaded machine
        # a grab can fall between the two), so grab again until it shows or time runs out
        from PySide6.QtGui import QImage

        shot = tmp_path / "desktop.png"
        deadline = time.monotonic() + 60
        while True:
            grab = subprocess.run([sys.executable, "-c", GRAB, str(shot)], env=env,
                                  capture_output=True, text=True, timeout=60)
            assert grab.stdout.split() == ["1600", "1000", "True"], grab.stderr[-2000:]
            img = QImage(str(shot))
            colours = {img.pixel(x, y) for x in range(0, img.width(), 8)
                       for y in range(0, img.height(), 8)}
            if len(colours) > 20 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert len(colours) > 20, len(colours)

        app.send_signal(signal.SIGTERM)  # closes the window as Quit does
        _out, err = app.communicate(timeout=60)
        assert app.returncode == 0, err[-2000:]
        assert "Could not load the Qt platform plugin" not in err
        assert not _main_windows(xvfb)
    finally:
        if app.poll() is None:
            app.kill()
            app.wait(10)
