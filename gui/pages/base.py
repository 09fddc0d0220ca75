"""What every page has: the shared context, a title, and a refresh hook; and what the
pages that show a voice have: its snapshot, re-read on refresh and redrawn when loaded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtWidgets import QMessageBox, QVBoxLayout, QWidget

from engine.catalog import VoiceSnapshot
from gui.context import AppContext
from gui.jobs import EngineJob
from gui.widgets import page_header, show_error


class Page(QWidget):
    title = ""
    subtitle = ""
    icon_name = ""

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.ctx = ctx
        self.outer = QVBoxLayout(self)
        self.outer.setContentsMargins(28, 22, 28, 18)
        self.outer.setSpacing(12)
        self.outer.addWidget(page_header(self.title, self.subtitle))
        # hidden pages re-read the disk only when they are shown again
        ctx.voice_changed.connect(lambda _v: self._changed())
        ctx.data_changed.connect(self._changed)

    @property
    def voice(self) -> Path | None:
        return self.ctx.voice

    def _changed(self) -> None:
        if self.isVisible():
            self.refresh()

    def refresh(self) -> None:
        """Re-read what the page shows from disk."""

    def shown(self) -> None:
        """The page became the visible one."""
        self.refresh()

    def hidden(self) -> None:
        """Another page became visible (stop meters, playback...)."""

    def start_job(self, args: list[str], title: str, **kwargs: object) -> EngineJob:
        job = self.ctx.jobs.start(args, title, **kwargs)  # type: ignore[arg-type]
        job.failed.connect(lambda code, msg, hint: self.job_failed(title, code, msg, hint))
        return job

    def job_failed(self, title: str, code: str, message: str, hint: str) -> None:
        self.ctx.status.emit(f"{title} failed: {message}")
        show_error(self, f"{title} failed", message, hint)

    def confirm(self, title: str, text: str, on_yes: Callable[[], None],
                detail: str = "") -> QMessageBox:
        """Asynchronous yes/no question (no nested event loop)."""
        box = QMessageBox(QMessageBox.Icon.Question, title, text,
                          QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.Cancel,
                          self)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        if detail:
            box.setInformativeText(detail)

        def done(_result: int) -> None:
            clicked = box.clickedButton()
            yes = QMessageBox.StandardButton.Yes
            if clicked is not None and box.standardButton(clicked) == yes:
                on_yes()
            box.deleteLater()

        box.finished.connect(done)
        box.open()
        return box


class SnapshotPage(Page):
    """A page that shows the current voice's snapshot (`gui.workspace_reader`): a refresh
    shows what the reader has and re-reads in the background; the reader's answer is
    drawn when it is about the voice shown and the page is visible."""

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        ctx.reader.voice_loaded.connect(self._voice_loaded)

    def refresh(self) -> None:
        self._show_snapshot(self.ctx.reader.refresh(self.voice))

    def _voice_loaded(self, voice: Path, snap: VoiceSnapshot) -> None:
        if voice == self.voice and self.isVisible():
            self._show_snapshot(snap)

    def _show_snapshot(self, snap: VoiceSnapshot | None) -> None:
        """Draw the voice's snapshot (None: no voice, or not read yet)."""
        raise NotImplementedError
