"""The engine's remedies as buttons: each `Change` (a setting's path, a value, why) that
the Train form has a field for is a button that sets that field; the others are said in
words. The changes come as plain event data (the plan's `changes`, an error's `changes`),
never as text to read back."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QLabel, QPushButton, QVBoxLayout, QWidget

from engine.config.change import Change, as_changes
from gui.pages.train.settings import FORM_SETTINGS, TrainSettings
from gui.widgets import hbox


def apply_change(settings: TrainSettings, change: Change) -> bool:
    """Set the form's field for `change.path` to its value; False when the form has no
    field for it, the field is not open to edits, or it cannot show the value."""
    if change.path == "model.base":
        settings.base.setEditText(str(change.value))
        return settings.base.currentText() == change.value
    if change.path == "parallel.workers":
        if not settings.workers.isEnabled():  # it follows the GPUs ticked
            return False
        settings.workers.setValue(int(change.value))
        return settings.workers.value() == change.value
    if change.path not in FORM_SETTINGS:
        return False
    field = settings.fields[change.path.rpartition(".")[2]]
    field.set_value(change.value)
    return field.value() == change.value


def can_apply(settings: TrainSettings, change: Change) -> bool:
    """Whether the form has an open field for `change` (what a button is offered for)."""
    if change.path == "parallel.workers":
        return settings.workers.isEnabled()
    return change.path == "model.base" or change.path in FORM_SETTINGS


class Remedies(QWidget):
    """A caption and one row per change: a button that applies it, then why."""

    #: a change applied to the form (its words, "Activation checkpointing: on")
    applied = Signal(str)

    def __init__(self, settings: TrainSettings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        self.changes: list[Change] = []
        #: the button of each change offered as one, in order
        self.buttons: list[tuple[Change, QPushButton]] = []
        self._lay = QVBoxLayout(self)
        self._lay.setContentsMargins(0, 0, 0, 0)
        self.caption = QLabel("")
        self.caption.setObjectName("Muted")
        self._lay.addWidget(self.caption)
        self._rows: list[QWidget] = []
        self.hide()

    def offer(self, caption: str, changes: Any) -> None:
        """Show `changes` (their dicts, as events carry them, or `Change`s); none hides it."""
        for row in self._rows:
            self._lay.removeWidget(row)
            row.deleteLater()
        self._rows.clear()
        self.buttons.clear()
        self.changes = as_changes(changes)
        self.caption.setText(caption)
        for change in self.changes:
            why = QLabel(change.why)
            why.setObjectName("Muted")
            why.setWordWrap(True)
            if can_apply(self.settings, change):
                btn = QPushButton(change.label())
                btn.setToolTip(f"Set {change.label()} in the form")
                btn.clicked.connect(lambda _c=False, c=change, b=btn: self._apply(c, b))
                self.buttons.append((change, btn))
                row = hbox(btn, why, stretch_at=2)
            else:  # a setting the form does not show: said, not offered
                why.setText(f"{change.label()} \u2014 {change.why}")
                row = why
            self._lay.addWidget(row)
            self._rows.append(row)
        self.setVisible(bool(self.changes))

    def _apply(self, change: Change, btn: QPushButton) -> None:
        if apply_change(self.settings, change):
            btn.setEnabled(False)
            btn.setText(f"\u2713 {change.label()}")
            self.applied.emit(change.label())
