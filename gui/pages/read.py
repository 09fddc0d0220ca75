"""Read: a script or a book in your voices, line by line, exported with chapters.

The page shows the script's lines as the engine plans them (`engine.read.project`: each
line's voice, style and parts; torch-free), and runs `voxshard-engine --json read` as an
`EngineJob` to render and export, so the window never waits on the model. Render again
after editing the script: only the changed lines are rendered. A line is said in parts
(sentence groups, each a take of its own); a part's takes are played, picked (`choose`, a
small file in the project) or made anew (`read --regenerate N.K`); two takes of a part
are compared side by side (play A, play B, use B). How lines are cut and
checked (chunk length, frame cap, retries, the word check) is set on the page, in the
engine's own fields (`gui.settings_form`), and kept with the project.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QGridLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QSizePolicy,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QWidget,
)

from engine.audio.timebase import SAMPLE_RATE
from engine.config.read import LOUDNESS_PRESETS, ReadRequest
from engine.core.atomic import read_json
from engine.core.errors import VoxshardError
from engine.layout import reading
from engine.read.project import (
    Plan,
    PlannedLine,
    PlannedPart,
    best_take,
    choose,
    flagged_lines,
    line_flagged,
    line_takes,
    make_plan,
    part_flagged,
    reread_line,
)
from engine.read.pronounce import add_respelling
from engine.serve.voices import discover
from gui.context import AppContext
from gui.jobs import EngineJob
from gui.pages.base import Page
from gui.settings_form import SettingField
from gui.theme import icon
from gui.widgets import button, fmt_duration, hbox

COLUMNS = ["#", "Chapter", "Voice", "Style", "Line", "Takes"]
#: a project's settings the page keeps as the project saved them (the takes' keys use them)
SAVED = ("language", "seed", "line_pause_s", "paragraph_pause_s", "chapter_pause_s", "styles",
         "keep_other_models", "asr", "chapter_titles", "title_pause_s")
#: a project's settings the page sets (its fields start from what the project saved)
FIELDS = ("chunk_chars", "max_frames", "retries", "word_check", "wer_max")
#: the export's file types, in the order offered
EXPORTS = "Audiobook (*.m4b);;MP3 (*.mp3);;FLAC (*.flac);;WAV (*.wav)"


def words_score(record: dict[str, Any]) -> str:
    """A take's word check in a few words ("" when it was not checked)."""
    return f"WER {record['wer']:.2f}" if isinstance(record.get("wer"), (int, float)) else ""


def take_text(plan: Plan, number: int) -> str:
    """A line's takes in a few words: a line said in one take, how many takes, the one
    used and its word check; a line in parts, how many are rendered and the worst word
    check; a flag."""
    planned = plan.line(number)
    parts = planned.parts
    done = [p for p in parts if p.seeds]
    if not done:
        return "not rendered"
    if len(parts) == 1:
        part = parts[0]
        used = best_take(plan, part)
        text = f"{len(part.seeds)} (seed {used})" if len(part.seeds) > 1 else "1"
        score = words_score(part.record(plan.project, used)) if used is not None else ""
        if planned.whole:
            text += ", whole line"
    else:
        text = f"{len(done)} of {len(parts)} parts"
        scores = [r["wer"] for r in (p.record(plan.project, best_take(plan, p) or 0)
                                     for p in done) if isinstance(r.get("wer"), (int, float))]
        score = f"WER {max(scores):.2f} worst" if scores else ""
    return (text + (f", {score}" if score else "")
            + (" - check it" if line_flagged(plan, planned) else "")
            + (" (another model)" if planned.other_model else ""))


def part_text(part: PlannedPart, parts: int, flagged: bool) -> str:
    """A part as the part box lists it: its place, its first words, a flag."""
    words = part.text if len(part.text) <= 48 else part.text[:47] + "..."
    return (f"{part.index + 1}/{parts}: {words}" + (" - check it" if flagged else "")
            + ("" if part.seeds else " (not rendered)"))


