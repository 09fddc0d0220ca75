"""The status bar's view of running jobs, with a Cancel for each.

Every long job (training, download, import, prepare, export, compare,
evaluation) runs through the one job API (gui/jobs.py), so one place can stop
any of them: the button names what runs, its menu cancels each job (the
engine saves what it must first), and a job already stopping can be forced.
"""

from __future__ import annotations

from PySide6.QtWidgets import QMenu, QToolButton, QWidget

from gui.jobs import EngineJob, JobManager


class JobsPanel(QToolButton):
    def __init__(self, jobs: JobManager, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.jobs = jobs
        self.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.setAutoRaise(True)
        self.menu_ = QMenu(self)
        self.setMenu(self.menu_)
        self.menu_.aboutToShow.connect(self._fill)
        jobs.changed.connect(self.update_text)
        self.update_text()

    def user_jobs(self) -> list[EngineJob]:
        """The running jobs the user started (the warm speech engine is the window's)."""
        return [j for j in self.jobs.running() if not j.background]

    def update_text(self) -> None:
        running = self.user_jobs()
        self.setVisible(bool(running))
        if running:
            names = ", ".join(j.title + (" (stopping)" if j.stopping else "") for j in running)
            self.setText(f"Running: {names}  ▾")
            self.setToolTip("Click to cancel a job")

    def _fill(self) -> None:
        self.menu_.clear()
        for job in self.user_jobs():
            if job.stopping:
                action = self.menu_.addAction(f"Force stop {job.title} (loses what it is "
                                              "saving)")
                action.triggered.connect(lambda _c=False, j=job: self._force(j))
            else:
                action = self.menu_.addAction(f"Cancel {job.title}")
                action.triggered.connect(lambda _c=False, j=job: self._cancel(j))

    def _cancel(self, job: EngineJob) -> None:
        job.cancel()
        self.update_text()

    def _force(self, job: EngineJob) -> None:
        job.force_stop()
        self.update_text()
