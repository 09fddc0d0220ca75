"""A read project: each script line with its voice, the text the model is given, and its
parts: a line is cut where the synthesizer cuts a text into chunks (`line_parts`: sentence
groups of at most `chunk_chars`), and each part is a take of its own, with its key, seeds,
records and the chosen one (the folder: `engine.layout.reading`); a line is its parts'
chosen takes in order. Light: no torch, so the window reads a project through this
module."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config.read import ReadRequest, line_part
from engine.config.speak import SpeakOptions
from engine.core.atomic import read_json, write_json
from engine.core.errors import InputError, VoxshardError
from engine.layout import reading
from engine.read.pronounce import Dictionary, line_language
from engine.read.script import Line, Script, ScriptNames, read_script
from engine.serve.voices import ServedVoice, discover, serving_base
from engine.synth.fingerprint import sound_fingerprint
from engine.synth.voice import style_note
from engine.text import Chunk, split_text, spoken_text


@dataclass
class PlannedPart:
    """A part of a line (`line_parts`): the unit of a take, a retry, a pick and a progress
    step."""

    #: its line's number
    number: int
    #: 0-based, in the line (said as `N.K`, K from 1: `part_name`)
    index: int
    #: what the model is told: this part of its line's text as given to the model
    text: str
    #: seconds of silence after it in its line (the synthesizer's own pause between
    #: chunks; 0 after the line's last part)
    pause_after_s: float
    #: the folder of the takes it uses (`own_key`, or a key of another model of its voice
    #: when the request keeps those)
    key: str
    #: its takes' key with the model its voice speaks with now (`take_key`)
    own_key: str = ""
    #: what it is, whatever model says it (`part_identity`)
    identity: str = ""
    #: seeds of its finished takes
    seeds: list[int] = field(default_factory=list)
    chosen: int | None = None
    #: its takes came from another model of its voice: "kept" (asked) or "" (none)
    other_model: str = ""

    @property
    def name(self) -> str:
        return part_name(self.number, self.index)

    def record(self, project: Path, seed: int) -> dict[str, Any]:
        return read_json(reading.take_record(project, self.key, seed)) or {}


def part_name(number: int, index: int) -> str:
    """How a part is named to people and on the command line: `N.K`, K from 1."""
    return f"{number}.{index + 1}"


@dataclass
class PlannedLine:
    """A script line as rendered: its voice, what the model is told, its parts."""

    line: Line
    voice: ServedVoice
    #: the text with the pronunciations applied (what the model is given)
    spoken: str
    #: what it is, whatever model says it (`line_identity`)
    identity: str = ""
    #: the model its voice speaks with now (`engine.synth.fingerprint`)
    model: str = ""
    #: the parts its export uses, in order: `cut`, or its one whole-line take made before
    #: takes were cut in parts (`whole`)
    parts: list[PlannedPart] = field(default_factory=list)
    #: its parts as `line_parts` cuts it
    cut: list[PlannedPart] = field(default_factory=list)
    #: it keeps a whole-line take made before takes were cut in parts, until a new take of
    #: it is asked for (it is never rendered again on its own)
    whole: bool = False

    @property
    def number(self) -> int:
        return self.line.number

    @property
    def other_model(self) -> str:
        """"kept" when a part uses another model's takes ("" for none)."""
        return "kept" if any(p.other_model for p in self.parts) else ""

    def part(self, index: int) -> PlannedPart:
        if not 0 <= index < len(self.parts):
            raise InputError(f"Line {self.number} has no part {index + 1}.",
                             f"Its parts are {self.number}.1 to "
                             f"{part_name(self.number, len(self.parts) - 1)}.")
        return self.parts[index]

    @property
    def only(self) -> PlannedPart:
        """Its one part (a line said in one take); a line of several names one."""
        if len(self.parts) != 1:
            raise InputError(f"Line {self.number} is said in {len(self.parts)} parts.",
                             f"Name one as {self.number}.K, K from 1 to {len(self.parts)}.")
        return self.parts[0]

    # a line of one part: its take's key, seeds, chosen seed and records
    @property
    def key(self) -> str:
        return self.only.key

    @property
    def own_key(self) -> str:
        return self.only.own_key

    @property
    def seeds(self) -> list[int]:
        return self.only.seeds

    @property
    def chosen(self) -> int | None:
        return self.only.chosen

    def record(self, project: Path, seed: int) -> dict[str, Any]:
        return self.only.record(project, seed)


