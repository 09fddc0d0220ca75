"""A test fails when it leaves a Qt thread running or a Qt timer active behind it (a fixture
plugin, registered in tests/conftest.py).

Qt lists neither its threads nor its timers, and a parentless QTimer is reachable from no
widget, so every start from Python is noted as it happens: `QThread.start`,
`QTimer.start` and `QThreadPool.start`/`tryStart` are wrapped (once, at import) to keep a
weak reference to what they started. After a test's own fixtures are torn down (the
window shut down, the context's jobs ended), objects the test closed with `deleteLater`
are deleted, and then whatever of those is still running, and was not running before the
test began, is a leak: the test fails and names it (class, interval, owner chain). The
leak is stopped before the next test, so one leak fails one test.

Not seen: `QTimer.singleShot` (Qt keeps no object to ask) and Qt's own C++ timers.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import shiboken6
from PySide6.QtCore import QCoreApplication, QEvent, QObject, QThread, QThreadPool, QTimer

_threads: weakref.WeakSet[QThread] = weakref.WeakSet()
_timers: weakref.WeakSet[QTimer] = weakref.WeakSet()
_pools: weakref.WeakSet[QThreadPool] = weakref.WeakSet()


def _noting(method: Callable[..., Any], into: weakref.WeakSet[Any]) -> Callable[..., Any]:
    def start(self: Any, *args: Any, **kwargs: Any) -> Any:
        into.add(self)
        return method(self, *args, **kwargs)

    start.__doc__ = method.__doc__
    return start


QThread.start = _noting(QThread.start, _threads)  # type: ignore[method-assign]
QTimer.start = _noting(QTimer.start, _timers)  # type: ignore[method-assign]
QThreadPool.start = _noting(QThreadPool.start, _pools)  # type: ignore[method-assign]
QThreadPool.tryStart = _noting(QThreadPool.tryStart, _pools)  # type: ignore[method-assign]


def _owners(obj: QObject) -> str:
    chain = []
    parent = obj.parent()
    while parent is not None and len(chain) < 4:
        name = parent.objectName()
        chain.append(type(parent).__name__ + (f" '{name}'" if name else ""))
        parent = parent.parent()
    return " in ".join(chain) or "no parent"


def _running() -> dict[int, tuple[QObject, str]]:
    """Every noted thread, timer and pool still at work: id -> (object, description)."""
    found: dict[int, tuple[QObject, str]] = {}
    for thread in list(_threads):
        if shiboken6.isValid(thread) and thread.isRunning():
            found[id(thread)] = (thread, f"running {type(thread).__name__} "
                                         f"({_owners(thread)})")
    for timer in list(_timers):
        if shiboken6.isValid(timer) and timer.isActive():
            found[id(timer)] = (timer, f"active {type(timer).__name__} every "
                                       f"{timer.interval()} ms ({_owners(timer)})")
    for pool in list(_pools):
        if shiboken6.isValid(pool) and pool.activeThreadCount() > 0:
            found[id(pool)] = (pool, f"QThreadPool with {pool.activeThreadCount()} task(s) "
                                     f"still running ({_owners(pool)})")
    return found


def _stop(obj: QObject) -> None:
    if isinstance(obj, QTimer):
        obj.stop()
    elif isinstance(obj, QThread):
        obj.quit()
        obj.wait(10000)
    elif isinstance(obj, QThreadPool):
        obj.waitForDone(10000)


@pytest.fixture(autouse=True)
def _no_qt_leaks() -> Iterator[None]:
    # autouse and function-scoped: set up before, so torn down after, the test's fixtures
    before = set(_running())
    yield
    if not (_threads or _timers or _pools):
        return
    if QCoreApplication.instance() is not None:
        # what the test closed (pytest-qt closes its widgets with deleteLater) goes now,
        # with its child timers: outside an event loop Qt would keep it until much later
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    leaks = {k: v for k, v in _running().items() if k not in before}
    for obj, _ in leaks.values():
        _stop(obj)
    if leaks:
        pytest.fail("left running after the test: "
                    + "; ".join(sorted(text for _, text in leaks.values())), pytrace=False)
