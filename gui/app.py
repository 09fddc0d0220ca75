"""The Voxshard window and the `voxshard` entry point.

`MainWindow` needs a QApplication to exist but never creates one, so tests
(pytest-qt's) and `main()` (the desktop app's) both construct it.
"""

from __future__ import annotations

import gc
import os
import platform
import signal
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TypeVar

from PySide6 import __version__ as pyside_version
from PySide6.QtCore import QEvent, QObject, QRect, QSettings, QSize, Qt, QTimer, qVersion
from PySide6.QtGui import QCloseEvent, QKeySequence, QMoveEvent, QResizeEvent, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QDialog,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QMainWindow,
    QMessageBox,
    QSizePolicy,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from engine.audio import sound
from engine.catalog import VoiceSnapshot, speaker_name
from engine.core import syslibs
from engine.layout.voice import VOICE_FILE, is_voice_folder
from gui import __version__, placement
from gui.context import APP_NAME, ORG_NAME, AppContext, default_workspace
from gui.jobs import EngineJob
from gui.jobs_panel import JobsPanel
from gui.pages.base import Page
from gui.pages.help import HelpPage
from gui.pages.importer import ImportPage
from gui.pages.listen import ListenPage
from gui.pages.prepare import PreparePage
from gui.pages.read import ReadPage
from gui.pages.record import RecordPage
from gui.pages.serve import ServePage
from gui.pages.train import TrainPage
from gui.pages.voices import VoicesPage
from gui.theme import ThemeManager, app_icon, icon
from gui.widgets import button, install_wheel_guard, retint_buttons

P = TypeVar("P", bound=Page)
#: a move or resize is saved once the window has been still this long (ms)
PLACE_SETTLE_MS = 400

PAGE_CLASSES: list[type[Page]] = [VoicesPage, RecordPage, ImportPage, PreparePage, TrainPage,
                                  ListenPage, ReadPage, ServePage, HelpPage]


def versions() -> list[tuple[str, str]]:
    """The window's own versions for the About box (the engine reports its own)."""
    out = [("Voxshard", __version__), ("Python", platform.python_version()),
           ("Qt", qVersion()), ("PySide6", pyside_version)]
    for dist in ("pyqtgraph", "numpy", "sounddevice", "soundfile"):
        try:
            out.append((dist, metadata.version(dist)))
        except metadata.PackageNotFoundError:
            out.append((dist, "not installed"))
    try:
        out.append(("PortAudio", sound.sd.get_portaudio_version()[1].split(",")[0]))
    except Exception:  # DeviceError: PortAudio did not load
        out.append(("PortAudio", "not found"))
    return out


def job_names(jobs: list[EngineJob], state: Callable[[EngineJob], str] = lambda _j: ""
              ) -> str:
    """ "Training", "Training and Export", "Import, Training and Export"."""
    names = [j.title + state(j) for j in jobs]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


