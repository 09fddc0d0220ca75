"""Import: bring existing recordings in, then review every clip.

Files and folders come by dialog or drag and drop and are handed to the
engine's `import` command (a background job). The table lists every take of
the voice with the prepare step's quality flags; transcripts are edited in
place and saved through the workspace API; a take can be excluded from
training without deleting it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import (
    QAbstractTableModel,
    QModelIndex,
    QPersistentModelIndex,
    QSortFilterProxyModel,
    Qt,
    Signal,
)
from PySide6.QtGui import (
    QColor,
    QDragEnterEvent,
    QDropEvent,
    QFont,
    QKeySequence,
    QShortcut,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QFileDialog,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTableView,
    QWidget,
)

from engine.catalog import TakeInfo, VoiceSnapshot, minutes_in_use
from engine.core.errors import VoxshardError
from engine.layout.voice import VERDICT_GOOD, open_voice, take_verdict
from engine.prepare.styles import BY_YOU as STYLE_BY_YOU
from engine.prepare.styles import MEASURED as STYLE_MEASURED
from engine.prepare.styles import RECORDED as STYLE_RECORDED
from engine.prepare.styles import set_clip_style
from engine.prepare.transcribe import asr_info, is_machine_made
from gui.context import AppContext
from gui.jobs import EngineJob
from gui.pages.base import SnapshotPage
from gui.widgets import button, fmt_duration, hbox, show_error
from gui.words import count

AUDIO_SUFFIXES = {".wav", ".wave", ".flac", ".ogg", ".oga", ".opus", ".mp3"}
FILTERS = ["All clips", "Flagged", "Needs a look", "Usable", "Excluded", "Without transcript"]


def transcript_review(t: TakeInfo) -> tuple[bool, str | None]:
    """(the text is the recogniser's, why it needs a look) for a take.

    Only doubtful clips need a look: a machine transcript the recogniser was
    unsure of, or a person's transcript that does not match what was heard
    (a likely mislabelled clip)."""
    asr = asr_info(t)  # type: ignore[arg-type]  # TakeInfo has the fields it reads
    machine = is_machine_made(t)  # type: ignore[arg-type]
    if asr and asr.get("doubtful"):
        return machine, str(asr.get("reason") or "the recognised words differ a lot")
    return machine, None

_Index = QModelIndex | QPersistentModelIndex


def set_take_excluded(voice: Path, take_id: str, excluded: bool) -> None:
    """Mark a take as left out of (or back into) training; its audio is untouched."""
    open_voice(voice).set_take_excluded(take_id, excluded)


class TakesModel(QAbstractTableModel):
    """The takes of a voice; an edit is kept only when `save_text`/`save_use` saved it."""

    COLUMNS = ("Use", "Take", "Source", "Length", "Transcript", "Quality", "Style")

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.takes: list[TakeInfo] = []
        # (take id, value) -> saved?  A refused save leaves the cell as it was.
        self.save_text: Callable[[str, str], bool] = lambda _id, _text: True
        self.save_use: Callable[[str, bool], bool] = lambda _id, _used: True
        # (take id, description; None: the measured one) -> saved?
        self.save_style: Callable[[str, str | None], bool] = lambda _id, _style: True
        #: each take's prepared clips (manifest rows), which carry the style descriptions
        self.clips: dict[str, list[dict[str, Any]]] = {}
        self.sort_by: tuple[int, Qt.SortOrder] = (-1, Qt.SortOrder.AscendingOrder)

    def set_takes(self, takes: list[TakeInfo]) -> None:
        by_id = {t.id: t for t in takes}
        if takes and len(by_id) == len(self.takes) and all(t.id in by_id for t in self.takes):
            # the same takes re-read (a tick or an edit saved, a prepare verdict): each
            # row stays where it is, even when the sorted column changed (a tick under a
            # sort by Use moved the rows, and the next click hit another take), and the
            # selection, the scroll position and an open editor survive
            self.takes = [by_id[t.id] for t in self.takes]
            self.dataChanged.emit(self.index(0, 0),
                                  self.index(len(takes) - 1, len(self.COLUMNS) - 1))
            return
        takes = self._sorted(takes)
        self.beginResetModel()
        self.takes = takes
        self.endResetModel()

    # -- sorting: here, one key per row; the proxy's own sort called data() about 15
    # times per row (2 s on the GUI thread for 13,000 takes)
    def _key(self, column: int) -> Callable[[TakeInfo], Any]:
        keys: dict[int, Callable[[TakeInfo], Any]] = {
            0: lambda t: t.excluded, 1: lambda t: t.id,
            2: lambda t: str(self.data_of(t, 2)).lower(), 3: lambda t: t.duration_s,
            4: lambda t: t.text.lower(), 5: self.quality_text,
            6: lambda t: self.style_text(t).lower(),
        }
        return keys.get(column, keys[1])

    def _sorted(self, takes: list[TakeInfo]) -> list[TakeInfo]:
        column, order = self.sort_by
        if column < 0:
            return list(takes)
        return sorted(takes, key=self._key(column),
                      reverse=order == Qt.SortOrder.DescendingOrder)

    def sort(self, column: int, order: Qt.SortOrder = Qt.SortOrder.AscendingOrder) -> None:
        self.sort_by = (column, order)
        self.layoutAboutToBeChanged.emit()  # first: the proxy keeps its indexes here now
        old = self.persistentIndexList()
        ids = [self.takes[i.row()].id if i.row() < len(self.takes) else "" for i in old]
        self.takes = self._sorted(self.takes)
        rows = {t.id: r for r, t in enumerate(self.takes)}
        # the selection follows its takes to their new rows
        self.changePersistentIndexList(old, [self.index(rows[i], o.column()) if i in rows
                                             else QModelIndex() for i, o in zip(ids, old,
                                                                                strict=True)])
        self.layoutChanged.emit()

    def rowCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.takes)

    def columnCount(self, parent: _Index = QModelIndex()) -> int:  # noqa: B008
        return len(self.COLUMNS)

    def headerData(self, section: int, orientation: Qt.Orientation,
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return self.COLUMNS[section]
        return None

    @staticmethod
    def excluded(t: TakeInfo) -> bool:
        return t.excluded

    @staticmethod
    def quality_text(t: TakeInfo) -> str:
        _machine, doubt = transcript_review(t)
        if doubt:
            return f"transcript doubtful: {doubt}"
        if t.issues:
            return "; ".join(str(i.get("message") or i.get("code")) for i in t.issues)
        if t.usable is None:
            return "not prepared"
        return "ok" if t.usable else "rejected"

    def set_clips(self, clips: list[dict[str, Any]]) -> None:
        """The prepared clips (a snapshot's manifest rows), by the take they came from."""
        self.clips = {}
        for c in clips:
            self.clips.setdefault(str(c.get("source_take") or ""), []).append(c)

    def style_text(self, t: TakeInfo) -> str:
        """What the take's clips are told to sound like in training: the user's own
        description, else the take's recorded style, else the measured words."""
        said = dict.fromkeys(str(c.get("style") or "") for c in self.clips.get(t.id, []))
        return " / ".join(s for s in said if s)

    def style_measured_only(self, t: TakeInfo) -> bool:
        """Every clip of the take has the description measured by prepare (none is yours)."""
        mine = self.clips.get(t.id, [])
        return bool(mine) and all(c.get("style_source") == STYLE_MEASURED for c in mine)

    def style_tip(self, t: TakeInfo) -> str:
        mine = self.clips.get(t.id, [])
        if not mine:
            return "Prepare the voice: its clips are then described, and can be described here."
        where = {STYLE_BY_YOU: "yours", STYLE_RECORDED: "recorded with the take",
                 STYLE_MEASURED: "measured"}
        lines = [f"{c.get('id')}: {c.get('style') or '(plain)'} "
                 f"({where.get(str(c.get('style_source')), '?')}; measured: "
                 f"{c.get('style_measured') or '(plain)'})" for c in mine]
        return "\n".join([*lines, "Edit to describe how it is spoken (empty: plain); "
                                  "'Measured style' gives back the measured words."])

    @staticmethod
    def data_of(t: TakeInfo, column: int) -> str:
        src = t.source or ""
        return Path(src).name if src and t.origin == "imported" else t.origin

    def data(self, index: _Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:  # noqa: C901
        if not index.isValid():
            return None
        t = self.takes[index.row()]
        col = index.column()
        if role == Qt.ItemDataRole.CheckStateRole and col == 0:
            return Qt.CheckState.Unchecked if self.excluded(t) else Qt.CheckState.Checked
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole):
            if col == 1:
                return t.id
            if col == 2:
                return self.data_of(t, 2)
            if col == 3:
                return fmt_duration(t.duration_s) if role == Qt.ItemDataRole.DisplayRole \
                    else t.duration_s
            if col == 4:
                return t.text
            if col == 5:
                return self.quality_text(t)
            if col == 6:
                # a prepared clip without a description trains plain: said, not left blank
                plain = role == Qt.ItemDataRole.DisplayRole and t.id in self.clips
                return self.style_text(t) or ("(plain)" if plain else "")
        if role == Qt.ItemDataRole.ToolTipRole and col == 6:
            return self.style_tip(t)
        if role == Qt.ItemDataRole.FontRole and col == 6 and self.style_measured_only(t):
            font = QFont()
            font.setItalic(True)  # measured by prepare, not said by a person
            return font
        if role == Qt.ItemDataRole.ToolTipRole and col == 5 and t.issues:
            return "\n".join(f"{i.get('code')}: {i.get('message')}" for i in t.issues)
        if role == Qt.ItemDataRole.ToolTipRole and col == 4:
            machine, doubt = transcript_review(t)
            asr = asr_info(t) or {}  # type: ignore[arg-type]
            lines = []
            if machine:
                lines.append(f"Machine-made by {asr.get('backend') or 'speech recognition'}: "
                             "check it, or edit it to make it yours.")
            if doubt:
                lines.append(f"Needs a look: {doubt}.")
            if asr.get("text") and not machine:
                lines.append(f"Heard: {asr['text']}")
            return "\n".join(lines) or None
        if role == Qt.ItemDataRole.FontRole and col == 4 and transcript_review(t)[0]:
            font = QFont()
            font.setItalic(True)  # the recogniser's words, not a person's
            return font
        if role == Qt.ItemDataRole.ForegroundRole:
            if col in (4, 5) and transcript_review(t)[1]:
                return QColor("#f5a524")
            if col == 5 and (t.issues or t.usable is False):
                return QColor("#e5484d") if t.usable is False else QColor("#f5a524")
            if self.excluded(t):
                return QColor("#8e9aaf")
        if role == Qt.ItemDataRole.UserRole:
            return t
        return None

    def flags(self, index: _Index) -> Qt.ItemFlag:
        base = super().flags(index)
        if index.column() == 0:
            return base | Qt.ItemFlag.ItemIsUserCheckable
        if index.column() == 4 or (index.column() == 6 and index.row() < len(self.takes)
                                   and self.takes[index.row()].id in self.clips):
            return base | Qt.ItemFlag.ItemIsEditable
        return base

    def setData(self, index: _Index, value: Any, role: int = Qt.ItemDataRole.EditRole) -> bool:
        if not index.isValid():
            return False
        t = self.takes[index.row()]
        if index.column() == 0 and role == Qt.ItemDataRole.CheckStateRole:
            used = Qt.CheckState(value) == Qt.CheckState.Checked
            if not self.save_use(t.id, used):
                return False
            t.excluded = not used
            t.extra["excluded"] = not used
            if used and any(i.get("code") == "excluded" for i in t.issues):
                # the last prepare's "is excluded" is no longer true; the next one judges it
                t.issues = [i for i in t.issues if i.get("code") != "excluded"]
                t.usable = None
            self.dataChanged.emit(index.siblingAtColumn(0), index.siblingAtColumn(5))
            return True
        if index.column() == 4 and role == Qt.ItemDataRole.EditRole:
            text = str(value).strip()
            if text == t.text:
                return False
            if not self.save_text(t.id, text):
                return False  # the cell shows the saved text again; the page said why
            t.text = text
            self.dataChanged.emit(index, index)
            return True
        if index.column() == 6 and role == Qt.ItemDataRole.EditRole:
            return self.set_style(t, str(value).strip())
        return False

    def set_style(self, t: TakeInfo, style: str | None) -> bool:
        """Describe every clip of a take (None: give each its measured words back)."""
        mine = self.clips.get(t.id, [])
        if not mine or (style is not None and all(c.get("style") == style for c in mine)) \
                or (style is None and self.style_measured_only(t)):
            return False  # unchanged (an editor closed as it opened)
        if not self.save_style(t.id, style):
            return False
        for c in mine:  # what the engine wrote (engine.prepare.styles.set_clip_style)
            if style is None:
                c["style"], c["style_source"] = c.get("style_measured") or "", STYLE_MEASURED
            else:
                c["style"], c["style_source"] = style, STYLE_BY_YOU
        row = self.takes.index(t)
        self.dataChanged.emit(self.index(row, 6), self.index(row, 6))
        return True


class TakesFilter(QSortFilterProxyModel):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.mode = FILTERS[0]
        self.needle = ""

    def set_mode(self, mode: str) -> None:
        self.mode = mode
        self.invalidateFilter()

    def set_needle(self, text: str) -> None:
        self.needle = text.lower().strip()
        self.invalidateFilter()

    def sort(self, column: int, order: Qt.SortOrder = Qt.SortOrder.AscendingOrder) -> None:
        """The source model sorts (fast); this proxy only filters, in the source's order."""
        model = self.sourceModel()
        assert isinstance(model, TakesModel)
        model.sort(column, order)

    def filterAcceptsRow(self, row: int, parent: _Index) -> bool:
        model = self.sourceModel()
        assert isinstance(model, TakesModel)
        t = model.takes[row]
        excluded = TakesModel.excluded(t)
        if self.mode == "Flagged" and not (t.issues or t.usable is False):
            return False
        if self.mode == "Needs a look" and not transcript_review(t)[1]:
            return False
        if self.mode == "Usable" and not (t.usable and not excluded):
            return False
        if self.mode == "Excluded" and not excluded:
            return False
        if self.mode == "Without transcript" and t.text.strip():
            return False
        if self.needle and self.needle not in \
                f"{t.id} {t.text} {t.source} {model.style_text(t)}".lower():
            return False
        return True


class RowsDelegate(QStyledItemDelegate):
    """Cells of a table whose rows are selected whole: no focus frame around one cell
    (beside the first row's tick it read as an empty box to tick)."""

    def initStyleOption(self, option: QStyleOptionViewItem, index: _Index) -> None:
        super().initStyleOption(option, index)
        option.state &= ~QStyle.StateFlag.State_HasFocus


class DropZone(QLabel):
    dropped = Signal(object)  # list[Path]

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("DropZone")
        self.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.setWordWrap(True)  # the formats line is wider than the window's minimum width
        self.setText("Drop audio files or folders here\n"
                     "WAV · FLAC · OGG · MP3, with transcripts in same-named .txt files, "
                     "an LJSpeech metadata.csv, or a CSV/JSONL list")
        self.setAcceptDrops(True)
        self.setMinimumHeight(84)

    def _set_active(self, on: bool) -> None:
        self.setProperty("active", on)
        self.style().unpolish(self)
        self.style().polish(self)

    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        if event.mimeData().hasUrls():
            self._set_active(True)
            event.acceptProposedAction()

    def dragLeaveEvent(self, event: Any) -> None:
        self._set_active(False)

    def dropEvent(self, event: QDropEvent) -> None:
        self._set_active(False)
        paths = [Path(u.toLocalFile()) for u in event.mimeData().urls() if u.isLocalFile()]
        if paths:
            self.dropped.emit(paths)
            event.acceptProposedAction()


class ImportPage(SnapshotPage):
    title = "Import"
    subtitle = ("Add recordings you already have, then check every clip: "
                "fix transcripts, leave out what should not be learned.")
    icon_name = "import"

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.job: EngineJob | None = None
        self.transcripts: Path | None = None
        #: a clip of the voice's speaker alone: prepare keeps only that speaker
        self.speaker_reference: Path | None = None
        self.drop = DropZone()
        self.drop.dropped.connect(self.import_paths)
        self.outer.addWidget(self.drop)

        self._build_adding()
        self._build_table()
        ctx.player.finished.connect(self._played)
        self.outer.addWidget(self.table, 1)

    def _build_adding(self) -> None:
        """What to add (files, a folder), where its text comes from, and whose speech to keep."""
        self.transcripts_label = QLabel("Transcripts: found automatically")
        self.transcripts_label.setObjectName("Muted")
        self.files_btn = button("Add files…", "add", primary=True, slot=self.pick_files)
        self.folder_btn = button("Add folder…", "folder", slot=self.pick_folder)
        self.tr_btn = button("Transcript list…", "rename", slot=self.pick_transcripts,
                             tip="A CSV, JSONL or LJSpeech metadata.csv naming each file's text")
        self.ref_btn = button("Speaker reference…", "listen", slot=self.pick_speaker_reference,
                              tip="A clip of this voice's speaker alone: in interviews, "
                                  "podcasts and videos only that speaker is kept")
        self.ref_label = QLabel("")
        self.ref_label.setObjectName("Muted")
        self.ref_clear = button("Clear", None, slot=lambda: self.set_speaker_reference(None),
                                tip="Import without a speaker reference")
        self.set_speaker_reference(None)
        self.transcribe_box = QCheckBox("Transcribe with speech recognition")
        self.transcribe_box.setToolTip(
            "Takes without a transcript get the recogniser's text (marked as machine-made, "
            "in italics); takes with one are checked against what is heard")
        self.transcribe_btn = button("Transcribe missing", "rename",
                                     slot=lambda: self.transcribe(),
                                     tip="Run speech recognition on the takes without text")
        # two rows: what to add, then where the text comes from (one row was clipped
        # even at 1320 px wide)
        self.outer.addWidget(hbox(self.files_btn, self.folder_btn, self.tr_btn,
                                  self.transcripts_label, stretch_at=4))
        self.measured_btn = button("Measured style", "retake", slot=self.use_measured_style,
                                   tip="The selected takes' clips get back the style that "
                                       "prepare measured (your own description is dropped)")
        self.outer.addWidget(hbox(self.transcribe_box, self.transcribe_btn, self.measured_btn,
                                  stretch_at=2))
        self.outer.addWidget(hbox(self.ref_btn, self.ref_label, self.ref_clear, stretch_at=3))
        self.progress = QProgressBar()
        self.progress.hide()
        self.outer.addWidget(self.progress)


    def _build_table(self) -> None:
        """The takes: a filter and search above, the table with its keys."""
        self.filter_combo = QComboBox()
        self.filter_combo.addItems(FILTERS)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search transcripts…")
        self.search.setClearButtonEnabled(True)
        self.count_label = QLabel("")
        self.count_label.setObjectName("Muted")
        self.play_btn = button("Play", "play", slot=self.play_selected, tip="Space in the table")
        self.outer.addWidget(hbox(QLabel("Show"), self.filter_combo, self.search,
                                  self.play_btn, self.count_label, stretch_at=5))

        self.model = TakesModel(self)
        self.model.save_text = self.save_text
        self.model.save_use = self.save_use
        self.model.save_style = self.save_style
        self.model.dataChanged.connect(lambda *_: self._update_count())
        self.proxy = TakesFilter(self)
        self.proxy.setSourceModel(self.model)
        self.filter_combo.currentTextChanged.connect(self._filter_changed)
        self.search.textChanged.connect(self._search_changed)
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.setSortingEnabled(True)
        # by take, oldest first (Qt's default is the first column, Use, so each tick
        # would have sorted the row away)
        self.table.sortByColumn(1, Qt.SortOrder.AscendingOrder)
        self.table.setAlternatingRowColors(True)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.DoubleClicked
                                   | QAbstractItemView.EditTrigger.EditKeyPressed)
        self.table.verticalHeader().hide()
        self.table.setItemDelegate(RowsDelegate(self.table))
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(4, QHeaderView.ResizeMode.Stretch)
        # the transcript is what the user reads and fixes: it gets what is left, and the
        # others stay narrow enough that it is the widest column on a laptop (1100 px);
        # a long verdict or style is elided, its tooltip has it whole
        for col, width in ((0, 48), (1, 130), (2, 125), (3, 60), (5, 95), (6, 100)):
            self.table.setColumnWidth(col, width)
        self.table.doubleClicked.connect(self._double_clicked)
        play_key = QShortcut(QKeySequence(Qt.Key.Key_Space), self.table)
        play_key.setContext(Qt.ShortcutContext.WidgetShortcut)  # the table's own Space
        play_key.activated.connect(self.play_selected)
        # F2 edits the transcript from any cell of the row (Qt's F2 edits only the cell)
        edit_key = QShortcut(QKeySequence(Qt.Key.Key_F2), self.table)
        edit_key.setContext(Qt.ShortcutContext.WidgetShortcut)
        edit_key.activated.connect(self.edit_transcript)

    # -- adding files --------------------------------------------------------------
    def pick_files(self) -> None:
        dlg = QFileDialog(self, "Import audio files")
        dlg.setFileMode(QFileDialog.FileMode.ExistingFiles)
        dlg.setNameFilter("Audio (*.wav *.flac *.ogg *.opus *.mp3);;All files (*)")
        dlg.filesSelected.connect(lambda files: self.import_paths([Path(f) for f in files]))
        dlg.open()

    def pick_folder(self) -> None:
        dlg = QFileDialog(self, "Import a folder of recordings")
        dlg.setFileMode(QFileDialog.FileMode.Directory)
        dlg.fileSelected.connect(lambda d: self.import_paths([Path(d)]))
        dlg.open()

    def _pick_one(self, title: str, name_filter: str, slot: Callable[[Path], None]) -> None:
        dlg = QFileDialog(self, title)
        dlg.setFileMode(QFileDialog.FileMode.ExistingFile)
        dlg.setNameFilter(name_filter)
        dlg.fileSelected.connect(lambda f: slot(Path(f)))
        dlg.open()

    def pick_transcripts(self) -> None:
        self._pick_one("Transcript list",
                       "Transcripts (*.csv *.jsonl *.txt *.tsv);;All files (*)",
                       self.set_transcripts)

    def set_transcripts(self, path: Path | None) -> None:
        self.transcripts = path
        self.transcripts_label.setText(f"Transcripts: {path.name}" if path
                                       else "Transcripts: found automatically")

    def pick_speaker_reference(self) -> None:
        self._pick_one("Speaker reference: a clip of this voice alone",
                       "Audio (*.wav *.flac *.ogg *.opus *.mp3);;All files (*)",
                       self.set_speaker_reference)

    def set_speaker_reference(self, path: Path | None) -> None:
        """The clip handed to `import --speaker-reference` (kept in the voice by the engine)."""
        self.speaker_reference = path
        self.ref_label.setText(
            f"Speaker reference: {path.name} (only this speaker is kept)" if path
            else "Speaker reference: none (your recorded takes, else the main speaker)")
        self.ref_clear.setEnabled(path is not None)

    def import_paths(self, paths: list[Path]) -> EngineJob | None:
        if self.voice is None:
            show_error(self, "No voice", "Open or create a voice before importing.")
            return None
        if self.job is not None:
            show_error(self, "Busy", "An import is already running.")
            return None
        args = ["import", str(self.voice), *[str(p) for p in paths]]
        if self.transcripts is not None:
            args += ["--transcripts", str(self.transcripts)]
        if self.transcribe_box.isChecked():
            args.append("--transcribe")
        if self.speaker_reference is not None:
            args += ["--speaker-reference", str(self.speaker_reference)]
        return self._run(args, "Import")

    def _run(self, args: list[str], title: str) -> EngineJob:
        """An engine job writing into this voice, with the page's progress bar."""
        job = self.start_job(args, title, voice=self.voice)
        self.job = job
        self.progress.setRange(0, 0)
        self.progress.show()
        job.progress.connect(self._on_progress)
        job.succeeded.connect(self._imported)
        job.finished.connect(self._job_done)
        return job

    def transcribe(self, extra_args: list[str] | None = None) -> EngineJob | None:
        """`transcribe VOICE`: fill the missing transcripts with the recogniser's text."""
        if self.voice is None or self.job is not None:
            return None
        job = self._run(["transcribe", str(self.voice), *(extra_args or [])], "Transcribe")
        self.transcribe_btn.setEnabled(False)
        return job

    def _on_progress(self, stage: str, done: float, total: object) -> None:
        if isinstance(total, float) and total > 0:
            self.progress.setRange(0, int(total))
            self.progress.setValue(int(done))
            self.progress.setFormat(f"{stage} %v / %m")

    def _imported(self, result: dict) -> None:
        self.ctx.status.emit(str(result.get("summary") or "Import finished"))
        self.set_transcripts(None)
        # the status bar shows one line: each file left out, with its own reason, in a box
        skipped = [s for s in result.get("skipped") or []
                   if isinstance(s, dict) and s.get("code") != "already_imported"]
        if skipped:
            done = len(result.get("imported") or [])
            show_error(self, "Some files were not imported",
                       f"Imported {count(done, 'file')}; {count(len(skipped), 'file')} "
                       "could not be used:",
                       "\n".join(f"{s.get('path')} {s.get('reason')}." for s in skipped))

    def _job_done(self) -> None:
        self.job = None
        self.transcribe_btn.setEnabled(True)
        self.progress.hide()
        self.ctx.notify_changed()

    # -- table -------------------------------------------------------------------------
    def _show_snapshot(self, snap: VoiceSnapshot | None) -> None:
        self.model.set_clips(list(snap.clips) if snap is not None else [])
        self.model.set_takes(list(snap.takes) if snap is not None else [])
        self._update_count()
        busy = self.job is not None
        for b in (self.files_btn, self.folder_btn, self.tr_btn):
            b.setEnabled(self.voice is not None and not busy)

    def _filter_changed(self, mode: str) -> None:
        self.proxy.set_mode(mode)
        self._update_count()

    def _search_changed(self, text: str) -> None:
        self.proxy.set_needle(text)
        self._update_count()

    def _update_count(self) -> None:
        takes = self.model.takes
        flagged = sum(1 for t in takes if t.issues or t.usable is False
                      or take_verdict(t.extra) != VERDICT_GOOD)  # as recorded
        # speech by the engine's one rule (what prepare keeps of the takes it has judged),
        # in m:ss: "0.0 min" hid a ticked 2 s clip
        in_use = fmt_duration(minutes_in_use(takes) * 60.0)
        self.count_label.setText(f"{self.proxy.rowCount()} shown · {len(takes)} takes · "
                                 f"{flagged} flagged · {in_use} of speech in use")

    def save_text(self, take_id: str, text: str) -> bool:
        """Save a corrected transcript; on failure the cell keeps the saved text and says why."""
        if self.voice is None:
            return False
        try:
            open_voice(self.voice).set_take_text(take_id, text)
        except VoxshardError as exc:
            show_error(self, "Transcript not saved",
                       f"{exc.message} The table shows the saved transcript again.",
                       exc.hint or "")
            return False
        self.ctx.status.emit(f"Transcript of {take_id} saved")
        return True

    def save_use(self, take_id: str, used: bool) -> bool:
        if self.voice is None:
            return False
        try:
            set_take_excluded(self.voice, take_id, not used)
        except VoxshardError as exc:
            show_error(self, "Not saved", f"{exc.message} The take keeps its previous setting.",
                       exc.hint or "")
            return False
        self.ctx.status.emit(f"{take_id} {'included in' if used else 'left out of'} training")
        return True

    def save_style(self, take_id: str, style: str | None) -> bool:
        """Describe the take's prepared clips (None: their measured words) through the
        engine (`voice style`'s own function): the prepared set, what training reads."""
        if self.voice is None:
            return False
        try:
            for clip in self.model.clips.get(take_id, []):
                set_clip_style(self.voice, str(clip["id"]), style)
        except VoxshardError as exc:
            show_error(self, "Style not saved", f"{exc.message} The table shows the saved "
                       "style again.", exc.hint or "")
            self.ctx.notify_changed()  # a clip may have been saved before the failure
            return False
        self.ctx.status.emit(f"Style of {take_id}: " + ("measured" if style is None
                                                         else style or "plain"))
        self.ctx.notify_changed()  # the voice's styles (voice.toml) changed with it
        return True

    def use_measured_style(self) -> None:
        """The selected takes' clips: back to the measured description."""
        for row in self.table.selectionModel().selectedRows():
            t = self.proxy.data(row, Qt.ItemDataRole.UserRole)
            if t is not None:
                self.model.set_style(t, None)

    def selected_take(self) -> TakeInfo | None:
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return None
        return self.proxy.data(rows[0], Qt.ItemDataRole.UserRole)

    def play_selected(self) -> None:
        """Space: play the selected take, or stop it; the count line says which plays."""
        t = self.selected_take()
        if t is None:
            return
        if self.ctx.player.playing and self.ctx.player.current == t.path:
            self.ctx.player.stop()
            self.play_btn.setText("Play")
            self._update_count()
        else:
            self.ctx.player.play_file(t.path)
            self.play_btn.setText("Stop")
            self.count_label.setText(f"▶ Playing {t.id} (Space stops it)")

    def _played(self) -> None:
        if self.play_btn.text() == "Stop":
            self.play_btn.setText("Play")
            self._update_count()

    def edit_transcript(self) -> None:
        """Open the transcript cell of the current row for editing."""
        current = self.table.currentIndex()
        if not current.isValid():
            return
        cell = current.siblingAtColumn(4)
        self.table.setCurrentIndex(cell)
        self.table.edit(cell)

    def _double_clicked(self, index: QModelIndex) -> None:
        if index.column() not in (4, 6):  # the editable cells open their editor instead
            self.play_selected()
