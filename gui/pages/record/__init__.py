"""Record: read the prompt aloud, keyboard first. `page` builds the page from its parts:
`verdict` (judging a take), `take` (a take's lifecycle), `prompt_card` (what is read, the
set, the progress and styles), `dialogs` (the questions that guard a take), `keys`."""

from gui.pages.record.page import RecordPage
from gui.pages.record.verdict import (
    SILENT,
    TRIM_KEEP_S,
    Judgement,
    judge_take,
    take_warnings,
    trim_take,
)

__all__ = ["SILENT", "TRIM_KEEP_S", "Judgement", "RecordPage", "judge_take", "take_warnings",
           "trim_take"]
