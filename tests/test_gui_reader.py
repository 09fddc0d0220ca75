"""The workspace reader: a big voice is read off the GUI thread, cached, and re-read on change."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
from PySide6.QtCore import QTimer

from engine.layout.voice import create_voice, open_voice
from gui.workspace_reader import WorkspaceReader

BIG = 13_000


def _big_voice(root: Path, n: int) -> Path:
    """A voice of n takes: tiny sidecars and placeholder audio, no decoding anywhere."""
    voice = create_voice(root / "big", "Big").path
    takes = voice / "takes"
    for i in range(n):
        take_id = f"{i:06d}"
        (takes / f"{take_id}.wav").write_bytes(b"")
        (takes / f"{take_id}.json").write_text(json.dumps(
            {"id": take_id, "audio": f"{take_id}.wav", "text": f"Sentence number {i}.",
             "origin": "imported", "duration_s": 3.0, "sample_rate": 24000}))
    return voice


def _age(root: Path, seconds: float) -> None:
    then = time.time() - seconds
    for p in [root, *root.rglob("*")]:
        os.utime(p, (then, then))


def test_a_big_voice_loads_while_the_window_keeps_ticking(qtbot, tmp_path: Path) -> None:
    voice = _big_voice(tmp_path, BIG)
    reader = WorkspaceReader()
    ticks = 0

    def tick() -> None:
        nonlocal ticks
        ticks += 1

    timer = QTimer()
    timer.setInterval(1)
    timer.timeout.connect(tick)
    timer.start()
    try:
        with qtbot.waitSignal(reader.voice_loaded, timeout=300000) as blocker:
            reader.load_voice(voice)
            assert reader.busy  # returned at once: the read runs on a pool thread
        ticks_during_load = ticks
    finally:
        timer.stop()
        reader.shutdown()
    path, snap = blocker.args
    assert path == voice
    assert ticks_during_load > 0  # the event loop kept turning while 13,000 files were read
    assert len(snap.takes) == BIG and snap.summary["takes"] == BIG
    assert snap.takes[-1].text == f"Sentence number {BIG - 1}."
    assert reader.cached(voice) is snap and reader.reads == 1
    assert reader.pool.activeThreadCount() == 0


def test_the_reader_rereads_after_a_change_on_disk_and_not_without(qtbot,
                                                                   tmp_path: Path) -> None:
    voice = create_voice(tmp_path / "ada", "Ada")
    voice.add_take(np.full(2400, 0.1, dtype=np.float32), "One.", sample_rate=24000)
    _age(voice.path, 60)
    reader = WorkspaceReader()
    try:
        reader.watch(voice.path)
        with qtbot.waitSignal(reader.voice_loaded, timeout=30000):
            reader.load_voice(voice.path)
        assert reader.reads == 1
        # nothing changed: a check, no second read and no signal
        reader.load_voice(voice.path)
        qtbot.waitUntil(lambda: not reader.busy, timeout=30000)
        assert reader.reads == 1
        # a take written by another process: the watcher notices, nobody asks
        with qtbot.waitSignal(reader.voice_loaded, timeout=30000) as blocker:
            open_voice(voice.path).add_take(np.full(2400, 0.2, dtype=np.float32), "Two.",
                                            sample_rate=24000)
        assert [t.text for t in blocker.args[1].takes] == ["One.", "Two."]
        # a voice that is gone says so and leaves the cache
        with qtbot.waitSignal(reader.failed, timeout=30000) as failed:
            reader.load_voice(tmp_path / "nobody")
        assert "no voice" in failed.args[1].lower()
    finally:
        reader.shutdown()
    assert not reader.settle.isActive() and reader.watcher.directories() == []


def test_the_window_scans_takes_only_off_the_gui_thread(qtbot, window, voice: Path,
                                                       monkeypatch) -> None:
    import threading

    from engine.layout.voice import Voice
    from gui.pages.importer import ImportPage
    from gui.pages.listen import ListenPage
    from gui.pages.prepare import PreparePage
    from gui.pages.record import RecordPage
    from gui.pages.voices import VoicesPage

    open_voice(voice).add_take(np.full(2400, 0.1, dtype=np.float32), "One.", sample_rate=24000)
    threads: list[bool] = []
    real_scan = Voice._scan

    def watched_scan(self, *args, **kwargs):  # the real scan, noting which thread ran it
        threads.append(threading.current_thread() is threading.main_thread())
        return real_scan(self, *args, **kwargs)

    monkeypatch.setattr(Voice, "_scan", watched_scan)
    window.ctx.set_voice(voice)
    for cls in (VoicesPage, RecordPage, ImportPage, PreparePage, ListenPage):
        window.show_page(cls)
        qtbot.waitUntil(lambda: not window.ctx.reader.busy, timeout=30000)
    assert window.page(ImportPage).model.rowCount() == 1
    assert threads and not any(threads)  # read, and never on the GUI thread