class ReadPage(Page):
    title = "Read"
    subtitle = ("Read a script or a book in your voices: each sentence group a take you can "
                "replay and redo, exported as an audiobook with chapters.")
    icon_name = "read"

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.job: EngineJob | None = None
        self.plan: Plan | None = None

        form = self._build_form()
        row = self._build_fields()
        form.addWidget(QLabel("Takes"), 3, 0)
        form.addWidget(hbox(*row, stretch_at=len(row), spacing=6), 3, 1)
        self.outer.addLayout(form)

        self._build_buttons()
        self._build_table()
        self._build_line_rows()
        self._line_buttons(False)

    def _build_form(self) -> QGridLayout:
        """The script, its voices and its export."""
        form = QGridLayout()
        form.setHorizontalSpacing(10)
        self.script = QLineEdit()
        self.script.setPlaceholderText("A .txt, .md (headings are chapters; Name: lines are "
                                       "dialogue) or .epub")
        self.script.editingFinished.connect(self.refresh)
        form.addWidget(QLabel("Script"), 0, 0)
        form.addWidget(hbox(self.script, button("Open...", "folder", slot=self._browse)), 0, 1)
        self.narrator = QComboBox()
        self.narrator.setToolTip("The voice of lines that name no speaker. A speaker named "
                                 "like a voice speaks with it.")
        self.narrator.currentIndexChanged.connect(lambda _i: self.refresh())
        self.cast = QLineEdit()
        self.cast.setPlaceholderText("Cast: Bob=bob/instant, Eve=eve")
        self.cast.editingFinished.connect(self.refresh)
        form.addWidget(QLabel("Narrator"), 1, 0)
        form.addWidget(hbox(self.narrator, self.cast, spacing=10), 1, 1)
        self.out = QLineEdit()
        self.out.setPlaceholderText("book.m4b (chapters), .mp3, .flac or .wav")
        self.loudness = QComboBox()
        for name, lufs in LOUDNESS_PRESETS.items():
            self.loudness.addItem(f"{name.capitalize()} ({lufs:g} LUFS)", lufs)
        self.loudness.setCurrentIndex(1)
        form.addWidget(QLabel("Export"), 2, 0)
        form.addWidget(hbox(self.out, button("Save as...", "save", slot=self._save_as),
                            self.loudness), 2, 1)
        return form

    def _build_fields(self) -> list[QWidget | None]:
        """The take settings (the engine's ReadRequest fields), as one row's widgets."""
        self.fields = {name: SettingField(ReadRequest, name, decimals=2,
                                          unset="auto" if name == "max_frames" else "")
                       for name in FIELDS}
        self._fields_of: str | None = None  # the script whose project the fields show
        row: list[QWidget | None] = []
        for field in self.fields.values():
            # each as wide as its words and values: the row's room is left at its end
            field.widget.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)
            if isinstance(field.widget, QSpinBox | QDoubleSpinBox):
                spin = field.widget
                widest = max((spin.textFromValue(spin.maximum()) + spin.suffix(),
                              spin.specialValueText()), key=len)
                spin.setFixedWidth(spin.fontMetrics().horizontalAdvance(widest) + 40)
            if isinstance(field.widget, QCheckBox):
                field.widget.toggled.connect(lambda _on: self.refresh())
                row.append(field.widget)
            else:
                field.widget.editingFinished.connect(self.refresh)
                row += [QLabel(field.label), field.widget]
        for name in ("chunk_chars", "max_frames"):  # what a change of them costs
            self.fields[name].widget.setToolTip(self.fields[name].widget.toolTip() + " A "
                                                "change renders every line again.")
        return row

    def _build_buttons(self) -> None:
        """Render / Export / Stop, the progress and the state."""
        self.render_button = button("Render", "play", primary=True, slot=self.render,
                                    tip="Render the lines that have no take yet")
        self.export_button = button("Export", "save", slot=self.export,
                                    tip="Render what is missing, then write the export")
        self.stop_button = button("Stop", "stop", slot=self.stop,
                                  tip="Stop; every finished take is kept")
        self.stop_button.setEnabled(False)
        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.progress.setMaximumHeight(8)
        self.status = QLabel("")
        self.status.setObjectName("Muted")
        # its own row, wrapped: a finished export's summary (lines, what was kept, the
        # file and its measured level) is longer than the buttons leave at 1100 px
        self.status.setWordWrap(True)
        self.outer.addWidget(hbox(self.render_button, self.export_button, self.stop_button,
                                  stretch_at=3))
        self.outer.addWidget(self.progress)
        self.outer.addWidget(self.status)


    def _build_table(self) -> None:
        """The script's lines and their takes."""
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.verticalHeader().setVisible(False)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        header = self.table.horizontalHeader()
        for column in range(len(COLUMNS)):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(4, QHeaderView.ResizeMode.Stretch)
        # columns fit the rows on screen: measured over a whole book (Qt's default, its
        # first thousand rows), each finished take's row cost a third of a second
        header.setResizeContentsPrecision(0)
        self.table.itemSelectionChanged.connect(self._selected)
        self.outer.addWidget(self.table, 1)


    def _build_line_rows(self) -> None:
        """The chosen line's parts, a part's takes (A, B, a new one), and the
        pronunciations."""
        self.part = QComboBox()
        self.part.setToolTip("A part of the line (a sentence group, one take): its takes "
                             "are beside it")
        self.part.currentIndexChanged.connect(lambda _i: self._part_selected())
        # as wide as a part's first words, whatever it says (the whole is its tooltip)
        self.part.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.part.setMinimumContentsLength(40)
        self.takes = QComboBox()
        self.takes.setToolTip("The take this part's export uses")
        self.takes.activated.connect(self._pick)
        self.play_button = button("Play", "play", slot=self.play)
        self.other = QComboBox()
        self.other.setToolTip("Another take of the part, to compare with the one used")
        self.play_other_button = button("Play B", "play", slot=self.play_other,
                                        tip="Play the other take, then the first again to "
                                            "hear them one after the other")
        self.use_other_button = button("Use B", "check", slot=self.use_other,
                                       tip="The export uses this take instead")
        self.again_button = button("New take", "retake", slot=self.regenerate,
                                   tip="Render this part again with a new seed, and use it")
        self.word = QLineEdit()
        self.word.setPlaceholderText("Word")
        self.respelling = QLineEdit()
        self.respelling.setPlaceholderText("say it as")
        # A (the take used) beside B (another), each played, B made the one used: a row of
        # its own, the pronunciations below it (together they are wider than 1100 px)
        self.play_line_button = button("Play line", "play", slot=self.play_line,
                                       tip="Play the line as the export says it: its "
                                           "parts' takes in order, with their pauses")
        # the line's parts and the line whole on a row of their own: beside a part's takes
        # they are wider than the window's smallest width leaves
        self.outer.addWidget(hbox(QLabel("Part"), self.part, self.play_line_button,
                                  stretch_at=3, spacing=8))
        self.outer.addWidget(hbox(QLabel("Take A"), self.takes, self.play_button,
                                  QLabel("B"), self.other, self.play_other_button,
                                  self.use_other_button, self.again_button, stretch_at=8,
                                  spacing=8))
        self.outer.addWidget(hbox(QLabel("Pronounce"), self.word, self.respelling,
                                  button("Add", "add", slot=self.add_word), stretch_at=4,
                                  spacing=8))

    # -- what the page shows -----------------------------------------------------------------
    def _request(self) -> ReadRequest | None:
        """The page's choices over the project's saved settings (its seed, chunking and
        pauses: the takes' keys are made with them)."""
        script = self.script.text().strip()
        if not script or self.ctx.workspace is None:
            return None
        saved = read_json(reading.default_project_dir(script) / reading.PROJECT_FILE) or {}
        if self._fields_of != script:  # another project: its own settings in the fields
            self._fields_of = script
            for name, field in self.fields.items():
                field.set_value(saved.get(name, field.default))
        kept = {k: tuple(v) if isinstance(v, list) else v for k, v in saved.items()
                if k in SAVED}
        cast = tuple(c.strip() for c in self.cast.text().split(",") if c.strip())
        return ReadRequest(script=script, workspace=str(self.ctx.workspace),
                           voice=self.narrator.currentData() or None, cast=cast,
                           loudness_lufs=self.loudness.currentData(), **kept,
                           **{name: field.value() for name, field in self.fields.items()})

    def _voices(self) -> None:
        names = []
        if self.ctx.workspace is not None:
            try:
                names = sorted(discover([], self.ctx.workspace))
            except VoxshardError:
                names = []
        current = self.narrator.currentData()
        self.narrator.blockSignals(True)
        self.narrator.clear()
        for name in names:
            self.narrator.addItem(name, name)
        if current in names:
            self.narrator.setCurrentIndex(names.index(current))
        self.narrator.blockSignals(False)

    def refresh(self) -> None:
        if self.narrator.count() == 0:
            self._voices()
        self.plan = None
        try:
            request = self._request()
            self.plan = make_plan(request) if request is not None else None
        except VoxshardError as exc:
            self.status.setText(f"{exc.message} {exc.hint or ''}".strip())
        self._fill()

    def shown(self) -> None:
        self._voices()
        self.refresh()

    def _fill(self) -> None:
        selected = self._selected_number()
        plan = self.plan
        self.table.setRowCount(0 if plan is None else len(plan.lines))
        if plan is None:
            return
        # columns sized to their contents measure every row on each cell set: sized once,
        # after the rows are filled (a 1,000-line book took minutes otherwise)
        header = self.table.horizontalHeader()
        modes = [header.sectionResizeMode(c) for c in range(len(COLUMNS))]
        for column in range(len(COLUMNS)):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.Interactive)
        for row, planned in enumerate(plan.lines):
            self._fill_row(row, planned)
        for column, mode in enumerate(modes):
            header.setSectionResizeMode(column, mode)
        done = sum(1 for p in plan.lines if all(part.seeds for part in p.parts))
        flagged = flagged_lines(plan)  # the project's, until a good take is used
        if self.job is None:
            self.status.setText(f"{len(plan.lines)} lines in {len(plan.script.chapters)} "
                                f"chapters, {done} rendered"
                                + (f"; lines {', '.join(map(str, flagged))} flagged"
                                   if flagged else ""))
        if selected is not None:
            self.table.selectRow(selected - 1)
        self._selected()  # the same row kept selected signals nothing: its takes may be new

    def _fill_row(self, row: int, planned: PlannedLine) -> None:
        plan = self.plan
        assert plan is not None
        line = planned.line
        cells = [str(line.number), plan.script.chapters[line.chapter].title,
                 planned.voice.name, line.style or "", line.text,
                 take_text(plan, line.number)]
        for column, text in enumerate(cells):
            item = QTableWidgetItem(text)
            if column == 4:  # the whole line (the column may cut it), and how it is said
                item.setToolTip(line.text if planned.spoken == line.text
                                else f"Said as: {planned.spoken}")
            if column == 5 and line_flagged(plan, planned):
                item.setIcon(icon("warning"))
                item.setToolTip("Every take of a part of this line looped, stayed silent, "
                                "ran to its length cap or said other words than its part: "
                                "listen to it, or make a new take.")
            self.table.setItem(row, column, item)

    def _line_finished(self, number: int) -> None:
        """A take of line `number` is finished: its row (and its takes, if it is the one
        selected) re-read from disk, not the whole book (the script stays as planned
        until the render ends)."""
        if self.plan is None:
            return
        try:
            planned = reread_line(self.plan, number)
        except VoxshardError:  # a line the page's plan does not have: shown at the end
            return
        self._fill_row(number - 1, planned)  # rows are the lines in order
        if self._selected_number() == number:
            self._selected()

    def _selected_number(self) -> int | None:
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        return rows[0].row() + 1 if rows else None

    def _line_buttons(self, on: bool) -> None:
        line = self.plan is not None and (number := self._selected_number()) is not None \
            and all(p.seeds for p in self.plan.line(number).parts)
        self.play_line_button.setEnabled(bool(line))
        for widget in (self.takes, self.play_button, self.again_button):
            widget.setEnabled(on)
        for widget in (self.other, self.play_other_button, self.use_other_button):
            widget.setEnabled(on and self.other.count() > 0)

    def _selected(self) -> None:
        """The selected line's parts (the part shown kept while the line stays selected)."""
        number = self._selected_number()
        keep = self.part.currentIndex() if self.part.property("line") == number else 0
        self.part.blockSignals(True)
        self.part.clear()
        self.part.setProperty("line", number)
        if self.plan is not None and number is not None:
            planned = self.plan.line(number)
            for part in planned.parts:
                self.part.addItem(part_text(part, len(planned.parts),
                                            part_flagged(self.plan, part)), part.index)
                self.part.setItemData(self.part.count() - 1, part.text,
                                      Qt.ItemDataRole.ToolTipRole)
            self.part.setCurrentIndex(min(keep, self.part.count() - 1))
        self.part.setEnabled(self.part.count() > 1)
        self.part.blockSignals(False)
        self._part_selected()

    def _current_part(self) -> tuple[PlannedLine, PlannedPart] | None:
        number, index = self._selected_number(), self.part.currentData()
        if self.plan is None or number is None or index is None:
            return None
        planned = self.plan.line(number)
        return planned, planned.part(int(index))

    def _part_selected(self) -> None:
        """The takes of the part shown: A (the one used) and the others (B)."""
        self.takes.clear()
        self.other.clear()
        current = self._current_part()
        if self.plan is None or current is None:
            self._line_buttons(False)
            return
        _planned, part = current
        used = best_take(self.plan, part)
        for seed in part.seeds:
            record = part.record(self.plan.project, seed)
            notes = [*(record.get("problems") or []), *filter(None, [words_score(record)])]
            text = f"seed {seed}" + (f" ({', '.join(notes)})" if notes else "")
            heard = f"Heard: {record['heard']}" if record.get("heard") else ""
            for box in (self.takes, self.other) if seed != used else (self.takes,):
                box.addItem(text, seed)
                if heard:  # what the recogniser heard, beside the score
                    box.setItemData(box.count() - 1, heard, Qt.ItemDataRole.ToolTipRole)
            if seed == used:
                self.takes.setCurrentIndex(self.takes.count() - 1)
        self.other.setCurrentIndex(self.other.count() - 1)  # the newest of the others
        self._line_buttons(bool(part.seeds))
        self.again_button.setEnabled(self.job is None)

    # -- actions -----------------------------------------------------------------------------
    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a script", "",
                                              "Scripts (*.txt *.md *.markdown *.epub)")
        if path:
            self.script.setText(path)
            if not self.out.text():
                self.out.setText(str(Path(path).with_suffix(".m4b")))
            self.refresh()

    def _save_as(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export as", self.out.text(), EXPORTS)
        if path:
            self.out.setText(path)

    def _args(self, request: ReadRequest) -> list[str]:
        args = ["read", request.script, "--workspace", str(request.workspace)]
        if request.voice:
            args += ["--voice", request.voice]
        for item in request.cast:
            args += ["--cast", item]
        args += ["--loudness-lufs", f"{request.loudness_lufs:g}"]
        for field in self.fields.values():
            args += field.args(always=field.value() is not None)
        for name in SAVED:
            value = getattr(request, name)
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):  # a switch, said either way (the engine's default
                args += [flag if value else "--no-" + flag[2:]]  # may be the other one)
                continue
            for one in value if isinstance(value, tuple) else () if value is None else (value,):
                args += [flag, str(one)]
        return args

    def _start(self, extra: list[str], title: str) -> None:
        request = self._request()
        if request is None or self.job is not None:
            return
        job = self.start_job(self._args(request) + extra, title)
        self.job = job
        self.progress.setRange(0, 0)
        job.event.connect(self._event)
        job.finished.connect(self._done)
        job.succeeded.connect(lambda result: self.status.setText(str(result.get("summary"))))
        job.cancelled.connect(lambda: self.status.setText("Stopped; the finished takes are "
                                                          "kept."))
        self.render_button.setEnabled(False)
        self.export_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.again_button.setEnabled(False)
        self.status.setText("Loading the voices...")

    def render(self) -> None:
        self._start([], "Read")

    def export(self) -> None:
        out = self.out.text().strip()
        if not out:
            self._save_as()
            out = self.out.text().strip()
        if out:
            self._start(["-o", out], "Read and export")

    def _target(self) -> tuple[str, str] | None:
        """(`N` or `N.K`, how it is said) of the part shown: a line said in one take is
        named by its number."""
        current = self._current_part()
        if current is None:
            return None
        planned, part = current
        if len(planned.parts) == 1:
            return str(planned.number), f"line {planned.number}"
        return part.name, f"line {planned.number}, part {part.index + 1}"

    def regenerate(self) -> None:
        target = self._target()
        if target is not None:
            self._start(["--regenerate", target[0]], f"New take of {target[1]}")

    def stop(self) -> None:
        if self.job is not None:
            self.job.cancel()

    def _event(self, event: dict[str, Any]) -> None:
        """A finished line: the bar, the time left, and its take in the table at once; a
        kept take's words checked (the takes made before the check)."""
        if event.get("event") != "progress" or event.get("stage") not in ("render", "words"):
            return
        done, total = int(event.get("done") or 0), int(event.get("total") or 0)
        self.progress.setRange(0, max(1, total))
        self.progress.setValue(done)
        if event.get("stage") == "words":
            self.status.setText(f"Checking the words of the takes made before: {done} of "
                                f"{total} takes")
            return
        if isinstance(event.get("line"), int):
            self._line_finished(event["line"])
        if event.get("loading"):
            self.status.setText(f"Loading the voice's model ({done} of {total} takes done)...")
            return
        eta = event.get("eta_s")
        left = f", about {fmt_duration(float(eta))} left" if eta else ""
        self.status.setText(f"Rendering: {done} of {total} takes{left}")

    def _done(self) -> None:
        self.job = None
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.render_button.setEnabled(True)
        self.export_button.setEnabled(True)
        self.stop_button.setEnabled(False)
        status = self.status.text()
        self.refresh()
        self.status.setText(status)

    def _play(self, box: QComboBox, which: str) -> None:
        current, target, seed = self._current_part(), self._target(), box.currentData()
        if self.plan is None or current is None or target is None or seed is None:
            return
        if self.ctx.player.play_file(reading.take_audio(self.plan.project, current[1].key,
                                                        int(seed))):
            self.status.setText(f"Playing {target[1]}, take {which} (seed {seed})")

    def play(self) -> None:
        self._play(self.takes, "A")

    def play_line(self) -> None:
        """The selected line whole: its parts' takes joined as the export joins them."""
        number = self._selected_number()
        if self.plan is None or number is None:
            return
        try:
            takes = line_takes(self.plan, self.plan.line(number))
        except VoxshardError as exc:
            self.status.setText(f"{exc.message} {exc.hint or ''}".strip())
            return
        pieces, rate = [], SAMPLE_RATE
        for path, pause_s in takes:
            audio, rate = sf.read(path, dtype="float32", always_2d=True)
            pieces += [audio.mean(axis=1), np.zeros(round(pause_s * rate), np.float32)]
        if self.ctx.player.play(np.concatenate(pieces), rate):
            self.status.setText(f"Playing line {number}"
                                + (f" ({len(takes)} parts)" if len(takes) > 1 else ""))

    def play_other(self) -> None:
        self._play(self.other, "B")

    def use_other(self) -> None:
        """Take B becomes the part's take (A, in the export); the old one becomes B."""
        target, seed = self._target(), self.other.currentData()
        if self.plan is not None and target is not None and seed is not None:
            choose(self.plan, target[0], int(seed))
            self._fill()
            self.status.setText(f"{target[1].capitalize()} uses take seed {seed}")

    def _pick(self, _index: int) -> None:
        target, seed = self._target(), self.takes.currentData()
        if self.plan is not None and target is not None and seed is not None:
            choose(self.plan, target[0], int(seed))
            self._fill()

    def add_word(self) -> None:
        word, say = self.word.text().strip(), self.respelling.text().strip()
        if not word or not say or self.ctx.workspace is None:
            return
        try:
            add_respelling(self.ctx.workspace / reading.PRONUNCIATIONS_FILE, word, say)
        except VoxshardError as exc:
            self.status.setText(f"{exc.message} {exc.hint or ''}".strip())
            return
        self.word.clear()
        self.respelling.clear()
        self.refresh()
        self.status.setText(f"{word} is said as {say} in every project of this workspace; "
                            "Render renders again the lines it changes.")
