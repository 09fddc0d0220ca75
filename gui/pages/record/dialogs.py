"""The Record page's questions that guard a take: keeping one that cannot train, and
Quit with a take recording or under review. Each opens without blocking; the page takes
its keys back once it is answered. Mixed into `RecordPage`."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtWidgets import QMessageBox

from engine.layout.voice import VERDICT_UNUSABLE


class TakeDialogs:
    """The Record page's dialogs about its take."""

    def _ask_keep_unusable(self) -> None:
        if self._confirm is not None:
            return
        box = QMessageBox(QMessageBox.Icon.Warning, "Keep a take that cannot train?",
                          "This take cannot train: " + " ".join(self.judgement.warnings),
                          QMessageBox.StandardButton.NoButton, self)
        keep = box.addButton("Keep anyway", QMessageBox.ButtonRole.DestructiveRole)
        retake = box.addButton("Re-take", QMessageBox.ButtonRole.RejectRole)
        box.setDefaultButton(retake)  # Enter again re-takes: keeping needs a deliberate click
        box.setEscapeButton(retake)
        box.setInformativeText("It is saved with its verdict: Import counts it as flagged, "
                               "Prepare leaves it out, and its prompt is offered again.")
        self._confirm = box

        def answered(_r: int) -> None:
            self._confirm = None
            if box.clickedButton() is keep:
                self._save_take()
            elif box.clickedButton() is retake:
                self.retake()

        box.finished.connect(answered)
        self._after(box)
        box.open()

    # -- quit ----------------------------------------------------------------------
    def unsaved(self) -> str:
        """What Quit would lose: "recording", "take" (one under review), or ""."""
        if self.recorder.active and not self.testing:
            return "recording"
        return "take" if self.take_audio is not None else ""

    def ask_before_quit(self, quit_again: Callable[[], None]) -> bool:
        """True when nothing would be lost. Else asks (without blocking) whether to keep
        the take, and calls `quit_again` once it is saved or deliberately dropped."""
        what = self.unsaved()
        if not what:
            return True
        if self._quit_box is not None:
            return False
        box = QMessageBox(QMessageBox.Icon.Question, "Quit Voxshard", "",
                          QMessageBox.StandardButton.NoButton, self)
        prompt = f"prompt {self.prompt.id}" if self.prompt is not None else "this prompt"
        if what == "recording":
            # stopped now, not when the question is answered: the time the question
            # stays open is not the take's
            self.toggle_record()
            box.setText(f"The take of {prompt} was being recorded: it is stopped, for you "
                        "to review.")
            keep = box.addButton("Review it", QMessageBox.ButtonRole.AcceptRole)
        else:
            verdict = "" if self.judgement.verdict != VERDICT_UNUSABLE else \
                " It cannot train (" + " ".join(self.judgement.warnings) + ")"
            box.setText(f"The take of {prompt} is not saved yet.{verdict}")
            keep = box.addButton("Save it and quit", QMessageBox.ButtonRole.AcceptRole)
        drop = box.addButton("Discard it and quit", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(keep)
        self._quit_box = box

        def answered(_r: int) -> None:
            self._quit_box = None
            clicked = box.clickedButton()
            if clicked is drop:
                self.recorder.abort()
                self._end_recording_ui()
                self._reset_take()
                quit_again()
            elif clicked is keep and what == "recording":
                pass  # the take (stopped) is under review; the quit is called off
            elif clicked is keep and self._save_take():
                quit_again()

        box.finished.connect(answered)
        self._after(box)
        box.open()
        return False

