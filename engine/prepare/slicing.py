"""A take cut into clips, each with its text and speaker: at the pauses, one sentence per
clip where the pauses single the sentences out, else whole sentences grouped by length, or
by the recogniser's word times when the transcript is machine-made; a take with several
speakers is cut where the speaker changes.
"""

from __future__ import annotations

from typing import Any

from engine.audio.io import TARGET_SR
from engine.audio.vad import Slice, longest_gaps, out_of_words, plan_slices, slices_at
from engine.config import PrepareConfig
from engine.layout.voice import Take
from engine.prepare.speakers import TARGET
from engine.prepare.target import Heard
from engine.prepare.transcribe import asr_info, is_machine_made
from engine.prepare.transcripts import group_sentences, texts_from_words
from engine.text import split_sentences

#: how far (relative) a slice's share of the text may stray from its share of speech time
TEXT_TOLERANCE = 0.35
#: looser when the pauses already single out the sentence boundaries
SENTENCE_TOLERANCE = 0.6
#: sentence pauses must be this many times longer than the longest pause inside a sentence
PAUSE_CONTRAST = 1.5


def _pauses_stand_out(regions: list[tuple[int, int]], count: int) -> bool:
    """The `count` longest pauses are clearly longer than every other one."""
    gaps = sorted((regions[i][0] - regions[i - 1][1] for i in range(1, len(regions))),
                  reverse=True)
    if len(gaps) <= count:
        return True
    return gaps[count - 1] >= PAUSE_CONTRAST * gaps[count]


def _split_text(text: str, regions: list[tuple[int, int]], total: int,
                cfg: PrepareConfig) -> tuple[list[Slice], list[str], str]:
    """Slices and one text per slice; method says how reliable the text is."""
    lo, hi = cfg.min_clip_s, cfg.max_clip_s
    slices = plan_slices(regions, total, TARGET_SR, lo, hi)
    if len(slices) == 1:
        return slices, [text], "whole"
    if not text:
        return slices, [""] * len(slices), "whole"
    sentences = split_sentences(text)
    n = len(sentences)
    # first choice: one sentence per slice, cut at the n-1 longest pauses; reliable when
    # those pauses stand out from the rest and every sentence's length fits its slice
    if 1 < n <= len(regions):
        by_sentence = slices_at(regions, longest_gaps(regions, n - 1), total, TARGET_SR)
        if (all(lo <= s.duration(TARGET_SR) <= hi for s in by_sentence)
                and _pauses_stand_out(regions, n - 1)):
            texts = group_sentences(sentences, [s.speech_s for s in by_sentence],
                                    SENTENCE_TOLERANCE)
            if texts is not None:
                return by_sentence, texts, "sentences"
    # else: whole sentences grouped onto the pause-based slices by length
    texts = group_sentences(sentences, [s.speech_s for s in slices], TEXT_TOLERANCE)
    if texts is not None:
        return slices, texts, "proportional"
    return slices, [""] * len(slices), "none"


def machine_words(take: Take) -> list[dict[str, Any]] | None:
    """The timed words of a machine-made transcript, or None (a person's transcript)."""
    asr = asr_info(take)
    if not is_machine_made(take) or not asr or not asr.get("words"):
        return None
    return list(asr["words"])


def _texts_by_word_times(take: Take, slices: list[Slice]) -> list[str] | None:
    """A machine-made transcript comes with the time of every word: each slice gets
    exactly the words spoken inside it (a person's transcript keeps the other ways)."""
    words = machine_words(take)
    if words is None:
        return None
    spans = [(s.start / TARGET_SR, s.end / TARGET_SR) for s in slices]
    return texts_from_words(words, spans)


def slice_take(take: Take, total: int, regions: list[tuple[int, int]],
                words: list[dict[str, Any]] | None, heard: Heard | None,
                cfg: PrepareConfig) -> tuple[list[Slice], list[str], list[str], str]:
    """The take's slices, each one's text and speaker, and how the texts were found."""
    if heard is not None and heard.mixed:
        slices, whos = heard.slices(cfg.min_clip_s, cfg.max_clip_s)
        if words:
            kept = [(sl, w) for sl, w in zip(out_of_words(slices, words, TARGET_SR), whos,
                                              strict=True) if sl.end > sl.start]
            slices, whos = [k[0] for k in kept], [k[1] for k in kept]
        by_time = _texts_by_word_times(take, slices)
        if by_time is not None:
            return slices, by_time, whos, "timestamps"
        # the take's text is everyone's words: it cannot be told apart by speaker
        return slices, [""] * len(slices), whos, "none" if take.text.strip() else "whole"
    slices, texts, method = _split_text(take.text, regions, total, cfg)
    if len(slices) > 1:
        by_time = _texts_by_word_times(take, slices)
        if by_time is not None:
            texts, method = by_time, "timestamps"
    return slices, texts, [TARGET] * len(slices), method
