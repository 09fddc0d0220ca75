"""Render a project's missing takes on the warm synthesis worker, many lines and voices
in one batch.

A take is one part of a line (`project.line_parts`: a sentence group of at most
`chunk_chars`, the chunk the synthesizer cuts). Parts are grouped by what their voice
loads (`serve.pool.voice_identity`): the adapter and instant voices of one base share one
model and one continuous batch, each request naming its voice; a full export has its
own. Every missing part of a group is submitted at once, so the batcher keeps its rows
full across lines and voices; each part is one request with its own seed. A take is
written the moment it is finished (its audio, then its record), so a render stopped
half-way loses nothing finished and the next one goes on from there. Progress counts
parts (its events name the line and the part).

A take that looped, stayed silent (the runaway guard) or reached its length cap, that is
silent as a whole, or whose words are not its part's (the word check,
`engine.read.words`), is rendered again with the next unused seed, up to `retries` times,
that part alone: the line's other takes stay. Every take is kept, and a part whose takes
all failed flags its line.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engine.audio.io import read_mono
from engine.audio.timebase import SAMPLE_RATE
from engine.core.atomic import write_json
from engine.core.errors import Cancelled, InputError
from engine.core.events import Emitter, Event
from engine.layout import reading
from engine.layout.voice import now_iso
from engine.read.project import (
    Plan,
    PlannedLine,
    PlannedPart,
    cut_line,
    flagged_lines,
    own_takes,
    retry_due,
    targets,
)
from engine.read.words import Words
from engine.serve.pool import voice_identity
from engine.synth.worker import SpeechWorker

#: a take quieter than this (RMS, full scale 1) as a whole is silent
SILENT_RMS = 1e-4


@dataclass
class _Attempt:
    planned: PlannedLine
    part: PlannedPart
    seed: int
    #: renders of this part so far in this run (the first is 0)
    tries: int = 0


def take_problems(result: dict[str, Any], audio: np.ndarray, max_frames: int | None
                  ) -> list[str]:
    """Why a finished render is not a good take (empty: it is). A chunk cut by the cap
    the user set (`max_frames`) was asked for; one cut by the cap from its text's length
    never ended."""
    problems = [str(r) for r in result.get("runaway") or []]
    if any(c.get("capped") and (max_frames is None or int(c.get("max_frames") or 0) < max_frames)
           for c in result.get("chunks") or []):
        problems.append("length cap")
    if audio.size == 0 or float(np.sqrt(np.mean(np.square(audio)))) < SILENT_RMS:
        problems.append("silent")
    return list(dict.fromkeys(problems))


def _next_seed(part: PlannedPart, first: int) -> int:
    seed = first
    while seed in part.seeds:
        seed += 1
    return seed


class _Group:
    """The parts of one loaded model, rendered on one `SpeechWorker`."""

    def __init__(self, plan: Plan, attempts: list[_Attempt], emitter: Emitter,
                 progress: _Progress, words: Words | None) -> None:
        self.plan = plan
        self.words = words
        self.attempts = attempts
        self.emitter = emitter
        self.progress = progress
        self.events: queue.Queue[Event] = queue.Queue()
        request = plan.request
        self.worker = SpeechWorker(self.events.put, device=request.device,
                                   dtype=_dtype(request.dtype), rows=request.rows).start()
        self.shared = voice_identity(attempts[0].planned.voice).startswith("base:")
        self._ids = 0
        self.waiting: dict[str, _Attempt] = {}
        #: the model's and voices' load, seconds
        self.load_s = 0.0

    def _ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """Submit a load or voice request and wait for its end."""
        rid = request["id"]
        self.worker.submit(request)
        while True:
            event = self.events.get()
            if event.data.get("request") != rid:
                continue
            if event.kind == "error":
                raise InputError(str(event.data.get("message")), event.data.get("hint"))
            if event.kind == "result":
                return dict(event.data)

    def run(self, cancel: threading.Event | None) -> None:
        started = time.perf_counter()
        self.progress.loading()
        first = self.attempts[0].planned.voice
        self._ask({"op": "load", "id": "load", "voice": str(first.target),
                   **first.load_options()})
        if self.shared:
            voices = {a.planned.voice.name: a.planned.voice for a in self.attempts}
            for name, voice in voices.items():
                self._ask({"op": "voice", "id": f"voice-{name}", "name": name,
                           "voice": str(voice.target), **voice.load_options()})
        self.load_s = time.perf_counter() - started
        self.progress.loaded(self.load_s)
        for attempt in self.attempts:
            self._submit(attempt)
        while self.waiting:
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            try:
                event = self.events.get(timeout=0.5)
            except queue.Empty:
                continue
            attempt = self.waiting.get(str(event.data.get("request")))
            if attempt is None:
                continue
            where = _where(attempt)
            if event.kind == "log" and event.data.get("level") == "warning" \
                    and "instruct" not in event.data:  # `read` said it of the line already
                self.emitter.log(f"{where}: {event.data.get('message')}",
                                 level="warning", line=attempt.planned.number,
                                 part=attempt.part.index + 1)
            elif event.kind == "error":
                self.waiting.pop(str(event.data["request"]))
                raise InputError(f"{where} could not be rendered: "
                                 f"{event.data.get('message')}", event.data.get("hint"))
            elif event.kind == "result":
                self.waiting.pop(str(event.data["request"]))
                self._finished(attempt, dict(event.data))

    def _submit(self, attempt: _Attempt) -> None:
        request = self.plan.request
        planned, part = attempt.planned, attempt.part
        self._ids += 1
        rid = f"part-{part.name}-{self._ids}"
        out = reading.take_audio(self.plan.project, part.key, attempt.seed)
        out.parent.mkdir(parents=True, exist_ok=True)
        options: dict[str, Any] = {"seed": attempt.seed, "language": request.language,
                                   "chunk_chars": request.chunk_chars,
                                   "max_frames": request.max_frames,
                                   "instruct": planned.line.style}
        self.waiting[rid] = attempt
        self.worker.submit({"op": "speak", "id": rid, "text": part.text, "out": str(out),
                            "voice": planned.voice.name if self.shared else None,
                            "options": options})

    def _finished(self, attempt: _Attempt, result: dict[str, Any]) -> None:
        planned, part, project = attempt.planned, attempt.part, self.plan.project
        audio = read_mono(reading.take_audio(project, part.key, attempt.seed), SAMPLE_RATE)
        problems = take_problems(result, audio, self.plan.request.max_frames)
        said = self.words.judge(planned, part, audio, problems) if self.words else {}
        line = planned.line
        write_json(reading.take_record(project, part.key, attempt.seed), {
            "identity": part.identity, "model": planned.model, "line": line.number,
            "part": part.index + 1, "parts": len(planned.parts),
            "text": line.text, "spoken": part.text,
            "speaker": line.speaker, "voice": planned.voice.name, "style": line.style,
            "language": self.plan.request.language, "seed": attempt.seed,
            "duration_s": round(len(audio) / SAMPLE_RATE, 3), "problems": problems, **said,
            "compute_s": result.get("compute_s"),
            "chunks": [{k: c.get(k) for k in ("text", "frames", "max_frames", "capped",
                                              "runaway")}
                       for c in result.get("chunks") or []],
            "created": now_iso()})
        part.seeds = sorted({*part.seeds, attempt.seed})
        where = _where(attempt)
        if problems and attempt.tries < self.plan.request.retries:
            retry = _Attempt(planned, part, _next_seed(part, attempt.seed + 1),
                             attempt.tries + 1)
            self.emitter.log(f"{where} ({', '.join(problems)}) with seed {attempt.seed}: "
                             f"trying seed {retry.seed}.", level="warning",
                             line=line.number, part=part.index + 1, problems=problems,
                             retry_seed=retry.seed)
            self._submit(retry)
            return
        if problems:
            self.emitter.log(f"{where} still has a problem ({', '.join(problems)}) after "
                             f"{attempt.tries + 1} render(s); listen to it, or render a new "
                             "take.", level="warning", line=line.number, part=part.index + 1,
                             problems=problems, flagged=True)
        self.progress.part_done(attempt, len(audio) / SAMPLE_RATE)

    def close(self, cancelled: bool) -> None:
        self.worker.close(timeout=60, cancel=cancelled)


def _where(attempt: _Attempt) -> str:
    """"Line N" for a line said in one take, else "Line N, part K"."""
    planned = attempt.planned
    return (f"Line {planned.number}" if len(planned.parts) == 1
            else f"Line {planned.number}, part {attempt.part.index + 1}")


class _Progress:
    """Takes (parts) finished, audio made, and the time left: the characters still to say
    at the rate measured since rendering began, the models' loads left out (a load is not
    render time: counted in, the first estimates were a hundred times the render)."""

    def __init__(self, emitter: Emitter, parts: list[PlannedPart]) -> None:
        self.emitter = emitter
        self.total = len(parts)
        self.chars = sum(len(p.text) for p in parts) or 1
        self.done = 0
        self.chars_done = 0
        self.audio_s = 0.0
        self.started = time.perf_counter()
        #: seconds spent loading models, left out of the render rate
        self.loads_s = 0.0

    def loading(self) -> None:
        """A model loads: no estimate until takes render (said as loading)."""
        self.emitter.progress("render", self.done, self.total, loading=True, eta_s=None,
                              audio_s=round(self.audio_s, 2))

    def loaded(self, seconds: float) -> None:
        self.loads_s += seconds

    def eta_s(self) -> float | None:
        rendering = time.perf_counter() - self.started - self.loads_s
        if self.chars_done == 0 or rendering <= 0:
            return None
        return rendering / self.chars_done * (self.chars - self.chars_done)

    def part_done(self, attempt: _Attempt, seconds: float) -> None:
        self.done += 1
        self.chars_done += len(attempt.part.text)
        self.audio_s += seconds
        left = self.eta_s()
        self.emitter.progress("render", self.done, self.total, line=attempt.planned.number,
                              part=attempt.part.index + 1,
                              eta_s=None if left is None else round(left, 1),
                              audio_s=round(self.audio_s, 2))


def _dtype(name: str) -> Any:
    if name in (None, "", "auto"):
        return None
    return getattr(torch, name)


def render_missing(plan: Plan, emitter: Emitter, cancel: threading.Event | None = None
                   ) -> dict[str, Any]:
    """Render every part without a take, and a new take of each part that
    `plan.request.regenerate` names; returns what was made (see the module doc)."""
    request = plan.request
    asked: list[tuple[PlannedLine, PlannedPart]] = []
    for item in request.regenerate:  # a new take is the model's of the voice now, in parts
        planned, parts = targets(plan, item)
        if planned.whole:  # a line kept whole from before: its new takes are its parts
            cut_line(planned)
            parts = list(planned.parts)
        for part in parts:
            own_takes(plan, part)
            asked.append((planned, part))
    words = Words(plan, emitter) if request.word_check else None
    if words is not None:  # takes made without the check: scored before retries are due
        words.score_kept()
    missing = plan.missing()
    attempts = [_Attempt(p, part, _next_seed(part, request.seed)) for p, part in missing]
    # a render stopped before its retries: they are still due (the takes say so)
    regenerated = {id(part) for _, part in asked}
    # (a line kept whole from before is never rendered again unasked: a new take of it
    # is made in parts)
    retried = [(p, part) for p in plan.lines if not p.whole for part in p.parts
               if id(part) not in regenerated and retry_due(plan, part)]
    attempts += [_Attempt(p, part, _next_seed(part, max(part.seeds) + 1), len(part.seeds))
                 for p, part in retried]
    for planned, part in asked:
        if part.seeds:  # a part without a take is rendered above already
            attempts.append(_Attempt(planned, part, _next_seed(part, max(part.seeds) + 1)))
    groups: dict[str, list[_Attempt]] = defaultdict(list)
    for attempt in attempts:
        groups[voice_identity(attempt.planned.voice)].append(attempt)
    progress = _Progress(emitter, [a.part for a in attempts])
    emitter.state("rendering", takes=len(attempts),
                  lines=len({a.planned.number for a in attempts}),
                  total_lines=len(plan.lines), models=len(groups))
    load = 0.0
    started = time.perf_counter()
    for members in groups.values():
        group = _Group(plan, members, emitter, progress, words)
        cancelled = True
        try:
            group.run(cancel)
            cancelled = False
        finally:
            group.close(cancelled)
        load += group.load_s
    for _, part in asked:  # the new take is the one asked for
        newest = max(part.seeds)
        write_json(reading.chosen_file(plan.project, part.key), {"seed": newest})
        part.chosen = newest
    rendering = time.perf_counter() - started - load
    kept = sum(len(p.parts) for p in plan.lines) - len(missing) - len(retried)
    # audio per second of rendering: the loads (once per model) are counted apart
    # the project's flags, not this run's: a line stays flagged until a good take is used
    return {"rendered": len(attempts), "reused": kept,
            "retried": sorted({p.number for p, _ in retried}), "flagged": flagged_lines(plan),
            "audio_s": round(progress.audio_s, 3),
            "load_s": round(load, 3), "render_s": round(rendering, 3),
            "audio_per_s": round(progress.audio_s / rendering, 3) if rendering > 0 else 0.0}
