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

    # -- quit, another voice -------------------------------------------------------
    def unsaved(self) -> str:
        """What Quit would lose: "recording", "take" (one under review), or ""."""
        if self.recorder.active and not self.testing:
            return "recording"
        return "take" if self.take_audio is not None else ""

    def ask_before_quit(self, quit_again: Callable[[], None]) -> bool:
        """True when nothing would be lost. Else asks (without blocking) whether to keep
        the take, and calls `quit_again` once it is saved or deliberately dropped."""
        return self._ask_before_leaving("Quit Voxshard", "quit", quit_again)

    def ask_before_switch(self, switch_again: Callable[[], None]) -> bool:
        """Another voice is picked: True when nothing would be lost. Else asks, as Quit
        does, and calls `switch_again` once the take is kept for the voice it was recorded
        for, or deliberately dropped; Cancel (or reviewing a stopped take) stays here."""
        return self._ask_before_leaving("Open another voice", "switch", switch_again)

    def _ask_before_leaving(self, title: str, verb: str, again: Callable[[], None]) -> bool:
        what = self.unsaved()
        if not what:
            return True
        if self._quit_box is not None:
            return False
        box = QMessageBox(QMessageBox.Icon.Question, title, "",
                          QMessageBox.StandardButton.NoButton, self)
        prompt = f"prompt {self.prompt.id}" if self.prompt is not None else "this prompt"
        owner = self._take_owner()
        if what == "recording":
            # stopped now, not when the question is answered: the time the question
            # stays open is not the take's
            self.toggle_record()
            box.setText(f"The take of {prompt} for {owner} was being recorded: it is "
                        "stopped, for you to review.")
            keep = box.addButton("Review it", QMessageBox.ButtonRole.AcceptRole)
        else:
            verdict = "" if self.judgement.verdict != VERDICT_UNUSABLE else \
                " It cannot train (" + " ".join(self.judgement.warnings) + ")"
            box.setText(f"The take of {prompt} for {owner} is not saved yet.{verdict}")
            keep = box.addButton(f"Save it and {verb}" if verb == "quit" else
                                 f"Keep it for {owner} and {verb}",
                                 QMessageBox.ButtonRole.AcceptRole)
        drop = box.addButton(f"Discard it and {verb}", QMessageBox.ButtonRole.DestructiveRole)
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
                again()
            elif clicked is keep and what == "recording":
                pass  # the take (stopped) is under review; the quit or switch is called off
            elif clicked is keep and self._save_take():
                again()

        box.finished.connect(answered)
        self._after(box)
        box.open()
        return False

    def _take_owner(self) -> str:
        """The speaker of the voice the take was started for, as the sidebar names it."""
        voice = self.take_voice or self.voice
        if voice is None:
            return "this voice"
        snap = self.ctx.reader.cached(voice)
        return snap.speaker if snap is not None else voice.name
