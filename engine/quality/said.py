"""Is a render saying its text? A take can be fluent and wrong: words skipped or said
twice, another sentence, another language. The recogniser transcribes it and the word
error rate against the text (both sides as `engine.text.wer_words` gives their words)
says how far it is; above a threshold, the take is said to have the wrong words.

`WordCheck` loads its recogniser once, on the first take it is asked about, and says
once, instead of failing the render, when it cannot check a language (pocketsphinx, the
offline fallback, knows English only).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.asr.recognizer import Recognizer, language_code, load_recognizer, to_16k
from engine.asr.wer import word_errors
from engine.core.errors import VoxshardError

#: the problem a take with too many word errors has (beside "loop", "silent", ...)
WRONG_WORDS = "wrong words"


@dataclass(frozen=True)
class Said:
    """What the recogniser heard in a take, and its word error rate against the text."""

    heard: str
    wer: float
    #: seconds the recogniser took
    compute_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"wer": round(self.wer, 3), "heard": self.heard,
                "wer_compute_s": round(self.compute_s, 3)}


def words_problem(wer: float | None, wer_max: float) -> str | None:
    """`WRONG_WORDS` when a take's word error rate is above `wer_max` (None: unscored)."""
    return WRONG_WORDS if wer is not None and wer > wer_max else None


class WordCheck:
    """Scores takes against their text with one recogniser (`spec`: as `--asr` takes it:
    "auto", "pocketsphinx", a Whisper folder or hub id)."""

    def __init__(self, spec: str = "auto", device: str | None = None) -> None:
        self.spec = spec
        self.device = device
        self._recognizer: Recognizer | None = None
        #: why takes in a language cannot be checked, by language ("" for every language)
        self.cannot: dict[str, str] = {}

    @property
    def name(self) -> str:
        """The recogniser's model once loaded, else the spec asked for."""
        return self._recognizer.model if self._recognizer is not None else self.spec

    def _load(self) -> Recognizer | None:
        if self._recognizer is None and "" not in self.cannot:
            try:
                self._recognizer = load_recognizer(self.spec, self.device)
            except VoxshardError as exc:
                self.cannot[""] = f"{exc.message} {exc.hint or ''}".strip()
        return self._recognizer

    def score(self, audio: np.ndarray, sample_rate: int, text: str,
              language: str | None) -> Said | None:
        """The take `audio` against `text`; None when it cannot be checked (`cannot`
        says why, once per language)."""
        lang = language_code(language) or (language or "")
        if lang in self.cannot:
            return None
        recognizer = self._load()
        if recognizer is None:
            return None
        try:
            heard = recognizer.transcribe(to_16k(audio, sample_rate),
                                          None if lang in ("", "auto") else lang)
        except VoxshardError as exc:  # a language the recogniser does not know
            self.cannot[lang] = f"{exc.message} {exc.hint or ''}".strip()
            return None
        return Said(heard.text, word_errors(text, heard.text).wer, heard.compute_s)

    def why_not(self, language: str | None) -> str | None:
        """Why takes in `language` are not checked (None: they are, or none was asked)."""
        lang = language_code(language) or (language or "")
        return self.cannot.get("") or self.cannot.get(lang)
