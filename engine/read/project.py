"""A read project: each script line with its voice, the text the model is given, its key,
its takes and the chosen one (the folder: `engine.layout.reading`). Light: no torch, so
the window reads a project through this module."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config.read import ReadRequest
from engine.core.atomic import read_json, write_json
from engine.core.errors import InputError
from engine.layout import reading
from engine.read.pronounce import Dictionary
from engine.read.script import Line, Script, read_script
from engine.serve.voices import ServedVoice, discover
from engine.text import spoken_text


@dataclass
class PlannedLine:
    """A script line as rendered: its voice, what the model is told, its takes."""

    line: Line
    voice: ServedVoice
    #: the text with the pronunciations applied (what the model is given)
    spoken: str
    key: str
    #: seeds of its finished takes
    seeds: list[int] = field(default_factory=list)
    chosen: int | None = None

    @property
    def number(self) -> int:
        return self.line.number

    def record(self, project: Path, seed: int) -> dict[str, Any]:
        return read_json(reading.take_record(project, self.key, seed)) or {}


@dataclass
class Plan:
    project: Path
    request: ReadRequest
    script: Script
    lines: list[PlannedLine]

    def line(self, number: int) -> PlannedLine:
        for planned in self.lines:
            if planned.number == number:
                return planned
        raise InputError(f"The script has no line {number}.",
                         f"Its lines are numbered 1 to {len(self.lines)}.")

    def missing(self) -> list[PlannedLine]:
        """Lines with no take yet (an export renders these first)."""
        return [p for p in self.lines if not p.seeds]


def line_key(line: Line, voice: str, spoken: str, language: str, chunk_chars: int,
             max_frames: int | None) -> str:
    """What changes a line's sound, as a short digest (the seed names the take)."""
    data = json.dumps([line.text, voice, line.style, spoken, language, chunk_chars, max_frames],
                      ensure_ascii=False)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()[:20]


def _voices(request: ReadRequest) -> dict[str, ServedVoice]:
    if request.workspace is None:
        raise InputError("No workspace was given, so the script's voices cannot be found.",
                         "Give {read.workspace} (the folder of your voices).")
    return discover([], request.workspace)


def _voice_for(speaker: str, request: ReadRequest, voices: dict[str, ServedVoice]
               ) -> ServedVoice:
    cast = request.casting()
    by_lower = {name.lower(): name for name in voices}
    if not speaker:
        name = request.voice or (next(iter(voices)) if len(voices) == 1 else None)
        if name is None:
            raise InputError("Lines without a speaker need a narrator's voice.",
                             "Give {read.voice}, one of: " + ", ".join(sorted(voices)) + ".")
    else:
        name = cast.get(speaker.lower()) or by_lower.get(speaker.lower())
        if name is None:
            raise InputError(f"The script's speaker {speaker!r} is not a voice.",
                             f"Give {{read.cast}} {speaker}=VOICE, VOICE one of: "
                             f"{', '.join(sorted(voices))}.")
    found = voices.get(name) or voices.get(by_lower.get(name.lower(), ""))
    if found is None:
        raise InputError(f"There is no voice {name!r} in the workspace.",
                         f"Use one of: {', '.join(sorted(voices))}.")
    return found


def voice_folder(voice: ServedVoice, workspace: Path) -> Path:
    """The voice folder a served voice belongs to (its pronunciations live there)."""
    return workspace / voice.name.split("/", 1)[0]


def _language(language: str) -> str | None:
    return None if language == "auto" else language


def project_dir(request: ReadRequest) -> Path:
    return Path(request.project) if request.project else reading.default_project_dir(
        request.script)


def make_plan(request: ReadRequest) -> Plan:
    """The project's lines as `request` renders them (reads the script and the disk)."""
    script = read_script(request.script)
    voices = _voices(request)
    project = project_dir(request)
    workspace = Path(str(request.workspace))
    chosen_voices = {line.speaker: _voice_for(line.speaker, request, voices)
                     for line in script.lines}
    folders = sorted({voice_folder(v, workspace) for v in chosen_voices.values()})
    dictionary = Dictionary.load(reading.pronunciation_files(project, workspace, folders))
    lines = []
    for line in script.lines:
        voice = chosen_voices[line.speaker]
        respelled = dictionary.apply(line.text, voice_folder(voice, workspace).name,
                                     request.language)
        # numbers, amounts and units in words, emoji and stray marks out (the one normal
        # form of text written to be read)
        spoken = spoken_text(respelled, _language(request.language)) or respelled
        key = line_key(line, voice.name, spoken, request.language, request.chunk_chars,
                       request.max_frames)
        seeds = reading.take_seeds(project, key)
        chosen = (read_json(reading.chosen_file(project, key)) or {}).get("seed")
        lines.append(PlannedLine(line, voice, spoken, key, seeds,
                                 chosen if chosen in seeds else None))
    return Plan(project, request, script, lines)


def open_project(project: str | Path) -> Plan:
    """The plan of a project folder as its last render asked (the window's view)."""
    data = read_json(Path(project) / reading.PROJECT_FILE)
    if not isinstance(data, dict):
        raise InputError(f"{project} is not a read project (it has no "
                         f"{reading.PROJECT_FILE}).", "Render a script into it first.")
    return make_plan(ReadRequest.from_dict({**data, "project": str(project)}))


def save_request(plan: Plan) -> None:
    plan.project.mkdir(parents=True, exist_ok=True)
    # what a later look at the project means: the voices and pauses, not a one-off action
    kept = plan.request.replace(regenerate=(), pick=())
    write_json(plan.project / reading.PROJECT_FILE, kept.to_dict())


def choose(plan: Plan, number: int, seed: int) -> None:
    """Make take `seed` the one line `number`'s export uses."""
    planned = plan.line(number)
    if seed not in planned.seeds:
        raise InputError(f"Line {number} has no take with seed {seed}.",
                         f"Its takes: {', '.join(map(str, planned.seeds)) or 'none yet'}.")
    write_json(reading.chosen_file(plan.project, planned.key), {"seed": seed})
    planned.chosen = seed


def take_flagged(record: dict[str, Any]) -> bool:
    return bool(record.get("problems"))


def best_take(plan: Plan, planned: PlannedLine) -> int | None:
    """The take the export uses: the chosen one, else the first without a problem, else
    the first (flagged)."""
    if planned.chosen is not None:
        return planned.chosen
    for seed in planned.seeds:
        if not take_flagged(planned.record(plan.project, seed)):
            return seed
    return planned.seeds[0] if planned.seeds else None
