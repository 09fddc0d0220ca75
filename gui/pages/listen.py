"""Listen: speak any text in the voice, from a checkpoint, an export, an adapter or instant
voice, or zero-shot. Voices of one base switch in the warm worker without a model load.

Each render is a job of the engine's `speak` command writing into the
voice's renders/ folder, with a small JSON beside it saying what made it (the
style it was spoken in among it). The Style field offers the styles the chosen
source was trained with (the engine reads them from its records) or free text:
the instruction the voice speaks with; empty is its plain speech.
The comparison renders the same sentences from several checkpoints (engine
`compare`) into a table: one click per cell plays it.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import soundfile as sf
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHeaderView,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPlainTextEdit,
    QProgressBar,
    QSizePolicy,
    QSplitter,
    QStyle,
    QStyleOptionComboBox,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from engine.catalog import VoiceSnapshot, latest_run, source_styles
from engine.config.schema import flag_of, lookup
from engine.config.speak import available_formats
from engine.core.atomic import write_json
from engine.core.errors import VoxshardError
from engine.core.kinds import ServedKind, Tier, VoiceKind
from engine.layout.exports import new_comparison_dir, new_render_path
from engine.layout.manifest import row_is_usable
from engine.synth.render import write_audio
from gui.context import AppContext
from gui.jobs import EngineJob
from gui.pages.base import SnapshotPage
from gui.pages.train import BASE_MODELS
from gui.settings_form import SettingField
from gui.widgets import ElidedComboBox, button, hbox, show_error
from gui.words import count

SAMPLE_TEXT = ("The quick brown fox jumps over the lazy dog. "
               "A cloned voice should sound natural on sentences it has never heard.")


#: Save as: the formats the engine writes, the filter a user picks, and each one's suffix
SAVE_FILTERS = {"wav": "WAV audio (*.wav)", "flac": "FLAC, lossless (*.flac)",
                "opus": "Ogg Opus, small (*.opus)", "mp3": "MP3 (*.mp3)"}
SAVE_SUFFIX = {"wav": ".wav", "flac": ".flac", "opus": ".opus", "mp3": ".mp3"}
#: said after a streamed playback that had to wait for the generator
PLAYBACK_GAPS = ("Playback paused while it waited for the speech (this machine makes it "
                 "slower than real time); the saved render has no gaps: play it from History.")


#: the speaking settings the page shows as fields (`engine.config.speak.SpeakOptions`), and
#: each one's words for "not given"
LISTEN_SETTINGS = ("speak.temperature", "speak.top_k", "speak.seed")
UNSET_WORDS = {"speak.temperature": "model's", "speak.top_k": "model's", "speak.seed": "random"}

#: the state while the speech worker loads a model (a voice of the same base only switches)
LOADING = "Loading the model…"
#: what the engine's runaway guard saw where it cut a render short (its result's "runaway")
CUT_WORDS = {"loop": "it kept repeating itself", "silence": "it stayed silent"}


def cut_sentence(reasons: object) -> str:
    """One plain sentence on a render the runaway guard cut short ("" when none was)."""
    said = [CUT_WORDS[str(r)] for r in reasons if str(r) in CUT_WORDS] \
        if isinstance(reasons, list | tuple) else []
    if not said:
        return ""
    return (f"The speech was cut short where {' and where '.join(said)}; you hear it up to "
            "there.")


def best_label(run: str, step: int) -> str:
    """The source list's name of a run's best checkpoint (its evaluation's pick)."""
    return f"Best checkpoint: {run} · step {step} (the evaluation's best)"


#: an item's short form, what the closed box shows (its list shows the whole label)
SHORT_TEXT_ROLE = Qt.ItemDataRole.UserRole + 1


class ShortTextComboBox(QComboBox):
    """Shows the current item's short form, elided in the middle to fit the box: a long
    label was cut off mid-word by the box's edge, its end readable only in a tooltip."""

    def initStyleOption(self, option: QStyleOptionComboBox) -> None:
        super().initStyleOption(option)
        short = self.currentData(SHORT_TEXT_ROLE)
        field = self.style().subControlRect(QStyle.ComplexControl.CC_ComboBox, option,
                                            QStyle.SubControl.SC_ComboBoxEditField, self)
        # the style draws the label 1 px inside each side of the field
        option.currentText = self.fontMetrics().elidedText(
            str(short) if short else option.currentText, Qt.TextElideMode.ElideMiddle,
            field.width() - 2)


def note_label(text: str) -> QLabel:
    """A muted note that takes the rest of its row and wraps (beside a stretch one was
    squeezed onto two short lines at 1100 px)."""
    label = QLabel(text)
    label.setObjectName("Muted")
    label.setWordWrap(True)
    label.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Preferred)
    return label


