"""Prompt sets: sentences to read aloud, grouped by style.

Sets live in `assets/prompts/*.txt` (format in assets/prompts/README.md). Which of
them a voice still lacks is `engine.layout.voice_prompts`.

Light module: no numpy, no torch.
"""

from __future__ import annotations

import os
import re
from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from engine.core.errors import InputError
from engine.text import tidy_text

_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def prompts_dir() -> Path:
    """Where the bundled sets are; VOXSHARD_PROMPTS_DIR overrides (tests, packaging)."""
    override = os.environ.get("VOXSHARD_PROMPTS_DIR")
    if override:
        return Path(override)
    return Path(__file__).resolve().parents[2] / "assets" / "prompts"


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str
    group: str
    set_name: str
    #: how to read it (its group's style: "Whisper."); "" plain. A take keeps it.
    style: str = ""
    #: the style as the reader is told it, in the set's language ("Flüstern."); "" where
    #: the set gives none (the style itself is then said)
    cue: str = ""

    @property
    def reading_cue(self) -> str:
        """What the reader is told of how to read it: the cue, else the style."""
        return self.cue or self.style

    def to_dict(self) -> dict[str, str]:
        return {"id": self.id, "text": self.text, "group": self.group, "set": self.set_name,
                "style": self.style, "cue": self.reading_cue}


@dataclass
class PromptSet:
    name: str
    language: str = "english"
    title: str = ""
    prompts: list[Prompt] = field(default_factory=list)

    @property
    def groups(self) -> list[str]:
        seen: dict[str, None] = {}
        for p in self.prompts:
            seen.setdefault(p.group, None)
        return list(seen)

    def get(self, prompt_id: str) -> Prompt | None:
        for p in self.prompts:
            if p.id == prompt_id:
                return p
        return None

    def __len__(self) -> int:
        return len(self.prompts)


def parse_prompt_set(text: str, default_name: str, source: str = "<text>") -> PromptSet:
    """Parse the prompt-set format; raises InputError naming the bad line."""
    ps = PromptSet(name=default_name)
    group, style, cue = "default", "", ""
    ids: set[str] = set()
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("@"):
            key, _, value = line[1:].partition(" ")
            if key in ("name", "language", "title"):
                setattr(ps, key, value.strip())
            continue
        if line.startswith("[") and line.endswith("]"):
            # "[group | style | cue]": every prompt of the group is read in that style
            # (the description it trains with); the cue tells the reader so in the set's
            # language
            name, _, said = line[1:-1].partition("|")
            said, _, told = said.partition("|")
            group, style, cue = name.strip() or "default", tidy_text(said), tidy_text(told)
            continue
        pid, sep, sentence = line.partition("|")
        pid, sentence = pid.strip(), tidy_text(sentence)
        if not sep or not sentence or not _ID_RE.match(pid):
            raise InputError(f"{source} line {n} is not 'id | sentence'.")
        if pid in ids:
            raise InputError(f"{source} line {n} repeats the prompt id {pid!r}.")
        ids.add(pid)
        ps.prompts.append(Prompt(pid, sentence, group, ps.name, style, cue))
    # the set name may be declared after the first prompt is read
    ps.prompts = [Prompt(p.id, p.text, p.group, ps.name, p.style, p.cue) for p in ps.prompts]
    return ps


def load_prompt_set(path: str | os.PathLike[str]) -> PromptSet:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"Cannot read the prompt set {p}: {exc}.") from exc
    return parse_prompt_set(text, p.stem, p.name)


def list_prompt_sets(folder: Path | None = None) -> list[PromptSet]:
    root = folder or prompts_dir()
    return [load_prompt_set(f) for f in sorted(root.glob("*.txt"))]


def get_prompt_set(name: str, folder: Path | None = None) -> PromptSet:
    sets = list_prompt_sets(folder)
    for ps in sets:
        if ps.name == name:
            return ps
    names = ", ".join(ps.name for ps in sets) or "none"
    raise InputError(f"There is no prompt set named {name!r} (available: {names}).")


def languages_with_prompts(folder: Path | None = None) -> list[str]:
    """The languages some bundled prompt set is written in (what a new voice may choose)."""
    return sorted({ps.language.strip().lower() for ps in list_prompt_sets(folder)
                   if ps.language.strip() and len(ps)})


def prompt_set_for_language(language: str, folder: Path | None = None) -> str | None:
    """The name of the prompt set for a language (its own name first), or None."""
    lang = language.strip().lower()
    sets = [ps for ps in list_prompt_sets(folder) if ps.language.strip().lower() == lang]
    sets.sort(key=lambda ps: ps.name != lang)
    return sets[0].name if sets else None


def in_groups(ps: PromptSet, groups: list[str] | tuple[str, ...] | set[str]) -> list[Prompt]:
    """The prompts of `ps` in the given groups, in set order (no groups: every prompt)."""
    wanted = set(groups)
    return [p for p in ps.prompts if not wanted or p.group in wanted]


class StyledPrompt(Protocol):
    """What `style_counts` reads of a prompt (the window keeps prompts of its own)."""

    @property
    def id(self) -> str: ...
    @property
    def group(self) -> str: ...
    @property
    def style(self) -> str: ...


@dataclass(frozen=True)
class StyleCount:
    """How many of a style's prompts have a take that can train."""

    style: str  # how its prompts are read ("Whisper.")
    group: str  # its group's name in the set ("whisper"): the short name to show
    recorded: int
    total: int
    #: its first prompt without such a take, in set order (None: every one is recorded)
    next_id: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"style": self.style, "group": self.group, "recorded": self.recorded,
                "total": self.total, "next": self.next_id}


def style_counts(prompts: Iterable[StyledPrompt], done: Container[str]) -> list[StyleCount]:
    """Per style the prompts offer, in set order: its prompts with a take (`done`: the
    prompt ids whose takes can train, as `recorded_prompt_ids`) of how many. Plain
    prompts count nowhere."""
    by_style: dict[str, list[StyledPrompt]] = {}
    for p in prompts:
        if p.style:
            by_style.setdefault(p.style, []).append(p)
    out = []
    for style, mine in by_style.items():
        left = [p.id for p in mine if p.id not in done]
        out.append(StyleCount(style, mine[0].group, len(mine) - len(left), len(mine),
                              left[0] if left else None))
    return out
