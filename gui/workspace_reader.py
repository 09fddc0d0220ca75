"""Reads the workspace through engine.catalog off the GUI thread, cached and kept fresh.

A voice of 13,000 takes is 13,000 JSON files: reading them on the GUI thread
froze the window. Here a small thread pool reads, a snapshot comes back by a
queued signal, and it is cached per voice with the catalog's change
signature (modification times), so showing a page again costs nothing and a
re-read happens only when something on disk changed. A QFileSystemWatcher on
the open voice's folders, and the app's `data_changed`, trigger that check.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QFileSystemWatcher, QObject, QRunnable, QThreadPool, QTimer, Signal

from engine import catalog
from engine.core.errors import VoxshardError
from engine.layout.exports import EXPORTS_DIR, RENDERS_DIR
from engine.layout.manifest import PREPARED
from engine.layout.run import RUNS_DIR
from engine.layout.voice import TakeCache

#: folders of a voice whose own change (a file added, renamed or removed) means a re-read
WATCHED = ("", "takes", PREPARED, RUNS_DIR, EXPORTS_DIR, RENDERS_DIR)
#: a burst of changes (an import writes two files per take) becomes one re-read
SETTLE_MS = 300


class _Relay(QObject):
    """Lives in the GUI thread: a worker's emit reaches it queued."""

    done = Signal(object)  # (key, outcome, value)


class _Read(QRunnable):
    def __init__(self, key: tuple[str, Path], work: Callable[[], Any], relay: _Relay) -> None:
        super().__init__()
        self.key, self.work, self.relay = key, work, relay

    def run(self) -> None:
        try:
            outcome: tuple[str, Any] = ("ok", self.work())
        except VoxshardError as exc:
            outcome = ("error", exc.message)
        except OSError as exc:
            outcome = ("error", f"Cannot read {self.key[1]}: {exc.strerror or exc}.")
        except Exception as exc:  # a bug must not kill the pool thread silently
            outcome = ("error", f"Reading {self.key[1]} failed: {type(exc).__name__}: {exc}")
        self.relay.done.emit((self.key, *outcome))


class WorkspaceReader(QObject):
    voice_loaded = Signal(object, object)  # Path, catalog.VoiceSnapshot (new or changed)
    voices_loaded = Signal(object, object)  # workspace Path, list[catalog.VoiceEntry]
    failed = Signal(object, str)  # Path, one sentence

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.pool = QThreadPool(self)
        self.pool.setMaxThreadCount(2)  # the voice list never waits behind a big voice
        self._relay = _Relay(self)
        self._relay.done.connect(self._done)
        self._cache: dict[Path, catalog.VoiceSnapshot] = {}
        self._voices: dict[Path, list[catalog.VoiceEntry]] = {}
        self._take_caches: dict[Path, TakeCache] = {}
        self._inflight: set[tuple[str, Path]] = set()
        self._again: set[tuple[str, Path]] = set()
        self._closed = False
        self.reads = 0  # full voice reads done (a check that found no change is not one)
        self.watched: Path | None = None
        self.watcher = QFileSystemWatcher(self)
        self.watcher.directoryChanged.connect(self._disk_changed)
        self.watcher.fileChanged.connect(self._disk_changed)
        self.settle = QTimer(self)
        self.settle.setSingleShot(True)
        self.settle.setInterval(SETTLE_MS)
        self.settle.timeout.connect(self._reload_watched)

    # -- asking -------------------------------------------------------------------------
    def cached(self, voice: Path | None) -> catalog.VoiceSnapshot | None:
        """The last snapshot read of a voice (possibly stale; a load refreshes it)."""
        return self._cache.get(voice) if voice is not None else None

    def cached_voices(self, workspace: Path | None) -> list[catalog.VoiceEntry] | None:
        return self._voices.get(workspace) if workspace is not None else None

    @property
    def busy(self) -> bool:
        """A read is running or queued."""
        return bool(self._inflight)

    def load_voice(self, voice: Path) -> None:
        """Check a voice in the background; `voice_loaded` follows when it is new or changed."""
        old = self._cache.get(voice)
        # the pool thread alone uses it: one read per voice runs at a time
        takes = self._take_caches.setdefault(voice, {})

        def work() -> catalog.VoiceSnapshot | None:
            if old is not None and catalog.is_current(old):
                return None  # unchanged: the cached snapshot stands
            return catalog.snapshot(voice, takes)

        self._submit(("voice", voice), work)

    def load_voices(self, workspace: Path) -> None:
        """List a workspace's voices in the background; `voices_loaded` follows."""
        self._submit(("voices", workspace), lambda: catalog.list_voices(workspace))

    def refresh(self, voice: Path | None) -> catalog.VoiceSnapshot | None:
        """What a page calls when shown: the cached snapshot now, a check in the background."""
        if voice is not None and ("voice", voice) not in self._inflight:
            self.load_voice(voice)
        return self.cached(voice)

    def _submit(self, key: tuple[str, Path], work: Callable[[], Any]) -> None:
        if self._closed:
            return
        if key in self._inflight:
            self._again.add(key)  # the running read may predate the change: read once more
            return
        self._inflight.add(key)
        self.pool.start(_Read(key, work, self._relay))

    def _done(self, message: tuple[tuple[str, Path], str, Any]) -> None:
        (read, path), outcome, value = message
        key = (read, path)
        self._inflight.discard(key)
        if self._closed:
            return
        if outcome == "error":
            if read == "voice":
                self._cache.pop(path, None)
            self.failed.emit(path, str(value))
        elif read == "voice" and value is not None:
            self.reads += 1
            self._cache[path] = value
            self.voice_loaded.emit(path, value)
        elif read == "voices":
            self._voices[path] = value
            self.voices_loaded.emit(path, value)
        if key in self._again:
            self._again.discard(key)
            (self.load_voice(path) if read == "voice" else self.load_voices(path))

    # -- watching -----------------------------------------------------------------------
    def watch(self, voice: Path | None) -> None:
        """Follow one voice's folders (the open one); None stops watching."""
        if self._closed:
            return
        for paths in (self.watcher.directories(), self.watcher.files()):
            if paths:
                self.watcher.removePaths(paths)
        self.watched = voice
        if voice is None:
            return
        dirs = [str(voice / sub) if sub else str(voice) for sub in WATCHED
                if (voice / sub).is_dir()]
        if dirs:
            self.watcher.addPaths(dirs)

    def _disk_changed(self, _path: str) -> None:
        if not self._closed:
            self.settle.start()

    def _reload_watched(self) -> None:
        if self.watched is not None:
            self.watch(self.watched)  # a folder made since (e.g. prepared/) is watched too
            self.load_voice(self.watched)

    def forget(self, voice: Path) -> None:
        """Drop a voice from the cache (deleted or renamed)."""
        self._cache.pop(voice, None)
        if ("voice", voice) not in self._inflight:
            self._take_caches.pop(voice, None)

    def shutdown(self) -> None:
        """Stop watching and wait for reads in progress (each is short); idempotent."""
        self._closed = True
        self.settle.stop()
        for paths in (self.watcher.directories(), self.watcher.files()):
            if paths:
                self.watcher.removePaths(paths)
        self.pool.clear()
        self.pool.waitForDone(-1)
