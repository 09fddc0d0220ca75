"""The `voxshard` command: checks the system libraries Qt itself links, then starts the app.

`gui.app` imports PySide6 at its top, and PySide6's GUI library needs libEGL, libGL,
fontconfig and xkbcommon from the system: without one, Python stops with an
ImportError from deep inside Qt before any of our code runs. This module imports no
Qt, so it can name the library and the line that installs it first.
"""

from __future__ import annotations

import sys

from engine.core import syslibs


def qt_libraries_reason() -> str | None:
    """Why Qt's own libraries cannot load here (one sentence), or None."""
    gone = syslibs.missing([syslibs.QT])
    if not gone:
        return None
    return (f"The window cannot start because "
            f"{syslibs.describe(gone, syslibs.package_manager())}.")


def main(argv: list[str] | None = None) -> int:
    reason = qt_libraries_reason()
    if reason is not None:
        print(f"error: {reason}", file=sys.stderr)
        return 1
    from gui.app import main as run_app  # Qt loads here, once its libraries are known  # noqa: PLC0415

    return run_app(argv)


if __name__ == "__main__":
    sys.exit(main())