class ListenPage(SnapshotPage):
    title = "Listen"
    subtitle = "Hear the voice speak any text. Compare checkpoints to pick the best one."
    icon_name = "listen"

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.speech = ctx.speech
        self.request: str | None = None
        self._pending: tuple[Path, str, dict[str, Any], str] | None = None
        self._style_warning: str | None = None  # the engine's, for the chosen source
        self._load_error = False
        self._base_voice: Path | None = None  # the voice whose own base fills "Base"
        self.speech.progress.connect(self._req_progress)
        self.speech.finished.connect(self._req_finished)
        self.speech.partial.connect(self._req_partial)
        self._streaming = False
        self._stream_playing = False  # a stream of this page is (still) being heard
        self.speech.failed.connect(self._req_failed)
        self.speech.cancelled.connect(self._req_cancelled)
        self.speech.state.connect(self._req_state)
        self.compare_job: EngineJob | None = None
        self.last_render: Path | None = None
        self.last_comparison: Path | None = None

        self._build_source()
        self._build_sampling()
        self._build_tabs()
        ctx.player.finished.connect(self._played)
        ctx.player.started.connect(lambda: self.stop_btn.setEnabled(True))

    def _build_source(self) -> None:
        """The text, which model speaks it (and the zero-shot preview's base), and the style."""
        self.text = QPlainTextEdit()
        self.text.setPlaceholderText("Type or paste what the voice should say…")
        self.text.setPlainText(SAMPLE_TEXT)
        self.text.setMaximumHeight(130)
        self.outer.addWidget(self.text)

        self.source = ElidedComboBox()  # a long label ends in "…", not mid-word
        self.source.setMinimumWidth(360)
        self.source.setToolTip("Which model speaks: an exported model, an adapter or "
                               "instant voice, a training checkpoint, or the base model "
                               "with a reference clip")
        self.base = QComboBox()
        self.base.setEditable(True)
        self.base.addItems(BASE_MODELS)
        self.base.setToolTip("Base model for the zero-shot preview")
        self.speak_btn = button("Speak", "play", primary=True, slot=lambda: self.speak(),
                                tip="Ctrl+Enter")
        self.stop_btn = button("Stop", "stop", slot=self.stop)
        self.save_btn = button("Save as…", "save", slot=self.save_as)
        self.outer.addWidget(hbox(QLabel("Speak with"), self.source, QLabel("Base"), self.base,
                                  stretch_at=4))
        # the instruction the voice speaks with: a style it was trained with, or free text
        self.style = QComboBox()
        self.style.setEditable(True)
        self.style.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.style.setMinimumContentsLength(24)
        self.style.lineEdit().setPlaceholderText("Plain speech (or pick a trained style, or "
                                                 "describe one)")
        self.style.setToolTip("How the voice speaks: the list holds the styles this source was "
                              "trained with; empty is its plain speech")
        self.style_note = note_label("")
        self.style_note.hide()
        style_row = hbox(QLabel("Style"), self.style, self.style_note)
        style_row.layout().setStretchFactor(self.style, 1)
        style_row.layout().setStretchFactor(self.style_note, 1)
        self.outer.addWidget(style_row)
        self.style.editTextChanged.connect(self._style_edited)
        self.source.currentIndexChanged.connect(lambda _i: self._fill_styles())

    def _build_sampling(self) -> None:
        """The zero-shot preview's reference clip, the sampling settings (the engine's
        fields), the buttons and the state."""
        # the zero-shot preview's reference clip, and the sampling the engine offers
        self.reference = ShortTextComboBox()
        self.reference.setToolTip("The prepared clip the zero-shot preview imitates "
                                  "(3-12 s of clean speech works best)")
        self.reference.setMinimumContentsLength(18)
        self.reference.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        # the speaking settings the page offers, each a field of the engine's SpeakOptions
        self.fields = {lookup(path)[1]: SettingField(*lookup(path), decimals=2,
                                                     unset=UNSET_WORDS[path])
                       for path in LISTEN_SETTINGS}
        self.temperature, self.top_k, self.seed = (self.fields[n].widget for n in
                                                   ("temperature", "top_k", "seed"))
        self.temperature.setSingleStep(0.05)
        labelled = [w for f in self.fields.values() for w in (QLabel(f.label), f.widget)]
        sampling = hbox(QLabel("Reference"), self.reference, *labelled,
                        stretch_at=2 + len(labelled))
        # the clip's name takes half of a wide window's spare room (the stretch the rest)
        sampling.layout().setStretchFactor(self.reference, 1)
        self.outer.addWidget(sampling)
        self.state = QLabel("")
        self.state.setObjectName("Muted")
        # a line of its own that wraps: an error message ran off the window beside the buttons
        self.state.setWordWrap(True)
        self.outer.addWidget(hbox(self.speak_btn, self.stop_btn, self.save_btn, stretch_at=3))
        self.outer.addWidget(self.state)
        self.progress = QProgressBar()
        self.progress.hide()
        self.outer.addWidget(self.progress)


    def _build_tabs(self) -> None:
        """The history of renders and the checkpoints' A/B comparison."""
        tabs = self.tabs = QTabWidget()
        # history
        hist = QWidget()
        hl = QVBoxLayout(hist)
        self.history = QTableWidget(0, 4)
        self.history.setHorizontalHeaderLabels(["When", "Model", "Text", "Length"])
        self.history.verticalHeader().hide()
        self.history.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.history.setSelectionBehavior(QTableWidget.SelectionBehavior.SelectRows)
        self.history.setAlternatingRowColors(True)
        # the model and the text share the width the window has: a fixed 330 px model
        # column squeezed the text at 1100 px
        for col in (1, 2):
            self.history.horizontalHeader().setSectionResizeMode(
                col, QHeaderView.ResizeMode.Stretch)
        self.history.setColumnWidth(0, 130)
        self.history.cellDoubleClicked.connect(lambda r, _c: self.play_history(r))
        hl.addWidget(self.history)
        hl.addWidget(hbox(button("Play", "play", slot=lambda: self.play_history(
            self.history.currentRow())), stretch_at=1))
        tabs.addTab(hist, "History")
        # comparison
        comp = QWidget()
        cl = QVBoxLayout(comp)
        self.compare_btn = button("Compare checkpoints", "compare", slot=lambda: self.compare(),
                                  tip="Render the text from every checkpoint of the latest "
                                      "run and the zero-shot preview, same seed")
        self.compare_note = note_label("Each row is one sentence; click a cell to hear it.")
        cl.addWidget(hbox(self.compare_btn, self.compare_note))
        # which checkpoints of the latest run to compare (all, unless the user unticks some)
        self.compare_pick = QListWidget()
        self.compare_pick.setFlow(QListWidget.Flow.LeftToRight)
        self.compare_pick.setWrapping(True)
        self.compare_pick.setMaximumHeight(64)
        self.compare_pick.setToolTip("Tick the checkpoints to compare")
        cl.addWidget(self.compare_pick)
        self.compare_table = QTableWidget(0, 0)
        self.compare_table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.compare_table.verticalHeader().hide()
        self.compare_table.cellClicked.connect(self._compare_clicked)
        cl.addWidget(self.compare_table)
        tabs.addTab(comp, "A/B comparison")
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(tabs)
        self.outer.addWidget(split, 1)

    # -- sources -------------------------------------------------------------------
    @property
    def snap(self) -> VoiceSnapshot | None:
        return self.ctx.reader.cached(self.voice)

    def _show_snapshot(self, snap: VoiceSnapshot | None) -> None:
        current = self.source.currentData()
        self.source.clear()
        voice = self.voice
        if voice is not None and snap is not None:
            # each entry's kind: one tier of the voice named on its own (as a server names
            # it), a checkpoint, or the zero-shot preview; a render's record keeps the word
            for export in reversed(snap.exports):
                self.source.addItem(f"Exported: {export.name}", {"kind": ServedKind.EXPORT,
                                                                  "path": str(export.path)})
            tiers = list(snap.summary.get("tiers") or [])
            # adapter and instant voices sit on a base: switching among them (and the
            # checkpoints and zero-shot of that base) swaps them in the warm worker's model
            for tier in (t for t in tiers if t["tier"] == Tier.ADAPTER):
                self.source.addItem(f"Adapter voice: {tier['name']}",
                                    {"kind": ServedKind.ADAPTER, "path": str(tier["path"])})
            for run in reversed(snap.runs):
                best = run.best_step
                if best is not None and best not in run.checkpoint_steps:
                    # training pruned it: the evaluation's copy under best/ speaks
                    self.source.addItem(best_label(run.name, best),
                                        {"kind": VoiceKind.CHECKPOINT, "path": str(run.best),
                                         "run": run.name})
                for ckpt, step in zip(reversed(run.checkpoints),
                                      reversed(run.checkpoint_steps), strict=True):
                    self.source.addItem(best_label(run.name, step) if step == best
                                        else f"Checkpoint: {run.name} · step {step}",
                                        {"kind": VoiceKind.CHECKPOINT, "path": str(ckpt),
                                         "run": run.name})
            for tier in (t for t in tiers if t["tier"] == Tier.INSTANT):
                # no base known yet (none recorded, no run): it speaks on the Base field's
                self.source.addItem("Instant voice (its reference clip, no training)"
                                    if tier["base"] else
                                    "Instant voice on the Base model (no training)",
                                    {"kind": ServedKind.INSTANT, "path": str(tier["path"]),
                                     "base": tier["base"]})
            self.source.addItem("Zero-shot preview (base model + a reference clip)",
                                {"kind": VoiceKind.ZERO_SHOT})
            if current is not None:
                for i in range(self.source.count()):
                    if self.source.itemData(i) == current:
                        self.source.setCurrentIndex(i)
        self._fill_compare_pick(snap)
        self._fill_references(snap)
        if voice is not None and snap is not None and self._base_voice != voice:
            self._base_voice = voice
            own = snap.base_model
            if own:  # the voice's own base, not a download of 1.7B it never trained on
                self.base.setEditText(own)
        self._fill_history(snap.renders if snap is not None else [])
        if snap is not None and snap.comparisons \
                and snap.comparisons[-1] != self.last_comparison:
            self.show_comparison(snap.comparisons[-1])
        self._buttons()

    def _buttons(self) -> None:
        has = self.voice is not None and self.source.count() > 0
        self.speak_btn.setEnabled(has and self.request is None)
        self.compare_btn.setEnabled(has and self.compare_job is None)
        self.stop_btn.setEnabled(self.request is not None or self.ctx.player.playing)
        self.save_btn.setEnabled(self.last_render is not None)

    def sampling(self) -> dict[str, Any]:
        """The speak options the user set, by field (left out: the model's own; no style:
        plain): what the speech worker is sent."""
        out = {name: f.value() for name, f in self.fields.items() if f.value() is not None}
        if self.style_text():
            out["instruct"] = self.style_text()
        return out

    def speak_args(self) -> list[str]:
        """The same settings as `speak` and `compare` flags (the CLI's own for each field)."""
        args = [a for f in self.fields.values() for a in f.args()]
        style = self.style_text()
        return args + ([flag_of(*lookup("speak.instruct")), style] if style else [])

    # -- style ----------------------------------------------------------------------------
    def style_text(self) -> str:
        return self.style.currentText().strip()

    def _fill_styles(self) -> None:
        """The chosen source's trained styles in the list (the engine reads them from its
        records), what was typed kept."""
        src = self.source.currentData() or {"kind": VoiceKind.ZERO_SHOT}
        # a zero-shot or instant voice clones on a Base model: no folder of its own trained
        folder = src.get("path") if src["kind"] not in (VoiceKind.ZERO_SHOT,
                                                     ServedKind.INSTANT) else None
        found = source_styles(folder)
        typed = self.style.currentText()
        self.style.blockSignals(True)
        self.style.clear()
        self.style.addItems(["", *sorted(found.styles)])
        self.style.setEditText(typed)
        self.style.blockSignals(False)
        self._style_warning = found.warning
        self._style_edited(typed)

    def _style_edited(self, text: str) -> None:
        """Say the engine's warning as soon as an instruction is given to a source that
        does little or nothing with one."""
        warn = self._style_warning if text.strip() else None
        self.style_note.setText(warn or "")
        self.style_note.setVisible(bool(warn))

    def _fill_references(self, snap: VoiceSnapshot | None) -> None:
        current = self.reference.currentData()
        self.reference.clear()
        best = snap.reference if snap is not None else None
        clips = [c for c in (snap.clips if snap is not None else []) if row_is_usable(c)]
        for c in sorted(clips, key=lambda c: -float(c.get("duration_s") or 0)):
            path = str(snap.path / str(c["path"])) if snap is not None else ""
            text = str(c.get("text") or "")
            label = f"{Path(str(c['path'])).stem} · {float(c.get('duration_s') or 0):.1f} s"
            self.reference.addItem(label + (f" · {text[:40]}" if text else ""), path)
            self.reference.setItemData(self.reference.count() - 1, text or path,
                                       Qt.ItemDataRole.ToolTipRole)
            self.reference.setItemData(self.reference.count() - 1, label, SHORT_TEXT_ROLE)
        i = self.reference.findData(current if current else (str(best) if best else None))
        self.reference.setCurrentIndex(max(0, i))
        self.reference.setEnabled(self.reference.count() > 0)

    def _engine_reference(self) -> Path | None:
        """The voice's reference clip as the engine picks it (the CLI's compare uses it)."""
        return self.snap.reference if self.snap is not None else None

    def voice_spec(self) -> dict[str, Any]:
        """What the speech worker loads for the chosen source (a `load` request)."""
        assert self.voice is not None
        src = self.source.currentData() or {"kind": VoiceKind.ZERO_SHOT}
        if src["kind"] == ServedKind.INSTANT and not src.get("base"):
            # an instant voice that knows no base speaks on the one the Base field names
            # (the engine records it: the voice then speaks on it everywhere)
            return {"voice": src["path"], "base": self.base.currentText().strip() or None}
        if src["kind"] in (ServedKind.EXPORT, VoiceKind.CHECKPOINT, ServedKind.ADAPTER,
                          ServedKind.INSTANT):
            # a checkpoint, adapter or instant folder speaks directly; the engine finds
            # its base model
            return {"voice": src["path"]}
        ref = self.reference.currentData() or self._engine_reference()
        return {"voice": self.base.currentText().strip(),
                "reference": str(ref) if ref is not None else None}

    # -- speak --------------------------------------------------------------------------
    def speak(self, text: str | None = None) -> str | None:
        """Render through the warm speech worker; returns the request id."""
        if self.voice is None or self.request is not None:
            return None
        text = (text if text is not None else self.text.toPlainText()).strip()
        if not text:
            show_error(self, "Nothing to say", "Type some text first.")
            return None
        if self.snap is None:  # the sources are not known yet (Ctrl+Enter skips the button)
            self.ctx.status.emit("Still reading the voice; speak again in a moment.")
            return None
        src = self.source.currentData() or {"kind": VoiceKind.ZERO_SHOT}
        if src["kind"] == VoiceKind.ZERO_SHOT and self._engine_reference() is None:
            show_error(self, "No reference clip", "The zero-shot preview needs a prepared clip.",
                       "Record or import some audio and run Prepare first.")
            return None
        out = new_render_path(self.voice)
        self.ctx.player.stop()
        loading = self.speech.needs_load(self.voice_spec())
        # a warm worker holding another voice: the engine swaps a voice of the same base
        # in place (no model load) and says "loading_model" only when it does load one
        # (`_req_state`); a worker with nothing loaded always loads
        cold = loading and self.speech.loaded is None
        # streamed: the first words play while the rest is still being generated
        self.request = self.speech.speak(self.voice_spec(), text, str(out),
                                         options=self.sampling(), stream=True)
        self._streaming = False
        self._pending = (out, text, src, self.style_text())
        self._load_error = False
        self.progress.setRange(0, 0)
        self.progress.show()
        served = self.speech.served_name(self.voice_spec())
        self.state.setText(LOADING if cold else "Switching voice…" if loading else
                           f"Speaking on the Serve page's server ({served})…" if served else
                           "Speaking…")
        self._buttons()
        return self.request

    def _req_state(self, _rid: str, state: str) -> None:
        if state == "loading_model" and self.request is not None and not self._streaming:
            # the switch needs a model of its own after all (another base, a full voice)
            self.state.setText(LOADING)

    def _req_progress(self, rid: str, stage: str, done: float, total: object) -> None:
        if rid == self.request:
            self.state.setText("Speaking…")
            self._on_progress(stage, done, total)

    def _req_partial(self, rid: str, path: str) -> None:
        if rid == self.request and self.ctx.player.play_stream(path):
            self._streaming = self._stream_playing = True
            self.state.setText("Speaking (playing as it is generated)…")

    def _played(self) -> None:
        self.stop_btn.setEnabled(self.request is not None)
        if self._stream_playing:
            self._stream_playing = False
            player = self.ctx.player
            # the player caught up with the generator (or the device starved): what was
            # heard had pauses the render itself does not have; say so, or it sounds broken
            if player.underruns or player.device_underflows:
                self.state.setText(self.state.text() + " " + PLAYBACK_GAPS)

    def _req_finished(self, rid: str, result: dict) -> None:
        if rid == self.request and self._pending is not None:
            out, text, src, style = self._pending
            streamed = self._streaming  # already playing: it ends by itself
            self._end_request()
            self._spoken(out, text, src, result, streamed, style)

    def _req_failed(self, rid: str, code: str, message: str, hint: str) -> None:
        if self.request is None:
            return
        if rid.startswith("load-"):
            # the model did not load: say that, not the speak request's follow-up error
            self._load_error = True
            show_error(self, "The model could not be loaded", message, hint)
        elif rid == self.request:
            if not self._load_error:
                show_error(self, "Speaking failed", message, hint)
            self.state.setText("Failed: " + message)
            self._end_request()

    def _req_cancelled(self, rid: str) -> None:
        if rid == self.request:
            self.state.setText("Stopped.")
            self._end_request()

    def _end_request(self) -> None:
        if self._streaming:
            self.ctx.player.end_stream()  # what was streamed plays to its end, then stops
            self._streaming = False
        self.request = None
        self._pending = None
        self.progress.hide()
        self._buttons()

    def _on_progress(self, stage: str, done: float, total: object) -> None:
        if isinstance(total, float) and total > 0:
            self.progress.setRange(0, int(total))
            self.progress.setValue(int(done))

    def _spoken(self, out: Path, text: str, src: dict[str, Any], result: dict,
                streamed: bool = False, style: str = "") -> None:
        self.last_render = out
        meta = out.with_suffix(".json")
        if not meta.exists():
            label = (self.source.currentText() if src["kind"] != VoiceKind.ZERO_SHOT
                     else "Zero-shot")
            write_json(meta, {"text": text, "model": label, "source": src, "style": style,
                              "duration_s": result.get("duration_s"),
                              "created": time.strftime("%Y-%m-%d %H:%M:%S")})
        summary = str(result.get("summary") or f"Saved {out.name}")
        cut = cut_sentence(result.get("runaway"))
        self.state.setText(f"{summary} {cut}" if cut else summary)
        if out.exists() and not streamed:
            self.ctx.player.play_file(out)
        self.ctx.notify_changed()  # the history is re-read with the new render

    def stop(self) -> None:
        if self.request is not None:
            self.speech.cancel(self.request)
        self.ctx.player.stop()

    def save_as(self) -> None:
        if self.last_render is None:
            return
        src = self.last_render
        filters = [f for fmt, f in SAVE_FILTERS.items() if fmt in available_formats()]
        dlg = QFileDialog(self, "Save the render as", str(Path.home() / src.name))
        dlg.setAcceptMode(QFileDialog.AcceptMode.AcceptSave)
        dlg.setOption(QFileDialog.Option.DontUseNativeDialog)  # the filter is ours to read
        dlg.setNameFilters(filters)
        dlg.fileSelected.connect(lambda f: self.save_render_as(src, Path(f),
                                                               dlg.selectedNameFilter()))
        self.save_dialog = dlg
        dlg.open()

    def save_render_as(self, src: Path, target: Path, name_filter: str) -> Path | None:
        """Write the render in the chosen filter's format, through the engine's writer,
        with that format's suffix (a file called hello.mp3 is an MP3, not WAV bytes)."""
        fmt = next((k for k, f in SAVE_FILTERS.items() if f == name_filter), "wav")
        if target.suffix.lower() != SAVE_SUFFIX[fmt]:
            target = target.with_name(target.name + SAVE_SUFFIX[fmt]) \
                if target.suffix.lower() not in SAVE_SUFFIX.values() \
                else target.with_suffix(SAVE_SUFFIX[fmt])
        try:
            audio, rate = sf.read(str(src), dtype="float32", always_2d=False)
            if getattr(audio, "ndim", 1) > 1:
                audio = audio.mean(axis=1)
            write_audio(target, audio, fmt, rate)
        except (VoxshardError, OSError, RuntimeError) as exc:
            message = getattr(exc, "message", str(exc))
            show_error(self, "Not saved", message, getattr(exc, "hint", "") or "")
            return None
        self.state.setText(f"Saved {target}")
        return target

    # -- history -----------------------------------------------------------------------
    def _fill_history(self, items: list[dict[str, Any]]) -> None:
        self.history.setRowCount(len(items))
        for row, e in enumerate(items):
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(float(e["mtime"])))
            dur = e.get("duration_s")
            model = str(e.get("model", ""))
            if e.get("style"):
                model += f" · style: {e['style']}"
            cells = [when, model, str(e.get("text", e["path"].name)),
                     f"{float(dur):.1f} s" if isinstance(dur, int | float) else ""]
            for col, value in enumerate(cells):
                item = QTableWidgetItem(value)
                item.setData(Qt.ItemDataRole.UserRole, str(e["path"]))
                self.history.setItem(row, col, item)

    def play_history(self, row: int) -> None:
        item = self.history.item(row, 0) if row >= 0 else None
        if item is not None:
            self.last_render = Path(item.data(Qt.ItemDataRole.UserRole))
            self.ctx.player.play_file(self.last_render)
            self._buttons()

    # -- A/B comparison -------------------------------------------------------------------
    def _fill_compare_pick(self, snap: VoiceSnapshot | None) -> None:
        """The latest run's checkpoints (the run `compare` picks), ticked as before (new ones
        ticked)."""
        latest = latest_run(snap.runs, with_checkpoint=True) if snap is not None else None
        steps = latest.checkpoint_steps if latest is not None else []
        before = {self.compare_pick.item(i).data(Qt.ItemDataRole.UserRole):
                  self.compare_pick.item(i).checkState()
                  for i in range(self.compare_pick.count())}
        self.compare_pick.clear()
        for step in steps:
            item = QListWidgetItem(f"step {step}")
            item.setData(Qt.ItemDataRole.UserRole, step)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(before.get(step, Qt.CheckState.Checked))
            self.compare_pick.addItem(item)
        self.compare_pick.setVisible(bool(steps))

    def compare_steps(self) -> list[int]:
        """The ticked checkpoints' steps."""
        return [self.compare_pick.item(i).data(Qt.ItemDataRole.UserRole)
                for i in range(self.compare_pick.count())
                if self.compare_pick.item(i).checkState() == Qt.CheckState.Checked]

    def compare(self, extra_args: list[str] | None = None) -> EngineJob | None:
        if self.voice is None or self.compare_job is not None:
            return None
        sentences = [s.strip() for s in self.text.toPlainText().split("\n") if s.strip()]
        out = new_comparison_dir(self.voice)
        args = ["compare", str(self.voice), str(out)]
        chosen = self.compare_steps()
        if self.compare_pick.count() and not chosen:
            show_error(self, "Nothing to compare", "Tick at least one checkpoint.")
            return None
        if len(chosen) < self.compare_pick.count():
            args += ["--checkpoints", *(str(s) for s in chosen)]
        if sentences:
            args += ["--sentences", *sentences[:10]]
        ref = self._engine_reference()
        if ref is not None:
            args += ["--reference", str(ref)]
        else:
            args.append("--no-zero-shot")
        args += self.speak_args()  # the same seed, sampling and style as Speak
        # the comparison loads every checkpoint on the GPU: the warm speech model leaves first
        unloaded = shutil.which("nvidia-smi") is not None and self.ctx.speech.unload()
        job = self.start_job(args + list(extra_args or []), "Compare", voice=self.voice)
        self.compare_job = job
        self.compare_note.setText("Rendering every checkpoint with the same seed…"
                                  + (" (the speech model left the GPU to make room)"
                                     if unloaded else ""))
        job.succeeded.connect(lambda r: self.show_comparison(Path(r.get("path") or out)))
        job.finished.connect(self._compare_done)
        self._buttons()
        return job

    def _compare_done(self) -> None:
        self.compare_job = None
        self._buttons()

    def show_comparison(self, folder: Path) -> None:
        """Fill the table from the comparison folder's index.json."""
        try:
            index = json.loads((folder / "index.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.compare_note.setText(f"No comparison index in {folder}.")
            return
        # engine/quality/compare.py: {"sentences": [...], "entries": [{"label", "files":
        # [{"sentence": i, "path": relative}]}]}
        texts = [str(t) for t in index.get("sentences") or []]
        entries: list[dict[str, Any]] = [e for e in index.get("entries") or []
                                         if isinstance(e, dict)]
        sources = [str(e.get("label")) for e in entries]
        self.compare_table.clear()
        self.compare_table.setColumnCount(1 + len(sources))
        self.compare_table.setRowCount(len(texts))
        self.compare_table.setHorizontalHeaderLabels(["Sentence", *sources])
        self.compare_table.horizontalHeader().setSectionResizeMode(
            0, QHeaderView.ResizeMode.Stretch)
        for r, text in enumerate(texts):
            self.compare_table.setItem(r, 0, QTableWidgetItem(text))
        for c, entry in enumerate(entries, start=1):
            for f in entry.get("files") or []:
                r = int(f.get("sentence", -1))
                if not 0 <= r < len(texts):
                    continue
                dur = f.get("duration_s")
                cell = QTableWidgetItem("▶ " + (f"{float(dur):.1f} s" if dur else "play"))
                cell.setData(Qt.ItemDataRole.UserRole, str(folder / str(f.get("path"))))
                cell.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
                cell.setToolTip(f"{entry.get('label')}: sentence {r + 1}")
                self.compare_table.setItem(r, c, cell)
        self.last_comparison = folder
        self.compare_note.setText(f"{count(len(texts), 'sentence')} × "
                                  f"{count(len(sources), 'model')}, same seed. Click a cell "
                                  "to hear it.")

    def _compare_clicked(self, row: int, col: int) -> None:
        item = self.compare_table.item(row, col)
        path = item.data(Qt.ItemDataRole.UserRole) if item else None
        if path:
            self.ctx.player.play_file(Path(path))
