"""Voxshard desktop app (PySide6 + pyqtgraph). Never imports torch or ray."""

from __future__ import annotations

import ctypes
import sys

__version__ = "0.1.0"
#: PySide6 releases whose emit() drops references to True/False/None
AFFECTED_PYSIDE = ("6.12.0",)


def _pin_bool_singletons() -> None:
    """Work around a PySide6 6.12.0 refcount bug that crashes the app on Python 3.11.

    Calls that return True/False or None (every `Signal.emit()`, many QPainter
    calls) return the singleton without taking a reference (measured: 10 emits
    lower `sys.getrefcount(True)` by 10; 6.11.3 does not), so a long training
    run drives the count to zero and CPython aborts ("bool_dealloc",
    "none_dealloc"). Python 3.12+ makes these singletons immortal; on older
    interpreters we give them the same property by adding a huge reference
    count once, and only under the affected release (pyproject excludes it;
    this guards an environment that installed it anyway).
    """
    if sys.implementation.name != "cpython" or sys.version_info >= (3, 12):
        return
    from PySide6 import __version__ as pyside_version  # the package only, not Qt  # noqa: PLC0415

    if pyside_version not in AFFECTED_PYSIDE:
        return
    for singleton in (True, False, None):
        ctypes.c_ssize_t.from_address(id(singleton)).value += 1 << 40


_pin_bool_singletons()
