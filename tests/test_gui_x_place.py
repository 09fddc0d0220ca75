"""Issue 28 §6: on a real X server with a laptop's 1100x760 screen the window opened at
1320x860, partly off the screen, and forgot the size it was given. Now it opens inside the
screen, comes back where it was left, and a place saved on a larger monitor is moved onto
this one. The app runs as a user starts it (`python -m gui.app`, Qt's xcb platform);
xdotool resizes it, as a window manager would for the user.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PySide6.QtCore import QRect, QSettings, QSize
from PySide6.QtGui import QImage

from gui.placement import fit

ROOT = Path(__file__).resolve().parents[1]
SCREEN = QRect(0, 0, 1100, 760)
GRAB = """
import sys
from PySide6.QtGui import QGuiApplication
app = QGuiApplication([sys.argv[0], "-platform", "xcb"])
app.primaryScreen().grabWindow(0).save(sys.argv[1])
"""


def _main_window(display: str) -> tuple[str, QRect] | None:
    """The X id and place of the largest window titled Voxshard (Qt also maps helpers)."""
    tree = subprocess.run(["xwininfo", "-root", "-tree", "-display", display],
                          capture_output=True, text=True, timeout=10).stdout
    found = []
    for line in tree.splitlines():
        if '"Voxshard"' not in line:
            continue
        # 0x1200007 "Voxshard": ("voxshard" "Voxshard")  1100x728+0+0  +0+0
        parts = line.split()
        size = parts[-2].split("+")[0]
        width, height = (int(v) for v in size.split("x"))
        x, y = (int(v) for v in parts[-1].lstrip("+").split("+"))
        found.append((width * height, parts[0], QRect(x, y, width, height)))
    if not found:
        return None
    _area, wid, rect = max(found)
    return wid, rect if rect.width() > 200 else None


class App:
    """`python -m gui.app` on the display, with its own settings folder."""

    def __init__(self, display: str, home: Path) -> None:
        self.display = display
        env = {k: v for k, v in os.environ.items()
               if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
        env.update(DISPLAY=display, QT_QPA_PLATFORM="xcb", HOME=str(home),
                   XDG_CONFIG_HOME=str(home / "config"), XDG_DATA_HOME=str(home / "data"),
                   PYTHONPATH=str(ROOT))
        self.home, self.env = home, env
        self.proc = subprocess.Popen([sys.executable, "-m", "gui.app"], cwd=ROOT, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def window(self) -> tuple[str, QRect]:
        deadline = time.monotonic() + 120
        while (found := _main_window(self.display)) is None or found[1] is None:
            if self.proc.poll() is not None:
                pytest.fail(f"the app exited with {self.proc.returncode}: "
                            f"{self.proc.stderr.read()[-2000:]}")
            if time.monotonic() > deadline:
                pytest.fail("no Voxshard window appeared on the X server in 120 s")
            time.sleep(0.25)
        return found  # type: ignore[return-value]

    def placed(self, expected: QRect) -> QRect:
        """The window's place once the app has placed it (X maps a window before Qt's
        first move and resize reach it), or its last place if it never gets there."""
        deadline = time.monotonic() + 30
        while (place := self.window()[1]) != expected and time.monotonic() < deadline:
            time.sleep(0.1)
        return place

    def saved(self, expected: QRect) -> QRect | None:
        """The place the app saved in its settings, once it is `expected` (or the last)."""
        ini = self.home / "config" / "Voxshard" / "Voxshard.ini"
        deadline = time.monotonic() + 30
        while True:
            value = QSettings(str(ini), QSettings.Format.IniFormat).value("window/geometry")
            if value == expected or time.monotonic() > deadline:
                return value if isinstance(value, QRect) else None
            time.sleep(0.1)

    def painted(self) -> None:
        """Wait for the window's first paint: a move or resize from outside before the
        app has finished showing was undone by its own pending geometry."""
        deadline = time.monotonic() + 60
        shot = self.home / "shot.png"
        while time.monotonic() < deadline:
            subprocess.run([sys.executable, "-c", GRAB, str(shot)], env=self.env,
                           capture_output=True, timeout=60)
            img = QImage(str(shot))
            if len({img.pixel(x, y) for x in range(0, img.width(), 8)
                    for y in range(0, img.height(), 8)}) > 20:
                return
            time.sleep(0.5)
        pytest.fail("the window was never painted")

    def quit(self) -> None:
        self.proc.send_signal(signal.SIGTERM)  # closes the window as Quit does
        _out, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err[-2000:]


def _on_screen(rect: QRect) -> bool:
    return SCREEN.contains(rect)


def test_the_window_opens_on_the_screen_and_where_it_was_left(laptop_xvfb: str,
                                                              tmp_path: Path) -> None:
    if not shutil.which("xdotool"):
        pytest.skip("xdotool is missing (apt-get install xdotool)")
    app = App(laptop_xvfb, tmp_path)
    try:
        # the default place, in the middle of the screen: it was 1320x860 at 0,0, 220 px
        # off to the right and 100 px below
        first = app.placed(fit(None, SCREEN))
        assert first == fit(None, SCREEN) and _on_screen(first), first
        wid = app.window()[0]
        app.painted()
        assert first.width() >= 1024 and first.height() >= 680, first
        # the user resizes it (xdotool in the window manager's place; a move without a
        # window manager reached Qt only now and then, so the place is the unit test's)
        subprocess.run(["xdotool", "windowsize", wid, "1040", "690"], check=True, timeout=30,
                       env={**os.environ, "DISPLAY": laptop_xvfb})
        wanted = QRect(first.topLeft(), QSize(1040, 690))
        assert app.placed(wanted) == wanted
        # the app saves its place once it has had the resize (on a loaded machine the X
        # server's answer can reach it after a quit sent at once: it saved the old place)
        assert app.saved(wanted) == wanted
        app.quit()

        app = App(laptop_xvfb, tmp_path)
        assert app.placed(wanted) == wanted  # remembered (it opened at 1320x860 again)
        app.quit()

        # a place saved on a larger monitor, since unplugged: moved and shrunk onto this one
        ini = tmp_path / "config" / "Voxshard" / "Voxshard.ini"
        assert ini.is_file()
        saved = QSettings(str(ini), QSettings.Format.IniFormat)
        saved.setValue("window/geometry", QRect(1500, 900, 1400, 900))
        saved.sync()
        app = App(laptop_xvfb, tmp_path)
        moved = app.placed(fit(QRect(1500, 900, 1400, 900), SCREEN))
        assert _on_screen(moved), moved
        assert moved.width() >= 1024 and moved.height() >= 680, moved
        app.quit()
    finally:
        if app.proc.poll() is None:
            app.proc.kill()
            app.proc.wait(10)
