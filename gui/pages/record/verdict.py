"""A take's verdict before it is kept: silent, clipped or cut off cannot train; too quiet,
noisy or with audio the input dropped is advice. And the silence trimmed around its speech."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from engine.audio.checks import BLOCKING
from engine.audio.vad import speech_regions
from engine.config import PrepareConfig
from engine.layout.voice import VERDICT_FLAGGED, VERDICT_GOOD, VERDICT_UNUSABLE
from engine.prepare.check import check_recording

#: loudest sample below this (-20 dBFS) is a take recorded too far or too low
QUIET_PEAK = 0.1
#: faster than this, in words per second of speech, no one reads aloud: the take was cut
#: (a fast synthetic reader measured 4 words/s; people read about 2.5-3)
MAX_WORDS_PER_S = 6.0
FRAME_S = 0.02

#: what the page says of a take with no sound in it (also written into its metadata)
SILENT = "Silent take: check the microphone, then re-take (R)."


@dataclass
class Judgement:
    """A take's verdict (engine.layout.voice VERDICT_*) and the sentences behind it."""

    verdict: str = VERDICT_GOOD
    warnings: list[str] = field(default_factory=list)
    #: Prepare's issue codes among them (engine.audio.checks)
    codes: set[str] = field(default_factory=set)

    def add(self, sentence: str, blocking: bool) -> None:
        """One finding; `blocking`: the take cannot train with it."""
        self.warnings.append(sentence)
        if blocking:
            self.verdict = VERDICT_UNUSABLE
        elif self.verdict == VERDICT_GOOD:
            self.verdict = VERDICT_FLAGGED


def judge_take(audio: np.ndarray, sr: int, text: str, overflows: int = 0,
               cfg: PrepareConfig | None = None) -> Judgement:
    """What is wrong with a take before it is kept. Silent or too short for its text (cut
    off) cannot train; too quiet, or with audio the input dropped (`overflows`: the
    device's overflow reports while recording) is advice. Clipping, noise, length and
    echo are Prepare's verdict on the clip it cuts of the take (the engine's
    `check_recording`, with the voice's prepare settings `cfg`): what Prepare refuses
    cannot train here, what it warns of is advice here."""
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
        _judge_length(out, np.sqrt(np.mean(frames**2, axis=1)), text)
    if overflows:
        out.add(f"Audio was lost: the computer was too busy to read the microphone "
                f"in time ({overflows} gap{'s' if overflows > 1 else ''}). Close other "
                "programs, then re-take (R).", blocking=False)
    for found in check_recording(audio, sr, text, cfg)["issues"]:
        sentence = PREPARE_SAYS.get(found["code"])
        if sentence is None:
            continue
        out.codes.add(found["code"])
        if found["code"] == "too_short" and out.verdict == VERDICT_UNUSABLE:
            continue  # "too short for the sentence" says it already
        out.add(sentence.format(found["message"]), blocking=found["code"] in BLOCKING)
    return out


#: Prepare's findings on a take, as the Record page says them ({}: Prepare's own words)
PREPARE_SAYS = {
    "clipping": "Clipped: {} Move back or lower the input gain, then re-take (R).",
    "minor_clipping": "Peaks touched the limit: {} Prepare keeps the take; lower the "
                      "input gain a little if it happens often.",
    "low_snr": "Too noisy: {} Record somewhere quieter, then re-take (R).",
    "noisy": "Noisy: {} Somewhere quieter would train a cleaner voice.",
    "too_short": "Too short to train: {} Re-take it (R).",
    "too_long": "Too long: {} Re-take it (R).",
    "too_reverberant": "Echo: {} Record in a smaller or softer room, then re-take (R).",
}


def _judge_length(out: Judgement, rms: np.ndarray, text: str) -> None:
    """Too short for the text, from the loudness of 20 ms frames."""
    # speech spans from the first to the last frame within 30 dB of the loudest
    # (pauses between words count, room noise before and after does not)
    loud = np.flatnonzero(rms > max(1e-3, 0.03 * float(rms.max())))
    span_s = float(loud[-1] - loud[0] + 1) * FRAME_S if len(loud) else 0.0
    words = len(re.findall(r"\w+", text))
    if words and span_s < words / MAX_WORDS_PER_S:
        out.add(f"Too short for the sentence ({words} words in {span_s:.1f} s of "
                "speech): cut off, or read too fast? Re-take (R).", blocking=True)


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

