"""The leak check of tests/helpers/qt_leaks.py fails a test that leaves a Qt thread, timer
or pool task running, and passes one that cleans up (or whose widget takes its timers
along when pytest-qt deletes it). Run in a pytest of its own, in a child process."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

INNER = '''
import threading

from PySide6.QtCore import QThread, QThreadPool, QTimer
from PySide6.QtWidgets import QWidget

kept = []


def test_leaks_a_timer(qapp):
    timer = QTimer()
    timer.start(1000)
    kept.append(timer)


def test_stops_its_timer(qapp):
    timer = QTimer()
    timer.start(1000)
    timer.stop()
    kept.append(timer)


def test_a_closed_widget_takes_its_timer_along(qtbot):
    widget = QWidget()
    qtbot.addWidget(widget)
    QTimer(widget).start(1000)


def test_leaks_a_thread(qapp):
    thread = QThread()
    thread.start()
    kept.append(thread)


def test_leaves_a_pool_task_running(qapp):
    release = threading.Event()
    pool = QThreadPool()
    pool.start(lambda: release.wait(30))
    kept.append((pool, release))
    threading.Timer(1.0, release.set).start()
'''


def test_leaks_fail_their_test_and_clean_tests_pass(pytester: pytest.Pytester,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    pytester.makepyfile(test_inner=INNER)
    result = pytester.runpytest_subprocess("-p", "tests.helpers.qt_leaks", "-p",
                                           "no:cacheprovider", "-rE")
    result.assert_outcomes(passed=5, errors=3)
    out = result.stdout.str()
    assert "active QTimer every 1000 ms (no parent)" in out
    assert "running QThread (no parent)" in out
    assert "QThreadPool with 1 task(s) still running" in out
    for clean in ("test_stops_its_timer", "test_a_closed_widget_takes_its_timer_along"):
        assert f"ERROR at teardown of {clean}" not in out
