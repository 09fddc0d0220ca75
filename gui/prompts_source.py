"""The sentences to read aloud, from the engine's prompt sets (engine.layout.prompts).

Which prompts are done is read from the voice's takes (their `prompt_id`),
so the order survives restarts and a crash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.core.errors import VoxshardError
from engine.layout import prompts as engine_prompts


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    group: str = ""
    #: how to read it (the engine prompt's style, e.g. "Whisper."); "" reads it plainly
    style: str = ""
    #: the style as the reader is told it, in the set's language (the engine's reading_cue)
    cue: str = ""


def _as_prompt(obj: Any) -> Prompt:
    if isinstance(obj, Prompt):
        return obj
    if isinstance(obj, dict):
        style = str(obj.get("style", "") or "")
        return Prompt(str(obj["id"]), str(obj["text"]), str(obj.get("group", "")), style,
                      str(obj.get("cue", "") or style))
    style = str(getattr(obj, "style", "") or "")
    return Prompt(str(obj.id), str(obj.text), str(getattr(obj, "group", "") or ""), style,
                  str(getattr(obj, "reading_cue", "") or style))


class PromptSource:
    def __init__(self) -> None:
        self.set_name = "english"
        self.groups: tuple[str, ...] = ()  # the groups chosen to read; empty: all
        self.all_groups: list[str] = []  # every group of the set, in set order
        self.prompts: list[Prompt] = []
        self.done: set[str] = set()
        self.error = ""

    def load(self, set_name: str, groups: tuple[str, ...], done: set[str]) -> None:
        """The voice's prompt set and chosen groups, and the prompt ids its takes already
        hold (a snapshot's)."""
        try:
            if set_name != self.set_name or groups != self.groups or not self.prompts:
                prompt_set = engine_prompts.get_prompt_set(set_name)
                self.all_groups = prompt_set.groups
                self.prompts = [_as_prompt(p)
                                for p in engine_prompts.in_groups(prompt_set, groups)]
            self.set_name = set_name
            self.groups = tuple(groups)
            self.done = set(done)
            self.error = ""
        except VoxshardError as exc:
            self.prompts, self.done, self.error = [], set(), exc.message

    def is_done(self, prompt: Prompt) -> bool:
        return prompt.id in self.done

    def mark_done(self, prompt: Prompt) -> None:
        self.done.add(prompt.id)

    def counts(self) -> tuple[int, int]:
        ids = {p.id for p in self.prompts}
        return len(self.done & ids), len(ids)

    def previous(self, before: Prompt | None) -> Prompt | None:
        """The prompt before `before` in set order, recorded or not (the last one for None)."""
        if not self.prompts:
            return None
        ids = [p.id for p in self.prompts]
        at = ids.index(before.id) if before is not None and before.id in ids else 0
        return self.prompts[(at - 1) % len(self.prompts)]

    def next(self, after: Prompt | None = None) -> Prompt | None:
        """The next unrecorded prompt, after `after` when skipping (wrapping around)."""
        if not self.prompts:
            return None
        start = 0
        if after is not None:
            ids = [p.id for p in self.prompts]
            if after.id in ids:
                start = ids.index(after.id) + 1
        n = len(self.prompts)
        for k in range(n):
            p = self.prompts[(start + k) % n]
            if p.id not in self.done and (after is None or p.id != after.id):
                return p
        return None
