"""A long-lived synthesis worker: load a voice once, serve many requests, cancel.

The GUI keeps one `voxshard-engine serve-speech` process warm and talks JSON
lines to it. Requests (stdin), one object per line:

    {"op": "load", "id": "l1", "voice": "PATH", "checkpoint": null,
     "reference": null, "base": null, "speaker": null}
    {"op": "speak", "id": "r1", "text": "...", "out": "PATH.wav",
     "format": null, "options": {"seed": 1, "temperature": 0.8}, "stream": false}

With "stream": true each chunk is also written as PATH.partNN.wav the moment
it is ready (artifact event, role "speech_chunk"), so playback can start
while later chunks are still being generated.
    {"op": "cancel", "id": "r1"}          (queued or running; no id: the running one)
    {"op": "ping", "id": "p"}
    {"op": "shutdown"}

Every event the worker writes (stdout, with --json) is an engine event (see events.py)
with a "request" field naming the request it belongs to; each request ends
with exactly one "result" or "error" event. A cancelled speak request ends
with an error of code "cancelled" when no chunk was finished, otherwise with
a result (`"cancelled": true`) whose file holds the finished chunks. Requests run one at a time in
order; reading continues meanwhile, so cancel takes effect within one frame.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

from ..errors import Cancelled, InputError, VoxshardError
from ..events import Emitter, Event
from .options import SpeakOptions
from .voice import resolve_source

_STOP = object()


@dataclass
class _Job:
    request: dict[str, Any]
    cancel: threading.Event = field(default_factory=threading.Event)


class SpeechWorker:
    """Serve requests on a background thread; `events(Event)` receives everything."""

    def __init__(self, events: Callable[[Event], None], device: str | None = None,
                 dtype: Any = None) -> None:
        self._events = events
        self._device = device
        self._dtype = dtype
        self._queue: queue.Queue[Any] = queue.Queue()
        self._jobs: dict[str, _Job] = {}
        self._current: _Job | None = None
        self._lock = threading.Lock()
        self._synth: Any = None
        self._thread = threading.Thread(target=self._run, name="speech-worker", daemon=True)
        self.served = 0

    # -- client side --------------------------------------------------------------------------
    def start(self) -> SpeechWorker:
        self._thread.start()
        return self

    def submit(self, request: dict[str, Any]) -> None:
        """Queue a request (load/speak/ping); handle cancel and shutdown at once."""
        op = request.get("op")
        rid = str(request.get("id", ""))
        if op == "cancel":
            self.cancel(rid or None)
            return
        if op == "shutdown":
            self._queue.put(_STOP)
            return
        if op not in ("load", "speak", "ping"):
            self._emitter(rid).emit("error", code="input",
                                    message=f"Unknown request op {op!r}.",
                                    hint="Use load, speak, cancel, ping or shutdown.")
            return
        job = _Job(request)
        with self._lock:
            if rid:
                self._jobs[rid] = job
        self._queue.put(job)

    def cancel(self, rid: str | None = None) -> bool:
        with self._lock:
            job = self._jobs.get(rid) if rid else self._current
        if job is None:
            return False
        job.cancel.set()
        return True

    def close(self, timeout: float | None = None) -> None:
        """Finish the queued requests, then stop the thread."""
        self._queue.put(_STOP)
        self._thread.join(timeout)

    # -- worker side --------------------------------------------------------------------------
    def _emitter(self, rid: str) -> Emitter:
        def forward(event: Event) -> None:
            self._events(Event(event.kind, {"request": rid, **event.data}, event.time))

        return Emitter(forward)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            if job is _STOP:
                return
            rid = str(job.request.get("id", ""))
            emitter = self._emitter(rid)
            with self._lock:
                self._current = job
            try:
                if job.cancel.is_set():
                    raise Cancelled()
                result = self._handle(job, emitter)
                emitter.emit("result", **result)
            except VoxshardError as exc:
                emitter.emit("error", code=exc.code, message=exc.message, hint=exc.hint)
            except Exception as exc:  # a bug: report it and keep serving
                emitter.emit("error", code="internal",
                             message=f"Internal error: {type(exc).__name__}: {exc}",
                             hint="Report this with the request that caused it.")
            finally:
                with self._lock:
                    self._current = None
                    self._jobs.pop(rid, None)
                self.served += 1

    def _handle(self, job: _Job, emitter: Emitter) -> dict[str, Any]:
        from .synthesizer import Synthesizer

        req = job.request
        op = req["op"]
        if op == "ping":
            return {"pong": True, "loaded": self._synth is not None}
        if op == "load":
            voice = req.get("voice")
            if not voice:
                raise InputError("The load request has no voice.", "Add \"voice\": PATH.")
            source = resolve_source(voice, checkpoint=req.get("checkpoint"),
                                    reference=req.get("reference"), speaker=req.get("speaker"),
                                    base=req.get("base"),
                                    reference_text=req.get("reference_text"),
                                    x_vector_only=bool(req.get("x_vector_only", False)))
            same_base = (self._synth is not None and source.kind != "custom_voice"
                         and self._synth.source.kind != "custom_voice"
                         and source.model_dir == self._synth.source.model_dir)
            if same_base:
                # checkpoint <-> checkpoint <-> zero-shot on one base: swap in place
                self._synth.use_source(source, on_event=emitter)
            else:
                self._synth = None  # free the old model before loading the next
                self._synth = Synthesizer.load(source, device=self._device, dtype=self._dtype,
                                               on_event=emitter)
            return {"loaded": source.to_dict(), "languages": ["auto", *self._synth.languages],
                    "summary": f"Loaded {source.label}"}
        # speak
        if self._synth is None:
            raise InputError("No voice is loaded.", "Send a load request first.")
        text = req.get("text")
        out = req.get("out")
        if not isinstance(text, str):
            raise InputError("The speak request has no text.", "Add \"text\": \"...\".")
        if not out:
            raise InputError("The speak request has no output path.", "Add \"out\": PATH.")
        options = SpeakOptions.from_dict(dict(req.get("options") or {}))
        result: dict[str, Any] = self._synth.speak_to_file(
            text, out, options, req.get("format"), emitter, job.cancel,
            stream=bool(req.get("stream", False)))
        return result


def serve(stdin: TextIO, sink: Callable[[Event], None], device: str | None = None,
          dtype: Any = None, first_load: dict[str, Any] | None = None) -> int:
    """Run the JSON-lines protocol until stdin closes or a shutdown request; returns
    how many requests were served. `sink` receives every event (the CLI passes
    its `--json` writer, which owns the real stdout)."""
    write_lock = threading.Lock()

    def write(event: Event) -> None:
        with write_lock:
            sink(event)

    worker = SpeechWorker(write, device=device, dtype=dtype).start()
    write(Event("state", {"state": "ready", "request": ""}))
    if first_load:
        worker.submit(first_load)
    for line in stdin:
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
    worker.close()
    return worker.served
