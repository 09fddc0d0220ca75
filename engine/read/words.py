"""Is every take saying its line? The word check of a read (`ReadRequest.word_check`).

Each take is transcribed as it is finished (`Words.judge`, from `render`) and its word
error rate against its part's text (`project.said_text`) kept in its record ("wer",
"heard"); above `ReadRequest.wer_max` the take has the problem `WRONG_WORDS`, so it is
retried and flagged like a loop. Takes made before (the check off, or an older project)
are scored when a read with the check on finds the take an export would use of a part
unscored
(`Words.score_kept`), so turning the check on checks the book as it stands.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.audio.io import read_mono
from engine.audio.timebase import SAMPLE_RATE
from engine.core.atomic import write_json
from engine.core.events import Emitter
from engine.layout import reading
from engine.quality.said import WRONG_WORDS, WordCheck, words_problem
from engine.read.project import Plan, PlannedLine, PlannedPart, best_take, said_text
from engine.read.pronounce import line_language


class Words:
    """The word check of one read: its recogniser, loaded on the first take it scores."""

    def __init__(self, plan: Plan, emitter: Emitter) -> None:
        request = plan.request
        self.plan = plan
        self.emitter = emitter
        self.check = WordCheck(request.asr, request.device)
        self._told: set[str] = set()

    def language(self, planned: PlannedLine) -> str:
        return line_language(self.plan.request.language, planned.voice.language)

    def judge(self, planned: PlannedLine, part: PlannedPart, audio: np.ndarray,
              problems: list[str]) -> dict[str, Any]:
        """Score a finished take of `part` (`audio`, 24 kHz); adds `WRONG_WORDS` to
        `problems` when its words are not the part's. Returns what its record keeps ({}
        if unchecked)."""
        language = self.language(planned)
        said = self.check.score(audio, SAMPLE_RATE, said_text(self.plan, planned, part),
                                language)
        if said is None:
            self._tell(language)
            return {}
        problem = words_problem(said.wer, self.plan.request.wer_max)
        if problem and problem not in problems:
            problems.append(problem)
        return said.to_dict()

    def _tell(self, language: str) -> None:
        why = self.check.why_not(language)
        if why and why not in self._told:
            self._told.add(why)
            self.emitter.log(f"The words of {language} takes are not checked: {why}",
                             level="warning", word_check=False)

    def score_kept(self) -> list[int]:
        """Score the take each part's export would use where it has no score yet (and the
        next one, while the used take says the wrong words); returns the lines scored."""
        plan = self.plan
        due = [(p, part) for p in plan.lines for part in p.parts
               if part.seeds and not part.other_model
               and "wer" not in part.record(plan.project,
                                            best_take(plan, part) or part.seeds[0])]
        scored: list[int] = []
        for done, (planned, part) in enumerate(due, 1):
            tried: set[int] = set()
            while (seed := best_take(plan, part)) is not None and seed not in tried:
                tried.add(seed)
                record = part.record(plan.project, seed)
                if "wer" in record:
                    break
                audio = read_mono(reading.take_audio(plan.project, part.key, seed),
                                  SAMPLE_RATE)
                problems = [str(p) for p in record.get("problems") or []]
                said = self.judge(planned, part, audio, problems)
                if not said:
                    break
                write_json(reading.take_record(plan.project, part.key, seed),
                           {**record, **said, "problems": problems})
                if WRONG_WORDS not in problems:
                    break
            if planned.number not in scored:
                scored.append(planned.number)
            self.emitter.progress("words", done, len(due), line=planned.number,
                                  part=part.index + 1)
        return scored
