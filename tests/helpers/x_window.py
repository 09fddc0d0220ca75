"""The window's side of an X test (a script run under Xvfb by `xserver.run_on_display`):
the app on a workspace at the laptop size, and a wait that keeps Qt's events moving."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QEventLoop, QRect, QSettings
from PySide6.QtWidgets import QApplication

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
