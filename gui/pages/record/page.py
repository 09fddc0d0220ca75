"""Record: read the prompt aloud, keyboard first.

Space starts and stops, Enter accepts, R re-takes, Delete discards, P plays,
S skips, N goes to the next style still needing takes, B goes back to the
previous prompt (its take can be heard; recording it again replaces it).
"Speak now" shows once the input really delivers audio and a short pre-roll
has passed; the take is cut by the times Space was pressed, and after stop
the input stays open for a short hold so the last word is not cut. Each take
gets a verdict before it is kept: one that cannot train (silent, clipped, cut
off) is kept only after a deliberate confirm, its verdict is written with it,
and its prompt is offered again. A take is written through the engine's
workspace API the moment it is accepted; nothing accepted lives only in
memory, and Quit asks before a take under review is lost.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import (
    QComboBox,
    QGridLayout,
    QLabel,
    QMessageBox,
    QProgressBar,
    QVBoxLayout,
    QWidget,
)

from engine.audio.sound import unavailable
from gui import audio as au
from gui.context import AppContext
from gui.pages.base import SnapshotPage
from gui.pages.record.dialogs import TakeDialogs
from gui.pages.record.keys import RecordKeys
from gui.pages.record.prompt_card import PromptCard
from gui.pages.record.take import METER_MS, TakeLifecycle
from gui.pages.record.verdict import Judgement
from gui.prompts_source import Prompt, PromptSource
from gui.widgets import LevelMeter, WaveformView, button, fmt_duration, hbox, show_error

#: capturing before "speak now": the first word is never cut by a late start
PREROLL_MS = 600


class RecordPage(TakeLifecycle, PromptCard, TakeDialogs, RecordKeys, SnapshotPage):
    title = "Record"
    subtitle = ("Read each sentence naturally, in a quiet room. Space: record/stop · "
                "Enter: accept · R: re-take · Delete: discard · P: play · S: skip · "
                "B: back · N: next style")
    icon_name = "record"

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.recorder = au.Recorder(self)
        self.recorder.stopped.connect(self._stopped)
        self.recorder.failed.connect(self._record_failed)
        self.prompts = PromptSource()
        self.prompt: Prompt | None = None
        self.take_audio: np.ndarray | None = None
        self.take_sr = 48000
        #: the voice the take recording or under review was started for: it is saved there
        self.take_voice: Path | None = None
        self.clipped = False  # the take's verdict: Prepare refuses it for clipping
        self.loud = False  # the input touched full scale while recording (an early word)
        self.trimmed_s = 0.0  # silence cut from around the take's speech
        self.saved_takes = 0
        self.accepted: dict[Path, set[str]] = {}  # prompt ids saved here, per voice
        self.saved_ids: dict[tuple[Path, str], str] = {}  # (voice, prompt id) -> take id
        self.revisiting = False  # B brought back a prompt that may be recorded already
        self.judgement = Judgement()
        #: a revisited prompt's saved take, to hear with P: (audio, rate)
        self.existing: tuple[np.ndarray, int] | None = None
        self.playing = False  # this page's take is playing
        self._play_total = 0.0
        self._state_before_play = ("", False)
        self.has_mic = au.has_input()
        self._live_ticks = 0
        self.live_draws = 0  # live waveform redraws (tests count them)
        self.testing = False
        self.said_speak_now = False
        self._confirm: QMessageBox | None = None  # "keep a take that cannot train?"
        self._quit_box: QMessageBox | None = None
        self._language_box: QMessageBox | None = None  # "read another language's set?"
        #: (set, groups) saved here that a snapshot may not show yet
        self._pending_choice: tuple[str, tuple[str, ...]] | None = None

        self._build_devices()
        self._build_prompt_card()
        self._build_meter()
        self.wave = WaveformView()
        self.outer.addWidget(self.wave, 1)
        self._build_controls()
        self._build_progress()

        self._build_timers()
        ctx.player.finished.connect(self._play_finished)

        self._build_keys()
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        ctx.voice_changed.connect(self._voice_switched)
        ctx.leave_voice_guards.append(self.ask_before_switch)
        self._fill_devices()
        self._update_buttons()

    def _build_timers(self) -> None:
        """The meter's poll, the pre-roll before "speak now", and playback's clock."""
        self.meter_timer = QTimer(self)
        self.meter_timer.setInterval(METER_MS)
        self.meter_timer.timeout.connect(self._poll_meter)
        self.preroll_timer = QTimer(self)
        self.preroll_timer.setSingleShot(True)
        self.preroll_timer.setInterval(PREROLL_MS)
        self.preroll_timer.timeout.connect(self._speak_now)
        self.play_timer = QTimer(self)
        self.play_timer.setInterval(100)
        self.play_timer.timeout.connect(self._show_playing)

    # -- building ----------------------------------------------------------------
    def _build_devices(self) -> None:
        self.input_combo = QComboBox()
        self.output_combo = QComboBox()
        self.input_combo.currentIndexChanged.connect(self._input_changed)
        self.output_combo.currentIndexChanged.connect(self._output_changed)
        self.test_btn = button("Test input", "record", slot=self.toggle_test,
                               tip="Watch the meter while you speak; nothing is saved.")
        dev_row = hbox(QLabel("Microphone"), self.input_combo, self.test_btn,
                       QLabel("Speakers"), self.output_combo, stretch_at=5)
        self.outer.addWidget(dev_row)

    def _build_meter(self) -> None:
        meter_box = QWidget()
        ml = QGridLayout(meter_box)
        ml.setContentsMargins(0, 0, 0, 0)
        self.meter = LevelMeter()
        self.rec_state = QLabel("Ready")
        self.rec_state.setObjectName("StateLabel")
        self.rec_state.setWordWrap(True)
        self.rec_time = QLabel("0:00")
        self.clip_label = QLabel("")
        self.clip_label.setObjectName("ClipWarning")
        self.clip_label.setWordWrap(True)
        ml.addWidget(self.rec_state, 0, 0)
        ml.addWidget(self.meter, 0, 1)
        ml.addWidget(self.rec_time, 0, 2)
        ml.addWidget(self.clip_label, 1, 1)
        ml.setColumnStretch(1, 1)
        self.outer.addWidget(meter_box)

    def _build_controls(self) -> None:
        self.rec_btn = button("Record", "rec-dot", primary=True, slot=self.toggle_record,
                              tip="Space")
        self.accept_btn = button("Accept", "check", slot=self.accept, tip="Enter")
        self.retake_btn = button("Re-take", "retake", slot=self.retake,
                                 tip="R: drop this take and record again")
        self.discard_btn = button("Discard", "stop", slot=self.discard,
                                  tip="Delete: drop this take without recording")
        self.play_btn = button("Play", "play", slot=self.play, tip="P")
        self.skip_btn = button("Skip", "skip", slot=self.skip, tip="S")
        self.back_btn = button("Back", "resume", slot=self.back,
                               tip="B: the previous prompt; recording it again replaces its take")
        self.style_btn = button("Next style", "skip", slot=self.next_style,
                                tip="N: the next prompt of a style that still needs takes")
        # Next style sits by the styles it counts (_build_progress): eight buttons in one
        # row were wider than the page at the window's minimum size in the app's theme
        self.outer.addWidget(hbox(self.rec_btn, self.accept_btn, self.retake_btn,
                                  self.discard_btn, self.play_btn, self.back_btn,
                                  self.skip_btn, stretch_at=7))

    def _build_progress(self) -> None:
        prog = QVBoxLayout()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress_label = QLabel("")
        self.progress_label.setObjectName("Muted")
        # which styles still need takes (the set's style prompts, engine.layout.prompts)
        self.style_label = QLabel("")
        self.style_label.setObjectName("Muted")
        prog.addWidget(self.progress_label)
        prog.addWidget(hbox(self.style_label, self.style_btn, stretch_at=2))
        prog.addWidget(self.progress)
        self.outer.addLayout(prog)

    # -- devices -----------------------------------------------------------------
    def _fill_devices(self) -> None:
        self.input_combo.blockSignals(True)
        self.output_combo.blockSignals(True)
        self.input_combo.clear()
        self.output_combo.clear()
        if self.has_mic:
            self.input_combo.addItem("System default", None)
        else:
            self.input_combo.addItem("No microphone found", None)
            # without PortAudio no device is listed: say what to install instead
            self._set_state(unavailable() or au.NO_MICROPHONE, warn=True)
        self.input_combo.setEnabled(self.has_mic)
        self.output_combo.addItem("System default", None)
        for d in au.input_devices():
            self.input_combo.addItem(d.label, d.index)
        for d in au.output_devices():
            self.output_combo.addItem(d.label, d.index)
        saved_in = self.ctx.settings.value("audio/input_device")
        saved_out = self.ctx.settings.value("audio/output_device")
        for combo, saved in ((self.input_combo, saved_in), (self.output_combo, saved_out)):
            if saved not in (None, "", "None"):
                i = combo.findData(int(saved))
                if i >= 0:
                    combo.setCurrentIndex(i)
        self.input_combo.blockSignals(False)
        self.output_combo.blockSignals(False)

    def input_device(self) -> int | None:
        return self.input_combo.currentData()

    def _input_changed(self, _i: int) -> None:
        dev = self.input_device()
        self.ctx.save_setting("audio/input_device", "" if dev is None else dev)

    def _output_changed(self, _i: int) -> None:
        self.ctx.set_output_device(self.output_combo.currentData())

    def _record_failed(self, message: str) -> None:
        self._set_state(message, warn=True)
        self._after(show_error(self, "Recording failed", message))

    def toggle_test(self) -> None:
        if self.testing:
            self.recorder.abort()
            self.testing = False
            self.meter_timer.stop()
            self.meter.reset()
            self.test_btn.setText("Test input")
            self._set_state("Ready")
        elif not self.recorder.active:
            if self.recorder.start(self.input_device(), keep=False):
                self.testing = True
                self.meter.reset()
                self.meter_timer.start()
                self.test_btn.setText("Stop test")
                self._set_state("Testing input: speak now")
        self._update_buttons()

    def _voice_switched(self, _voice: object) -> None:
        """Another voice: its own next prompt and state, nothing of the last voice's. A take
        was kept or dropped before (`ask_before_switch`); one left (its voice folder moved
        away under it) is not saved into the voice now open."""
        if self.recorder.active:
            self.recorder.abort()
            self.testing = False
            self._end_recording_ui()
        self._reset_take()
        self.revisiting = False
        self.prompt = None
        self._pending_choice = None
        self._set_state("Ready: Space to record" if self.has_mic
                        else (unavailable() or au.NO_MICROPHONE), warn=not self.has_mic)
        if self.isVisible():  # the page's own refresh may have come first, with the old prompt
            self._show_snapshot(self.ctx.reader.cached(self.voice) if self.voice else None)

    # -- state -------------------------------------------------------------------
    def _set_state(self, text: str, warn: bool = False) -> None:
        """The line under the prompt; a take that cannot train is said in the warning colour."""
        self.rec_state.setText(text)
        name = "Warn" if warn else "StateLabel"
        if self.rec_state.objectName() != name:
            self.rec_state.setObjectName(name)
            self.rec_state.style().unpolish(self.rec_state)
            self.rec_state.style().polish(self.rec_state)

    @property
    def state_warns(self) -> bool:
        return self.rec_state.objectName() == "Warn"

    def skip(self) -> None:
        if self.recorder.active or self.prompt is None:
            return
        self._reset_take()
        self.revisiting = False
        self.prompt = self.prompts.next(after=self.prompt)
        self._show_prompt()
        self._set_state("Ready: Space to record")
        self._update_buttons()

    def back(self) -> None:
        """The previous prompt, recorded or not: hear its take with P, record it with Space."""
        if self.recorder.active or self.voice is None or not self.prompts.prompts:
            return
        self._reset_take()
        self.revisiting = True
        self.prompt = self.prompts.previous(self.prompt)
        self._show_prompt()
        self.existing = self._load_existing(self.prompt.id) if self.prompt else None
        if self.existing is not None:
            self.wave.show_audio(*self.existing)
            self.rec_time.setText(fmt_duration(len(self.existing[0]) / self.existing[1]))
            self._set_state("Recorded already: P plays its take; Space records it again "
                            "(the new take replaces it)")
        else:
            self._set_state("Ready: Space to record")
        self._update_buttons()

    def _update_buttons(self) -> None:
        rec = self.recorder.active and not self.testing
        has_take = self.take_audio is not None and not rec
        can_record = self.voice is not None and self.prompt is not None
        self.rec_btn.setEnabled((can_record and self.has_mic) or rec)
        self.accept_btn.setEnabled(has_take)
        self.retake_btn.setEnabled(has_take and self.has_mic)
        self.discard_btn.setEnabled(has_take)
        self.play_btn.setEnabled((has_take or self.existing is not None) and not rec)
        self.skip_btn.setEnabled(can_record and not rec)
        self.style_btn.setEnabled(not rec and any(c.next_id for c in self.styles()))
        self.back_btn.setEnabled(self.voice is not None and bool(self.prompts.prompts)
                                 and not rec)
        self.test_btn.setEnabled(not rec and self.has_mic)
        self.set_combo.setEnabled(self.voice is not None and not rec)
        self.groups_btn.setEnabled(self.voice is not None and not rec
                                   and bool(self.prompts.all_groups))

    def _end_recording_ui(self) -> None:
        self.preroll_timer.stop()
        self.meter_timer.stop()
        self.rec_btn.setText("Record")

    def shown(self) -> None:
        self._enable_keys(True)
        super().shown()

    def hidden(self) -> None:
        self._enable_keys(False)
        # leaving the page ends a device test; a running take finishes normally
        if self.testing:
            self.toggle_test()

    def shutdown(self) -> None:
        self.preroll_timer.stop()
        self.meter_timer.stop()
        self.play_timer.stop()
        self.recorder.abort()
        self.testing = False
