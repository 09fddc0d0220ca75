"""The window's side of an X test (a script run under Xvfb by `xserver.run_on_display`):
the app on a workspace at the laptop size, a wait that keeps Qt's events moving, and real
input through xdotool."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QEventLoop, QPoint, QRect, QSettings
from PySide6.QtWidgets import QApplication, QWidget

from gui.app import MainWindow
from gui.context import AppContext


def open_window(workspace: Path, out: Path, voice: str = "ada"
                ) -> tuple[QApplication, MainWindow]:
    """The app on `workspace` with `voice` open, its settings beside `out`, at 1100x760."""
    app = QApplication([__file__])
    settings = QSettings(str(out.with_suffix(".ini")), QSettings.Format.IniFormat)
    settings.setValue("workspace", str(workspace))
    settings.setValue(f"last_voice/{workspace}", voice)
    window = MainWindow(AppContext(settings))
    window.setGeometry(QRect(0, 0, 1100, 760))
    window.show()
    return app, window


def pump_until(app: QApplication, cond: Callable[[], object], seconds: float = 15.0) -> bool:
    """Process events until `cond()` holds (True) or `seconds` pass (False)."""
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            return False
        app.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
        time.sleep(0.01)
    return True


class XDriver:
    """Real input through xdotool: the X server delivers it to the window as a desktop
    would (focus handed around, the widget under the pointer)."""

    def __init__(self, app: QApplication) -> None:
        self.app = app

    def wait(self, cond: Callable[[], object], seconds: float = 15.0) -> bool:
        return pump_until(self.app, cond, seconds)

    def need(self, cond: Callable[[], object], what: str, seconds: float = 60.0) -> None:
        """Wait for `cond`; the script ends saying what it waited for if it never holds."""
        if not self.wait(cond, seconds):
            raise SystemExit(f"timed out waiting for {what}")

    def xdotool(self, *args: object) -> None:
        subprocess.run(["xdotool", *map(str, args)], check=True, timeout=30)

    def key(self, name: str) -> None:
        self.xdotool("key", name)
        self.wait(lambda: False, 0.3)  # what the key set off

    def point_at(self, widget: QWidget, x_fraction: float = 0.5) -> None:
        spot = widget.mapToGlobal(QPoint(int(widget.width() * x_fraction), widget.height() // 2))
        self.xdotool("mousemove", "--sync", spot.x(), spot.y())
