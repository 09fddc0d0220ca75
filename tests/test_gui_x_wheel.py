"""Issue 28 §1: a real mouse wheel, through the X server, never changes a setting it only
passes over. With a real wheel Precision, "What trains", "Early stop" and the Run
selector changed: Qt gives a spin or combo box (Qt.WheelFocus) the focus before the app's
guard asks whether it has focus. The older test sent a synthetic QWheelEvent, which skips
that step, so it passed.

The window runs in its own process on Xvfb with Qt's xcb platform (this file, run as a
script); xdotool moves the real pointer and clicks the wheel buttons (4 up, 5 down).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import QEvent, QObject, QRect, QSettings
from PySide6.QtWidgets import QApplication

from engine.config.train import TrainConfig
from engine.core.atomic import write_json
from gui.app import MainWindow
from gui.context import AppContext
from gui.pages.train import TrainPage
from gui.theme import ThemeManager
from tests.helpers.voices import make_voice
from tests.helpers.x_window import XDriver

ROOT = Path(__file__).resolve().parents[1]


def _write_run(voice: Path, name: str, steps: int) -> None:
    run = voice / "runs" / name
    run.mkdir(parents=True)
    cfg = TrainConfig()
    cfg.run.steps = steps
    cfg.model.base = "/models/tiny"
    write_json(run / "config.json", cfg.to_dict())
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"kind": "train", "step": s, "rank": 0, "loss/train": 9 - s / 10,
                    "total_steps": steps}) + "\n" for s in range(1, 11)))
    (run / "checkpoint_step_0000010").mkdir()
    (run / "checkpoint_step_0000010" / "COMPLETE").write_text("")


def test_a_real_wheel_scrolls_the_form_and_changes_only_a_clicked_field(
        laptop_xvfb: str, tmp_path: Path) -> None:
    if not shutil.which("xdotool"):
        pytest.skip("xdotool is missing (apt-get install xdotool)")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    voice = make_voice(workspace)
    _write_run(voice, "2026-01-01_a", 100)
    _write_run(voice, "2026-01-02_b", 200)
    out = tmp_path / "seen.json"
    env = {k: v for k, v in os.environ.items() if k not in ("QT_QPA_PLATFORM", "WAYLAND_DISPLAY")}
    env.update(DISPLAY=laptop_xvfb, QT_QPA_PLATFORM="xcb", HOME=str(tmp_path),
               XDG_CONFIG_HOME=str(tmp_path / "config"), PYTHONPATH=str(ROOT))
    child = subprocess.run([sys.executable, __file__, str(workspace), str(out)], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    seen = json.loads(out.read_text())
    # over an unfocused field: the value stays, the form scrolls instead
    for name in ("trainable", "precision", "patience", "ckpt_every"):
        wheel = seen[name]
        assert wheel["after"] == wheel["before"], (name, wheel)
        assert wheel["scroll_after"] != wheel["scroll_before"], (name, wheel)
        assert not wheel["focused"], (name, wheel)
    # the Run selector (outside the form) keeps the run on screen
    assert seen["run_picker"]["after"] == seen["run_picker"]["before"], seen["run_picker"]
    # clicked into, the field is the user's to wheel
    clicked = seen["clicked_spin"]
    assert clicked["focused"] and clicked["after"] == clicked["before"] + 1, clicked
    clicked = seen["clicked_combo"]
    assert clicked["focused"] and clicked["after"] == clicked["before"] + 1, clicked


# -- the window's side (run as a script under Xvfb) -------------------------------------

class _Wheels(QObject):
    """Counts the real wheel events the X server delivered (to the widget under the
    pointer; a parent's copy is not spontaneous)."""

    seen = 0

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.Wheel and event.spontaneous():
            _Wheels.seen += 1
        return False


def _wheel_once(drv: XDriver, up: bool) -> None:
    before = _Wheels.seen
    drv.xdotool("click", 4 if up else 5)
    drv.need(lambda: _Wheels.seen > before, "the wheel event")
    for _ in range(5):  # what the wheel set off (a scroll, a changed value) settles
        drv.app.processEvents()


def _passed_over(drv: XDriver, page: TrainPage) -> dict[str, dict[str, object]]:
    """The wheel over each field (not clicked) and over the run selector: before and
    after, the form's scroll position, whether the field took the focus."""
    s = page.settings
    bar = s.scroll.verticalScrollBar()
    value = {"trainable": s.trainable.currentIndex, "precision": s.precision.currentIndex,
             "patience": s.patience.value, "ckpt_every": s.ckpt_every.value}
    fields = {"trainable": s.trainable, "precision": s.precision, "patience": s.patience,
              "ckpt_every": s.ckpt_every}
    seen: dict[str, dict[str, object]] = {}
    page.start_btn.setFocus()
    for name, field in fields.items():
        s.scroll.ensureWidgetVisible(field, 40, 60)
        drv.app.processEvents()
        drv.point_at(field)
        record: dict[str, object] = {"before": value[name](), "scroll_before": bar.value()}
        _wheel_once(drv, up=bar.value() >= bar.maximum())
        record.update(after=value[name](), scroll_after=bar.value(), focused=field.hasFocus())
        seen[name] = record
    picker = page.run_picker
    drv.point_at(picker)
    seen["run_picker"] = {"before": picker.currentIndex()}
    _wheel_once(drv, up=picker.currentIndex() > 0)
    seen["run_picker"]["after"] = picker.currentIndex()
    return seen


def _clicked_into(drv: XDriver, page: TrainPage) -> dict[str, dict[str, object]]:
    """The wheel over a spin box clicked into (its text, not its arrows) and over a combo
    box whose list a click opened and Escape closed: the field is the user's to wheel."""
    s = page.settings
    seen: dict[str, dict[str, object]] = {}
    spin = s.ckpt_every
    spin.setValue(10)
    s.scroll.ensureWidgetVisible(spin, 40, 60)
    drv.app.processEvents()
    drv.point_at(spin, 0.2)
    drv.xdotool("click", 1)
    drv.need(spin.hasFocus, "the clicked spin box's focus")
    seen["clicked_spin"] = {"before": spin.value()}
    _wheel_once(drv, up=True)
    seen["clicked_spin"].update(after=spin.value(), focused=spin.hasFocus())
    combo = s.precision
    combo.setCurrentIndex(0)
    s.scroll.ensureWidgetVisible(combo, 40, 60)
    drv.app.processEvents()
    drv.point_at(combo)
    drv.xdotool("click", 1)
    drv.need(lambda: combo.view().isVisible(), "the combo box's list")
    drv.xdotool("key", "Escape")
    drv.need(lambda: not combo.view().isVisible() and combo.hasFocus(), "the list to close")
    seen["clicked_combo"] = {"before": combo.currentIndex()}
    _wheel_once(drv, up=False)
    seen["clicked_combo"].update(after=combo.currentIndex(), focused=combo.hasFocus())
    return seen


def _drive(workspace: Path, out: Path) -> int:
    app = QApplication([sys.argv[0]])
    theme = ThemeManager(app, "dark")
    theme.apply()
    settings = QSettings(str(out.with_suffix(".ini")), QSettings.Format.IniFormat)
    settings.setValue("workspace", str(workspace))
    settings.setValue(f"last_voice/{workspace}", "ada")
    window = MainWindow(AppContext(settings), theme=theme)
    window.setGeometry(QRect(0, 0, 1100, 760))  # the laptop screen, whatever it opens at
    window.show()
    wheels = _Wheels()
    app.installEventFilter(wheels)  # after the window's guard: it sees every wheel first
    drv = XDriver(app)
    page = window.show_page(TrainPage)
    assert isinstance(page, TrainPage)
    drv.need(lambda: window.isVisible() and page._history is None
             and page.run_picker.count() >= 2, "the Train page with both runs")
    window.activateWindow()
    drv.need(lambda: app.focusWindow() is not None, "the window's focus")
    seen = _passed_over(drv, page)
    seen.update(_clicked_into(drv, page))
    out.write_text(json.dumps(seen))
    window.shutdown()
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(_drive(Path(sys.argv[1]), Path(sys.argv[2])))