class MainWindow(QMainWindow):
    def __init__(self, ctx: AppContext | None = None, settings: QSettings | None = None,
                 theme: ThemeManager | None = None) -> None:
        super().__init__()
        self.ctx = ctx or AppContext(settings)
        self.theme = theme
        app = QApplication.instance()
        if app is not None:
            install_wheel_guard(app)
        self.setWindowTitle(APP_NAME)
        self.setWindowIcon(app_icon())
        self._maximized = self._place()
        # the place is saved a moment after each move or resize too, not only at quit: a
        # quit that comes before the window system's last resize reached the window (or
        # no clean quit at all) would otherwise save an older place
        self._place_timer = QTimer(self)
        self._place_timer.setSingleShot(True)
        self._place_timer.setInterval(PLACE_SETTLE_MS)
        self._place_timer.timeout.connect(self._save_place)
        self._closing_confirmed = False
        self._quit_wait: QMessageBox | None = None  # shown while quitting waits for jobs

        self._build_pages()
        self._build_status_bar()
        self.ctx.status.connect(lambda msg: self.statusBar().showMessage(msg, 8000))
        self.ctx.voice_changed.connect(self._voice_changed)
        self.ctx.reader.voice_loaded.connect(self._voice_read)
        # what `voxshard-engine version` answered (None: not asked yet / no answer)
        self.engine_versions: dict[str, str] | None = None
        self._engine_error = ""
        self._version_warned = False
        self._about: QMessageBox | None = None
        self._version_job: EngineJob | None = None

        self._shortcuts()
        # every dialog of the window hands the focus back when it closes (_focus_back)
        if (app := QApplication.instance()) is not None:
            app.installEventFilter(self)
        if self.theme is not None:
            self.theme.changed.connect(lambda _t: self._retint())
        if self.ctx.workspace is None:
            self.ctx.set_workspace(default_workspace())
        else:
            self.ctx.set_workspace(self.ctx.workspace)
        self.nav.setCurrentRow(0)
        self._voice_changed(self.ctx.voice)

    def _build_pages(self) -> None:
        """The sidebar beside the pages, one page per entry."""
        central = QWidget()
        lay = QHBoxLayout(central)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(0)
        lay.addWidget(self._build_sidebar())
        self.stack = QStackedWidget()
        lay.addWidget(self.stack, 1)
        self.setCentralWidget(central)

        self.pages: list[Page] = []
        for cls in PAGE_CLASSES:
            page = cls(self.ctx)
            self.pages.append(page)
            self.stack.addWidget(page)
            item = QListWidgetItem(icon(cls.icon_name), cls.title)
            item.setData(Qt.ItemDataRole.UserRole, cls.icon_name)
            item.setSizeHint(QSize(180, 42))
            self.nav.addItem(item)
        self.nav.currentRowChanged.connect(self._go)
        self._current = 0


    def _build_status_bar(self) -> None:
        """The status bar: the jobs that run, and a notice when there is no sound."""
        # what runs, with a Cancel for each job (download, import, export, compare...)
        self.jobs_panel = JobsPanel(self.ctx.jobs)
        self.statusBar().addPermanentWidget(self.jobs_panel)
        # without PortAudio the window works, silent: say so where it stays in view
        self.sound_notice: QLabel | None = None
        if why := sound.unavailable():
            self.sound_notice = QLabel(why)
            self.sound_notice.setObjectName("ClipWarning")
            self.sound_notice.setToolTip(why)
            # the status bar may be narrower than the sentence: never widen the window for it
            self.sound_notice.setSizePolicy(QSizePolicy.Policy.Ignored,
                                            QSizePolicy.Policy.Preferred)
            self.statusBar().addWidget(self.sound_notice, 1)

    # -- layout -----------------------------------------------------------------------
    def _build_sidebar(self) -> QWidget:
        side = QWidget()
        side.setObjectName("Sidebar")
        side.setFixedWidth(220)
        lay = QVBoxLayout(side)
        lay.setContentsMargins(12, 18, 12, 12)
        brand_row = QHBoxLayout()
        logo = QLabel()
        logo.setPixmap(app_icon().pixmap(34, 34))
        brand = QLabel("Voxshard")
        brand.setObjectName("Brand")
        brand_row.addWidget(logo)
        brand_row.addWidget(brand, 1)
        lay.addLayout(brand_row)
        sub = QLabel("Local voice cloning")
        sub.setObjectName("BrandSub")
        lay.addWidget(sub)
        lay.addSpacing(14)
        self.nav = QListWidget()
        self.nav.setIconSize(QSize(20, 20))
        self.nav.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        lay.addWidget(self.nav, 1)
        self.voice_badge = QLabel("No voice open")
        self.voice_badge.setObjectName("VoiceBadge")
        self.voice_badge.setWordWrap(True)
        lay.addWidget(self.voice_badge)
        lay.addSpacing(6)
        self.about_btn = button("About", "info", slot=self.show_about)
        lay.addWidget(self.about_btn)
        return side

    def _shortcuts(self) -> None:
        # every page of the sidebar before Help (which has F1)
        for i in range(self.nav.count() - 1):
            QShortcut(QKeySequence(f"Ctrl+{i + 1}"), self,
                      activated=lambda i=i: self.nav.setCurrentRow(i))
        QShortcut(QKeySequence(Qt.Key.Key_F1), self,
                  activated=lambda: self.nav.setCurrentRow(len(self.pages) - 1))
        QShortcut(QKeySequence("Ctrl+N"), self, activated=self._new_voice)
        QShortcut(QKeySequence("Ctrl+Q"), self, activated=self.close)
        listen = self.page(ListenPage)
        sc = QShortcut(QKeySequence("Ctrl+Return"), listen, activated=lambda: listen.speak())
        sc.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        esc = QShortcut(QKeySequence(Qt.Key.Key_Escape), listen, activated=listen.stop)
        esc.setContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)

    def _place(self) -> bool:
        """Size and move the window onto the screen's free area, where it was left if that
        is still on a screen; returns whether it was left maximized."""
        saved, maximized = placement.saved_place(self.ctx.settings)
        available = placement.screen_for(saved).availableGeometry()
        self.setMinimumSize(placement.minimum_for(available))
        place = placement.fit(saved, available)
        self.resize(place.size())
        self.move(place.topLeft())
        return maximized

    def show_as_left(self) -> None:
        """Show the window as it was last closed: maximized, or at its own place."""
        if self._maximized:
            self.showMaximized()
        else:
            self.show()

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if self.isVisible():
            self._place_timer.start()

    def moveEvent(self, event: QMoveEvent) -> None:
        super().moveEvent(event)
        if self.isVisible():
            self._place_timer.start()

    def _save_place(self) -> None:
        self._remember_place()
        self.ctx.settings.sync()

    def _remember_place(self) -> None:
        maximized = self.isMaximized()
        if maximized:  # the place it returns to when un-maximized, as its frame's top-left
            normal = self.normalGeometry()
            frame = self.geometry().topLeft() - self.pos()
            place = QRect(normal.topLeft() - frame, normal.size())
        else:
            place = QRect(self.pos(), self.size())
        placement.remember(self.ctx.settings, place, maximized)

    def page(self, cls: type[P]) -> P:
        for p in self.pages:
            if isinstance(p, cls):
                return p
        raise KeyError(cls.__name__)

    def _go(self, row: int) -> None:
        if row < 0:
            return
        if 0 <= self._current < len(self.pages) and self._current != row:
            self.pages[self._current].hidden()
        self._current = row
        self.stack.setCurrentIndex(row)
        self.pages[row].shown()
        if isinstance(self.pages[row], RecordPage):
            self.activateWindow()
            self.pages[row].setFocus()

    def show_page(self, cls: type[Page]) -> Page:
        page = self.page(cls)
        self.nav.setCurrentRow(self.pages.index(page))
        return page

    def _new_voice(self) -> None:
        self.show_page(VoicesPage)
        self.page(VoicesPage).new_voice()

    def _voice_changed(self, voice: Path | None) -> None:
        if voice is None:
            self.voice_badge.setText("No voice open")
            self.setWindowTitle(APP_NAME)
        else:
            snap = self.ctx.reader.cached(voice)
            name = snap.speaker if snap is not None else speaker_name(voice)  # one small file
            self.voice_badge.setText(f"<b>{name}</b><br><span>{voice.name}</span>")
            self.setWindowTitle(f"{name} — {APP_NAME}")

    def _voice_read(self, voice: Path, snap: VoiceSnapshot) -> None:
        if voice == self.ctx.voice:  # a rename shows in the badge and the title
            self._voice_changed(voice)

    def open_path(self, path: Path) -> bool:
        """Open a voice folder given on the command line (or by the desktop entry's %F)."""
        folder = path.parent if path.name == VOICE_FILE else path
        if not is_voice_folder(folder):
            self.statusBar().showMessage(
                f"{path} is not a voice folder; open a folder that holds a voice.toml.", 15000)
            return False
        folder = folder.resolve()
        self.ctx.set_workspace(folder.parent)
        self.ctx.set_voice(folder)
        return True

    def _retint(self) -> None:
        for i in range(self.nav.count()):
            item = self.nav.item(i)
            item.setIcon(icon(str(item.data(Qt.ItemDataRole.UserRole))))
        retint_buttons(self)

    # -- about / close ---------------------------------------------------------------------
    def show_about(self) -> QMessageBox:
        box = QMessageBox(self)
        box.setWindowTitle("About Voxshard")
        box.setIconPixmap(app_icon().pixmap(64, 64))
        box.setText("<h3>Voxshard</h3><p>Clone a voice on your own machine: record, prepare, "
                    "fine-tune Qwen3-TTS with Ray + FSDP2, speak.</p>")
        self._about = box
        box.finished.connect(lambda _r: setattr(self, "_about", None))
        self._fill_about()
        if self.engine_versions is None:
            self.check_engine()  # the engine's packages are the engine's to report
        box.open()
        return box

    def _fill_about(self) -> None:
        if self._about is None:
            return

        def table(rows: list[tuple[str, str]]) -> str:
            return "<table>" + "".join(f"<tr><td>{k}</td><td>&nbsp;&nbsp;{v}</td></tr>"
                                       for k, v in rows) + "</table>"
        if self.engine_versions is not None:
            engine = table(list(self.engine_versions.items()))
        else:
            engine = f"<p>{self._engine_error or 'Asking the engine…'}</p>"
        self._about.setInformativeText(f"<p><b>Window</b></p>{table(versions())}"
                                       f"<p><b>Engine</b></p>{engine}<p>Apache-2.0</p>")

    def check_engine(self) -> EngineJob:
        """Ask the engine its versions in the background; warn once if it is another release.

        Not one of the manager's jobs: a read-only answer in a fraction of a
        second, which a quit neither waits for nor asks about.
        """
        if self._version_job is not None and self._version_job.is_running():
            return self._version_job
        job = self._version_job = EngineJob(["version"], title="Engine version",
                                            kill_after_s=2.0, parent=self)
        job.succeeded.connect(lambda r: self._engine_answered(r.get("versions") or {}, ""))
        job.failed.connect(lambda _c, msg, hint: self._engine_answered(
            None, f"The engine did not answer: {msg} {hint}".strip()))
        job.start()
        return job

    def _engine_answered(self, found: dict[str, str] | None, error: str) -> None:
        self.engine_versions = {str(k): str(v) for k, v in found.items()} \
            if found is not None else None
        self._engine_error = error
        self._fill_about()
        engine = (found or {}).get("voxshard-engine")
        if engine and engine != __version__ and not self._version_warned:
            self._version_warned = True
            box = QMessageBox(QMessageBox.Icon.Warning, "Different engine version",
                              f"This window is Voxshard {__version__}, but the engine it starts "
                              f"is version {engine}.", QMessageBox.StandardButton.Ok, self)
            box.setInformativeText("Install the window and the engine from the same release "
                                   "(or point VOXSHARD_ENGINE at the matching engine); jobs "
                                   "may fail or read results wrongly until then.")
            box.open()

    def closeEvent(self, event: QCloseEvent) -> None:
        # a take being recorded or under review is kept or dropped only when the user says
        if not self.page(RecordPage).ask_before_quit(lambda: QTimer.singleShot(0, self.close)):
            event.ignore()
            return
        running = self.ctx.jobs.running()
        if running and self._quit_wait is not None:
            event.ignore()  # already waiting for the jobs to stop; the window stays
            return
        # the user's jobs; the warm speech engine is the window's own and stops with it
        mine = [j for j in running if not j.background]
        if mine and not self._closing_confirmed:
            event.ignore()
            one = len(mine) == 1
            box = QMessageBox(QMessageBox.Icon.Question, "Quit Voxshard",
                              f"{job_names(mine)} {'is' if one else 'are'} still running. "
                              f"Stop {'it' if one else 'them'} and quit?",
                              QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
                              self)
            box.setInformativeText("Training saves a checkpoint before it stops; the window "
                                   "waits for that and closes by itself.")

            def answer(_r: int) -> None:
                b = box.clickedButton()
                if b is not None and box.standardButton(b) == QMessageBox.StandardButton.Yes:
                    self._closing_confirmed = True
                    QTimer.singleShot(0, self.close)

            box.finished.connect(answer)
            box.open()
            return
        if mine:
            # confirmed: ask every job to stop, then wait without blocking the window
            event.ignore()
            self._wait_for_jobs_then_quit()
            return
        self.shutdown()
        super().closeEvent(event)

    def _wait_for_jobs_then_quit(self) -> None:
        self.ctx.jobs.stop_all()
        box = QMessageBox(QMessageBox.Icon.Information, "Quitting Voxshard", "",
                          QMessageBox.StandardButton.NoButton, self)
        self._quit_wait = box
        force = box.addButton("Quit now", QMessageBox.ButtonRole.DestructiveRole)
        keep = box.addButton("Keep running", QMessageBox.ButtonRole.RejectRole)
        box.setInformativeText("The window closes by itself as soon as they have stopped. "
                               "Quit now kills them: a checkpoint being saved is lost "
                               "(earlier checkpoints are safe).")

        def update() -> None:
            running = self.ctx.jobs.running()
            if not running:
                box.done(0)
                self._quit_wait = None
                QTimer.singleShot(0, self.close)
                return
            mine = [j for j in running if not j.background]
            box.setText("Waiting for " + job_names(
                mine, lambda j: f" ({'saving and stopping' if j.stopping else 'running'})")
                + " to stop…" if mine else "Closing the speech engine…")

        def clicked(button: object) -> None:
            if button is force:
                for job in self.ctx.jobs.running():
                    job.force_stop()
            elif button is keep:
                # the stop already asked for goes on; only the quit is called off
                self._closing_confirmed = False
                self._quit_wait = None
                self.ctx.jobs.changed.disconnect(update)

        self.ctx.jobs.changed.connect(update)
        box.buttonClicked.connect(clicked)
        update()
        if self._quit_wait is not None:
            box.open()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        """A dialog of this window closed: the window takes the focus back. Without a
        window manager nothing else does, and the keyboard went to the root window (dead
        keys after New voice, Ctrl+N)."""
        if event.type() == QEvent.Type.Hide and isinstance(watched, QDialog) \
                and watched.isWindow() and watched.parentWidget() is not None \
                and watched.parentWidget().window() is self:
            QTimer.singleShot(0, self._focus_back)
        return False

    def _focus_back(self) -> None:
        if not self.isVisible() or QApplication.activeModalWidget() is not None \
                or any(d.isVisible() for d in self.findChildren(QDialog)):
            return  # another dialog is open: it has the keys until it closes too
        self.activateWindow()
        self.raise_()
        page = self.pages[self._current] if 0 <= self._current < len(self.pages) else None
        if page is not None and page.focusWidget() is None:
            page.setFocus(Qt.FocusReason.ActiveWindowFocusReason)

    def shutdown(self) -> None:
        """Stop everything this window started: jobs, streams, timers."""
        if (app := QApplication.instance()) is not None:
            app.removeEventFilter(self)
        self.page(RecordPage).shutdown()
        self.page(TrainPage).redraw_timer.stop()
        self.ctx.player.stop()
        self.ctx.jobs.shutdown()
        self.ctx.reader.shutdown()
        if self._version_job is not None:
            self._version_job.force_stop()
        self._place_timer.stop()
        self._save_place()


