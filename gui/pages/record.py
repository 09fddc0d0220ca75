"""Record: read the prompt aloud, keyboard first.

Space starts and stops, Enter accepts, R re-takes, P plays, S skips, B goes
back to the previous prompt (a recorded one is recorded again: the new take
replaces it). Recording starts with a short pre-roll (the input is already
capturing while "Get ready" shows, so the first word is never clipped); after
stop the input stays open for a short hold so the last word is not cut. A
take that is too quiet, or too short for its sentence, is flagged before it
is accepted. A take is written through the engine's workspace API the moment
it is accepted; nothing accepted lives only in memory.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QComboBox,
    QGridLayout,
    QLabel,
    QProgressBar,
    QVBoxLayout,
    QWidget,
)

from engine.audio.sound import unavailable
from engine.catalog import VoiceSnapshot
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


def take_warnings(audio: np.ndarray, sr: int, text: str, overflows: int = 0) -> list[str]:
    """What is wrong with a take before it is kept: too quiet, clipped, noisy, too short
    for its text (cut off, or read too fast), or with audio the input dropped
    (`overflows`: the device's overflow reports while recording)."""
    mono = np.asarray(audio, dtype=np.float32)
    if mono.ndim > 1:
        mono = mono.mean(axis=1)
    if mono.size == 0 or sr <= 0:
        return []
    warnings = []
    peak = float(np.max(np.abs(mono)))
    if 1e-4 <= peak < QUIET_PEAK:
        warnings.append(f"Too quiet (peak {20 * np.log10(peak):.0f} dBFS): move closer or raise "
                        "the input gain, then re-take (R).")
    n = max(1, int(FRAME_S * sr))
    frames = mono[: len(mono) // n * n].reshape(-1, n)
    if len(frames):
        rms = np.sqrt(np.mean(frames**2, axis=1))
        # speech spans from the first to the last frame within 30 dB of the loudest
        # (pauses between words count, room noise before and after does not)
        loud = np.flatnonzero(rms > max(1e-3, 0.03 * float(rms.max())))
        span_s = float(loud[-1] - loud[0] + 1) * FRAME_S if len(loud) else 0.0
        words = len(re.findall(r"\w+", text))
        if peak >= 1e-4 and words and span_s < words / MAX_WORDS_PER_S:
            warnings.append(f"Too short for the sentence ({words} words in {span_s:.1f} s of "
                            "speech): cut off, or read too fast? Re-take (R).")
        if peak >= QUIET_PEAK and len(rms) >= 20:
            # the room's noise (quietest tenth of the frames) against the speech (loudest
            # tenth): under 20 dB apart, the noise is learned with the voice
            quiet, loud_rms = np.percentile(rms, 10), np.percentile(rms, 90)
            snr = 20 * np.log10(max(float(loud_rms), 1e-9) / max(float(quiet), 1e-9))
            if snr < NOISY_SNR_DB:
                warnings.append(f"Noisy: the speech is only {snr:.0f} dB above the room "
                                "noise. Record somewhere quieter, then re-take (R).")
    if overflows:
        warnings.append(f"Audio was lost: the computer was too busy to read the microphone "
                        f"in time ({overflows} gap{'s' if overflows > 1 else ''}). Close other "
                        "programs, then re-take (R).")
    if float(np.mean(np.abs(mono) >= 0.999)) > 0.0005:
        warnings.append("Clipped: the loudest parts hit the limit. Move back or lower the "
                        "input gain, then re-take (R).")
    return warnings


class RecordPage(Page):
    title = "Record"
    subtitle = ("Read each sentence naturally, in a quiet room. "
                "Space: record/stop · Enter: accept · R: re-take · P: play · S: skip")
    icon_name = "record"

    def __init__(self, ctx: AppContext, parent: QWidget | None = None) -> None:
        super().__init__(ctx, parent)
        self.recorder = au.Recorder(self)
        self.no_sound = unavailable()  # no PortAudio: nothing can be recorded; say why
        self.recorder.stopped.connect(self._stopped)
        self.recorder.failed.connect(lambda m: show_error(self, "Recording failed", m))
        self.prompts = PromptSource()
        self.prompt: Prompt | None = None
        self.take_audio: np.ndarray | None = None
        self.take_sr = 48000
        self.clipped = False
        self.saved_takes = 0
        self.accepted: dict[Path, set[str]] = {}  # prompt ids saved here, per voice
        self.saved_ids: dict[tuple[Path, str], str] = {}  # (voice, prompt id) -> take id
        self.revisiting = False  # B brought back a prompt that may be recorded already
        self.warnings: list[str] = []
        self._live_ticks = 0
        self.live_draws = 0  # live waveform redraws (tests count them)
        self.testing = False

        # devices
        self.input_combo = QComboBox()
        self.output_combo = QComboBox()
        self.input_combo.currentIndexChanged.connect(self._input_changed)
        self.output_combo.currentIndexChanged.connect(self._output_changed)
        self.test_btn = button("Test input", "record", slot=self.toggle_test,
                               tip="Watch the meter while you speak; nothing is saved.")
        dev_row = hbox(QLabel("Microphone"), self.input_combo, self.test_btn,
                       QLabel("Speakers"), self.output_combo, stretch_at=5)
        self.outer.addWidget(dev_row)

        # prompt card
        card = Card()
        self.prompt_meta = QLabel("")
        self.prompt_meta.setObjectName("PromptMeta")
        self.prompt_label = QLabel("Open a voice to start recording.")
        self.prompt_label.setObjectName("Prompt")
        self.prompt_label.setWordWrap(True)
        self.prompt_label.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.prompt_label.setMinimumHeight(150)
        card.layout_.addWidget(self.prompt_meta)
        card.layout_.addWidget(self.prompt_label, 1)
        self.outer.addWidget(card, 2)

        # meter + status
        meter_box = QWidget()
        ml = QGridLayout(meter_box)
        ml.setContentsMargins(0, 0, 0, 0)
        self.meter = LevelMeter()
        self.rec_state = QLabel("Ready")
        self.rec_state.setObjectName("StateLabel")
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

        self.wave = WaveformView()
        self.outer.addWidget(self.wave, 1)

        # controls
        self.rec_btn = button("Record", "rec-dot", primary=True, slot=self.toggle_record,
                              tip="Space")
        self.accept_btn = button("Accept", "check", slot=self.accept, tip="Enter")
        self.retake_btn = button("Re-take", "retake", slot=self.retake, tip="R")
        self.play_btn = button("Play", "play", slot=self.play, tip="P")
        self.skip_btn = button("Skip", "skip", slot=self.skip, tip="S")
        self.back_btn = button("Back", "resume", slot=self.back,
                               tip="B: the previous prompt; recording it again replaces its take")
        self.outer.addWidget(hbox(self.rec_btn, self.accept_btn, self.retake_btn,
                                  self.play_btn, self.back_btn, self.skip_btn, stretch_at=6))

        # progress toward the recommended minutes
        prog = QVBoxLayout()
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress_label = QLabel("")
        self.progress_label.setObjectName("Muted")
        prog.addWidget(self.progress_label)
        prog.addWidget(self.progress)
        self.outer.addLayout(prog)

        self.meter_timer = QTimer(self)
        self.meter_timer.setInterval(METER_MS)
        self.meter_timer.timeout.connect(self._poll_meter)
        self.preroll_timer = QTimer(self)
        self.preroll_timer.setSingleShot(True)
        self.preroll_timer.setInterval(PREROLL_MS)
        self.preroll_timer.timeout.connect(self._speak_now)

        # window-wide while this page is shown (enabled in shown()), so the keys
        # work wherever the focus is; they win over a focused button's Space
        self.shortcuts: list[QShortcut] = []
        for key, slot in ((Qt.Key.Key_Space, self.toggle_record),
                          (Qt.Key.Key_Return, self.accept), (Qt.Key.Key_Enter, self.accept),
                          (Qt.Key.Key_R, self.retake), (Qt.Key.Key_P, self.play),
                          (Qt.Key.Key_S, self.skip), (Qt.Key.Key_B, self.back)):
            sc = QShortcut(QKeySequence(key), self)
            sc.setContext(Qt.ShortcutContext.WindowShortcut)
            sc.activated.connect(slot)
            sc.setEnabled(False)
            self.shortcuts.append(sc)
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        ctx.reader.voice_loaded.connect(self._voice_loaded)
        self._fill_devices()
        if self.no_sound:
            self.rec_state.setText(self.no_sound)
            self.rec_state.setWordWrap(True)
        self._update_buttons()

    # -- devices -----------------------------------------------------------------
    def _fill_devices(self) -> None:
        self.input_combo.blockSignals(True)
        self.output_combo.blockSignals(True)
        self.input_combo.clear()
        self.output_combo.clear()
        self.input_combo.addItem("System default", None)
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

    def toggle_test(self) -> None:
        if self.testing:
            self.recorder.abort()
            self.testing = False
            self.meter_timer.stop()
            self.meter.reset()
            self.test_btn.setText("Test input")
            self.rec_state.setText("Ready")
        elif not self.recorder.active:
            if self.recorder.start(self.input_device(), keep=False):
                self.testing = True
                self.meter.reset()
                self.meter_timer.start()
                self.test_btn.setText("Stop test")
                self.rec_state.setText("Testing input: speak now")
        self._update_buttons()

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
            # a take accepted a moment ago counts even before the re-read reaches here
            done = {t.prompt_id for t in snap.takes if t.prompt_id}
            self.prompts.load(snap.prompt_set, done | self.accepted.get(self.voice, set()))
            if self.prompt is None or (self.prompts.is_done(self.prompt)
                                       and not self.revisiting):
                self.prompt = self.prompts.next()
            self._show_prompt()
        self._update_progress(snap)
        self._update_buttons()

    def _show_prompt(self) -> None:
        if self.prompt is None:
            self.prompt_label.setText("Every prompt of this set is recorded. Well done!")
            self.prompt_meta.setText("")
            return
        done, total = self.prompts.counts()
        self.prompt_label.setText(self.prompt.text)
        again = ("  ·  recorded already: a new take replaces it"
                 if self.prompts.is_done(self.prompt) else "")
        self.prompt_meta.setText(f"Prompt {self.prompt.id}  ·  {self.prompt.group}  ·  "
                                 f"{done} of {total} recorded{again}")

    def _update_progress(self, snap: VoiceSnapshot | None) -> None:
        if self.voice is None or snap is None:
            self.progress.setValue(0)
            self.progress_label.setText("")
            return
        minutes = float(snap.summary["minutes_recorded"])
        target = float(snap.summary["recommended_minutes"])
        self.progress.setValue(int(min(1.0, minutes / target) * 1000))
        self.progress.setFormat(f"{minutes:.1f} of {target:.0f} min")
        self.progress_label.setText(
            f"{minutes:.1f} minutes recorded · {max(0.0, target - minutes):.1f} more recommended"
            if minutes < target else f"{minutes:.1f} minutes recorded · enough to train")

    # -- actions -----------------------------------------------------------------
    def toggle_record(self) -> None:
        if self.testing:
            self.toggle_test()
        if self.recorder.stopping:
            return
        if self.recorder.active:
            self.recorder.stop()
            self.rec_state.setText("Finishing…")
            self._update_buttons()
            return
        if self.voice is None or self.prompt is None:
            return
        self.ctx.player.stop()
        self.take_audio = None
        self.clipped = False
        self.clip_label.setText("")
        self.wave.clear_audio()
        if self.recorder.start(self.input_device()):
            self.meter.reset()
            self.meter_timer.start()
            self.rec_state.setText("Get ready…")  # already capturing: the pre-roll
            self.preroll_timer.start()
            self.rec_btn.setText("Stop")
        self._update_buttons()

    def _speak_now(self) -> None:
        if self.recorder.active and not self.recorder.stopping and not self.testing:
            self.rec_state.setText("● Recording: speak now")

    def _poll_meter(self) -> None:
        peak, _rms, clipped = self.recorder.read_level()
        self.meter.set_level(peak, clipped > 0)
        if self.recorder.active:
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
        self.take_audio = audio
        self.take_sr = sr
        self.rec_btn.setText("Record")
        self.wave.show_audio(audio, sr)
        secs = len(audio) / float(sr or 1)
        self.rec_time.setText(fmt_duration(secs))
        self.warnings = take_warnings(audio, sr, self.prompt.text if self.prompt else "",
                                      self.recorder.overflows)
        if len(audio) == 0 or float(np.max(np.abs(audio))) < 1e-4:
            self.rec_state.setText("Silent take: check the microphone, then re-take")
        else:
            self.rec_state.setText("Review: Enter to accept, R to re-take, P to play")
        if self.warnings:
            shown = self.clip_label.text()
            if self.clipped:  # the live clipping note says the same as the verdict's
                self.warnings = [w for w in self.warnings if not w.startswith("Clipped")]
            self.clip_label.setText("\n".join(([shown] if shown else []) + self.warnings))
        elif len(audio) and float(np.max(np.abs(audio))) >= 1e-4 and not self.clipped:
            self.rec_state.setText("✓ Good take: Enter to accept, R to re-take, P to play")
        self._update_buttons()

    def accept(self) -> bool:
        """Save the take through the engine workspace and move to the next prompt."""
        if self.take_audio is None or self.voice is None or self.prompt is None:
            return False
        if self.recorder.active:
            return False
        from engine.core.errors import VoxshardError
        from engine.layout.voice import open_voice

        voice = open_voice(self.voice)
        replaced = self._takes_of(self.prompt.id)
        extra = {"clipped": self.clipped, "prompt_set": self.prompts.set_name}
        if self.warnings:
            extra["warnings"] = list(self.warnings)
        try:
            take = voice.add_take(self.take_audio, self.prompt.text, sample_rate=self.take_sr,
                                  prompt_id=self.prompt.id, extra=extra)
        except VoxshardError as exc:
            show_error(self, "The take was not saved", exc.message, exc.hint or "")
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
        self.warnings = []
        self.clip_label.setText("")
        self.ctx.status.emit(f"Saved take for prompt {self.prompt.id}"
                             + (f", replacing {', '.join(gone)}" if gone else ""))
        self.take_audio = None
        self.wave.clear_audio()
        self.prompts.mark_done(self.prompt)
        self.accepted.setdefault(self.voice, set()).add(self.prompt.id)
        self.prompt = self.prompts.next()
        self._show_prompt()
        self.rec_state.setText("Saved. Space to record the next one")
        self._update_buttons()
        self.ctx.notify_changed()  # the re-read brings the new minutes
        return True

    def retake(self) -> None:
        if self.recorder.active:
            return
        self.take_audio = None
        self.wave.clear_audio()
        self.clip_label.setText("")
        self.rec_state.setText("Ready: Space to record again")
        self._update_buttons()
        self.toggle_record()

    def play(self) -> None:
        if self.take_audio is None or self.recorder.active:
            return
        if self.ctx.player.playing:
            self.ctx.player.stop()
        else:
            self.ctx.player.play(self.take_audio, self.take_sr)

    def skip(self) -> None:
        if self.recorder.active or self.prompt is None:
            return
        self.take_audio = None
        self.wave.clear_audio()
        self.revisiting = False
        self.prompt = self.prompts.next(after=self.prompt)
        self._show_prompt()
        self._update_buttons()

    def back(self) -> None:
        """The previous prompt, recorded or not: record it (again) with Space."""
        if self.recorder.active or self.voice is None or not self.prompts.prompts:
            return
        self.take_audio = None
        self.wave.clear_audio()
        self.clip_label.setText("")
        self.revisiting = True
        self.prompt = self.prompts.previous(self.prompt)
        self._show_prompt()
        self._update_buttons()

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
        self.rec_btn.setEnabled((can_record or rec) and not self.no_sound)
        self.accept_btn.setEnabled(has_take)
        self.retake_btn.setEnabled(has_take)
        self.play_btn.setEnabled(has_take)
        self.skip_btn.setEnabled(can_record and not rec)
        self.back_btn.setEnabled(self.voice is not None and bool(self.prompts.prompts)
                                 and not rec)
        self.test_btn.setEnabled(not rec and not self.no_sound)

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
        self.recorder.abort()
        self.testing = False
