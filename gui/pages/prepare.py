"""Prepare: the engine's prepare step as a background job, and its quality report.

The report says what is wrong, with which clip, and what to do about it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import QModelIndex, QRect, QSize, Qt
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QCheckBox,
    QGridLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QSizePolicy,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QTreeWidget,
    QTreeWidgetItem,
    QWidget,
)

from engine.catalog import VoiceSnapshot
from engine.config import PrepareConfig
from engine.layout.manifest import prepared_folder
from engine.layout.voice import open_voice
from engine.prepare.target import write_decision
from gui.context import AppContext
from gui.jobs import EngineJob
from gui.pages.base import SnapshotPage
from gui.settings_form import SettingField
from gui.widgets import Card, StatCard, button, hbox

# What a person can do about each issue code (engine/audio/checks.py codes).
WHAT_TO_DO = {
    "too_short": "Record a longer sentence; clips under a second teach little.",
    "too_long": "Pause between sentences so the clip can be split, or import shorter files.",
    "empty_text": "Type the transcript on the Import page.",
    "needs_transcript": "Add a transcript (.txt beside the file, a transcript list, or type it).",
    "clipping": "Lower the input gain or move back from the microphone, then re-take.",
    "minor_clipping": "A few samples hit full scale; fine, but watch the input level.",
    "low_snr": "Record in a quieter room, closer to the microphone.",
    "noisy": "Some background noise: usable, a quieter room would be better.",
    "dc_offset": "The microphone adds a DC offset; usable, but check the audio interface.",
    "text_estimated": "The transcript of this slice was estimated; check it on the Import page.",
    "duplicate_text": "The same sentence appears twice; keep the better take.",
    "peak_limited": "Peaks were limited during normalising; usable.",
    "unreadable": "The file cannot be decoded: convert it to WAV or FLAC.",
    "silent": "The file is silent: check the recording.",
    "non_finite": "The file holds invalid samples: export it again from the source.",
    "excluded": "You left this take out: tick it in the Use column of the Import page.",
    "damaged_metadata": "The take's JSON file is damaged: delete the take and record it again.",
    "missing_audio": "The take's audio file is missing: delete the take.",
    "another_speaker": "Another voice than this one: play it; keep it if it is the voice.",
    "overlap": "Two voices at once: play it; keep it only if the other voice is faint.",
    "excluded_by_you": "You left this clip out; keep it again below if you change your mind.",
    "speaker_kept": "You kept this clip although another voice was heard in it.",
    "reverberant": "Room echo: record closer to the microphone, in a furnished room.",
    "too_reverberant": "Strong echo: use another recording, or record in a smaller room.",
    "music_bed": "Music under the speech: use parts without music, or another recording.",
    "denoised": "Background noise was reduced where it helped (see the numbers).",
}

#: the prepare settings the page offers (the others stay the voice's: `prepare --set`)
PREPARE_FIELDS = ("target_lufs", "peak_dbfs", "vad", "denoise", "min_clip_s", "max_clip_s",
                  "min_snr_db")

#: who was heard, in the report's words (engine/prepare/speakers.py)
HEARD = {"target": "this voice", "another speaker": "another speaker",
         "overlap": "two voices at once"}


def advice_for(code: str) -> str:
    return WHAT_TO_DO.get(code, "See the message.")


class _WrappingDelegate(QStyledItemDelegate):
    """Row heights for wrapped text: a tree asks its delegate for a cell's size without
    the column's width, so Qt measured every message as one line and elided it."""

    def __init__(self, tree: QTreeWidget) -> None:
        super().__init__(tree)
        self.tree = tree

    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex) -> QSize:
        if index.column() == 0:  # the clip's name: sized to its content, never wrapped
            return super().sizeHint(option, index)
        sized = QStyleOptionViewItem(option)
        # a valid rect (a height too): Qt's style wraps only inside one
        sized.rect = QRect(0, 0, max(self.tree.columnWidth(index.column()), 1),
                           max(option.rect.height(), 1))
        return super().sizeHint(sized, index)


