"""Word error rate with text normalisation (no dependency: a word-level edit distance).

Both sides are normalised the same way before counting: Unicode folded,
lower case, punctuation dropped (apostrophes inside words kept), numbers up
to a million spelled out, recogniser markers removed (pocketsphinx's
alternative pronunciations ``word(2)`` and fillers ``<sil>``/``[NOISE]``).
So "Dr. Smith paid $12." and "dr smith paid twelve" differ only where the
words do.

WER = (substitutions + deletions + insertions) / words of the reference; it
can exceed 1 when the hypothesis adds many words. An empty reference gives 0
for an empty hypothesis and 1 otherwise.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen "
         "fourteen fifteen sixteen seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
_MARKER = re.compile(r"\(\d+\)$")
_FILLERS = {"<s>", "</s>", "<sil>", "[noise]", "[speech]", "[laughter]", "[breath]",
            "[cough]", "[music]"}


def number_words(n: int) -> str:
    """English words for 0 <= n < 1,000,000 ("one hundred twenty three")."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else " " + _ONES[n % 10])
    if n < 1000:
        rest = n % 100
        return _ONES[n // 100] + " hundred" + ("" if rest == 0 else " " + number_words(rest))
    rest = n % 1000
    return number_words(n // 1000) + " thousand" + ("" if rest == 0 else
                                                    " " + number_words(rest))


def _spell_numbers(text: str) -> str:
    def one(m: re.Match[str]) -> str:
        digits = m.group(0).replace(",", "")
        value = int(digits)
        return f" {number_words(value)} " if value < 1_000_000 else f" {digits} "

    return re.sub(r"\d{1,3}(?:,\d{3})+(?!\d)|\d+", one, text)


def normalize_words(text: str) -> list[str]:
    """The words of `text` as compared for WER."""
    if not text:
        return []
    folded = unicodedata.normalize("NFKD", text)
    folded = "".join(c for c in folded if not unicodedata.combining(c)).lower()
    folded = folded.replace("’", "'").replace("‘", "'").replace("&", " and ")
    words: list[str] = []
    for raw in folded.split():
        if raw in _FILLERS:
            continue
        words.append(_MARKER.sub("", raw))
    folded = _spell_numbers(" ".join(words))
    # keep letters, digits and apostrophes inside words
    folded = re.sub(r"[^\w']+", " ", folded)
    folded = re.sub(r"(?<!\w)'|'(?!\w)", " ", folded).replace("_", " ")
    return folded.split()


@dataclass(frozen=True)
class WordErrors:
    substitutions: int
    deletions: int
    insertions: int
    reference_words: int
    hypothesis_words: int

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def wer(self) -> float:
        if self.reference_words == 0:
            return 0.0 if self.hypothesis_words == 0 else 1.0
        return self.errors / self.reference_words

    def to_dict(self) -> dict[str, float | int]:
        return {"wer": round(self.wer, 4), "substitutions": self.substitutions,
                "deletions": self.deletions, "insertions": self.insertions,
                "reference_words": self.reference_words}


def align(ref: list[str], hyp: list[str]) -> WordErrors:
    """Minimum edit alignment of two word lists (Levenshtein, unit costs)."""
    n, m = len(ref), len(hyp)
    # each cell: (cost, subs, dels, ins), ties broken towards fewer insertions
    prev = [(j, 0, 0, j) for j in range(m + 1)]
    for i in range(1, n + 1):
        cur = [(i, 0, i, 0)]
        for j in range(1, m + 1):
            c, s, d, k = prev[j - 1]
            same = ref[i - 1] == hyp[j - 1]
            best = (c + (0 if same else 1), s + (0 if same else 1), d, k)
            c, s, d, k = prev[j]
            best = min(best, (c + 1, s, d + 1, k))
            c, s, d, k = cur[j - 1]
            best = min(best, (c + 1, s, d, k + 1))
            cur.append(best)
        prev = cur
    _, s, d, k = prev[m]
    return WordErrors(s, d, k, n, m)


def word_errors(reference: str, hypothesis: str) -> WordErrors:
    return align(normalize_words(reference), normalize_words(hypothesis))


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate of `hypothesis` against `reference`, after normalisation."""
    return word_errors(reference, hypothesis).wer


def word_count(text: str) -> int:
    return len(normalize_words(text))
