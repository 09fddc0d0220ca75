"""A long-lived synthesis worker: load a voice once, serve many requests, cancel.

The GUI keeps one `voxshard-engine serve-speech` process warm and talks JSON
lines to it. Requests (stdin), one object per line:

    {"op": "load", "id": "l1", "voice": "PATH", "checkpoint": null,
     "reference": null, "reference_text": null, "base": null, "speaker": null}
    {"op": "voice", "id": "v1", "name": "ada/a1", "voice": "PATH",
     "reference": null, "reference_text": null, "base": null}
    {"op": "speak", "id": "r1", "text": "...", "out": "PATH.wav", "voice": null,
     "format": null, "options": {"seed": 1, "temperature": 0.8}, "stream": false}
    {"op": "forget", "id": "f1", "name": "ada/a1"}
    {"op": "cancel", "id": "r1"}          (queued or running; no id: every running one)
    {"op": "ping", "id": "p"}
    {"op": "shutdown"}                    (finish what was asked, then exit)

A "voice" request loads another voice of the loaded model's base beside it, by name,
without a model load and without waiting for the speech in progress (an adapter voice
takes a slot of the adapter pool, an instant voice its prompt); a speak request with
"voice": NAME speaks it, in the same batch as every other voice (`Synthesizer.add_voice`).
A "forget" request lets a voice loaded by name go (it was deleted), and a "voice" request
for a name already loaded replaces it: either way its adapter slot is free for the next
voice once the last request speaking it ends (each speak request holds its voice's slot
until it ends), so a worker whose voices come and go keeps a pool of fixed size. Both
answer with the pool's size ("pool": the named voices, the adapter slots and those used).
Speak requests from any number of clients are batched together
(`batcher.ContinuousBatcher`): each chunk is a row of one batch, and a row that
finishes is refilled with the next waiting chunk at once. With "stream": true
the file grows as the audio is generated (artifact role "speech_partial"): a
streamed request's rows are in the same batch as everyone else's, and its frames
become audio as they are made, so any number of streams advance together and a
new one starts at the next frame. A request waiting for a row hears its place
in the queue (state "queued", "position").

Every event the worker writes (stdout, with --json) is an engine event (see
events.py) with a "request" field naming the request it belongs to; each
request ends with exactly one "result" or "error" event. A request id still
queued or running cannot be used again (error code "input"). A cancelled
speak request ends with an error of code "cancelled" when no chunk was
finished, otherwise with a result (`"cancelled": true`) whose file holds the
finished chunks. A load that fails leaves no voice loaded: later speak
requests fail until a load succeeds, never speaking with the previous voice.
Loads wait for the speech already asked of the previous voice. When the
client goes away (stdin closes, or stdout breaks) the worker cancels
everything and exits. A speak request with an instruction ("instruct") first logs one
event whose "instruct" says whether the voice takes it and why it may do little.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from engine.config.speak import SpeakOptions, audio_format
from engine.core.errors import Cancelled, InputError, VoxshardError
from engine.core.events import Emitter, Event
from engine.core.kinds import VoiceKind
from engine.synth.batcher import BatchRequest, ContinuousBatcher
from engine.synth.capture import GATE
from engine.synth.synthesizer import Synthesizer
from engine.synth.voice import resolve_source
from engine.text import split_text

_STOP = object()


@dataclass
class _Job:
    request: dict[str, Any]
    cancel: threading.Event = field(default_factory=threading.Event)
    running: bool = False
    batched: bool = False
    #: the adapter pool and slot this speak request holds until it ends (`Adapters.hold`)
    held: tuple[Any, int] | None = None


class SpeechWorker:
    """Serve requests on a background thread; `events(Event)` receives everything."""

    def __init__(self, events: Callable[[Event], None], device: str | None = None,
                 dtype: Any = None, rows: int = 8, quantize: str | None = None,
                 fuse: bool = False) -> None:
        self._quantize = quantize
        self._fuse = fuse
        self._events = events
        self._device = device
        self._dtype = dtype
        self._rows = rows
        self._queue: queue.Queue[Any] = queue.Queue()
        self._jobs: dict[str, _Job] = {}
        self._current: _Job | None = None
        self._lock = threading.Lock()
        self._synth: Any = None
        self._batcher: Any = None
        self._load_error: str | None = None
        self._thread = threading.Thread(target=self._run, name="speech-worker", daemon=True)
        self.served = 0

    # -- client side --------------------------------------------------------------------------
    def start(self) -> SpeechWorker:
        self._thread.start()
        return self

    def submit(self, request: dict[str, Any]) -> None:
        """Queue a request (load/speak/ping); handle cancel and shutdown at once."""
        op = request.get("op")
        rid = str(request.get("id", "") or "")
        if op == "cancel":
            self.cancel(rid or None)
            return
        if op == "shutdown":
            self._queue.put(_STOP)
            return
        if op not in ("load", "voice", "forget", "speak", "ping"):
            self._emitter(rid).emit("error", code="input",
                                    message=f"Unknown request op {op!r}.",
                                    hint="Use load, voice, forget, speak, cancel, ping or "
                                         "shutdown.")
            return
        job = _Job(request)
        with self._lock:
            if rid and rid in self._jobs:
                duplicate = True
            else:
                duplicate = False
                if rid:
                    self._jobs[rid] = job
        if duplicate:
            # not "request": rid, which would look like the end of the running one
            self._events(Event("error", {"request": "", "duplicate_of": rid, "code": "input",
                                         "message": f"The request id {rid!r} is already queued "
                                                    "or running; this request was refused.",
                                         "hint": "Give every request its own id."}))
            return
        self._queue.put(job)

    def cancel(self, rid: str | None = None) -> bool:
        with self._lock:
            jobs = ([self._jobs[rid]] if rid and rid in self._jobs
                    else [] if rid else [j for j in self._jobs.values() if j.running])
        for job in jobs:
            job.cancel.set()
            if self._batcher is not None and job.batched:
                self._batcher.cancel(str(job.request.get("id", "")))
        return bool(jobs)

    def cancel_all(self) -> None:
        """Cancel every queued and running request, keeping nothing (the client is gone)."""
        with self._lock:
            jobs = list(self._jobs.values())
        for job in jobs:
            job.cancel.set()
            if self._batcher is not None and job.batched:
                self._batcher.cancel(str(job.request.get("id", "")), discard=True)

    def close(self, timeout: float | None = None, cancel: bool = False) -> None:
        """Finish the queued requests (or cancel them all: the client is gone), then stop."""
        if cancel:
            self.cancel_all()
        self._queue.put(_STOP)
        self._thread.join(timeout)

    # -- worker side --------------------------------------------------------------------------
    def _emitter(self, rid: str) -> Emitter:
        def forward(event: Event) -> None:
            self._events(Event(event.kind, {"request": rid, **event.data}, event.time))

        return Emitter(forward)

    def _end(self, job: _Job, result: dict[str, Any] | None,
             exc: BaseException | None) -> None:
        rid = str(job.request.get("id", "") or "")
        if job.held is not None:  # its rows are done with the slot
            adapters, slot = job.held
            job.held = None
            adapters.release(slot)
        emitter = self._emitter(rid)
        if isinstance(exc, VoxshardError):
            emitter.emit("error", code=exc.code, message=exc.message, hint=exc.hint,
                         **({"window_hint": exc.window_hint} if exc.window_hint else {}))
        elif exc is not None:  # a bug: report it and keep serving
            emitter.emit("error", code="internal",
                         message=f"Internal error: {type(exc).__name__}: {exc}",
                         hint="Report this with the request that caused it.")
        else:
            emitter.emit("result", **(result or {}))
        with self._lock:
            if self._jobs.get(rid) is job:
                self._jobs.pop(rid, None)
            self.served += 1

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is _STOP:
                if self._batcher is not None:
                    self._batcher.close()
                return
            rid = str(job.request.get("id", ""))
            emitter = self._emitter(rid)
            job.running = True
            try:
                if job.cancel.is_set():
                    raise Cancelled()
                if self._handle(job, emitter):
                    continue  # the batcher ends it
                raise AssertionError("unreachable")
            except _Done as done:
                self._end(job, done.result, None)
            except BaseException as exc:
                self._end(job, None, exc)

    def _drain(self) -> None:
        if self._batcher is not None:
            self._batcher.wait_idle()

    def _handle(self, job: _Job, emitter: Emitter) -> bool:
        req = job.request
        op = req["op"]
        if op == "ping":
            raise _Done(self._ping())
        if op == "load":
            raise _Done(self._load(req, emitter))
        if op == "voice":
            self._add_voice(req, emitter)
        if op == "forget":
            self._forget(req)
        return self._speak(job, emitter)

    def _ping(self) -> dict[str, Any]:
        return {"pong": True, "loaded": self._synth is not None,
                "batching": None if self._batcher is None else {
                    "rows": self._batcher.size, "refills": self._batcher.refills,
                    "frames": self._batcher.frames_run}}

    def _load(self, req: dict[str, Any], emitter: Emitter) -> dict[str, Any]:
        """Load the request's voice (swapped in place on the same base), and a new batcher
        for it; what was loaded."""
        voice = req.get("voice")
        if not voice:
            raise InputError("The load request has no voice.", "Add \"voice\": PATH.")
        self._drain()  # speech asked of the previous voice is finished with it
        try:
            source = resolve_source(voice, checkpoint=req.get("checkpoint"),
                                    reference=req.get("reference"),
                                    speaker=req.get("speaker"), base=req.get("base"),
                                    reference_text=req.get("reference_text"),
                                    x_vector_only=bool(req.get("x_vector_only", False)))
            same_base = (self._synth is not None and source.kind != VoiceKind.CUSTOM_VOICE
                         and self._synth.source.kind != VoiceKind.CUSTOM_VOICE
                         and source.model_dir == self._synth.source.model_dir)
            if same_base:
                # checkpoint <-> checkpoint <-> zero-shot on one base: swap in place
                self._synth.use_source(source, on_event=emitter)
            else:
                self._drop_voice()  # free the old model before loading the next
                self._synth = Synthesizer.load(source, device=self._device,
                                               dtype=self._dtype, on_event=emitter,
                                               quantize=self._quantize, fuse=self._fuse)
        except BaseException as exc:
            # never let the previous voice answer requests meant for this one
            self._drop_voice()
            self._load_error = getattr(exc, "message", None) or str(exc)
            raise
        self._load_error = None
        if self._batcher is not None:
            # same base, swapped in place: the old batcher's thread and caches go
            # now (it is idle: drained above), never left beside the new one
            self._batcher.close()
        self._batcher = ContinuousBatcher(self._synth, rows=self._rows)
        self._batcher.prepare()  # CUDA: frame graphs captured now, not mid-request
        return {"loaded": source.to_dict(), "languages": ["auto", *self._synth.languages],
                "summary": f"Loaded {source.label}"}

    def _speak(self, job: _Job, emitter: Emitter) -> bool:
        """The request checked and handed to the batcher, which ends the job."""
        req = job.request
        if self._synth is None:
            if self._load_error:
                raise InputError(f"No voice is loaded: the last load failed "
                                 f"({self._load_error.rstrip('.')}).",
                                 "Send a load request that succeeds.")
            raise InputError("No voice is loaded.", "Send a load request first.")
        text = req.get("text")
        out = req.get("out")
        if not isinstance(text, str):
            raise InputError("The speak request has no text.", "Add \"text\": \"...\".")
        if not out:
            raise InputError("The speak request has no output path.", "Add \"out\": PATH.")
        options = SpeakOptions.from_dict(dict(req.get("options") or {}))
        fmt = audio_format(str(out), req.get("format"))
        named = req.get("voice")
        voice = self._synth.voice(str(named)) if named else None
        self._say_instruction(options, voice, emitter)
        split_text(text, options.chunk_chars)  # bad text fails now, in order
        self._synth._language_id(options.language)
        self._hold(job, voice)
        job.batched = True
        self._batcher.submit(BatchRequest(
            rid=str(req.get("id", "")), text=text, out=str(out), fmt=fmt, options=options,
            emitter=emitter, done=lambda result, exc, job=job: self._end(job, result, exc),
            voice=voice, stream=bool(req.get("stream"))))
        if job.cancel.is_set():
            self._batcher.cancel(str(req.get("id", "")))
        return True

    def _say_instruction(self, options: SpeakOptions, voice: Any, emitter: Emitter) -> None:
        """What becomes of the request's instruction, said once per request in one log event
        whose "instruct" is {"text", "applied", "notes"}: the batch builds each row's prompt
        silently, and a server answers its client from this (a header, its request log)."""
        if not options.instruct:
            return
        notes: list[Event] = []
        source = (voice or self._synth.current_voice).source
        applied = self._synth.instruct_ids(options, Emitter(notes.append), source) is not None
        said = [str(n.data.get("message", "")) for n in notes]
        warned = not applied or any(n.data.get("level") == "warning" for n in notes)
        level = "debug" if not said else "warning" if warned else "info"
        emitter.log(" ".join(said) or f"Spoken with the instruction {options.instruct!r}.",
                    level=level,
                    instruct={"text": options.instruct, "applied": applied, "notes": said})

    def _add_voice(self, req: dict[str, Any], emitter: Emitter) -> None:
        """A voice of the loaded base beside the others (see the module doc)."""
        name, voice = req.get("name"), req.get("voice")
        if not name or not voice:
            raise InputError("The voice request needs a name and a voice.",
                             "Add \"name\": NAME and \"voice\": PATH.")
        if self._synth is None:
            raise InputError("No model is loaded to add the voice to.",
                             "Send a load request first.")
        source = resolve_source(voice, reference=req.get("reference"), base=req.get("base"),
                                reference_text=req.get("reference_text"))
        started = time.perf_counter()
        with GATE.section():
            self._synth.add_voice(str(name), source, on_event=emitter)
        raise _Done({"voice": str(name), "loaded": source.to_dict(),
                     "load_s": round(time.perf_counter() - started, 4), "pool": self._pool()})

    def _hold(self, job: _Job, voice: Any) -> None:
        """The request holds its voice's adapter slot until it ends (`_end`): a voice
        replaced or forgotten meanwhile never has its slot overwritten under the rows."""
        adapters = self._synth.fast.adapters
        slot = (voice or self._synth.current_voice).adapter
        adapters.hold(slot)
        job.held = (adapters, slot)

    def _pool(self) -> dict[str, int]:
        """How full the loaded model's voices are: the named ones and the adapter slots."""
        return {"voices": len(self._synth.voices), **self._synth.fast.adapters.usage()}

    def _forget(self, req: dict[str, Any]) -> None:
        """Let a voice loaded by name go (see the module doc)."""
        name = req.get("name")
        if not name:
            raise InputError("The forget request needs the voice's name.",
                             "Add \"name\": NAME.")
        removed = self._synth is not None and self._synth.remove_voice(str(name))
        raise _Done({"voice": str(name), "removed": removed,
                     **({"pool": self._pool()} if self._synth is not None else {})})

    def _drop_voice(self) -> None:
        if self._batcher is not None:
            self._batcher.close(cancel=True)
        self._batcher = None
        self._synth = None