def _quit_on_signals(window: MainWindow) -> None:
    """SIGTERM/SIGINT close the window as its Quit does (jobs stop cleanly), not abruptly."""
    if sys.platform == "win32":
        return

    def close(*_: object) -> None:
        window._closing_confirmed = True  # a signal is the user's answer already
        QTimer.singleShot(0, window.close)

    signal.signal(signal.SIGTERM, close)
    signal.signal(signal.SIGINT, close)
    # Python runs signal handlers only when it holds control: a slow no-op timer
    # hands it control a few times a second while Qt's loop waits in C++
    keepalive = QTimer(window)
    keepalive.timeout.connect(lambda: None)
    keepalive.start(250)


def no_display_reason(env: dict[str, str] | None = None) -> str | None:
    """Why a window cannot open here (Linux without X11/Wayland), or None."""
    env = dict(os.environ if env is None else env)
    if not sys.platform.startswith("linux") or env.get("QT_QPA_PLATFORM"):
        return None
    if env.get("DISPLAY") or env.get("WAYLAND_DISPLAY"):
        return None
    return ("No display was found, so the Voxshard window cannot open. Run it in a desktop "
            "session, or use `voxshard-engine` for headless work "
            "(QT_QPA_PLATFORM=offscreen runs the window without a screen).")


