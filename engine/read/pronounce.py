"""Pronunciation dictionaries: a word or pattern and how to say it, applied at render time.

Each scope keeps a JSON list of entries (`engine.layout.reading.pronunciation_files`):
the workspace's, each voice's (for that voice's lines only) and the project's; a narrower
scope's entry for the same word wins. An entry:

    {"word": "Voxshard", "say": "vox shard"}                       whole word, any case
    {"pattern": "\\bQ(\\d)\\b", "say": "quarter \\1"}               a regular expression
    {"word": "live", "say": "lyve", "language": "english"}         only for that language

A line's language is the read's (`--language`), or under "auto" its voice's own. A scope
is `project`, `workspace` or `voice:NAME` with NAME a voice folder of the workspace
(`dictionary_file`); any other is refused, never written where no read looks.

The line's stored text never changes: the respelling is what the model is given, and it is
part of the take's key, so a changed dictionary renders again only the lines it touches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.atomic import read_json, write_json
from engine.core.errors import InputError
from engine.layout import reading


@dataclass(frozen=True)
class Respelling:
    find: str
    say: str
    #: `find` is a regular expression (else a whole word, any case)
    pattern: bool = False
    language: str | None = None

    def regex(self) -> re.Pattern[str]:
        if self.pattern:
            return re.compile(self.find)
        return re.compile(rf"(?<!\w){re.escape(self.find)}(?!\w)", re.IGNORECASE)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pattern" if self.pattern else "word": self.find, "say": self.say}
        if self.language:
            out["language"] = self.language
        return out


def _entry(raw: Any, where: Path) -> Respelling:
    if not isinstance(raw, dict) or not isinstance(raw.get("say"), str) \
            or not (isinstance(raw.get("word"), str) or isinstance(raw.get("pattern"), str)):
        raise InputError(f"An entry of {where} is not {{\"word\" or \"pattern\", \"say\"}}: "
                         f"{raw!r}.", "Fix or remove that entry.")
    pattern = "pattern" in raw
    entry = Respelling(str(raw["pattern"] if pattern else raw["word"]).strip(), raw["say"],
                       pattern, (str(raw["language"]).lower() if raw.get("language") else None))
    if not entry.find:
        raise InputError(f"An entry of {where} has an empty word.", "Fix or remove that entry.")
    try:
        entry.regex()
    except re.error as exc:
        raise InputError(f"The pattern {entry.find!r} in {where} is not a regular expression "
                         f"({exc}).", "Fix the pattern, or give it as a word.") from exc
    return entry


def read_dictionary(path: Path) -> list[Respelling]:
    """The entries of one scope's file (none when it does not exist)."""
    if not path.is_file():
        return []
    data = read_json(path)
    if not isinstance(data, list):
        raise InputError(f"The pronunciation dictionary {path} is not a JSON list.",
                         "Fix it, or remove it to start again.")
    return [_entry(raw, path) for raw in data]


def add_respelling(path: Path, find: str, say: str, *, pattern: bool = False,
                   language: str | None = None) -> list[Respelling]:
    """Add (or replace) an entry in one scope's file; returns its entries."""
    new = _entry({"pattern" if pattern else "word": find, "say": say,
                  **({"language": language} if language else {})}, path)
    kept = [e for e in read_dictionary(path)
            if (e.find.lower(), e.pattern, e.language) != (new.find.lower(), new.pattern,
                                                           new.language)]
    kept.append(new)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, [e.to_dict() for e in kept])
    return kept


def dictionary_file(scope: str, project: Path, workspace: Path | None) -> Path:
    """The file a scope's entries live in, where a read looks for them
    (`engine.layout.reading.pronunciation_files`); a scope no read looks at is refused."""
    if scope == "project":
        return project / reading.PRONUNCIATIONS_FILE
    if scope != "workspace" and not scope.startswith("voice:"):
        raise InputError(f"The pronunciation scope {scope!r} is not project, workspace or "
                         "voice:NAME.", "Give one of those.")
    if workspace is None:
        raise InputError(f"The pronunciation scope {scope} needs the workspace.",
                         "Give {read.workspace}.")
    if scope == "workspace":
        return workspace / reading.PRONUNCIATIONS_FILE
    name = scope.split(":", 1)[1].strip()
    folders = sorted(p.name for p in workspace.iterdir()
                     if p.is_dir() and (p / "voice.toml").is_file()) if workspace.is_dir() else []
    if name not in folders:
        raise InputError(f"The pronunciation scope {scope} names no voice folder of the "
                         "workspace (a voice's entries apply to all its tiers).",
                         "Give voice:NAME with NAME one of: " + (", ".join(folders) or "none")
                         + ".")
    return workspace / name / reading.PRONUNCIATIONS_FILE


@dataclass(frozen=True)
class Dictionary:
    """Every scope's entries, widest first: (scope, entries)."""

    scopes: tuple[tuple[str, tuple[Respelling, ...]], ...]

    @staticmethod
    def load(files: dict[str, Path]) -> Dictionary:
        return Dictionary(tuple((scope, tuple(read_dictionary(path)))
                                for scope, path in files.items()))

    def entries(self, voice_dir: str | None, language: str) -> list[Respelling]:
        """The entries that apply to a line of `voice_dir`'s voice in `language` (the
        line's: `line_language`), one per word, the narrowest scope's."""
        chosen: dict[tuple[str, bool], Respelling] = {}
        for scope, entries in self.scopes:
            if scope.startswith("voice:") and scope != f"voice:{voice_dir}":
                continue
            for entry in entries:
                if entry.language is not None and entry.language != language.lower():
                    continue
                chosen[(entry.find if entry.pattern else entry.find.lower(), entry.pattern)] = entry
        return list(chosen.values())

    def apply(self, text: str, voice_dir: str | None, language: str) -> str:
        """`text` as the model should be given it."""
        for entry in self.entries(voice_dir, language):
            text = entry.regex().sub(entry.say.replace("\\", "\\\\") if not entry.pattern
                                     else entry.say, text)
        return text


def line_language(language: str, voice_language: str | None) -> str:
    """The language a line's pronunciations are picked by: the read's, or under "auto"
    its voice's own (as its voice.toml says; "auto" when it says none)."""
    if language.lower() != "auto":
        return language.lower()
    return (voice_language or "auto").lower()
