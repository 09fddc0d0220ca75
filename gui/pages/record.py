"""Record: read the prompt aloud, keyboard first.

Space starts and stops, Enter accepts, R re-takes, Delete discards, P plays,
S skips, B goes back to the previous prompt (its take can be heard; recording
it again replaces it). "Speak now" shows once the input really delivers audio
and a short pre-roll has passed; the take is cut by the times Space was
pressed, and after stop the input stays open for a short hold so the last
word is not cut. Each take gets a verdict before it is kept: one that cannot
train (silent, clipped, cut off) is kept only after a deliberate confirm, its
verdict is written with it, and its prompt is offered again. A take is written
through the engine's workspace API the moment it is accepted; nothing accepted
lives only in memory, and Quit asks before a take under review is lost.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QComboBox,
    QGridLayout,
    QLabel,
    QMenu,
    QMessageBox,
    QProgressBar,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from engine.audio.checks import BLOCKING, take_clipping
from engine.audio.sound import unavailable
from engine.audio.vad import speech_regions
from engine.catalog import VoiceSnapshot
from engine.core.errors import VoxshardError
from engine.layout.prompts import StyleCount, get_prompt_set, list_prompt_sets, style_counts
from engine.layout.voice import (
    VERDICT_FLAGGED,
    VERDICT_GOOD,
    VERDICT_UNUSABLE,
    open_voice,
    take_verdict,
)
from gui import audio as au
from gui.context import AppContext
from gui.pages.base import Page
from gui.prompts_source import Prompt, PromptSource
from gui.widgets import Card, LevelMeter, WaveformView, button, fmt_duration, hbox, show_error

METER_MS = 33
#: capturing before "speak now": the first word is never cut by a late start
PREROLL_MS = 600
#: loudest sample below this (-20 dBFS) is a take recorded too far or too low
QUIET_PEAK = 0.1
#: faster than this, in words per second of speech, no one reads aloud: the take was cut
#: (a fast synthetic reader measured 4 words/s; people read about 2.5-3)
MAX_WORDS_PER_S = 6.0
FRAME_S = 0.02
#: speech less than this far above the room noise is reported as noisy
NOISY_SNR_DB = 20.0
#: the live waveform while recording: redrawn at this interval, the last this many seconds
LIVE_WAVE_MS = 150
LIVE_WAVE_S = 20.0


#: what the page says of a take with no sound in it (also written into its metadata)
SILENT = "Silent take: check the microphone, then re-take (R)."


@dataclass
class Judgement:
    """A take's verdict (engine.layout.voice VERDICT_*) and the sentences behind it."""

    verdict: str = VERDICT_GOOD
    warnings: list[str] = field(default_factory=list)

    def add(self, sentence: str, blocking: bool) -> None:
        """One finding; `blocking`: the take cannot train with it."""
        self.warnings.append(sentence)
        if blocking:
            self.verdict = VERDICT_UNUSABLE
        elif self.verdict == VERDICT_GOOD:
            self.verdict = VERDICT_FLAGGED


