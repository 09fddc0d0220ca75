"""State the pages share: the workspace, the current voice, jobs, playback, settings."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import platformdirs
from PySide6.QtCore import QObject, QSettings, Signal

from engine.layout.voice import is_voice_folder
from gui.audio import Player
from gui.jobs import JobManager
from gui.speech import SpeechService
from gui.workspace_reader import WorkspaceReader

APP_NAME = "Voxshard"
ORG_NAME = "Voxshard"


def default_workspace() -> Path:
    return Path(platformdirs.user_documents_dir()) / "Voxshard"


class AppContext(QObject):
    workspace_changed = Signal(object)  # Path | None
    voice_changed = Signal(object)  # Path | None
    voice_kept = Signal(object)  # Path: a switch waits for a question (lists show it again)
    data_changed = Signal()  # something in the current voice changed on disk
    status = Signal(str)  # a line for the status bar

    def __init__(self, settings: QSettings | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        # platform's standard place (~/.config/Voxshard/Voxshard.conf on Linux)
        self.settings = settings or QSettings(
            QSettings.Format.IniFormat, QSettings.Scope.UserScope, ORG_NAME, APP_NAME)
        self.jobs = JobManager(self)
        self.speech = SpeechService(self.jobs, self)
        self.player = Player(self)
        self.player.failed.connect(self.status.emit)  # e.g. no PortAudio: say what to install
        out_dev = self.settings.value("audio/output_device")
        self.player.device = int(out_dev) if out_dev not in (None, "", "None") else None
        self.workspace: Path | None = None
        self.voice: Path | None = None
        #: asked before the current voice is left: `guard(then)` is True when nothing
        #: would be lost; else it asks, and calls `then` (the switch, again) once answered
        self.leave_voice_guards: list[Callable[[Callable[[], None]], bool]] = []
        saved = self.settings.value("workspace")
        if saved:
            self.workspace = Path(str(saved))
        # pages read the workspace through this (off the GUI thread, cached); connected
        # before any page, so a change is being re-read by the time pages refresh
        self.reader = WorkspaceReader(self)
        self.voice_changed.connect(self._read_voice)
        self.data_changed.connect(self._read_voice)
        self.workspace_changed.connect(lambda ws: self.reader.load_voices(ws))
        self.reader.failed.connect(lambda _path, message: self.status.emit(message))

    def _read_voice(self, *_: object) -> None:
        self.reader.watch(self.voice)
        if self.voice is not None:
            self.reader.load_voice(self.voice)
        if self.workspace is not None:
            self.reader.load_voices(self.workspace)

    def may_leave_voice(self, then: Callable[[], None]) -> bool:
        """True when the current voice can be left now; else a page asks first (a take
        recording or under review belongs to the voice it was started for)."""
        return all(guard(then) for guard in self.leave_voice_guards)

    def set_workspace(self, path: Path) -> None:
        if self.voice is not None and self.voice.parent != path \
                and not self.may_leave_voice(lambda: self.set_workspace(path)):
            return
        path.mkdir(parents=True, exist_ok=True)
        self.workspace = path
        self.save_setting("workspace", str(path))
        self.workspace_changed.emit(path)
        last = self.settings.value(f"last_voice/{path}")
        candidate = path / str(last) if last else None
        self.set_voice(candidate if candidate and is_voice_folder(candidate) else None)

    def set_voice(self, voice: Path | None) -> None:
        if voice == self.voice:
            return
        if self.voice is not None and not self.may_leave_voice(lambda: self.set_voice(voice)):
            self.voice_kept.emit(self.voice)
            return
        self.voice = voice
        if voice is not None and self.workspace is not None:
            self.save_setting(f"last_voice/{self.workspace}", voice.name)
        self.voice_changed.emit(voice)

    def set_output_device(self, index: int | None) -> None:
        self.player.device = index
        self.save_setting("audio/output_device", "" if index is None else index)

    def save_setting(self, key: str, value: object) -> None:
        """Write a setting now, at the user's action.

        QSettings otherwise syncs from a later turn of the event loop, and its
        sync fsyncs: on a busy disk that blocked the window for 1.7 s in the
        middle of a training run (measured by the stall test).
        """
        self.settings.setValue(key, value)
        self.settings.sync()

    def notify_changed(self) -> None:
        self.data_changed.emit()
