"""A take's lifecycle: record (pre-roll, "speak now", the live meter and waveform), stop
(trim, judge, show the verdict), keep (saved through the engine's workspace, replacing the
prompt's older take), re-take or discard, play; and the saved takes of a prompt to hear
again. Mixed into `RecordPage`, whose widgets and state it uses."""

from __future__ import annotations

import numpy as np
import soundfile as sf

from engine.config import PrepareConfig
from engine.core.errors import VoxshardError
from engine.layout.voice import VERDICT_FLAGGED, VERDICT_UNUSABLE, open_voice
from gui.pages.record.verdict import SILENT, Judgement, judge_take, trim_take
from gui.widgets import fmt_duration, show_error

METER_MS = 33
#: said while recording when the input touches full scale: a warning, not yet a verdict
LOUD_NOTE = ("Loud: the input touched full scale. The verdict comes when you stop; "
             "move back a little if it keeps happening.")
#: the live waveform while recording: redrawn at this interval, the last this many seconds
LIVE_WAVE_MS = 150
LIVE_WAVE_S = 20.0


class TakeLifecycle:
    """The take's part of the Record page."""

    def _reset_take(self) -> None:
        """Forget the take under review, its verdict and waveform (a new prompt, or none)."""
        self._stop_playing()
        self.take_audio = None
        self.take_voice = None
        self.existing = None
        self.clipped = False
        self.loud = False
        self.trimmed_s = 0.0
        self.judgement = Judgement()
        self.clip_label.setText("")
        self.rec_time.setText("0:00")
        self.wave.clear_audio()
        self.accept_btn.setText("Accept")

    def _prepare_config(self) -> PrepareConfig | None:
        """The voice's prepare settings, which Prepare will judge the take by."""
        voice = self.take_voice or self.voice
        try:
            return open_voice(voice).prepare_config if voice is not None else None
        except VoxshardError:
            return None  # unreadable voice.toml: the defaults; saving will say what is wrong

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
        self.take_voice = self.voice  # the take is this voice's, whatever is opened meanwhile
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
        if clipped and not self.loud and not self.testing:
            # early word only: the take's verdict, when it stops, says whether it can train
            self.loud = True
            self.clip_label.setText(LOUD_NOTE)

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
                                    self.recorder.overflows, self._prepare_config())
        self.clipped = "clipping" in self.judgement.codes
        self._show_verdict()
        self._update_buttons()

    def _show_verdict(self) -> None:
        j = self.judgement
        shown = [w for w in j.warnings if w != SILENT]
        self.loud = False  # the live note gives way to the verdict
        self.clip_label.setText("\n".join(shown))
        if j.verdict == VERDICT_UNUSABLE:
            first = j.warnings[0] if j.warnings[0] == SILENT else "This take cannot train."
            self._set_state(f"{first} Enter asks before keeping it.", warn=True)
            self.accept_btn.setText("Keep anyway…")
            return
        # said when it matters (a breath's worth is not news), as news, not as a warning
        trimmed = (f" (trimmed {self.trimmed_s:.1f} s of silence before and after the "
                   "speech)" if self.trimmed_s >= 1.0 else "")
        if j.verdict == VERDICT_FLAGGED:
            self._set_state(f"Review: Enter to accept, R to re-take, P to play{trimmed}")
        else:
            self._set_state(f"✓ Good take: Enter to accept, R to re-take, P to play{trimmed}")

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

    def _save_take(self) -> bool:
        assert self.take_audio is not None and self.voice is not None
        assert self.prompt is not None
        if self.take_voice not in (None, self.voice):
            return False  # never saved into a voice it was not recorded for
        voice = open_voice(self.voice)
        replaced = self._takes_of(self.prompt.id)
        j = self.judgement
        extra = {"clipped": self.clipped, "prompt_set": self.prompts.set_name,
                 "verdict": j.verdict}
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