def judge_take(audio: np.ndarray, sr: int, text: str, overflows: int = 0) -> Judgement:
    """What is wrong with a take before it is kept. Silent, clipped or too short for its
    text (cut off) cannot train; too quiet, noisy, or with audio the input dropped
    (`overflows`: the device's overflow reports while recording) is advice."""
    mono = np.asarray(audio, dtype=np.float32)
    if mono.ndim > 1:
        mono = mono.mean(axis=1)
    out = Judgement()
    peak = float(np.max(np.abs(mono))) if mono.size else 0.0
    if mono.size == 0 or sr <= 0 or peak < 1e-4:
        out.add(SILENT, blocking=True)
        return out
    if peak < QUIET_PEAK:
        out.add(f"Too quiet (peak {20 * np.log10(peak):.0f} dBFS): move closer or raise "
                "the input gain, then re-take (R).", blocking=False)
    n = max(1, int(FRAME_S * sr))
    frames = mono[: len(mono) // n * n].reshape(-1, n)
    if len(frames):
        _judge_frames(out, np.sqrt(np.mean(frames**2, axis=1)), peak, text)
    if overflows:
        out.add(f"Audio was lost: the computer was too busy to read the microphone "
                f"in time ({overflows} gap{'s' if overflows > 1 else ''}). Close other "
                "programs, then re-take (R).", blocking=False)
    clipping = take_clipping(audio)  # Prepare's own verdict, so Record keeps what it keeps
    if clipping is not None and clipping["code"] in BLOCKING:
        out.add("Clipped: the loudest parts hit the limit. Move back or lower the "
                "input gain, then re-take (R).", blocking=True)
    return out


def _judge_frames(out: Judgement, rms: np.ndarray, peak: float, text: str) -> None:
    """Too short for the text, and noisy, from the loudness of 20 ms frames."""
    # speech spans from the first to the last frame within 30 dB of the loudest
    # (pauses between words count, room noise before and after does not)
    loud = np.flatnonzero(rms > max(1e-3, 0.03 * float(rms.max())))
    span_s = float(loud[-1] - loud[0] + 1) * FRAME_S if len(loud) else 0.0
    words = len(re.findall(r"\w+", text))
    if words and span_s < words / MAX_WORDS_PER_S:
        out.add(f"Too short for the sentence ({words} words in {span_s:.1f} s of "
                "speech): cut off, or read too fast? Re-take (R).", blocking=True)
    if peak >= QUIET_PEAK and len(rms) >= 20:
        # the room's noise (quietest tenth of the frames) against the speech (loudest
        # tenth): under 20 dB apart, the noise is learned with the voice
        quiet, loud_rms = np.percentile(rms, 10), np.percentile(rms, 90)
        snr = 20 * np.log10(max(float(loud_rms), 1e-9) / max(float(quiet), 1e-9))
        if snr < NOISY_SNR_DB:
            out.add(f"Noisy: the speech is only {snr:.0f} dB above the room "
                    "noise. Record somewhere quieter, then re-take (R).", blocking=False)


def take_warnings(audio: np.ndarray, sr: int, text: str, overflows: int = 0) -> list[str]:
    """The sentences of `judge_take`, without the one saying the take is silent."""
    return [w for w in judge_take(audio, sr, text, overflows).warnings if w != SILENT]


#: silence kept before and after the speech of a take; more is cut when the take stops
#: (a quit dialog left open once joined 7 s of silence to a good take)
TRIM_KEEP_S = 0.5


def trim_take(audio: np.ndarray, sr: int) -> tuple[np.ndarray, float]:
    """The take with the silence around its speech (the engine's `speech_regions`) cut to
    TRIM_KEEP_S each side, and the seconds cut; unchanged when no speech is found."""
    mono = np.asarray(audio, dtype=np.float32)
    if mono.ndim > 1:
        mono = mono.mean(axis=1)
    regions = speech_regions(mono, sr) if mono.size and sr > 0 else []
    if not regions:
        return audio, 0.0
    keep = int(TRIM_KEEP_S * sr)
    start = max(0, regions[0][0] - keep)
    end = min(len(mono), regions[-1][1] + keep)
    return audio[start:end], (len(mono) - (end - start)) / float(sr)


class RecordPage(Page):
    title = "Record"
    subtitle = ("Read each sentence naturally, in a quiet room. Space: record/stop · "
                "Enter: accept · R: re-take · Delete: discard · P: play · S: skip · "
                "B: back")
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
        self.clipped = False
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
        ctx.player.finished.connect(self._play_finished)

        # window-wide while this page is shown (enabled in shown()), so the keys
        # work wherever the focus is; they win over a focused button's Space
        self.shortcuts: list[QShortcut] = []
        for key, slot in ((Qt.Key.Key_Space, self.toggle_record),
                          (Qt.Key.Key_Return, self.accept), (Qt.Key.Key_Enter, self.accept),
                          (Qt.Key.Key_R, self.retake), (Qt.Key.Key_P, self.play),
                          (Qt.Key.Key_Delete, self.discard),
                          (Qt.Key.Key_Backspace, self.discard),
                          (Qt.Key.Key_S, self.skip), (Qt.Key.Key_B, self.back)):
            sc = QShortcut(QKeySequence(key), self)
            sc.setContext(Qt.ShortcutContext.WindowShortcut)
            sc.activated.connect(slot)
            sc.setEnabled(False)
            self.shortcuts.append(sc)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        ctx.reader.voice_loaded.connect(self._voice_loaded)
        ctx.voice_changed.connect(self._voice_switched)
        self._fill_devices()
        self._update_buttons()

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

    def _build_prompt_card(self) -> None:
        card = Card()
        # which sentences to read: the set, and optionally only some of its groups
        self.set_combo = QComboBox()
        self.set_combo.setToolTip("The sentences to read (saved with the voice)")
        self.set_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.set_combo.activated.connect(self._set_chosen)
        self.groups_btn = QToolButton()
        self.groups_btn.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.groups_btn.setToolTip("Read only some groups of the set (saved with the voice)")
        self.groups_menu = QMenu(self.groups_btn)
        self.groups_btn.setMenu(self.groups_menu)
        self.groups_btn.setText("Groups: all")
        self.prompt_meta = QLabel("")
        self.prompt_meta.setObjectName("PromptMeta")
        # a style prompt's line is long: it wraps rather than squeeze the set's name
        self.prompt_meta.setWordWrap(True)
        self.prompt_label = QLabel("Open a voice to start recording.")
        self.prompt_label.setObjectName("Prompt")
        self.prompt_label.setWordWrap(True)
        self.prompt_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        # two lines of the theme's 22pt prompt and its 18 px padding: 150 px left the page
        # taller than the window at its minimum size, and the card cut the prompt off
        self.prompt_label.setMinimumHeight(110)
        meta_row = hbox(self.prompt_meta, self.set_combo, self.groups_btn)
        meta_row.layout().setStretch(0, 1)  # the line takes the room left, wrapping past it
        card.layout_.addWidget(meta_row)
        card.layout_.addWidget(self.prompt_label, 1)
        self.outer.addWidget(card, 2)

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
                                tip="The next prompt of a style that still needs takes")
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

    def take_keys_back(self) -> None:
        """After a dialog: the window active again and the focus on this page, so Space
        and the other keys reach the page (once Space pressed a button the window had
        focused instead, About, while a take ran on)."""
        if not self.isVisible():
            return
        self.window().activateWindow()
        self.setFocus(Qt.FocusReason.OtherFocusReason)

    def _after(self, box: QMessageBox) -> None:
        """The page takes its keys back once `box` is answered (after its own handler)."""
        box.finished.connect(lambda _r: QTimer.singleShot(0, self.take_keys_back))

    def _voice_switched(self, _voice: object) -> None:
        """Another voice: its own next prompt and state, nothing of the last voice's."""
        if self.recorder.active and not self.testing:
            return  # the take goes on; it is the voice it was started for
        self._reset_take()
        self.revisiting = False
        self.prompt = None
        self._pending_choice = None
        self._set_state("Ready: Space to record" if self.has_mic
                        else (unavailable() or au.NO_MICROPHONE), warn=not self.has_mic)
        if self.isVisible():  # the page's own refresh may have come first, with the old prompt
            self._show_snapshot(self.ctx.reader.cached(self.voice) if self.voice else None)

    # -- prompt ------------------------------------------------------------------
    def refresh(self) -> None:
        self._show_snapshot(self.ctx.reader.refresh(self.voice))

    def _voice_loaded(self, voice: Path, snap: VoiceSnapshot) -> None:
        if voice == self.voice and self.isVisible():
            self._show_snapshot(snap)

    def _show_snapshot(self, snap: VoiceSnapshot | None) -> None:
        if self.recorder.active and not self.testing:
            return  # never pull the prompt from under a running take
        if self.voice is None:
            self.prompt = None
            self.prompt_label.setText("Open or create a voice on the Voices page first.")
            self.prompt_meta.setText("")
        elif snap is None:
            self.prompt = None
            self.prompt_label.setText("Reading the voice…")
            self.prompt_meta.setText("")
        else:
            # a take accepted a moment ago counts even before the re-read reaches here;
            # an unusable take's prompt is read again (engine: Take.fills_prompt)
            done = {t.prompt_id for t in snap.takes
                    if t.prompt_id and take_verdict(t.extra) != VERDICT_UNUSABLE}
            self.prompts.load(*self._prompt_choice(snap),
                              done | self.accepted.get(self.voice, set()))
            in_set = self.prompt is not None and any(p.id == self.prompt.id
                                                     for p in self.prompts.prompts)
            if not in_set or (self.prompts.is_done(self.prompt) and not self.revisiting
                              and self.take_audio is None):
                self.prompt = self.prompts.next()
            self._show_prompt()
        self._fill_prompt_choice(snap)
        self._update_progress(snap)
        self._show_styles()
        self._update_buttons()

    def _prompt_choice(self, snap: VoiceSnapshot) -> tuple[str, tuple[str, ...]]:
        """The set and groups to read: the snapshot's, unless this page has just chosen
        others and the snapshot was read before that reached the disk."""
        read = (snap.prompt_set, tuple(snap.prompt_groups))
        if self._pending_choice is None or self._pending_choice == read:
            self._pending_choice = None
            return read
        return self._pending_choice

    def _show_prompt(self) -> None:
        if self.prompt is None:
            self.prompt_label.setText(self.prompts.error or
                                      "Every prompt of this set is recorded. Well done!")
            self.prompt_meta.setText("")
            return
        done, total = self.prompts.counts()
        self.prompt_label.setText(self.prompt.text)
        again = ("  ·  recorded already: a new take replaces it"
                 if self.prompts.is_done(self.prompt) else "")
        style = f"  ·  read it this way: {self.prompt.style}" if self.prompt.style else ""
        self.prompt_meta.setText(f"Prompt {self.prompt.id}  ·  {self.prompt.group}  ·  "
                                 f"{done} of {total} recorded{again}{style}")

    def _fill_prompt_choice(self, snap: VoiceSnapshot | None) -> None:
        """The set and group pickers show what the voice reads."""
        self.set_combo.blockSignals(True)
        self.set_combo.clear()
        if snap is not None:
            try:
                sets = list_prompt_sets()
            except VoxshardError:
                sets = []
            for ps in sets:
                self.set_combo.addItem(f"{ps.title or ps.name} ({len(ps)})", ps.name)
            i = self.set_combo.findData(self.prompts.set_name)
            self.set_combo.setCurrentIndex(i)
        self.set_combo.blockSignals(False)
        groups = self.prompts.all_groups if snap is not None else []
        if [a.text() for a in self.groups_menu.actions()] != groups:
            # rebuilt only when the set's groups differ: never under a toggling action
            self.groups_menu.clear()
            for group in groups:
                act = QAction(group, self.groups_menu)
                act.setCheckable(True)
                act.toggled.connect(lambda _on, g=group: self._group_toggled(g))
                self.groups_menu.addAction(act)
        chosen = set(self.prompts.groups)
        for act in self.groups_menu.actions():
            act.blockSignals(True)
            act.setChecked(not chosen or act.text() in chosen)
            act.blockSignals(False)
        every = not chosen or chosen >= set(self.prompts.all_groups)
        self.groups_btn.setText("Groups: all" if every else f"Groups: {len(chosen)} of "
                                f"{len(self.prompts.all_groups)}")

    def _set_chosen(self, _i: int) -> None:
        name = self.set_combo.currentData()
        if not name or name == self.prompts.set_name or self.voice is None:
            return
        try:
            voice = open_voice(self.voice)
            language = get_prompt_set(str(name)).language.strip().lower()
        except VoxshardError as exc:
            self._after(show_error(self, "The prompts were not changed", exc.message,
                                   exc.hint or ""))
            return
        if not language or language == voice.language.strip().lower():
            self._save_prompt_choice(str(name), [])
            return
        self._ask_language(str(name), language, voice.language, voice.display_name)

    def _ask_language(self, set_name: str, language: str, current: str, who: str) -> None:
        """A set in another language: its takes are judged and trained in the voice's
        language, so the voice changes with it, or the set does not."""
        box = QMessageBox(QMessageBox.Icon.Question, "Read sentences in another language?",
                          f"These sentences are in {language.capitalize()}; {who} speaks "
                          f"{current.capitalize()}. Change {who}'s language to "
                          f"{language.capitalize()}?", QMessageBox.StandardButton.NoButton,
                          self)
        change = box.addButton(f"Change to {language.capitalize()}",
                               QMessageBox.ButtonRole.AcceptRole)
        keep = box.addButton(f"Keep {current.capitalize()}", QMessageBox.ButtonRole.RejectRole)
        box.setDefaultButton(keep)
        box.setEscapeButton(keep)
        box.setInformativeText("Takes are checked and trained in the voice's language: "
                               "a voice reads one language.")
        self._language_box = box

        def answered(_r: int) -> None:
            self._language_box = None
            if box.clickedButton() is change and self.voice is not None:
                try:
                    open_voice(self.voice).set_language(language)
                except VoxshardError as exc:
                    self._after(show_error(self, "The language was not changed",
                                           exc.message, exc.hint or ""))
                    return
                self._save_prompt_choice(set_name, [])
            else:  # the picker shows the set still read
                self._fill_prompt_choice(self.ctx.reader.cached(self.voice)
                                         if self.voice else None)

        box.finished.connect(answered)
        self._after(box)
        box.open()

    def _group_toggled(self, group: str) -> None:
        every = self.prompts.all_groups
        chosen = set(self.prompts.groups or every)
        chosen ^= {group}
        if not chosen:
            self._set_state("Keep at least one group ticked: there would be nothing to read.",
                            warn=True)
            self._fill_prompt_choice(self.ctx.reader.cached(self.voice) if self.voice else None)
            return
        self._save_prompt_choice(self.prompts.set_name, [g for g in every if g in chosen])

    def _save_prompt_choice(self, set_name: str, groups: list[str]) -> None:
        """Store the set and groups in voice.toml; the next prompt comes from them."""
        if self.voice is None or (self.recorder.active and not self.testing):
            return
        try:
            voice = open_voice(self.voice)
            voice.set_prompts(set_name, groups)
        except VoxshardError as exc:
            self._after(show_error(self, "The prompts were not changed", exc.message,
                                   exc.hint or ""))
            return
        self._pending_choice = (voice.prompt_set, tuple(voice.prompt_groups))
        self._reset_take()
        self.revisiting = False
        self.prompt = None  # the first unrecorded prompt of the new choice
        self._show_snapshot(self.ctx.reader.cached(self.voice))
        self._set_state("Ready: Space to record")
        self.ctx.notify_changed()

    def _update_progress(self, snap: VoiceSnapshot | None) -> None:
        if self.voice is None or snap is None:
            self.progress.setValue(0)
            self.progress_label.setText("")
            return
        # Prepare's count (engine.layout.manifest.SpeechCount), not the takes' raw length:
        # a silent take, a take left out and trailing silence count nothing toward it
        minutes = snap.minutes_in_use
        target = float(snap.summary["recommended_minutes"])
        self.progress.setValue(int(min(1.0, minutes / target) * 1000))
        self.progress.setFormat(f"{minutes:.1f} of {target:.0f} min")
        self.progress_label.setText(
            f"{minutes:.1f} minutes of usable speech recorded · "
            f"{max(0.0, target - minutes):.1f} more recommended" if minutes < target
            else f"{minutes:.1f} minutes of usable speech recorded · enough to train")

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

    def _reset_take(self) -> None:
        """Forget the take under review, its verdict and waveform (a new prompt, or none)."""
        self._stop_playing()
        self.take_audio = None
        self.existing = None
        self.clipped = False
        self.trimmed_s = 0.0
        self.judgement = Judgement()
        self.clip_label.setText("")
        self.rec_time.setText("0:00")
        self.wave.clear_audio()
        self.accept_btn.setText("Accept")

    @property
    def warnings(self) -> list[str]:
        return self.judgement.warnings

    # -- actions -----------------------------------------------------------------
    def toggle_record(self) -> None:
        if self.testing:
            self.toggle_test()
        if self.recorder.stopping:
            return
        if self.recorder.active:
            self.recorder.stop()
            self._set_state("Finishing…")
            self._update_buttons()
            return
        if self.voice is None or self.prompt is None or not self.has_mic:
            return
        self.ctx.player.stop()
        self._reset_take()
        self.said_speak_now = False
        if self.recorder.start(self.input_device()):
            self.meter.reset()
            self.meter_timer.start()
            self._set_state("Get ready…")  # until the input delivers and the pre-roll ends
            self.preroll_timer.start()
            self.rec_btn.setText("Stop")
        self._update_buttons()

    def _speak_now(self) -> None:
        """Say "speak now" once the pre-roll has passed and the input really delivers
        audio (an input can begin seconds after the stream is opened)."""
        if self.said_speak_now or self.preroll_timer.isActive() or self.testing:
            return
        if self.recorder.active and not self.recorder.stopping and self.recorder.heard:
            self.said_speak_now = True
            self._set_state("● Recording: speak now")

    def _poll_meter(self) -> None:
        peak, _rms, clipped = self.recorder.read_level()
        self.meter.set_level(peak, clipped > 0)
        if self.recorder.active:
            self._speak_now()
            self.rec_time.setText(fmt_duration(self.recorder.seconds()))
            self._live_ticks += 1
            if self._live_ticks * METER_MS >= LIVE_WAVE_MS and not self.testing:
                # the take as it is spoken (the last seconds), redrawn a few times a second
                self._live_ticks = 0
                live = self.recorder.recent(LIVE_WAVE_S)
                if live.size:
                    self.wave.show_audio(live, self.recorder.samplerate)
                    self.live_draws += 1
        if clipped and not self.clipped and not self.testing:
            self.clipped = True
            self.clip_label.setText("Clipping: the input is too loud. Move back or lower "
                                    "the input gain, then re-take.")

    def _stopped(self, audio: np.ndarray, sr: int) -> None:
        self.preroll_timer.stop()
        self.meter_timer.stop()
        self.meter.reset()
        audio, self.trimmed_s = trim_take(audio, sr)
        self.take_audio = audio
        self.take_sr = sr
        self.rec_btn.setText("Record")
        self.wave.show_audio(audio, sr)
        self.rec_time.setText(fmt_duration(len(audio) / float(sr or 1)))
        self.judgement = judge_take(audio, sr, self.prompt.text if self.prompt else "",
                                    self.recorder.overflows)
        self._show_verdict()
        self._update_buttons()

    def _show_verdict(self) -> None:
        j = self.judgement
        shown = [w for w in j.warnings if w != SILENT]
        if self.clipped:  # the live clipping note says the same as the verdict's
            shown = [w for w in shown if not w.startswith("Clipped")]
            shown.insert(0, self.clip_label.text())
        if self.trimmed_s >= 1.0:  # said when it matters; a breath's worth is not news
            shown.append(f"Trimmed {self.trimmed_s:.1f} s of silence before and after the "
                         "speech.")
        self.clip_label.setText("\n".join(shown))
        if j.verdict == VERDICT_UNUSABLE:
            first = j.warnings[0] if j.warnings[0] == SILENT else "This take cannot train."
            self._set_state(f"{first} Enter asks before keeping it.", warn=True)
            self.accept_btn.setText("Keep anyway…")
        elif j.verdict == VERDICT_FLAGGED or self.clipped:
            self._set_state("Review: Enter to accept, R to re-take, P to play")
        else:
            self._set_state("✓ Good take: Enter to accept, R to re-take, P to play")

    def accept(self) -> bool:
        """Save the take through the engine workspace and move to the next prompt. A take
        that cannot train is saved only after the confirm this opens says so."""
        if self.take_audio is None or self.voice is None or self.prompt is None:
            return False
        if self.recorder.active:
            return False
        if self.judgement.verdict == VERDICT_UNUSABLE:
            self._ask_keep_unusable()
            return False
        return self._save_take()

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

    def _save_take(self) -> bool:
        assert self.take_audio is not None and self.voice is not None
        assert self.prompt is not None
        voice = open_voice(self.voice)
        replaced = self._takes_of(self.prompt.id)
        j = self.judgement
        extra = {"clipped": self.clipped, "prompt_set": self.prompts.set_name,
                 "verdict": VERDICT_FLAGGED if self.clipped and j.verdict == VERDICT_GOOD
                 else j.verdict}
        if j.warnings:
            extra["warnings"] = list(j.warnings)
        if self.prompt.style:  # a style prompt's take trains with its description
            extra["style"] = self.prompt.style
        try:
            take = voice.add_take(self.take_audio, self.prompt.text, sample_rate=self.take_sr,
                                  prompt_id=self.prompt.id, extra=extra)
        except VoxshardError as exc:
            self._after(show_error(self, "The take was not saved", exc.message,
                                   exc.hint or ""))
            return False
        gone = []
        for old in replaced:  # the new take is saved first: a failure here loses nothing
            try:
                gone.append(voice.delete_take(old).id)
            except VoxshardError:
                continue  # already gone (deleted elsewhere)
        self.saved_ids[(self.voice, self.prompt.id)] = take.id
        self.saved_takes += 1
        self.revisiting = False
        self.ctx.status.emit(f"Saved take for prompt {self.prompt.id}"
                             + (f", replacing {', '.join(gone)}" if gone else ""))
        self._reset_take()
        saved = self.prompt
        if take.fills_prompt:
            self.prompts.mark_done(saved)
            self.accepted.setdefault(self.voice, set()).add(saved.id)
        else:  # kept, but the prompt is read again: it comes back after the others
            self.prompts.done.discard(saved.id)
            self.accepted.get(self.voice, set()).discard(saved.id)
        self.prompt = self.prompts.next(after=saved)
        self._show_prompt()
        self._show_styles()
        self._set_state("Saved. Space to record the next one" if take.fills_prompt else
                        f"Kept, but it cannot train: prompt {saved.id} is offered again. "
                        "Space to record the next one", warn=not take.fills_prompt)
        self._update_buttons()
        self.ctx.notify_changed()  # the re-read brings the new minutes
        return True

    def retake(self) -> None:
        if self.recorder.active:
            return
        self._reset_take()
        self._set_state("Ready: Space to record again")
        self._update_buttons()
        self.toggle_record()

    def discard(self) -> None:
        """Drop the take under review without recording another."""
        if self.recorder.active or self.take_audio is None:
            return
        self._reset_take()
        self._set_state("Discarded. Space to record it again")
        self._update_buttons()

    def play(self) -> None:
        if self.recorder.active:
            return
        if self.playing:
            self.ctx.player.stop()
            return
        audio = (self.take_audio, self.take_sr) if self.take_audio is not None \
            else self.existing
        if audio is None:
            return
        self._state_before_play = (self.rec_state.text(), self.state_warns)
        self._play_total = len(audio[0]) / float(audio[1] or 1)
        if self.ctx.player.play(audio[0], audio[1]):
            self.playing = True
            self.play_btn.setText("Stop")
            self.play_timer.start()
            self._show_playing()

    def _show_playing(self) -> None:
        if not self.playing:
            return
        self._set_state(f"▶ Playing {fmt_duration(self.ctx.player.position_s())} of "
                        f"{fmt_duration(self._play_total)}: P stops")

    def _play_finished(self) -> None:
        if not self.playing:
            return  # another page's playback
        self.playing = False
        self.play_timer.stop()
        self.play_btn.setText("Play")
        text, warn = self._state_before_play
        self._set_state(text, warn)

    def _stop_playing(self) -> None:
        if self.playing:
            self.ctx.player.stop()  # finished -> _play_finished

    def skip(self) -> None:
        if self.recorder.active or self.prompt is None:
            return
        self._reset_take()
        self.revisiting = False
        self.prompt = self.prompts.next(after=self.prompt)
        self._show_prompt()
        self._set_state("Ready: Space to record")
        self._update_buttons()

    def styles(self) -> list[StyleCount]:
        """The takes per style of the prompts read (the engine's count, with the takes
        accepted here that the snapshot may not show yet)."""
        return style_counts(self.prompts.prompts, self.prompts.done) if self.voice else []

    def _show_styles(self) -> None:
        counts = self.styles()
        self.style_label.setText("Styles: " + " · ".join(
            f"{c.group} {c.recorded}/{c.total}" for c in counts) if counts else "")
        self.style_btn.setVisible(bool(counts))  # a set without styles: nothing to go to
        self.style_label.setToolTip("\n".join(
            f"{c.group}: {c.style} {c.recorded} of {c.total} recorded" for c in counts))

    def next_style(self) -> None:
        """The first unrecorded prompt of the next style still needing takes (after the
        shown prompt's style, in set order, wrapping around)."""
        if self.recorder.active:
            return
        needing = [c for c in self.styles() if c.next_id]
        if not needing:
            return
        styles = [c.style for c in self.styles()]
        at = styles.index(self.prompt.style) if self.prompt and self.prompt.style in styles \
            else -1
        after = [c for c in needing if styles.index(c.style) > at]
        target = (after or needing)[0].next_id
        self._reset_take()
        self.revisiting = False
        self.prompt = next((p for p in self.prompts.prompts if p.id == target), self.prompt)
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

    def _load_existing(self, prompt_id: str) -> tuple[np.ndarray, int] | None:
        """The newest saved take of a prompt, to hear (None when it has none)."""
        assert self.voice is not None
        for take_id in reversed(self._takes_of(prompt_id)):
            try:
                path = open_voice(self.voice).find_take(take_id).audio_path
                audio, sr = sf.read(str(path), dtype="float32", always_2d=True)
            except (VoxshardError, OSError, RuntimeError):
                continue  # deleted meanwhile, or unreadable: the older one, else none
            return audio.mean(axis=1), int(sr)
        return None

    def _takes_of(self, prompt_id: str) -> list[str]:
        """Ids of the takes already holding a prompt (the snapshot's, and this session's)."""
        assert self.voice is not None
        snap = self.ctx.reader.cached(self.voice)
        ids = {t.id for t in snap.takes if t.prompt_id == prompt_id} if snap else set()
        saved = self.saved_ids.get((self.voice, prompt_id))
        return sorted(ids | ({saved} if saved else set()))

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

    def _end_recording_ui(self) -> None:
        self.preroll_timer.stop()
        self.meter_timer.stop()
        self.rec_btn.setText("Record")

    def shown(self) -> None:
        for sc in self.shortcuts:
            sc.setEnabled(True)
        super().shown()

    def hidden(self) -> None:
        for sc in self.shortcuts:
            sc.setEnabled(False)
        # leaving the page ends a device test; a running take finishes normally
        if self.testing:
            self.toggle_test()

    def shutdown(self) -> None:
        self.preroll_timer.stop()
        self.meter_timer.stop()
        self.play_timer.stop()
        self.recorder.abort()
        self.testing = False
