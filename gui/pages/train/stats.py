"""The run's numbers at a glance: a step progress bar with ETA, and stat cards.

Each figure is a card of its own (widgets.StatCard: a framed box with padding
and a minimum width), so two long values such as "10.2409" and "10.2658" can never
touch; cards wrap onto a second row when the window is narrow instead of
squeezing (8, 4, 3 or 2 per row, as the width allows).
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QSize, Qt
from PySide6.QtGui import QResizeEvent, QTextLayout, QTextOption
from PySide6.QtWidgets import (
    QGridLayout,
    QLabel,
    QProgressBar,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from gui.widgets import StatCard, fmt_duration

# key, caption; the order is the reading order
CARDS = [("step", "step"), ("loss", "train loss"), ("val", "val loss"),
         ("similarity", "similarity"), ("wer", "word errors"), ("lr", "learning rate"),
         ("tps", "tokens/s"), ("elapsed", "elapsed")]
CARD_MIN_WIDTH = 118
SPACING = 8
MAX_COLUMNS = 8


class OneLineLabel(QLabel):
    """A label that keeps to one line: a long text ends in "…" (the whole of it in the
    tooltip, and in `text()`). A state that wrapped pushed the cards and the chart tabs
    down as it changed, so a click aimed at a tab landed elsewhere."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._full = ""
        # the row's width, whatever the text: a new state never relays the row out
        self.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.setText(text)

    def setText(self, text: str) -> None:
        self._full = text
        self._fit()

    def text(self) -> str:
        return self._full

    def _fit(self) -> None:
        shown = self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight,
                                              max(0, self.contentsRect().width()))
        super().setText(shown)
        self.setToolTip(self._full if shown != self._full else "")

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit()

    def minimumSizeHint(self) -> QSize:
        return QSize(0, super().minimumSizeHint().height())

    def sizeHint(self) -> QSize:
        return QSize(0, super().sizeHint().height())


class FewLinesLabel(OneLineLabel):
    """A word-wrapped label `lines` lines tall whatever its text: a longer text ends in "…"
    on its last line (`text()` keeps it whole). The evaluation line wrapped to three lines
    in a room of two at 1100 px, and the room cut its first and last lines in half."""

    def __init__(self, lines: int = 2, parent: QWidget | None = None) -> None:
        self._lines = lines  # before the base class's first fit
        super().__init__("", parent)
        self.setWordWrap(True)

    def clear(self) -> None:
        self.setText("")

    def _line_starts(self, width: int) -> list[int]:
        """Where each line of the whole text starts, wrapped at `width` as QLabel wraps."""
        layout = QTextLayout(self._full, self.font())
        option = QTextOption()
        option.setWrapMode(QTextOption.WrapMode.WordWrap)
        layout.setTextOption(option)
        layout.beginLayout()
        starts = []
        while (line := layout.createLine()).isValid():
            line.setLineWidth(width)
            starts.append(line.textStart())
        layout.endLayout()
        return starts

    def _fit(self) -> None:
        metrics = self.fontMetrics()
        self.setFixedHeight(self._lines * metrics.lineSpacing() + 4)
        width = self.contentsRect().width()
        shown = self._full
        starts = self._line_starts(width) if width > 0 and shown else []
        if len(starts) > self._lines:
            cut = starts[self._lines - 1]
            shown = shown[:cut] + metrics.elidedText(shown[cut:], Qt.TextElideMode.ElideRight,
                                                     width)
        QLabel.setText(self, shown)

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._fit()  # the theme's font: other line heights and breaks


class StatsBar(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.setSpacing(6)
        self.state_label = OneLineLabel("Idle")
        self.state_label.setObjectName("StateLabel")
        # a monitor shows many figures at once: smaller than the Voices page's cards
        self.setStyleSheet("#StatValue { font-size: 12pt; }")
        self.progress = QProgressBar()
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat("No run")
        self.progress.setTextVisible(True)
        lay.addWidget(self.progress)
        self.grid = QGridLayout()
        self.grid.setHorizontalSpacing(SPACING)
        self.grid.setVerticalSpacing(SPACING)
        self.cards: dict[str, StatCard] = {}
        for key, caption in CARDS:
            card = StatCard(caption)
            card.setMinimumWidth(CARD_MIN_WIDTH)
            card.layout_.setContentsMargins(10, 4, 10, 4)
            card.layout_.setSpacing(0)
            card.value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.cards[key] = card
        self.columns = 0
        self._arrange(MAX_COLUMNS)
        lay.addLayout(self.grid)

    def _arrange(self, columns: int) -> None:
        """Lay the cards out in `columns` columns (more rows when the page is narrow)."""
        if columns == self.columns:
            return
        for card in self.cards.values():
            self.grid.removeWidget(card)
        for c in range(max(self.columns, columns)):
            self.grid.setColumnStretch(c, 1 if c < columns else 0)
        for i, card in enumerate(self.cards.values()):
            self.grid.addWidget(card, i // columns, i % columns)
        self.columns = columns

    def resizeEvent(self, event: QResizeEvent) -> None:
        fit = (event.size().width() + SPACING) // (CARD_MIN_WIDTH + SPACING)
        # the largest column count that holds every card at its minimum width,
        # preferring full rows (8 cards: 8 or 4 columns); 3 before 2, so a laptop's
        # narrow monitor column spends a row less on cards and more on the chart
        columns = next((c for c in (8, 4, 3, 2) if c <= max(fit, 1)), 1)
        self._arrange(min(columns, MAX_COLUMNS))
        super().resizeEvent(event)

    @property
    def labels(self) -> dict[str, QLabel]:
        return {k: c.value for k, c in self.cards.items()}

    def put(self, key: str, text: str) -> None:
        self.cards[key].value.setText(text)

    def show_progress(self, step: float, total: int, eta_s: float | None) -> None:
        if total <= 0:
            self.progress.setRange(0, 0 if step else 1)
            self.progress.setFormat(f"step {step:.0f}")
            return
        self.progress.setRange(0, total)
        self.progress.setValue(int(min(step, total)))
        text = f"step {step:.0f} of {total}  ·  {100.0 * min(step, total) / total:.0f}%"
        if eta_s is not None:
            text += f"  ·  about {fmt_duration(eta_s)} left"
        self.progress.setFormat(text)

    def clear(self) -> None:
        for card in self.cards.values():
            card.value.setText("—")
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat("No run")
        self.state_label.setText("Idle")
