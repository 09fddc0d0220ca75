"""Issue 50: after any dialog of the window, not only the Record page's, the keyboard works
again, on a real X server without a window manager (nothing else hands the focus back
there: after New voice, Ctrl+N, the keys once went to the root window). Real key presses
from xdotool; the window in its own process.

Run as a script, this file is the window's side."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from PySide6.QtWidgets import QDialog

from gui.pages.voices import VoicesPage
from tests.helpers.voices import make_voice
from tests.helpers.x_window import open_window, pump_until
from tests.helpers.xserver import run_on_display


def test_keys_work_after_the_new_voice_dialog_without_a_window_manager(
        laptop_xvfb: str, tmp_path: Path) -> None:
    if not shutil.which("xdotool"):
        pytest.skip("xdotool is missing (apt-get install xdotool)")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    make_voice(workspace)
    out = tmp_path / "seen.json"
    run_on_display(__file__, laptop_xvfb, tmp_path, str(workspace), str(out))
    seen = json.loads(out.read_text())
    assert seen == {"dialog_opened": True, "keys_after_cancel": True,
                    "keys_after_accept": True}, seen


# -- the window's side (run as a script under Xvfb) -------------------------------------

def _drive(workspace: Path, out: Path) -> int:
    app, window = open_window(workspace, out)

    def wait(cond: Callable[[], object], seconds: float = 15.0) -> bool:
        return pump_until(app, cond, seconds)

    def key(name: str) -> None:
        subprocess.run(["xdotool", "key", name], check=True, timeout=30)
        wait(lambda: False, 0.3)  # what the key set off

    def dialog() -> QDialog | None:
        found = [d for d in window.findChildren(QDialog) if d.isVisible()]
        return found[0] if found else None

    def keys_work(row: int) -> bool:
        """Ctrl+<row+1> goes to that page, as a person moves around by keyboard."""
        key(f"ctrl+{row + 1}")
        return wait(lambda: window.nav.currentRow() == row, 5)

    window.show_page(VoicesPage)
    window.activateWindow()
    wait(lambda: app.focusWindow() is not None, 30)
    seen: dict[str, bool] = {}
    key("ctrl+n")
    seen["dialog_opened"] = wait(lambda: dialog() is not None, 10)
    key("Escape")
    wait(lambda: dialog() is None, 10)
    seen["keys_after_cancel"] = keys_work(1)
    key("ctrl+n")
    wait(lambda: dialog() is not None, 10)
    subprocess.run(["xdotool", "type", "Bea"], check=True, timeout=30)
    key("Return")
    wait(lambda: dialog() is None, 10)
    seen["keys_after_accept"] = keys_work(2)
    out.write_text(json.dumps(seen))
    window.shutdown()
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(_drive(Path(sys.argv[1]), Path(sys.argv[2])))