class _Done(Exception):
    """A request's normal end, carried out of `_handle` with its result."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__()
        self.result = result


def serve(stdin: TextIO, sink: Callable[[Event], None], device: str | None = None,  # noqa: C901, PLR0913
          dtype: Any = None, first_load: dict[str, Any] | None = None,
          watch_parent: bool = False, rows: int = 8, quantize: str | None = None,
          fuse: bool = False) -> int:
    """Run the JSON-lines protocol until stdin closes or a shutdown request; returns
    how many requests were served. `sink` receives every event (the CLI passes
    its `--json` writer, which owns the real stdout).

    Stdin closing finishes what was asked, then exits. The client being gone
    (its end of stdout broken, or with `watch_parent` the parent process
    dead) cancels everything at once and exits."""
    write_lock = threading.Lock()
    gone = threading.Event()
    holder: list[SpeechWorker] = []

    def client_gone() -> None:
        if not gone.is_set():
            gone.set()
            if holder:
                holder[0].cancel_all()

    def write(event: Event) -> None:
        if gone.is_set():
            return
        try:
            with write_lock:
                sink(event)
        except (BrokenPipeError, ValueError, OSError):
            client_gone()

    worker = SpeechWorker(write, device=device, dtype=dtype, rows=rows, quantize=quantize,
                          fuse=fuse).start()
    holder.append(worker)
    if watch_parent:
        parent = os.getppid()

        def watch() -> None:
            while not gone.wait(1.0):
                if os.getppid() != parent:
                    client_gone()
                    worker.close(timeout=30, cancel=True)
                    os._exit(0)  # stdin may never close: nobody is left to read us

        threading.Thread(target=watch, name="speech-parent-watch", daemon=True).start()
    write(Event("state", {"state": "ready", "request": ""}))
    if first_load:
        worker.submit(first_load)
    for line in stdin:
        if gone.is_set():
            break
        line = line.strip()
        if not line:
            continue
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("not an object")
        except ValueError as exc:
            write(Event("error", {"request": "", "code": "input",
                                  "message": f"A request line is not a JSON object ({exc}).",
                                  "hint": "Send one JSON object per line."}))
            continue
        worker.submit(request)
        if request.get("op") == "shutdown":
            break
    worker.close(cancel=gone.is_set())
    return worker.served