def qt_platforms(argv: list[str], env: dict[str, str]) -> list[str]:
    """The platform plugins Qt will try, in its order: `-platform`, QT_QPA_PLATFORM, or
    the session's (Wayland first when there is one, then X11's xcb)."""
    chosen = env.get("QT_QPA_PLATFORM", "")
    for i, arg in enumerate(argv[1:-1], start=1):
        if arg in ("-platform", "--platform"):
            chosen = argv[i + 1]
    if not chosen:
        wayland = bool(env.get("WAYLAND_DISPLAY")) or env.get("XDG_SESSION_TYPE") == "wayland"
        chosen = "wayland;xcb" if wayland else "xcb"
    # "xcb:option=value" names a plugin with its options
    return [name.split(":")[0] for name in chosen.split(";") if name]


def platform_libraries_reason(argv: list[str], env: dict[str, str] | None = None) -> str | None:
    """Why Qt's xcb platform (the only one it would try) cannot load here, or None.

    Without one of its libraries Qt aborts with a list of plugins; this names the library
    and the line that installs it, before any QApplication exists."""
    env = dict(os.environ if env is None else env)
    if not sys.platform.startswith("linux") or qt_platforms(argv, env) != ["xcb"]:
        return None
    gone = syslibs.missing([syslibs.XCB])
    if not gone:
        return None
    return (f"The window cannot open on this X11 desktop because "
            f"{syslibs.describe(gone, syslibs.package_manager())}.")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    smoke = "--smoke-test" in argv  # packaging check: start, show, quit
    if smoke:
        argv.remove("--smoke-test")
    reason = no_display_reason() or platform_libraries_reason(argv)
    if reason:
        # Qt would abort with a plugin list; say what to do instead.
        print(f"error: {reason}", file=sys.stderr)
        return 1
    QApplication.setApplicationName(APP_NAME)
    QApplication.setOrganizationName(ORG_NAME)
    QApplication.setApplicationVersion(__version__)
    QApplication.setDesktopFileName("voxshard")
    app = QApplication(argv)
    app.setWindowIcon(app_icon())
    theme = ThemeManager(app)
    theme.apply()
    window = MainWindow(theme=theme)
    _quit_on_signals(window)  # before it shows: a SIGTERM once it is on screen closes it
    window.show_as_left()
    # `voxshard VOICE_FOLDER` (the desktop entry passes files with %F): open it
    for arg in app.arguments()[1:]:
        if not arg.startswith("-"):
            window.open_path(Path(arg))
            break
    window.check_engine()  # a bundle and an engine of different releases: warn once
    # what start-up built lives until exit: take it out of the garbage
    # collector's view, so a full collection during training is no 100 ms pause
    gc.collect()
    gc.freeze()
    if smoke:
        def report() -> None:
            print(f"Voxshard started: {len(window.pages)} pages, "
                  + ", ".join(f"{k} {v}" for k, v in versions()[:4]))
            if window.sound_notice is not None:  # what the window shows in its status bar
                print(f"Sound: {window.sound_notice.text()}")
            window.close()

        QTimer.singleShot(200, report)
    return app.exec()


if __name__ == "__main__":
    sys.exit(main())
