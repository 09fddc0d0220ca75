"""Help: keyboard shortcuts and the path from recordings to a cloned voice."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHeaderView, QLabel, QTableWidget, QTableWidgetItem, QWidget

from gui.context import AppContext
from gui.pages.base import Page

SHORTCUTS = [
    ("Anywhere", "Ctrl+1 … Ctrl+8", "Voices, Record, Import, Prepare, Train, Listen, Read, "
     "Serve"),
    ("Anywhere", "F1", "This help page"),
    ("Anywhere", "Ctrl+N", "New voice"),
    ("Anywhere", "Ctrl+Q", "Quit (running jobs are stopped safely)"),
    ("Record", "Space", "Record / stop (\u201cFinishing\u2026\u201d: the input stays open 0.3 s "
     "after stop, so the last word is kept)"),
    ("Record", "Enter", "Accept the take: it is saved at once (one that cannot train asks "
     "first; kept, its prompt is offered again)"),
    ("Record", "R", "Re-take"),
    ("Record", "Delete or Backspace", "Discard the take without recording another"),
    ("Record", "P", "Play the take / stop playing"),
    ("Record", "S / N", "Skip this prompt / next style: a prompt of a style still needing "
     "takes"),
    ("Record", "B", "Back to the previous prompt (P plays its take; a new one replaces it)"),
    ("Import", "Space", "Play the selected clip / stop it"),
    ("Import", "F2 or double-click", "Edit the transcript (F2 from any cell of the row)"),
    ("Listen", "Ctrl+Enter / Esc", "Speak the text / stop speaking or playing"),
]

STEPS = """
<ol>
<li><b>Voices</b>: pick a workspace folder and create a voice for one speaker.</li>
<li><b>Record</b> prompted sentences (10 minutes recommended) or <b>Import</b> recordings
you already have, with their transcripts.</li>
<li><b>Prepare</b>: the clips are cleaned and checked; the report says what to fix.</li>
<li><b>Train</b>: fine-tune the base model on every GPU (or CPU workers) and watch the
loss fall. Stop and resume at any time.</li>
<li><b>Listen</b>: type text and hear the cloned voice; compare checkpoints side by side.</li>
<li><b>Read</b> (optional): a script or a book in your voices, line by line, exported with
chapters.</li>
<li><b>Serve</b> (optional): let other programs (chat apps, home automation, scripts) speak
in the voice through OpenAI's speech endpoint on this computer.</li>
</ol>
<p>Every step is also a command of the headless engine (<code>voxshard-engine</code>), so
a script can do what the app does.</p>
"""


class HelpPage(Page):
    title = "Help"
    subtitle = "From a few minutes of speech to a cloned voice, and the keys that get you there."
    icon_name = "help"

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        steps = QLabel(STEPS)
        steps.setWordWrap(True)
        self.outer.addWidget(steps)
        title = QLabel("<b>Keyboard shortcuts</b>")
        self.outer.addWidget(title)
        self.table = QTableWidget(len(SHORTCUTS), 3)
        self.table.setHorizontalHeaderLabels(["Where", "Keys", "What"])
        self.table.verticalHeader().hide()
        self.table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.table.setAlternatingRowColors(True)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        self.table.setWordWrap(True)
        for row, cells in enumerate(SHORTCUTS):
            for col, text in enumerate(cells):
                self.table.setItem(row, col, QTableWidgetItem(text))
        # the keys' columns as wide as their longest entry and a little air, the rest is
        # "What"'s; a long "What" wraps onto a taller row (at 1100 px, with fixed 110 and
        # 170 px columns, the Space row of Record ended in "…")
        for col in (0, 1):
            self.table.setColumnWidth(col, self.table.sizeHintForColumn(col) + 16)
        # queued: while the signal is emitted the column still reports its old width
        header.sectionResized.connect(self.fit_rows, Qt.ConnectionType.QueuedConnection)
        self.outer.addWidget(self.table, 1)

    def fit_rows(self, *_resized: int) -> None:
        """Each row as tall as its wrapped text; one-line rows keep their height (the
        header's ResizeToContents made every row taller: the table scrolled at 1100x760)."""
        # a one-line row as tall as its text and a little air, not the style's roomier
        # default: the list grew with the Record and Read keys and scrolled at 1100x760
        one_line = self.table.fontMetrics().height() + 10
        for row in range(self.table.rowCount()):
            self.table.setRowHeight(row, max(one_line, self.table.sizeHintForRow(row) + 8))