@dataclass
class Plan:
    project: Path
    request: ReadRequest
    script: Script
    lines: list[PlannedLine]
    #: lines whose takes were made by another model of their voice than it speaks with
    #: now: rendered again, or kept when the request says so (`ReadRequest.keep_other_models`)
    other_model: list[int] = field(default_factory=list)

    def line(self, number: int) -> PlannedLine:
        for planned in self.lines:
            if planned.number == number:
                return planned
        raise InputError(f"The script has no line {number}.",
                         f"Its lines are numbered 1 to {len(self.lines)}.")

    def missing(self) -> list[tuple[PlannedLine, PlannedPart]]:
        """Parts with no take yet (an export renders these first)."""
        return [(p, part) for p in self.lines for part in p.parts if not part.seeds]

    @property
    def whole_lines(self) -> list[int]:
        """Lines that keep a whole-line take made before takes were cut in parts."""
        return [p.number for p in self.lines if p.whole]


def _digest(values: list[Any], size: int = 20) -> str:
    data = json.dumps(values, ensure_ascii=False)
    return hashlib.sha256(data.encode("utf-8")).hexdigest()[:size]


def line_identity(line: Line, voice: str, spoken: str, request: ReadRequest,
                  occurrence: int) -> str:
    """What a line is, whatever model says it: its words, voice name, style, what the model
    is told, and how it is cut; `occurrence` tells apart lines that are all that alike (the
    second "Yes." of a chapter is its own line, with its own takes)."""
    return _digest([line.text, voice, line.style, spoken, request.language,
                    request.chunk_chars, request.max_frames, occurrence])


def part_identity(line: Line, identity: str, text: str, parts: int, voice: str,
                  request: ReadRequest, occurrence: int) -> str:
    """What a part is, whatever model says it: its words as the model is given them, its
    voice, style, language and frame cap; `occurrence` tells apart parts that are all
    that alike in the book. Not its line's other words, nor the chunk length that cut
    it: an edit of one sentence of a long paragraph, or a new chunk length, renders
    again only the parts whose words changed. The one part of a line said in one take
    is the line itself (`line_identity`: its takes are the line's, as they were before
    lines were cut in parts)."""
    if parts == 1:
        return identity
    return _digest(["part", text, voice, line.style, request.language, request.max_frames,
                    occurrence])


def line_parts(spoken: str, request: ReadRequest) -> list[Chunk]:
    """How a line is cut into takes: the chunks the synthesizer cuts its text into
    (sentence groups of at most `chunk_chars`), with the pause it puts after each when
    it joins them (its own defaults: a read asks the worker for no other)."""
    speak = SpeakOptions()
    chunks = split_text(spoken, request.chunk_chars, speak.sentence_pause_s,
                        speak.paragraph_pause_s)
    return chunks or [Chunk(0, spoken, 0.0, 0)]


def take_key(identity: str, model: str) -> str:
    """The folder of a part's takes: the part (`part_identity`) as said by one model
    (`engine.synth.fingerprint.sound_fingerprint`); the seed names the take."""
    return _digest([identity, model])


def _unfingerprinted_key(line: Line, voice: str, spoken: str, request: ReadRequest) -> str:
    """The key a project made before takes named their model gave a line: by its voice's
    name only, so which model said it is unknown (another one, as far as a read knows)."""
    return _digest([line.text, voice, line.style, spoken, request.language,
                    request.chunk_chars, request.max_frames])


def voice_model(voice: ServedVoice) -> str:
    """The fingerprint of the model `voice` speaks with now (its name when it cannot be
    resolved; rendering it then says why)."""
    try:
        return sound_fingerprint(voice.source())
    except VoxshardError:
        return "unresolved:" + voice.name


def _earlier_keys(project: Path) -> dict[str, list[str]]:
    """Part identity -> the keys of its takes by other models, newest first (from the
    takes' records)."""
    found: dict[str, dict[str, str]] = {}
    for record_file in (project / reading.TAKES_DIR).glob("*/*.json"):
        if record_file.name == reading.CHOSEN_FILE:
            continue
        record = read_json(record_file) or {}
        if record.get("identity"):
            keys = found.setdefault(str(record["identity"]), {})
            key = record_file.parent.name
            keys[key] = max(keys.get(key, ""), str(record.get("created") or ""))
    return {identity: sorted(keys, key=keys.__getitem__, reverse=True)
            for identity, keys in found.items()}


