"""The reference clip a voice is cloned from, made ready for the model.

A clip whose last phoneme runs to its very end hands that phoneme to the talker as the
frames it continues, and the render starts with it (faster-qwen3-tts found this and
pads the reference). So a reference ends with `TAIL_S` of silence: the silence it
already has counts, and only what is missing is added, as digital silence.
"""

from __future__ import annotations

import numpy as np

from engine.audio.vad import speech_regions

#: seconds of silence a reference clip ends with
TAIL_S = 0.5


def trailing_silence_s(audio: np.ndarray, sample_rate: int) -> float:
    """Seconds after the last speech region (the energy detector's); 0 when none is found
    (a clip that is all one level gives no sign of where its speech ends)."""
    regions = speech_regions(np.asarray(audio, dtype=np.float32), sample_rate)
    if not regions:
        return 0.0
    return (len(audio) - regions[-1][1]) / sample_rate


def with_silent_tail(audio: np.ndarray, sample_rate: int, tail_s: float = TAIL_S) -> np.ndarray:
    """`audio` ending with at least `tail_s` of silence: zeros added for what it lacks."""
    missing = round((tail_s - trailing_silence_s(audio, sample_rate)) * sample_rate)
    if missing <= 0:
        return audio
    return np.concatenate((audio, np.zeros(missing, dtype=audio.dtype)))