def _row(parent: QTreeWidgetItem, texts: list[str]) -> QTreeWidgetItem:
    """A report row whose every cell reads in full: wrapped in the row, and as a tooltip."""
    item = QTreeWidgetItem(parent, texts)
    for col, text in enumerate(texts):
        item.setToolTip(col, text)
    return item


class PreparePage(SnapshotPage):
    title = "Prepare"
    subtitle = ("Turn the takes into clean 24 kHz clips: loudness, silence trimming, "
                "slicing at pauses, and a quality check of every clip.")
    icon_name = "prepare"

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.job: EngineJob | None = None
        self._snapshot: VoiceSnapshot | None = None
        self._shown: tuple[Path | None, dict[str, Any] | None] = (None, None)
        self.run_btn = button("Prepare now", "prepare", primary=True, slot=self.run)
        self.cancel_btn = button("Cancel", "stop", slot=self.cancel)
        self.cancel_btn.setEnabled(False)
        self.state = QLabel("")
        self.state.setObjectName("Muted")
        # a refusal or a warning is a long sentence: it wraps beside the buttons instead of
        # widening the page past a laptop's screen
        self.state.setWordWrap(True)
        self.state.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
        self.outer.addWidget(hbox(self.run_btn, self.cancel_btn, self.state))
        self._build_settings()
        self.progress = QProgressBar()
        self.progress.setValue(0)
        self.progress.hide()  # only while preparing: never "0%" above a finished report
        self.outer.addWidget(self.progress)

        self._build_report()
        self._build_lists()
        self._slice_buttons()

    def _build_settings(self) -> None:
        """The voice's prepare settings a person changes, as the schema's fields (range,
        unit, help): shown as the voice keeps them; a change is sent with the next
        prepare and kept as the voice's (`prepare --save-settings`)."""
        grid = QGridLayout()
        grid.setHorizontalSpacing(8)
        self.settings = {name: SettingField(PrepareConfig, name, decimals=1)
                         for name in PREPARE_FIELDS}
        for i, field in enumerate(self.settings.values()):
            row, column = divmod(i, 4)
            if isinstance(field.widget, QCheckBox):  # a switch carries its own label
                grid.addWidget(field.widget, row, 2 * column, 1, 2)
            else:
                grid.addWidget(QLabel(field.label), row, 2 * column)
                grid.addWidget(field.widget, row, 2 * column + 1)
        for column in range(1, 8, 2):  # the fields share the width, the labels fit theirs
            grid.setColumnStretch(column, 1)
        box = QWidget()
        box.setLayout(grid)
        grid.setContentsMargins(0, 0, 0, 0)
        self.outer.addWidget(box)

    def settings_args(self) -> list[str]:
        """The flags of the fields that differ from the voice's settings, then
        `--save-settings` (none: the voice's own settings are used as they are)."""
        kept = self._snapshot.prepare_settings if self._snapshot is not None else {}
        args = [arg for name, field in self.settings.items()
                if field.value() != kept.get(name, field.default)
                for arg in field.args(always=True)]
        return [*args, "--save-settings"] if args else []

    def _show_settings(self, snap: VoiceSnapshot | None) -> None:
        if snap is None or (self._snapshot is not None and self._snapshot.path == snap.path
                            and self._snapshot.prepare_settings == snap.prepare_settings):
            return  # the same voice's same settings: a value being edited stays
        for name, field in self.settings.items():
            field.set_value(snap.prepare_settings.get(name, field.default))

    def _build_report(self) -> None:
        """The report's figures and what to do."""
        grid = QGridLayout()
        grid.setSpacing(12)
        self.cards = {
            "usable": StatCard("usable minutes"),
            "percent": StatCard(f"of the recommended {PrepareConfig().recommended_minutes:g} min"),
            "clips": StatCard("clips (usable / all)"),
            "rejected": StatCard("takes rejected"),
        }
        for i, card in enumerate(self.cards.values()):
            grid.addWidget(card, 0, i)
        self.outer.addLayout(grid)

        advice_card = Card()
        cap = QLabel("What to do")
        cap.setObjectName("StatLabel")
        self.advice = QLabel("Run prepare to see the quality report.")
        self.advice.setWordWrap(True)
        self.verdict = QLabel("")
        advice_card.layout_.addWidget(cap)
        advice_card.layout_.addWidget(self.verdict)
        advice_card.layout_.addWidget(self.advice)
        self.outer.addWidget(advice_card)


    def _build_lists(self) -> None:
        """The clips' problems, then who was heard in each slice of a recording with more
        than one voice."""
        self.tree = QTreeWidget()
        self.tree.setHeaderLabels(["Clip / file", "Problem", "What to do"])
        self.tree.setAlternatingRowColors(True)
        self.tree.setRootIsDecorated(True)
        # a long message wraps onto more lines of its row instead of ending in "..."
        self.tree.setWordWrap(True)
        self.tree.setUniformRowHeights(False)
        self.tree.setItemDelegate(_WrappingDelegate(self.tree))
        hh = self.tree.header()
        hh.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        hh.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        hh.setSectionResizeMode(2, QHeaderView.ResizeMode.Stretch)
        # a row's height follows its wrapped text at the columns' new widths
        hh.sectionResized.connect(lambda *_: self.tree.doItemsLayout())
        self.outer.addWidget(self.tree, 1)

        # who was heard in each slice of recordings with more than one voice
        self.speaker_note = QLabel("")
        self.speaker_note.setObjectName("Muted")
        self.speaker_note.setWordWrap(True)
        self.play_btn = button("Play", "play", slot=self.play_slice,
                               tip="Play the selected slice (Space)")
        self.flip_btn = button("Keep / leave out", "prepare", slot=self.flip_slice,
                               tip="Overrule the speaker decision for the selected slice")
        self.outer.addWidget(hbox(self.speaker_note, self.play_btn, self.flip_btn,
                                  stretch_at=0))
        self.slices = QTreeWidget()
        self.slices.setHeaderLabels(["Slice", "Heard", "Similarity", "Decision"])
        self.slices.setRootIsDecorated(False)
        self.slices.setAlternatingRowColors(True)
        sh = self.slices.header()
        sh.setSectionResizeMode(0, QHeaderView.ResizeMode.ResizeToContents)
        sh.setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        self.outer.addWidget(self.slices, 1)
        self.slices.itemSelectionChanged.connect(self._slice_buttons)
        play_key = QShortcut(QKeySequence(Qt.Key.Key_Space), self.slices)
        play_key.setContext(Qt.ShortcutContext.WidgetShortcut)
        play_key.activated.connect(self.play_slice)

    def run(self) -> EngineJob | None:
        if self.voice is None or self.job is not None:
            return None
        job = self.start_job(["prepare", str(self.voice), *self.settings_args()], "Prepare")
        self.job = job
        self.progress.setRange(0, 0)
        self.progress.show()
        self.state.setText("Starting…")
        job.progress.connect(self._on_progress)
        job.log.connect(lambda level, msg: self.state.setText(msg) if level != "debug" else None)
        job.succeeded.connect(lambda r: self.state.setText(
            f"Prepared in {r.get('run', {}).get('wall_s', 0):.1f} s"))
        job.cancelled.connect(lambda: self.state.setText("Cancelled; finished takes are kept."))
        # a refusal (nothing left to train on) stays readable beside the button too
        job.failed.connect(lambda _code, msg, _hint: self.state.setText(msg))
        job.finished.connect(self._done)
        self._buttons()
        return job

    def cancel(self) -> None:
        if self.job is not None:
            self.job.cancel()

    def _on_progress(self, stage: str, done: float, total: object) -> None:
        if isinstance(total, float) and total > 0:
            self.progress.setRange(0, int(total))
            self.progress.setValue(int(done))
            self.progress.setFormat(f"{stage}: %v of %m takes")
            # the line beside the bar says the same moment the bar shows
            self.state.setText("Writing the clips and the report…" if done >= total else
                               f"Preparing take {int(done) + 1} of {int(total)}…")

    def _done(self) -> None:
        self.job = None
        if self.progress.maximum() == 0:
            self.progress.setRange(0, 1)
            self.progress.setValue(0)
            self.progress.hide()
        self.ctx.notify_changed()
        self._buttons()

    def _buttons(self) -> None:
        self.run_btn.setEnabled(self.voice is not None and self.job is None)
        self.cancel_btn.setEnabled(self.job is not None)

    def _show_snapshot(self, snap: VoiceSnapshot | None) -> None:
        self._show_settings(snap)
        self._snapshot = snap
        self._buttons()
        self.show_report(snap.report if snap is not None else None)

    def show_report(self, report: dict[str, Any] | None) -> None:
        # the whole report, not its time and totals: two prepares within one second can
        # differ only in one clip's decision (a flip that leaves totals as they were)
        shown = (self.voice, report)
        if report and shown == self._shown:
            return  # the same report re-read (takes changed): the tree is up to date
        self._shown = shown
        self.tree.clear()
        if not report:
            for card in self.cards.values():
                card.set("—")
            self.verdict.setText("")
            self.advice.setText("Not prepared yet. Press “Prepare now”." if self.voice
                                else "Open a voice first.")
            return
        t = report.get("totals", {})
        self.cards["usable"].set(f"{float(t.get('minutes_usable', 0)):.1f}")
        self.cards["percent"].set(f"{float(t.get('percent_of_recommendation', 0)):.0f}%")
        if isinstance(t.get("recommended_minutes"), int | float):  # the voice's own setting
            self.cards["percent"].label.setText(
                f"of the recommended {float(t['recommended_minutes']):g} min")
        self.cards["clips"].set(f"{t.get('usable_clips', 0)} / {t.get('clips', 0)}")
        self.cards["rejected"].set(str(t.get("rejected_takes", 0)))
        if t.get("enough"):
            self.verdict.setText("Enough clean speech to train.")
            self.verdict.setObjectName("Good")
        else:
            self.verdict.setText("Not enough usable speech yet for a good voice.")
            self.verdict.setObjectName("Warn")
        self.verdict.style().unpolish(self.verdict)
        self.verdict.style().polish(self.verdict)
        advice = report.get("advice") or []
        self.advice.setText("\n".join(f"• {a}" for a in advice) if advice
                            else "Nothing to fix. Go on to Train.")

        rejected = report.get("rejected") or []
        if rejected:
            top = QTreeWidgetItem([f"Rejected files ({len(rejected)})", "", ""])
            self.tree.addTopLevelItem(top)
            for r in rejected:
                _row(top, [f"{r.get('take')}  {r.get('source', '')}",
                           str(r.get("reason", "")), advice_for(str(r.get("code")))])
            top.setExpanded(True)
        unusable = [c for c in report.get("clips", []) if not c.get("usable")]
        notes = [c for c in report.get("clips", []) if c.get("usable") and c.get("issues")]
        for title, clips in ((f"Unusable clips ({len(unusable)})", unusable),
                             (f"Usable clips with notes ({len(notes)})", notes)):
            if not clips:
                continue
            top = QTreeWidgetItem([title, "", ""])
            self.tree.addTopLevelItem(top)
            for c in clips[:2000]:  # the report keeps all; the view stays quick
                for i in c.get("issues", []):
                    _row(top, [str(c.get("id", "?")), str(i.get("message", "")),
                               advice_for(str(i.get("code")))])
            top.setExpanded(len(clips) <= 50)
        if not self.tree.topLevelItemCount():
            self.tree.addTopLevelItem(QTreeWidgetItem(
                ["Every clip passed", "No clipping, noise, length or transcript problems.", ""]))
        self._show_speakers(report)

    # -- who was heard -------------------------------------------------------------------

    def _show_speakers(self, report: dict[str, Any] | None) -> None:
        """Every slice of the recordings where more than one voice was heard."""
        self.slices.clear()
        sp = (report or {}).get("speakers") or {}
        clips = (report or {}).get("clips") or []
        mixed_takes = {c.get("source_take") for c in clips
                       if (c.get("speaker") or {}).get("who") not in (None, "target")}
        shown = [c for c in clips if c.get("source_take") in mixed_takes]
        self.speaker_note.setText(
            f"Voices: {sp.get('note', '')} {len(shown)} slices of {len(mixed_takes)} "
            "recordings with more than one voice below." if shown else "")
        self.slices.setVisible(bool(shown))
        self.play_btn.setVisible(bool(shown))
        self.flip_btn.setVisible(bool(shown))
        for c in shown[:2000]:
            who = (c.get("speaker") or {}).get("who", "")
            sim = (c.get("speaker") or {}).get("similarity")
            codes = {i.get("code") for i in c.get("issues", [])}
            kept = "speaker_kept" in codes or (who == "target" and "excluded_by_you" not in codes)
            item = QTreeWidgetItem([str(c.get("id")), HEARD.get(who, who),
                                    "" if sim is None else f"{sim:.2f}",
                                    self._decision_text(who, codes)])
            item.setData(0, Qt.ItemDataRole.UserRole, {"id": c.get("id"), "kept": kept})
            self.slices.addTopLevelItem(item)
        self._slice_buttons()

    @staticmethod
    def _decision_text(who: str, codes: set[Any]) -> str:
        if "speaker_kept" in codes:
            return "kept by you"
        if "excluded_by_you" in codes:
            return "left out by you"
        return "kept" if who == "target" else "left out"

    def _selected_slice(self) -> dict[str, Any] | None:
        items = self.slices.selectedItems()
        return items[0].data(0, Qt.ItemDataRole.UserRole) if items else None

    def _slice_buttons(self) -> None:
        chosen = self._selected_slice()
        self.play_btn.setEnabled(chosen is not None)
        self.flip_btn.setEnabled(chosen is not None and self.job is None)
        if chosen is not None:
            self.flip_btn.setText("Leave out" if chosen["kept"] else "Keep")

    def slice_path(self, clip_id: str) -> Path | None:
        if self.voice is None:
            return None
        path = prepared_folder(self.voice).clip_file(clip_id)
        return path if path.is_file() else None

    def play_slice(self) -> None:
        chosen = self._selected_slice()
        path = self.slice_path(str(chosen["id"])) if chosen else None
        if path is None:
            return
        if self.ctx.player.playing and self.ctx.player.current == path:
            self.ctx.player.stop()
        else:
            self.ctx.player.play_file(path)

    def flip_slice(self) -> None:
        """Overrule the speaker decision of the selected slice; the next prepare applies it
        from its cache (nothing is recomputed), so it runs at once."""
        chosen = self._selected_slice()
        if chosen is None or self.voice is None or self.job is not None:
            return
        item = self.slices.selectedItems()[0]
        who = next(k for k, v in HEARD.items() if v == item.text(1)) if item.text(1) in \
            HEARD.values() else item.text(1)
        # back to what prepare decided when that is what the user now wants
        wanted_keep = not chosen["kept"]
        decision = None if (who == "target") == wanted_keep else (
            "keep" if wanted_keep else "exclude")
        write_decision(open_voice(Path(self.voice)), str(chosen["id"]), decision)
        self.state.setText(f"{chosen['id']}: {'kept' if wanted_keep else 'left out'}; "
                           "applying…")
        self.run()
