"""Does a render hurry as it goes? Its speaking rate in the first and the last third.

Fed its text one token per frame, the talker spoke faster and faster within one render
(QwenLM/Qwen3-TTS #239 measured it this way, first third against last); every voice now
speaks with the whole text in the prompt, and this is the measure that would show a
relapse. The words are the recogniser's, with their times: the span from the first word's
start to the last word's end is cut in three, and each word counts in the third its middle
falls in.
"""

from __future__ import annotations

from collections.abc import Sequence

from engine.asr.recognizer import Word

#: the figures `rate_thirds` gives, by name (the evaluation's metrics)
RATE_THIRDS = ("words_per_s_first_third", "words_per_s_last_third", "rate_drift")
#: fewer heard words than this say nothing about a change of pace
MIN_WORDS = 6


def rate_thirds(words: Sequence[Word]) -> dict[str, float | None]:
    """Words per second in the first and last third of the heard span, and `rate_drift`,
    the last over the first (above 1: speech hurried). None where the recogniser gave too
    few timed words."""
    none: dict[str, float | None] = dict.fromkeys(RATE_THIRDS)
    if len(words) < MIN_WORDS:
        return none
    start, end = words[0].start_s, words[-1].end_s
    third = (end - start) / 3
    if third <= 0:
        return none
    counts = [0, 0, 0]
    for w in words:
        counts[min(2, max(0, int(((w.start_s + w.end_s) / 2 - start) / third)))] += 1
    first, last = counts[0] / third, counts[2] / third
    return {"words_per_s_first_third": round(first, 3),
            "words_per_s_last_third": round(last, 3),
            "rate_drift": round(last / first, 3) if first > 0 else None}
