"""Word error rate (no dependency: a word-level edit distance).

Both sides are compared as `engine.text.wer_words` gives their words (case,
accents and punctuation aside, numbers spelled out, recogniser markers
removed), so "Dr. Smith paid $12." and "dr smith paid twelve" differ only
where the words do.

WER = (substitutions + deletions + insertions) / words of the reference; it
can exceed 1 when the hypothesis adds many words. An empty reference gives 0
for an empty hypothesis and 1 otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.text import wer_words


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
    return align(wer_words(reference), wer_words(hypothesis))


def wer(reference: str, hypothesis: str) -> float:
    """Word error rate of `hypothesis` against `reference`, after normalisation."""
    return word_errors(reference, hypothesis).wer


def word_count(text: str) -> int:
    return len(wer_words(text))
