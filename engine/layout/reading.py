"""A read project's folder: the takes of each part of a line, the chosen one, the export's
state.

    <project>/
      project.json            what the last render was asked (script, voices, seed, ...)
      pronunciations.json     the project's own respellings (see `pronunciation_files`)
      takes/<part key>/<seed>.wav    one rendered take of a part of a line
      takes/<part key>/<seed>.json   its record: line, part, text said, voice, style, flags
      takes/<part key>/chosen.json   {"seed": N}: the take the export uses
      export.json             the last export: its file, format and chapters

A line is said in parts, sentence groups of at most `chunk_chars` (the synthesizer's
chunks, `engine.read.project.line_parts`); a part's key is a digest of its line (its
text, voice, style, language, the text after pronunciations, and which of the lines
that are all that alike it is), its place and words in the line, and the model its
voice speaks with (`engine.read.project.take_key`); the seed names the take, so an
edited line, or a voice that now speaks with another model, gets new keys and only its
lines are rendered again. A line said in one part has the line's own key: the same
folder a whole-line take of it had before lines were cut in parts. Light: no torch.
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_FILE = "project.json"
TAKES_DIR = "takes"
CHOSEN_FILE = "chosen.json"
EXPORT_FILE = "export.json"
PRONUNCIATIONS_FILE = "pronunciations.json"
#: the project folder made beside a script when none is named: `<script stem>.read`
PROJECT_SUFFIX = ".read"


def default_project_dir(script: str | os.PathLike[str]) -> Path:
    path = Path(script)
    return path.with_name(path.stem + PROJECT_SUFFIX)


def takes_dir(project: Path, key: str) -> Path:
    return project / TAKES_DIR / key


def take_audio(project: Path, key: str, seed: int) -> Path:
    return takes_dir(project, key) / f"{seed}.wav"


def take_record(project: Path, key: str, seed: int) -> Path:
    return takes_dir(project, key) / f"{seed}.json"


def chosen_file(project: Path, key: str) -> Path:
    return takes_dir(project, key) / CHOSEN_FILE


def take_seeds(project: Path, key: str) -> list[int]:
    """The seeds of a part's finished takes (a take is finished once its record is
    written)."""
    folder = takes_dir(project, key)
    if not folder.is_dir():
        return []
    seeds = [int(p.stem) for p in folder.glob("*.json") if p.stem.isdigit()
             and (folder / f"{p.stem}.wav").is_file()]
    return sorted(seeds)


def pronunciation_files(project: Path, workspace: Path | None,
                        voice_dirs: list[Path]) -> dict[str, Path]:
    """Where each scope keeps its respellings, from the widest to the narrowest:
    the workspace's, each voice's (applied to its lines only), the project's."""
    files: dict[str, Path] = {}
    if workspace is not None:
        files["workspace"] = workspace / PRONUNCIATIONS_FILE
    for voice in voice_dirs:
        files[f"voice:{voice.name}"] = voice / PRONUNCIATIONS_FILE
    files["project"] = project / PRONUNCIATIONS_FILE
    return files
