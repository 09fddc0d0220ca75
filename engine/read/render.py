"""Render a project's missing takes on the warm synthesis worker, many lines and voices
in one batch.

Lines are grouped by what their voice loads (`serve.pool.voice_identity`): the adapter
and instant voices of one base share one model and one continuous batch, each request
naming its voice; a full export has its own. Every line of a group is submitted at once,
so the batcher keeps its rows full across lines and voices; each line is one request,
cut into short chunks at sentence and clause boundaries by the batcher, with the line's
seed. A take is written the moment it is finished (its audio, then its record), so a
render stopped half-way loses nothing finished and the next one goes on from there.

A take whose chunks looped, stayed silent (the runaway guard) or reached their length
cap, that is silent as a whole, or whose words are not its line's (the word check,
`engine.read.words`), is rendered again with the next unused seed, up to `retries` times;
every take is kept, and a line whose takes all failed is flagged.
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
from engine.read.project import Plan, PlannedLine, flagged_lines, own_takes, retry_due
from engine.read.words import Words
from engine.serve.pool import voice_identity
from engine.synth.worker import SpeechWorker

#: a take quieter than this (RMS, full scale 1) as a whole is silent
SILENT_RMS = 1e-4


@dataclass
class _Attempt:
    planned: PlannedLine
    seed: int
    #: renders of this line so far in this run (the first is 0)
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


def _next_seed(planned: PlannedLine, taken: set[int], first: int) -> int:
    seed = first
    while seed in taken or seed in planned.seeds:
        seed += 1
    return seed


class _Group:
    """The lines of one loaded model, rendered on one `SpeechWorker`."""

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
            if event.kind == "log" and event.data.get("level") == "warning" \
                    and "instruct" not in event.data:  # `read` said it of the line already
                self.emitter.log(f"Line {attempt.planned.number}: {event.data.get('message')}",
                                 level="warning", line=attempt.planned.number)
            elif event.kind == "error":
                self.waiting.pop(str(event.data["request"]))
                raise InputError(f"Line {attempt.planned.number} could not be rendered: "
                                 f"{event.data.get('message')}", event.data.get("hint"))
            elif event.kind == "result":
                self.waiting.pop(str(event.data["request"]))
                self._finished(attempt, dict(event.data))

    def _submit(self, attempt: _Attempt) -> None:
        request = self.plan.request
        planned = attempt.planned
        self._ids += 1
        rid = f"line-{planned.number}-{self._ids}"
        out = reading.take_audio(self.plan.project, planned.key, attempt.seed)
        out.parent.mkdir(parents=True, exist_ok=True)
        options: dict[str, Any] = {"seed": attempt.seed, "language": request.language,
                                   "chunk_chars": request.chunk_chars,
                                   "max_frames": request.max_frames,
                                   "instruct": planned.line.style}
        self.waiting[rid] = attempt
        self.worker.submit({"op": "speak", "id": rid, "text": planned.spoken, "out": str(out),
                            "voice": planned.voice.name if self.shared else None,
                            "options": options})

    def _finished(self, attempt: _Attempt, result: dict[str, Any]) -> None:
        planned, project = attempt.planned, self.plan.project
        audio = read_mono(reading.take_audio(project, planned.key, attempt.seed), SAMPLE_RATE)
        problems = take_problems(result, audio, self.plan.request.max_frames)
        said = self.words.judge(planned, audio, problems) if self.words else {}
        line = planned.line
        write_json(reading.take_record(project, planned.key, attempt.seed), {
            "identity": planned.identity, "model": planned.model, "line": line.number,
            "text": line.text, "spoken": planned.spoken,
            "speaker": line.speaker, "voice": planned.voice.name, "style": line.style,
            "language": self.plan.request.language, "seed": attempt.seed,
            "duration_s": round(len(audio) / SAMPLE_RATE, 3), "problems": problems, **said,
            "compute_s": result.get("compute_s"),
            "chunks": [{k: c.get(k) for k in ("text", "frames", "max_frames", "capped",
                                              "runaway")}
                       for c in result.get("chunks") or []],
            "created": now_iso()})
        planned.seeds = sorted({*planned.seeds, attempt.seed})
        if problems and attempt.tries < self.plan.request.retries:
            retry = _Attempt(planned, _next_seed(planned, set(), attempt.seed + 1),
                             attempt.tries + 1)
            self.emitter.log(f"Line {line.number} ({', '.join(problems)}) with seed "
                             f"{attempt.seed}: trying seed {retry.seed}.", level="warning",
                             line=line.number, problems=problems, retry_seed=retry.seed)
            self._submit(retry)
            return
        if problems:
            self.emitter.log(f"Line {line.number} still has a problem ({', '.join(problems)}) "
                             f"after {attempt.tries + 1} render(s); listen to it, or render "
                             "a new take.", level="warning", line=line.number,
                             problems=problems, flagged=True)
        self.progress.line_done(planned, len(audio) / SAMPLE_RATE)

    def close(self, cancelled: bool) -> None:
        self.worker.close(timeout=60, cancel=cancelled)


class _Progress:
    """Lines finished, audio made, and the time left: the characters still to say at the
    rate measured since rendering began, the models' loads left out (a load is not
    render time: counted in, the first estimates were a hundred times the render)."""

    def __init__(self, emitter: Emitter, lines: list[PlannedLine]) -> None:
        self.emitter = emitter
        self.total = len(lines)
        self.chars = sum(len(p.spoken) for p in lines) or 1
        self.done = 0
        self.chars_done = 0
        self.audio_s = 0.0
        self.started = time.perf_counter()
        #: seconds spent loading models, left out of the render rate
        self.loads_s = 0.0

    def loading(self) -> None:
        """A model loads: no estimate until lines render (said as loading)."""
        self.emitter.progress("render", self.done, self.total, loading=True, eta_s=None,
                              audio_s=round(self.audio_s, 2))

    def loaded(self, seconds: float) -> None:
        self.loads_s += seconds

    def eta_s(self) -> float | None:
        rendering = time.perf_counter() - self.started - self.loads_s
        if self.chars_done == 0 or rendering <= 0:
            return None
        return rendering / self.chars_done * (self.chars - self.chars_done)

    def line_done(self, planned: PlannedLine, seconds: float) -> None:
        self.done += 1
        self.chars_done += len(planned.spoken)
        self.audio_s += seconds
        left = self.eta_s()
        self.emitter.progress("render", self.done, self.total, line=planned.number,
                              eta_s=None if left is None else round(left, 1),
                              audio_s=round(self.audio_s, 2))


def _dtype(name: str) -> Any:
    if name in (None, "", "auto"):
        return None
    return getattr(torch, name)


def render_missing(plan: Plan, emitter: Emitter, cancel: threading.Event | None = None
                   ) -> dict[str, Any]:
    """Render every line without a take, and a new take of each line in
    `plan.request.regenerate`; returns what was made (see the module doc)."""
    request = plan.request
    for number in request.regenerate:  # a new take is the model's of the voice now
        own_takes(plan, plan.line(number))
    words = Words(plan, emitter) if request.word_check else None
    if words is not None:  # takes made without the check: scored before retries are due
        words.score_kept()
    missing = plan.missing()
    attempts = [_Attempt(p, _next_seed(p, set(), request.seed)) for p in missing]
    # a render stopped before its retries: they are still due (the takes say so)
    retried = [p for p in plan.lines if p.number not in request.regenerate
               and retry_due(plan, p)]
    attempts += [_Attempt(p, _next_seed(p, set(), max(p.seeds) + 1), len(p.seeds))
                 for p in retried]
    for number in request.regenerate:
        planned = plan.line(number)
        if planned.seeds:  # a line without a take is rendered above already
            attempts.append(_Attempt(planned, _next_seed(planned, set(),
                                                         max(planned.seeds) + 1)))
    groups: dict[str, list[_Attempt]] = defaultdict(list)
    for attempt in attempts:
        groups[voice_identity(attempt.planned.voice)].append(attempt)
    progress = _Progress(emitter, [a.planned for a in attempts])
    emitter.state("rendering", lines=len(attempts), total_lines=len(plan.lines),
                  models=len(groups))
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
    for number in request.regenerate:  # the new take is the one asked for
        planned = plan.line(number)
        newest = max(planned.seeds)
        write_json(reading.chosen_file(plan.project, planned.key), {"seed": newest})
        planned.chosen = newest
    rendering = time.perf_counter() - started - load
    # audio per second of rendering: the loads (once per model) are counted apart
    # the project's flags, not this run's: a line stays flagged until a good take is used
    return {"rendered": len(attempts), "reused": len(plan.lines) - len(missing) - len(retried),
            "retried": [p.number for p in retried], "flagged": flagged_lines(plan),
            "audio_s": round(progress.audio_s, 3),
            "load_s": round(load, 3), "render_s": round(rendering, 3),
            "audio_per_s": round(progress.audio_s / rendering, 3) if rendering > 0 else 0.0}