def read_voices(request: ReadRequest) -> dict[str, ServedVoice]:
    """The voices a read may cast, by name: those of its workspace (a read has no one to
    register voices for it, so no voice at all is said as such)."""
    if request.workspace is None:
        raise InputError("No workspace was given, so the script's voices cannot be found.",
                         "Give {read.workspace} (the folder of your voices).")
    workspace = Path(request.workspace).expanduser()
    if not workspace.is_dir():
        raise InputError(f"The workspace {workspace} does not exist.",
                         "Give {read.workspace}: the folder of your voices.")
    # an instant voice that knows no base of its own reads on the one the server would
    # serve it on (`serving_base`): one list of what can speak
    voices = discover([], workspace, registers=True, base=serving_base())
    if not voices:
        raise InputError(f"There is no voice in {workspace} to read with yet.",
                         "Prepare a voice there (that makes its instant voice), or train one.")
    return voices


def style_notes(plan: Plan) -> list[tuple[int, str]]:
    """(line, words) for each line whose style will do little or nothing for its voice, as
    `speak` says it (`engine.synth.voice.style_note`), before any model loads."""
    notes: dict[tuple[str, str], str | None] = {}
    out = []
    for planned in plan.lines:
        style = planned.line.style
        if not style:
            continue
        key = (planned.voice.name, style)
        if key not in notes:
            try:
                notes[key] = style_note(planned.voice.source(), style)
            except VoxshardError:
                notes[key] = None  # rendering it says why it cannot
        if notes[key]:
            out.append((planned.number, f"Line {planned.number} ({planned.voice.name}, "
                                        f"[{style}]): {notes[key]}"))
    return out


def script_names(request: ReadRequest, voices: dict[str, ServedVoice]) -> ScriptNames:
    """What a script read with `request` may name: its cast's speakers and the workspace's
    voices (as `Name: words`), the declared styles and those trained into a voice."""
    speakers = [*request.casting(), *voices, *(name.split("/", 1)[0] for name in voices)]
    return ScriptNames.of(speakers, [*request.styles,
                                     *(s for v in voices.values() for s in v.styles)])


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


def said_text(plan: Plan, planned: PlannedLine, part: PlannedPart | None = None) -> str:
    """What a listener should hear of a line (or of one of its parts): its text as it is
    spoken (numbers in words), without the respellings that only steer the model (a
    take's words are checked against it). A part's is the same cut of it, where it cuts
    into as many parts; else the part's own text."""
    said = spoken_text(planned.line.text, _language(plan.request.language),
                       fallback=planned.voice.language) or planned.line.text
    if part is None or len(planned.parts) == 1:
        return said
    cut = line_parts(said, plan.request)
    return cut[part.index].text if len(cut) == len(planned.cut) else part.text


def titles_spoken(request: ReadRequest) -> bool:
    """Are the chapters' titles said? As asked, else for an EPUB (its chapters' headings
    are titles; a text's headings may be notes to the reader)."""
    if request.chapter_titles is not None:
        return request.chapter_titles
    return Path(request.script).suffix.lower() == ".epub"


def project_dir(request: ReadRequest) -> Path:
    return Path(request.project) if request.project else reading.default_project_dir(
        request.script)


