"""Fixtures of the GUI tests, a plugin registered in tests/conftest.py.

- `settings`: a QSettings in a temporary INI file, so tests never touch the
  user's configuration.
- `ctx`, `window`: an AppContext / MainWindow on a temporary workspace; the
  window is shut down after the test (jobs, streams, timers). The window has the
  app's theme (light unless the test parametrizes `window` indirectly with "dark"),
  so every test measures what users see.
- `voice`: a new empty voice `ada` in `workspace`.
- `themed`: applies a theme as the app does at start (its style sheet sets every
  widget's padding, so layouts are measured as the user sees them), and the light
  theme back afterwards (the tests' application always has the app's theme).
- `pulse`: a running PulseAudio daemon with a null sink as the default sink
  and its monitor as the default source (started here when not running).
- `sink`: a null sink of the test's own, its monitor the source of the app's streams:
  what another test (or a second pytest process beside this one) plays is not heard.
- `pick_source`: take an item of Listen's source box by clicks and keys, as a person does.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QEvent, QSettings, Qt
from PySide6.QtWidgets import QApplication

from tests.helpers.voices import make_voice


@pytest.fixture(autouse=True)
def _no_widget_outlives_its_test() -> Iterator[None]:
    """Deletes the top-level widgets a test leaves behind (set up first, so torn down last).

    A deleted window leaves its parentless Python-owned widgets alive: pyqtgraph makes each
    plot's context menus (about 100 menus and popups a window) without a parent, and they
    live as long as anything holds the plot's Python object. 150 windows in one run left
    ~75,000 widgets, and every style-sheet or palette change re-polishes them all: GUI
    tests late in a run took 5-10x as long as early ones."""
    app = QApplication.instance()
    before = {id(w) for w in app.topLevelWidgets()} if app is not None else set()
    yield
    app = QApplication.instance()
    if app is None:
        return
    left = [w for w in app.topLevelWidgets() if id(w) not in before]
    for w in left:
        if w.parent() is None:  # its children (submenus, combo popups) go with it
            w.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


@pytest.fixture
def settings(tmp_path: Path) -> QSettings:
    return QSettings(str(tmp_path / "voxshard.ini"), QSettings.Format.IniFormat)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "workspace"
    ws.mkdir()
    return ws


@pytest.fixture
def ctx(qapp: object, settings: QSettings, workspace: Path) -> Iterator[object]:
    # start-up cost: the window's modules (pyqtgraph, every page) for every pytest run
    from gui.context import AppContext

    settings.setValue("workspace", str(workspace))
    c = AppContext(settings)
    yield c
    # what MainWindow.shutdown stops of the context, for tests without a window
    c.player.stop()
    c.jobs.shutdown(10000)
    c.reader.shutdown()


@pytest.fixture
def window(request: pytest.FixtureRequest, qtbot: object, ctx: object,
           themed: Callable[[str], object]) -> Iterator[object]:
    """The main window in the app's theme, applied before the window is built as at start:
    light unless a test asks for another with `@pytest.mark.parametrize("window", ["dark"],
    indirect=True)`."""
    from gui.app import MainWindow  # start-up cost, as above

    mode = getattr(request, "param", "light")
    w = MainWindow(ctx, theme=themed(mode))  # type: ignore[arg-type]
    w.show()
    yield w
    w.shutdown()
    # closed and deleted here, not by qtbot after `themed` is undone: putting the
    # application's style sheet back re-styles every live widget, and re-styling this
    # shut-down window (its pages, plots, dialogs) crashed the process once in a long run
    w.close()
    w.deleteLater()
    QApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


@pytest.fixture
def themed(qapp: Any) -> Iterator[Callable[[str], object]]:
    from gui.theme import ThemeManager  # start-up cost, as above

    managers: list[object] = []

    def apply(mode: str) -> object:
        manager = ThemeManager(qapp, mode)
        manager.apply()
        managers.append(manager)
        return manager

    yield apply
    # back to the light theme every test starts in, not to no theme: the app always has
    # one, and taking the style sheet off re-polished every live widget of the process at
    # every test (GUI tests late in a long run took 15-25 s each). Re-applying the theme
    # in place is free (apply_theme skips an unchanged one); only a dark test's costs.
    ThemeManager(qapp, "light").apply()
    for manager in managers:
        manager.deleteLater()  # type: ignore[attr-defined]


@pytest.fixture
def voice(workspace: Path) -> Path:
    return make_voice(workspace)


def _pulse_running() -> bool:
    if not shutil.which("pactl"):
        return False
    return subprocess.run(["pactl", "info"], capture_output=True, timeout=10).returncode == 0


@pytest.fixture(scope="session")
def pulse() -> str:
    """A real sound device: PulseAudio null sink `vsink`, its monitor as default source."""
    if not shutil.which("pulseaudio"):
        pytest.skip("PulseAudio is not installed (apt-get install pulseaudio libportaudio2)")
    if not _pulse_running():
        subprocess.run(["pulseaudio", "--daemonize=yes", "--exit-idle-time=-1", "-n",
                        "--load=module-null-sink sink_name=vsink",
                        "--load=module-native-protocol-unix"],
                       capture_output=True, timeout=30)
        deadline = time.monotonic() + 10
        while not _pulse_running() and time.monotonic() < deadline:
            time.sleep(0.1)  # daemon start-up, outside any Qt test
    if not _pulse_running():
        pytest.skip("PulseAudio could not be started")
    sinks = subprocess.run(["pactl", "list", "short", "sinks"], capture_output=True,
                           text=True, timeout=10).stdout
    if "vsink" not in sinks:
        subprocess.run(["pactl", "load-module", "module-null-sink", "sink_name=vsink"],
                       capture_output=True, timeout=10)
    subprocess.run(["pactl", "set-default-sink", "vsink"], check=True, timeout=10)
    subprocess.run(["pactl", "set-default-source", "vsink.monitor"], check=True, timeout=10)
    return "vsink"


@pytest.fixture
def sink(pulse: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A null sink of this test's own, its monitor the default source of the app's streams
    (libpulse reads PULSE_SOURCE and PULSE_SINK whenever a stream connects)."""
    name = f"rec{uuid.uuid4().hex[:8]}"
    module = subprocess.run(["pactl", "load-module", "module-null-sink", f"sink_name={name}"],
                            capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    monkeypatch.setenv("PULSE_SINK", name)
    monkeypatch.setenv("PULSE_SOURCE", f"{name}.monitor")
    try:
        yield name
    finally:
        subprocess.run(["pactl", "unload-module", module], capture_output=True, timeout=10)


def pick_source(qtbot: Any, listen: Any, label: str) -> None:
    """Open the source box with a click, move to the item `label` in its list with the
    arrow keys and take it with Return, as a person does."""
    index = listen.source.findText(label)
    assert index >= 0, [listen.source.itemText(i) for i in range(listen.source.count())]
    qtbot.mouseClick(listen.source, Qt.MouseButton.LeftButton)
    view = listen.source.view()
    qtbot.waitUntil(view.isVisible, timeout=5000)
    step = Qt.Key.Key_Down if index > view.currentIndex().row() else Qt.Key.Key_Up
    for _ in range(listen.source.count()):
        if view.currentIndex().row() == index:
            break
        qtbot.keyClick(view, step)
    qtbot.keyClick(view, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not view.isVisible(), timeout=5000)
    assert listen.source.currentIndex() == index


def speak_and_wait(qtbot: Any, listen: Any, timeout: int = 240000) -> list[tuple[Any, ...]]:
    """Click Listen's Speak, as a person does, and wait for the render to end; the failures
    the speech engine reported on the way. The engine is let go of after."""
    failures: list[tuple[Any, ...]] = []
    listen.speech.failed.connect(lambda *a: failures.append(a))
    try:
        qtbot.mouseClick(listen.speak_btn, Qt.MouseButton.LeftButton)
        assert listen.request is not None
        qtbot.waitUntil(lambda: listen.request is None, timeout=timeout)
    finally:
        listen.speech.unload()
    return failures
