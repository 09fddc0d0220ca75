"""The runaway guard: a row whose codes loop or stay silent ends early, with its reason.

A fine-tuned talker sometimes never ends a sentence: it repeats a word or a short
phrase, drones on one code, or keeps "speaking" silence until the length cap. The guard
watches each row's codebook-0 codes (the talker's own choice per frame) on the host,
from copies the decoding paths already make (the end-of-speech check), so it adds no
device work, no host sync and never changes a sampled code:

- loop: within the last `loop_frames` frames, at least `LOOP_SHARE` of them repeat the
  code `p` frames earlier, for some period 1 <= p <= `MAX_PERIOD` (a drone is period 1,
  a repeated word or phrase a longer one). Silent frames never count as repeats: a pause
  is judged by the silence rule only;
- silence: at least `SILENCE_SHARE` of the last `silence_frames` frames are codes the
  codec gives silence (`silence_codes`: what it encodes digital silence and faint noise
  as, worked out once per model by the synthesizer).

A row that trips keeps its frames up to and including the one where it tripped, and
ends with the reason ("loop" or "silence"). The rule is a function of the row's codes
alone, so every path (the eager and captured loops, the continuous batcher, streaming)
cuts a row at the same frame. Frame 0's code comes from the prefill, which the batcher
never reads back, so every path watches from frame 1 (`FIRST_WATCHED`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.audio.timebase import FRAME_RATE, SAMPLE_RATE
from engine.config.speak import RUNAWAY_MAX_S

#: longest repeated stretch caught as a loop, in frames (2 s at 12.5 frames per second)
MAX_PERIOD = 25
#: share of the window's frames that must repeat (sampling varies a loop a little)
LOOP_SHARE = 0.8
#: share of the window's frames that must be silent (a breath does not reset it)
SILENCE_SHARE = 0.9
#: the first frame watched (frame 0's code is chosen after the prefill, never copied back)
FIRST_WATCHED = 1
#: codes looked up as silent or not (the talker's vocabulary is 3072; the last entry,
#: never silent, takes anything beyond)
CODES = 4096
#: the longest window a limit may ask for, in frames
MAX_WINDOW = math.ceil(RUNAWAY_MAX_S * FRAME_RATE)
LOOP = "loop"
SILENCE = "silence"


@dataclass(frozen=True)
class RunawayGuard:
    """The limits one render runs under (0 frames: that rule is off)."""

    loop_frames: int
    silence_frames: int
    silence_codes: tuple[int, ...] = ()

    @staticmethod
    def of(loop_s: float, silence_s: float, silence_codes: Sequence[int]) -> RunawayGuard | None:
        """The guard for limits in seconds (`SpeakOptions`); None when both are off."""
        loop = math.ceil(loop_s * FRAME_RATE) if loop_s > 0 else 0
        silence = math.ceil(silence_s * FRAME_RATE) if silence_s > 0 else 0
        if not loop and not silence:
            return None
        return RunawayGuard(loop, silence, tuple(sorted({int(c) for c in silence_codes})))


class RunawayWatch:
    """The guard's state for `rows` rows, fed one frame's codebook-0 codes at a time.

    `start(row, guard)` (re)starts a row (None: not watched); `push(rows, codes)` feeds the
    next watched frame of each listed row and returns the rows that tripped on it.
    `reason[row]` and `cut[row]` (frames to keep) then say why and where it ended.
    """

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.fed = np.zeros(rows, dtype=np.int64)
        self.recent = np.full((rows, MAX_PERIOD), -1, dtype=np.int64)  # [:, k]: k+1 back
        # what each of the last MAX_WINDOW frames was (a ring), and the counts in the window
        self.loop_hits = np.zeros((rows, MAX_WINDOW, MAX_PERIOD), dtype=bool)
        self.loop_count = np.zeros((rows, MAX_PERIOD), dtype=np.int64)
        self.silent_hits = np.zeros((rows, MAX_WINDOW), dtype=bool)
        self.silent_count = np.zeros(rows, dtype=np.int64)
        self.loop_window = np.zeros(rows, dtype=np.int64)
        self.loop_need = np.zeros(rows, dtype=np.int64)
        self.silence_window = np.zeros(rows, dtype=np.int64)
        self.silence_need = np.zeros(rows, dtype=np.int64)
        self.active = np.zeros(rows, dtype=bool)
        #: silent or not, by code (a lookup: a set test costs most of a frame's watch)
        self.silent_code = np.zeros(CODES, dtype=bool)
        self.reason: list[str | None] = [None] * rows
        self.cut: list[int | None] = [None] * rows
        self._next = FIRST_WATCHED  # `feed`: the next frame of the whole batch

    @classmethod
    def of(cls, guard: RunawayGuard | None, rows: int) -> RunawayWatch | None:
        """A watch of `rows` rows all under `guard` (None without one)."""
        if guard is None:
            return None
        watch = cls(rows)
        for b in range(rows):
            watch.start(b, guard)
        return watch

    def start(self, row: int, guard: RunawayGuard | None) -> None:
        self.fed[row] = 0
        self.recent[row] = -1
        self.loop_hits[row] = False
        self.loop_count[row] = 0
        self.silent_hits[row] = False
        self.silent_count[row] = 0
        self.reason[row] = self.cut[row] = None
        self.active[row] = guard is not None
        if guard is None:
            return
        # one codec per watch (one model): its silence codes are the same for every row
        self.silent_code[:] = False
        self.silent_code[[c for c in guard.silence_codes if 0 <= c < CODES - 1]] = True
        self.loop_window[row] = guard.loop_frames
        self.loop_need[row] = math.ceil(LOOP_SHARE * guard.loop_frames)
        self.silence_window[row] = guard.silence_frames
        self.silence_need[row] = math.ceil(SILENCE_SHARE * guard.silence_frames)

    def push(self, rows: Sequence[int] | np.ndarray, codes: Sequence[int] | np.ndarray
             ) -> list[int]:
        """Feed each row in `rows` its next watched frame's code; the rows that trip now."""
        given = np.asarray(rows, dtype=np.int64)
        keep = self.active[given]
        r = given[keep]
        if not len(r):
            return []
        c = np.asarray(codes, dtype=np.int64)[keep]
        silent = self.silent_code[np.clip(c, 0, CODES - 1)]
        repeat = (self.recent[r] == c[:, None]) & ~silent[:, None]  # [n, MAX_PERIOD]
        fed = self.fed[r]
        at = fed % MAX_WINDOW
        # the frame leaving each window was written `window` frames ago (still in the ring)
        w = self.loop_window[r]
        gone = self.loop_hits[r, (fed - w) % MAX_WINDOW] & (fed >= w)[:, None]
        self.loop_count[r] += repeat.astype(np.int64) - gone
        self.loop_hits[r, at] = repeat
        w = self.silence_window[r]
        gone_silent = self.silent_hits[r, (fed - w) % MAX_WINDOW] & (fed >= w)
        self.silent_count[r] += silent.astype(np.int64) - gone_silent
        self.silent_hits[r, at] = silent
        self.recent[r, 1:] = self.recent[r, :-1]
        self.recent[r, 0] = c
        self.fed[r] = fed + 1
        loop = (self.loop_window[r] > 0) & (self.loop_count[r].max(axis=1)
                                             >= self.loop_need[r])
        quiet = (self.silence_window[r] > 0) & (self.silent_count[r] >= self.silence_need[r])
        tripped = []
        for row, is_loop, is_quiet in zip(r.tolist(), loop.tolist(), quiet.tolist(),
                                          strict=True):
            if is_loop or is_quiet:
                self.reason[row] = SILENCE if is_quiet else LOOP
                self.cut[row] = int(self.fed[row]) + FIRST_WATCHED
                self.active[row] = False
                tripped.append(row)
        return tripped

    def feed(self, first: np.ndarray, made: int) -> None:
        """Feed every row the codebook-0 codes `first` [rows, >= made] of the frames up to
        `made` it has not seen yet (the whole-batch loops of `FastTalker`: all rows at
        the same frame)."""
        everyone = np.arange(self.rows)
        for f in range(self._next, made):
            self.push(everyone, first[:, f])
        self._next = max(self._next, made)

    @property
    def tripped(self) -> list[int]:
        return [b for b, cut in enumerate(self.cut) if cut is not None]

    def length(self, row: int, natural: int) -> tuple[int, str | None]:
        """A row's kept frames and why it ended early: its cut when the guard tripped at or
        before its `natural` end (end-of-speech or its cap), else that end."""
        cut = self.cut[row]
        if cut is not None and cut <= natural:
            return cut, self.reason[row]
        return natural, None