class _Planner:
    """What planning a project's lines shares: the plan so far, the keys of takes by other
    models (read once, when a part first has no take of its own) and how often alike lines
    and parts came so far."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self._earlier: dict[str, list[str]] | None = None
        self.seen_lines: dict[str, int] = {}
        self.seen_parts: dict[str, int] = {}

    def earlier(self) -> dict[str, list[str]]:
        if self._earlier is None:
            self._earlier = _earlier_keys(self.plan.project)
        return self._earlier

    @staticmethod
    def occurrence(seen: dict[str, int], alike: str) -> int:
        """How many alike ones came before this one (0: it is the first)."""
        seen[alike] = seen.get(alike, 0) + 1
        return seen[alike] - 1

    def line(self, line: Line, voice: ServedVoice, spoken: str, model: str) -> bool:
        """Plan `line` and its parts into the plan; returns whether its takes are another
        model's of its voice."""
        plan, request = self.plan, self.plan.request
        occurrence = self.occurrence(self.seen_lines,
                                     _digest([line.text, voice.name, line.style, spoken]))
        first = occurrence == 0
        identity = line_identity(line, voice.name, spoken, request, occurrence)
        planned = PlannedLine(line, voice, spoken, identity=identity, model=model)
        chunks = line_parts(spoken, request)
        other_model = False
        for index, chunk in enumerate(chunks):
            seen = self.occurrence(self.seen_parts, _digest([chunk.text, voice.name,
                                                             line.style]))
            part_id = part_identity(line, identity, chunk.text, len(chunks), voice.name,
                                    request, seen)
            unfingerprinted = (_unfingerprinted_key(line, voice.name, spoken, request)
                               if first and len(chunks) == 1 else None)
            other_model = self._part(planned, index, chunk, part_id, unfingerprinted) \
                or other_model
        planned.parts = list(planned.cut)
        if len(chunks) > 1 and not any(p.seeds for p in planned.cut):
            own = take_key(identity, model)
            older = [k for k in self.earlier().get(identity, []) if k != own]
            if first:
                older.append(_unfingerprinted_key(line, voice.name, spoken, request))
            other_model = _keep_whole(planned, own, older, plan) or other_model
        plan.lines.append(planned)
        return other_model

    def _part(self, planned: PlannedLine, index: int, chunk: Chunk, part_id: str,
              unfingerprinted: str | None) -> bool:
        """Plan one part of `planned` with its own takes, or another model's when the
        request keeps those; returns whether another model's takes of it were found."""
        project, request = self.plan.project, self.plan.request
        own = take_key(part_id, planned.model)
        part = PlannedPart(planned.number, index, chunk.text, chunk.pause_after_s, own,
                           own_key=own, identity=part_id)
        _use_takes(part, project)
        planned.cut.append(part)
        if part.seeds:
            return False
        others = [k for k in self.earlier().get(part_id, []) if k != own]
        if unfingerprinted is not None:
            others.append(unfingerprinted)
        other = next((k for k in others if reading.take_seeds(project, k)), None)
        if other is None:
            return False
        if request.keep_other_models:
            part.key, part.other_model = other, "kept"
            _use_takes(part, project)
        return True


def make_plan(request: ReadRequest) -> Plan:
    """The project's lines as `request` renders them (reads the script and the disk)."""
    voices = read_voices(request)
    script = read_script(request.script, script_names(request, voices))
    if titles_spoken(request):
        script = script.with_titles(request.title_pause_s)
    project = project_dir(request)
    workspace = Path(str(request.workspace))
    chosen_voices = {line.speaker: _voice_for(line.speaker, request, voices)
                     for line in script.lines}
    folders = sorted({voice_folder(v, workspace) for v in chosen_voices.values()})
    dictionary = Dictionary.load(reading.pronunciation_files(project, workspace, folders))
    models = {v.name: voice_model(v) for v in chosen_voices.values()}
    plan = Plan(project, request, script, [])
    planner = _Planner(plan)
    for line in script.lines:
        voice = chosen_voices[line.speaker]
        respelled = dictionary.apply(line.text, voice_folder(voice, workspace).name,
                                     line_language(request.language, voice.language))
        # numbers, amounts and units in words, emoji and stray marks out (the one normal
        # form of text written to be read)
        spoken = spoken_text(respelled, _language(request.language),
                             fallback=voice.language) or respelled
        if planner.line(line, voice, spoken, models[voice.name]):
            plan.other_model.append(line.number)
    return plan


def _keep_whole(planned: PlannedLine, key: str, older: list[str], plan: Plan) -> bool:
    """A line of several parts whose takes were made whole (before lines were cut in
    parts) keeps its whole-line take as its one part: nothing made is lost or made again
    until a new take of it is asked for (`cut_line`). One made by another model of its
    voice (`older`: its keys, newest first) is kept when the request says so, like a
    part's. Returns whether the line's take is another model's."""
    project = plan.project
    other = False
    if not reading.take_seeds(project, key):
        found = next((k for k in older if reading.take_seeds(project, k)), None)
        if found is None:
            return False
        other = True
        if not plan.request.keep_other_models:
            return True
        key = found
    whole = PlannedPart(planned.number, 0, planned.spoken, 0.0, key, own_key=key,
                        identity=planned.identity, other_model="kept" if other else "")
    _use_takes(whole, project)
    planned.parts, planned.whole = [whole], True
    return other


def cut_line(planned: PlannedLine) -> None:
    """A line that kept its whole-line take is said in its parts from now on."""
    if planned.whole:
        planned.parts, planned.whole = list(planned.cut), False


