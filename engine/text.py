"""Text in: clean it, refuse what cannot be spoken, split it into chunks.

Qwen3-TTS reads one utterance per generation call and starts to drift (or
forgets to stop) on very long inputs, so long text is cut at sentence
boundaries into chunks of a few sentences. This module is pure Python (no
torch) so the GUI can validate and preview the split without loading a model.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from engine.core.errors import InputError

#: Soft limit on characters per chunk: a few sentences, well inside what the
#: model was trained on (clips of a few to ~20 seconds).
DEFAULT_CHUNK_CHARS = 220
#: Hard limit: about 25 s of speech. Longer chunks leave what the model was
#: trained on, and every text position must fit the worker's trailing-text
#: buffer and the chunk's frame cap to be spoken to its end-of-text.
MAX_CHUNK_CHARS = 400

# Invisible formatting characters pasted from web pages and word processors
# (soft hyphens, zero-width spaces, byte-order and direction marks; Unicode
# category Cf). They carry nothing to say, so they are dropped, not refused.
_INVISIBLE = {"\u00ad", "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff"}

# Typographic variants mapped to what the text tokenizer saw most in training.
_REPLACE = {
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u00ab": '"', "\u00bb": '"',
    "\u2013": "-", "\u2014": " - ", "\u2212": "-", "\u2026": "...",
    "\u00a0": " ", "\u2009": " ", "\u202f": " ",
}

# Sentence ends: Latin, CJK and other full-width marks.
_ENDERS = ".!?;\u3002\uff01\uff1f\uff1b\u2049\u203c"
_CJK_ENDERS = "\u3002\uff01\uff1f\uff1b"
_CLOSERS = "\"')]}\u300d\u300f\uff09"

# Words after which a period does not end a sentence.
_ABBREVIATIONS = {
    "mr", "mrs", "ms", "dr", "prof", "sr", "jr", "st", "vs", "etc", "e.g", "i.e",
    "no", "fig", "approx", "mt", "inc", "ltd", "co", "jan", "feb", "mar", "apr",
    "jun", "jul", "aug", "sep", "sept", "oct", "nov", "dec",
}

# Inside-sentence pause points used to split a sentence that is too long.
_SOFT_BREAKS = re.compile(r"(?<=[,:\u3001\uff0c\uff1a])\s*|\s+(?=-\s)")


def _is_cjk(ch: str) -> bool:
    code = ord(ch)
    return (0x3040 <= code <= 0x30FF or 0x3400 <= code <= 0x4DBF or 0x4E00 <= code <= 0x9FFF
            or 0xAC00 <= code <= 0xD7AF or 0xF900 <= code <= 0xFAFF)


def _is_pictograph(ch: str, category: str) -> bool:
    # Symbols below the arrows block are readable (degree, copyright, trademark,
    # numero); arrows, dingbats, box drawing and emoji are not.
    return category == "So" and ord(ch) >= 0x2190


def spoken_weight(text: str) -> float:
    """Rough speaking length in 'Latin character' units.

    A CJK character is a syllable or more, about three Latin letters of speech.
    Used to cap generated length and to balance chunks.
    """
    return sum(3.0 if _is_cjk(ch) else 1.0 for ch in text if not ch.isspace())


def max_frames_for(text: str, frames_per_unit: float = 2.5, floor: int = 40,
                   ceiling: int = 2048) -> int:
    """Cap on codec frames for `text`, so a missing end-of-speech cannot run forever.

    Natural English speech is about 15 characters per second, 12.5 frames per
    second, so about 0.85 frames per character; 2.5 leaves room for slow,
    expressive reading without letting a runaway generation go on for minutes.
    """
    return int(min(ceiling, max(floor, floor + frames_per_unit * spoken_weight(text))))


def clean_text(text: str) -> str:
    """Normalise `text` for the model, or raise `InputError` saying what is wrong.

    Refuses: empty text, text with nothing to pronounce, control characters,
    private-use or unassigned code points, and emoji/pictographs (the model has
    no reading for them, and guessing would put words in the user's mouth).
    """
    if text is None or not text.strip():
        raise InputError("The text to speak is empty.", "Give at least one word.")
    text = unicodedata.normalize("NFC", text)
    out: list[str] = []
    for index, ch in enumerate(text):
        if ch in _INVISIBLE or unicodedata.category(ch) == "Cf":
            continue
        ch = _REPLACE.get(ch, ch)
        if len(ch) == 1:
            category = unicodedata.category(ch)
            if ch in "\t\r\n\f\v":
                ch = "\n" if ch in "\r\n\f\v" else " "
            elif category in ("Cc", "Co", "Cn", "Cs") or _is_pictograph(ch, category):
                name = unicodedata.name(ch, "unnamed character")
                raise InputError(
                    f"The text contains an unsupported character {ch!r} "
                    f"(U+{ord(ch):04X} {name.lower()}) at position {index + 1}.",
                    "Remove it or write it out in words.",
                )
        out.append(ch)
    cleaned = "".join(out)
    # Paragraph breaks stay as single newlines (they become longer pauses);
    # every other run of whitespace becomes one space.
    cleaned = re.sub(r"[ \t]*\n[ \t\n]*", "\n", cleaned)
    cleaned = re.sub(r"[ \t]+", " ", cleaned).strip()
    if not any(unicodedata.category(c)[0] in "LN" for c in cleaned):
        raise InputError("The text has nothing to pronounce (no letters or digits).",
                         "Give at least one word.")
    return cleaned


@dataclass(frozen=True)
class Chunk:
    """One generation unit: a few sentences, and the pause that follows it."""

    index: int
    text: str
    #: seconds of silence after this chunk (0 for the last one)
    pause_after_s: float
    #: cap on codec frames for this chunk
    max_frames: int


def _split_sentences(paragraph: str) -> list[str]:
    sentences: list[str] = []
    start = 0
    i = 0
    n = len(paragraph)
    while i < n:
        ch = paragraph[i]
        if ch in _ENDERS:
            j = i + 1
            while j < n and (paragraph[j] in _ENDERS or paragraph[j] in _CLOSERS):
                j += 1
            at_end = j >= n
            # Latin marks end a sentence only before whitespace; CJK marks always do.
            boundary = at_end or paragraph[j].isspace() or ch in _CJK_ENDERS
            if boundary and ch == ".":
                word = re.split(r"[\s(\"']", paragraph[start:i])[-1].lower()
                # "Dr. Smith", "e.g. this", single initials "J. R. R."
                if word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
                    boundary = at_end
                # "3.5" never reaches here (no space after the dot)
            if boundary:
                sentence = paragraph[start:j].strip()
                if sentence:
                    sentences.append(sentence)
                start = j
                i = j
                continue
        i += 1
    tail = paragraph[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def _split_long(sentence: str, limit: int) -> list[str]:
    """Cut a sentence longer than `limit` at commas, then at spaces, then anywhere."""
    if spoken_weight(sentence) <= limit:
        return [sentence]
    pieces = [p for p in _SOFT_BREAKS.split(sentence) if p and p.strip()]
    if len(pieces) > 1:
        out: list[str] = []
        for piece in _pack(pieces, limit):
            out.extend(_split_long(piece, limit) if spoken_weight(piece) > limit else [piece])
        return out
    words = sentence.split(" ")
    if len(words) > 1:
        return [w for w in _pack(words, limit)]
    # one unbroken run (e.g. CJK without punctuation): hard cut
    step = max(1, int(limit / 3) if _is_cjk(sentence[0]) else limit)
    return [sentence[k:k + step] for k in range(0, len(sentence), step)]


def _pack(parts: list[str], limit: int) -> list[str]:
    """Greedily join consecutive parts while the result stays under `limit`."""
    chunks: list[str] = []
    current = ""
    for part in parts:
        part = part.strip()
        if not part:
            continue
        joined = f"{current} {part}" if current and not _is_cjk(part[0]) else current + part
        if current and spoken_weight(joined) > limit:
            chunks.append(current)
            current = part
        else:
            current = joined
    if current:
        chunks.append(current)
    return chunks


def split_text(text: str, chunk_chars: int = DEFAULT_CHUNK_CHARS, sentence_pause_s: float = 0.3,
               paragraph_pause_s: float = 0.6, frames_per_unit: float = 2.5,
               max_frames: int | None = None) -> list[Chunk]:
    """Clean `text` and split it into chunks at sentence boundaries.

    Sentences are packed together up to `chunk_chars` (in `spoken_weight`
    units); a single sentence longer than that is cut at commas or spaces.
    Chunks never span a paragraph break, which gets the longer pause.
    """
    if chunk_chars < 20:
        raise InputError(f"The chunk size {chunk_chars} is too small.",
                         "Use at least 20 characters per chunk.")
    if chunk_chars > MAX_CHUNK_CHARS:
        raise InputError(f"The chunk size {chunk_chars} is too large.",
                         f"Use at most {MAX_CHUNK_CHARS} characters per chunk.")
    cleaned = clean_text(text)
    texts: list[tuple[str, float]] = []
    paragraphs = [p for p in cleaned.split("\n") if p.strip()]
    for p_index, paragraph in enumerate(paragraphs):
        sentences: list[str] = []
        for sentence in _split_sentences(paragraph):
            sentences.extend(_split_long(sentence, chunk_chars))
        packed = _pack(sentences, chunk_chars)
        for s_index, chunk_text in enumerate(packed):
            last_in_paragraph = s_index == len(packed) - 1
            pause = paragraph_pause_s if last_in_paragraph else sentence_pause_s
            if p_index == len(paragraphs) - 1 and last_in_paragraph:
                pause = 0.0
            texts.append((chunk_text, pause))
    chunks = []
    for index, (chunk_text, pause) in enumerate(texts):
        cap = max_frames_for(chunk_text, frames_per_unit)
        if max_frames is not None:
            cap = min(cap, max_frames)
        chunks.append(Chunk(index=index, text=chunk_text, pause_after_s=pause, max_frames=cap))
    return chunks
