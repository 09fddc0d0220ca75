"""Screenshots of every page: `python -m gui.screenshots --workspace WS --voice NAME --out DIR`.

Opens the real window on a real workspace (a voice with takes, a prepare
report, a run's metrics, renders) and saves each page with `QWidget.grab()`.
Used for docs/screenshots/; runs offscreen.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import soundfile as sf
from PySide6.QtCore import QDeadlineTimer, QSettings, QTemporaryDir
from PySide6.QtWidgets import QApplication

from engine.catalog import list_takes
from gui.app import MainWindow
from gui.context import AppContext
from gui.pages.listen import ListenPage
from gui.pages.record import RecordPage
from gui.pages.train import TrainPage
from gui.theme import ThemeManager


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workspace", required=True, type=Path)
    parser.add_argument("--voice", required=True)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--theme", choices=["dark", "light"], default="dark")
    parser.add_argument("--suffix", default="", help="added to each file name, e.g. -light")
    parser.add_argument("--size", default="1360x860",
                        help="window size WIDTHxHEIGHT (1100x760: a laptop's, issue 19)")
    return parser.parse_args(argv)


def _window(app: QApplication, args: argparse.Namespace, tmp: QTemporaryDir) -> MainWindow:
    """The window on the workspace and voice asked for, in the theme and size asked for."""
    theme = ThemeManager(app, args.theme)  # type: ignore[arg-type]
    theme.apply()
    settings = QSettings(tmp.filePath("s.ini"), QSettings.Format.IniFormat)
    settings.setValue("workspace", str(args.workspace))
    settings.setValue(f"last_voice/{args.workspace}", args.voice)
    window = MainWindow(AppContext(settings), theme=theme)
    width, height = (int(v) for v in args.size.lower().split("x"))
    window.resize(width, height)
    window.show()
    return window


def _stage(app: QApplication, window: MainWindow, page: object) -> None:
    """A page in the state worth showing: Record reviewing a real take, Train's curves."""
    if isinstance(page, RecordPage):
        takes = [t for t in list_takes(window.ctx.voice) if t.path.exists()] \
            if window.ctx.voice else []
        if takes:
            # the review state of a real take: its waveform and level
            audio, sr = sf.read(str(takes[0].path), dtype="float32", always_2d=True)
            page._stopped(audio.mean(axis=1), sr)
            page.meter.set_level(0.5)
    if isinstance(page, TrainPage):
        while page._history is not None:
            app.processEvents()
        page.redraw()


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    app = QApplication.instance() or QApplication(sys.argv[:1])
    tmp = QTemporaryDir()
    window = _window(app, args, tmp)  # type: ignore[arg-type]
    args.out.mkdir(parents=True, exist_ok=True)

    def settle() -> None:
        # pages fill from the background reader: wait for its reads, then paint
        while window.ctx.reader.busy:
            app.processEvents()
        for _ in range(20):
            app.processEvents()

    # every page the window has, named by its title (a new page gets its own file)
    names = [type(p).title.lower() for p in window.pages]
    for row, name in enumerate(names):
        window.nav.setCurrentRow(row)
        page = window.pages[row]
        _stage(app, window, page)
        settle()
        window.grab().save(str(args.out / f"{row + 1}-{name}{args.suffix}.png"))
        if isinstance(page, ListenPage) and page.last_comparison is not None:
            page.tabs.setCurrentIndex(1)
            settle()
            window.grab().save(str(args.out / f"{row + 1}b-compare{args.suffix}.png"))
            page.tabs.setCurrentIndex(0)
    box = window.show_about()
    # the engine's versions come from a background `voxshard-engine version`: wait for
    # its answer (or its error) so the box does not show "Asking the engine…"
    deadline = QDeadlineTimer(60_000)
    while window.engine_versions is None and not window._engine_error \
            and not deadline.hasExpired():
        app.processEvents()
        time.sleep(0.02)  # the engine starts on the same cores
    settle()
    box.grab().save(str(args.out / f"{len(names) + 1}-about{args.suffix}.png"))
    box.close()
    window.shutdown()
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