def _use_takes(part: PlannedPart, project: Path) -> None:
    """Read the seeds and the chosen one of the takes under `part.key`."""
    part.seeds = reading.take_seeds(project, part.key)
    chosen = (read_json(reading.chosen_file(project, part.key)) or {}).get("seed")
    part.chosen = chosen if chosen in part.seeds else None


def reread_line(plan: Plan, number: int) -> PlannedLine:
    """Line `number` with its parts' takes re-read from disk (what a finished take
    changed), the rest of the plan as it was: a render's progress is shown take by take
    without planning the whole book again."""
    planned = plan.line(number)
    for part in planned.parts:
        _use_takes(part, plan.project)
    return planned


def own_takes(plan: Plan, part: PlannedPart) -> None:
    """Make a part that kept another model's takes use its own (a new take of it is
    the model's its voice speaks with now)."""
    if part.key != part.own_key:
        part.key, part.other_model = part.own_key, ""
        _use_takes(part, plan.project)


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


def targets(plan: Plan, item: str | int) -> tuple[PlannedLine, list[PlannedPart]]:
    """The parts `item` names: `N`, every part of line N (a line said in one take: its
    take); `N.K`, its part K. A line that kept a whole-line take is cut in parts first
    when one part is named."""
    number, index = line_part(item)
    planned = plan.line(number)
    if index is None:
        return planned, list(planned.parts)
    cut_line(planned)
    return planned, [planned.part(index)]


def choose(plan: Plan, item: str | int, seed: int) -> None:
    """Make take `seed` the one the export uses of part `item` (`N.K`, or `N` for a line
    said in one take)."""
    planned, parts = targets(plan, item)
    part = parts[0] if len(parts) == 1 else planned.only
    if seed not in part.seeds:
        raise InputError(f"{'Part' if len(planned.parts) > 1 else 'Line'} {item} has no take "
                         f"with seed {seed}.",
                         f"Its takes: {', '.join(map(str, part.seeds)) or 'none yet'}.")
    write_json(reading.chosen_file(plan.project, part.key), {"seed": seed})
    part.chosen = seed


def take_flagged(record: dict[str, Any]) -> bool:
    return bool(record.get("problems"))


def part_flagged(plan: Plan, part: PlannedPart) -> bool:
    """A part is flagged while the take its export uses has a problem: every render of
    it failed and no good take was picked (a project's flags outlive the run that made
    them)."""
    used = best_take(plan, part)
    return used is not None and take_flagged(part.record(plan.project, used))


def line_flagged(plan: Plan, planned: PlannedLine) -> bool:
    """A line is flagged while one of its parts is."""
    return any(part_flagged(plan, part) for part in planned.parts)


def flagged_lines(plan: Plan) -> list[int]:
    return [p.number for p in plan.lines if line_flagged(plan, p)]


def retry_due(plan: Plan, part: PlannedPart) -> bool:
    """A flagged part has renders left (`ReadRequest.retries`) when none of its takes is
    good and none was picked: a render stopped before its retries goes on with them (not
    for takes of another model kept as they are)."""
    return (part.chosen is None and not part.other_model
            and 0 < len(part.seeds) <= plan.request.retries and part_flagged(plan, part))


def best_take(plan: Plan, part: PlannedPart) -> int | None:
    """The take the export uses of a part: the chosen one, else the first without a
    problem, else the first (flagged)."""
    if part.chosen is not None:
        return part.chosen
    for seed in part.seeds:
        if not take_flagged(part.record(plan.project, seed)):
            return seed
    return part.seeds[0] if part.seeds else None


def line_takes(plan: Plan, planned: PlannedLine) -> list[tuple[Path, float]]:
    """A line's audio as it is joined: each part's take the export uses, in order, with
    the pause after it (the synthesizer's own between chunks, `line_parts`; none after
    the last). The export and the window's playing of a line join these."""
    joined = []
    for part in planned.parts:
        seed = best_take(plan, part)
        if seed is None:
            where = (f"Line {planned.number}" if len(planned.parts) == 1
                     else f"Line {planned.number}, part {part.index + 1},")
            raise InputError(f"{where} has no take yet.",
                             "Render the project first (an export does).")
        pause = part.pause_after_s if part is not planned.parts[-1] else 0.0
        joined.append((reading.take_audio(plan.project, part.key, seed), pause))
    return joined