def stop_reason(codes0: Sequence[int] | np.ndarray, guard: RunawayGuard | None) -> str | None:
    """Why a finished row of codebook-0 codes was ended by the guard (None: it was not):
    the guard trips on its last frame exactly when it cut the row there."""
    if guard is None or len(codes0) <= FIRST_WATCHED:
        return None
    watch = RunawayWatch.of(guard, 1)
    assert watch is not None
    watch.feed(np.asarray(codes0, dtype=np.int64)[None], len(codes0))
    return watch.reason[0] if watch.cut[0] == len(codes0) else None


def runaway_message(chunk_number: int, reason: str, frames: int) -> str:
    """The warning a render logs for a chunk the guard cut."""
    what = "repeated itself in a loop" if reason == LOOP else "stayed silent"
    return (f"Chunk {chunk_number} {what}; it was cut there, after {frames / FRAME_RATE:.1f} s "
            "by the runaway guard (its loop and silence limits).")


def cut_reasons(chunks: Sequence[dict[str, object]]) -> list[str]:
    """The reasons a render's chunks were cut by the guard, each once, in chunk order."""
    seen: list[str] = []
    for chunk in chunks:
        reason = chunk.get("runaway")
        if isinstance(reason, str) and reason not in seen:
            seen.append(reason)
    return seen


#: frames of encoded silence skipped before its codes settle (the codec's start-up)
SETTLE_FRAMES = 4


def silence_codes(model: object) -> tuple[int, ...]:
    """The codebook-0 codes `model`'s codec (an official Qwen3-TTS model) gives silence:
    what it encodes two seconds of digital silence and of faint noise (-60 dBFS) as,
    after its first frames. One short encode, at load."""
    rng = np.random.default_rng(0)
    found: set[int] = set()
    tokenizer = model.speech_tokenizer  # type: ignore[attr-defined]
    for level in (0.0, 1e-3):
        audio = (rng.standard_normal(48000) * level).astype(np.float32)
        with torch.inference_mode():
            codes = tokenizer.encode(audio, sr=SAMPLE_RATE).audio_codes[0]
        found |= {int(c) for c in codes[SETTLE_FRAMES:, 0].tolist()}
    return tuple(sorted(found))
