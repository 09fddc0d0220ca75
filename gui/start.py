"""The `voxshard` command: checks the system libraries Qt itself links, then starts the app.

`gui.app` imports PySide6 at its top, and PySide6's GUI library needs libEGL, libGL,
fontconfig and xkbcommon from the system: without one, Python stops with an
ImportError from deep inside Qt before any of our code runs. This module imports no
Qt, so it can name the library and the line that installs it first.
"""

from __future__ import annotations

import sys

from engine.core import syslibs
from gui import __version__


def qt_libraries_reason() -> str | None:
    """Why Qt's own libraries cannot load here (one sentence), or None."""
    gone = syslibs.missing([syslibs.QT])
    if not gone:
        return None
    return (f"The window cannot start because "
            f"{syslibs.describe(gone, syslibs.package_manager())}.")


USAGE = """usage: voxshard [VOICE_FOLDER] [--smoke-test] [Qt options]

Opens the Voxshard window: record or import a speaker, prepare, train, listen.

positional arguments:
  VOICE_FOLDER   a voice folder to open (what the desktop entry passes)

options:
  -h, --help     show this help and exit
  --version      print the version and exit
  --smoke-test   start, show the window, say what loaded, and quit (a packaging check)

Qt's own options (-platform, -style, ...) pass through to Qt. Everything the window does,
the engine's command line does too: voxshard-engine --help."""


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv if argv is None else argv)[1:]
    if "-h" in args or "--help" in args:  # before Qt: no window for a question
        print(USAGE)
        return 0
    if "--version" in args:
        print(f"voxshard {__version__}")
        return 0
    reason = qt_libraries_reason()
    if reason is not None:
        print(f"error: {reason}", file=sys.stderr)
        return 1
    from gui.app import main as run_app  # Qt loads here, once its libraries are known  # noqa: PLC0415

    return run_app(argv)


if __name__ == "__main__":
    sys.exit(main())
