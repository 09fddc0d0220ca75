"""The warm workers behind the server: one `SpeechWorker` per model in memory.

Each voice is loaded on first use into a warm worker (the same
`engine.synth.worker.SpeechWorker` that `serve-speech` runs for the app), so
requests for one voice from any number of HTTP clients share its continuous
batch. Adapter and instant voices share their base's worker (the server's device,
dtype and quantisation are one for all, so a base is one model): the first of them
loads the base, each next one is a "voice" request to it (no model load), and every
request names its voice, row by row in one batch; a voice deleted from the workspace
is forgotten by its worker, and one whose folder changed is loaded again over its old
self, so the worker's voices and adapter slots stay as many as are served (`forget`).
A full voice or a run's checkpoint has a worker of its own. At most `max_loaded` models
stay loaded (voices on them do not count); the least recently used idle one makes room.
A bounded number of requests are admitted at once (`Busy` beyond it: the app answers 429
with Retry-After).

The worker speaks into files; the server picks their names inside its own
private folder (never a client's path) and removes them when the request
ends. A streamed request's file grows as the audio is generated: it is opened
the moment the worker announces it (on the worker's thread, before the
finished render can replace it) and read as it grows.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from engine.core.errors import VoxshardError
from engine.core.events import Event
from engine.core.kinds import ServedKind, VoiceKind
from engine.layout.exports import exports_dir
from engine.serve import formats
from engine.serve.voices import ServedVoice

#: how often a stream looks for new audio in the growing file
TAIL_S = 0.01
#: the identity of a base's shared worker (`Pool.identity`): this, then its folder
BASE_IDENTITY = "base:"


class Busy(Exception):
    """The server holds as many requests as it admits; the client should retry later."""

    def __init__(self, message: str, retry_after: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after


class LoadFailed(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass
class Ticket:
    """One speak request inside a worker, seen from the event loop."""

    rid: str
    out: Path
    loop: asyncio.AbstractEventLoop
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    #: set (on the loop) when the streamed file exists and `partial` is open
    started: asyncio.Event = field(default_factory=asyncio.Event)
    partial: BinaryIO | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    chunks_done: int = 0
    #: the client is gone but the worker has not ended the request yet: the
    #: worker's last event removes what it wrote
    orphan: bool = False
    #: wall-clock time of the worker's first audio of a streamed request (its metric event)
    first_audio_at: float | None = None
    #: other files of this request (a client's reference clip), removed with it
    extra: list[Path] = field(default_factory=list)
    #: what the worker made of the request's instruction: {"text", "applied", "notes"}
    #: (`SpeechWorker._say_instruction`); None when it had none
    instruct: dict[str, Any] | None = None
    #: its first place in the worker's queue when it waited for a row (state "queued")
    queued: int | None = None

    def _set(self, flag: asyncio.Event) -> None:
        try:
            self.loop.call_soon_threadsafe(flag.set)
        except RuntimeError:  # the loop is closed: the server is gone
            pass

    def on_event(self, event: Event) -> None:
        """Called on the worker's threads."""
        if event.kind == "artifact" and event.data.get("role") == "speech_partial":
            if self.partial is None:
                try:
                    # opened here, before the worker can replace the file by the final render
                    self.partial = open(self.out, "rb")
                except OSError:
                    self.partial = None
            self._set(self.started)
        elif event.kind == "metric" and "synth/first_audio_s" in (event.data.get("values")
                                                                  or {}):
            self.first_audio_at = event.time
        elif event.kind == "log" and isinstance(event.data.get("instruct"), dict):
            self.instruct = dict(event.data["instruct"])
        elif event.kind == "state" and event.data.get("state") == "queued":
            if self.queued is None:
                self.queued = int(event.data.get("position") or 0)
        elif event.kind == "progress":
            self.chunks_done = int(event.data.get("current") or self.chunks_done)
        elif event.kind == "result":
            self.result = dict(event.data)
            self._set(self.started)
            self._set(self.ended)
        elif event.kind == "error":
            self.error = dict(event.data)
            self._set(self.started)
            self._set(self.ended)

    def said(self) -> dict[str, Any]:
        """The request log's record of what the worker made of the request: its instruction
        (none given: absent) and, when it waited for a row, its first place in the queue."""
        return {**({"instructions": self.instruct} if self.instruct else {}),
                **({"queue_position": self.queued} if self.queued else {})}

    def close(self) -> None:
        if self.partial is not None:
            self.partial.close()
            self.partial = None
        for path in (self.out, Path(self.result["path"]) if self.result else None, *self.extra):
            if path is not None:
                try:
                    path.unlink()
                except OSError:
                    pass


def _stat(path: Path) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (0, 0)
    return (st.st_ino, st.st_mtime_ns)


def voice_stamp(voice: ServedVoice) -> tuple[Any, ...]:
    """Which folder a voice's name means now: its path, inode and change time; for a voice
    folder also its exports/ folder's (an export written or rewritten there, such as a
    run's adapter voice from a new best checkpoint, changes what the voice speaks)."""
    stamp: tuple[Any, ...] = (str(voice.target), *_stat(voice.target))
    if voice.kind == ServedKind.VOICE:
        stamp += _stat(exports_dir(voice.target))
    return stamp


def voice_identity(voice: ServedVoice) -> str:
    """What a served voice loads (the export folder or checkpoint `speak` would use); the
    adapter and instant voices of one base share their base's (`BASE_IDENTITY`)."""
    try:
        source = voice.source()
    except VoxshardError:
        return voice.name
    if source.kind in (VoiceKind.ADAPTER, VoiceKind.ZERO_SHOT):
        # on its base's worker, beside the other voices of that base (each request
        # names its voice, so none answers for another)
        return BASE_IDENTITY + str(source.model_dir)
    return str(source.checkpoint or source.model_dir)


class VoiceWorker:
    """One loaded voice: a `SpeechWorker` and the requests it is serving."""

    def __init__(self, voice: ServedVoice, make_worker: Callable[..., Any]) -> None:
        self.voice = voice
        self.tickets: dict[str, Ticket] = {}
        self._lock = threading.Lock()
        self.worker = make_worker(self._route)
        self.last_used = time.monotonic()
        self.languages: list[str] = []
        #: what it loaded (`Pool.identity`): names that resolve alike share this worker
        self.identity = voice.name
        #: the names loaded on it by "voice" requests (a base's worker: `shared`), each
        #: with the stamp of the folder it was loaded from (`voice_stamp`)
        self.voices: dict[str, Any] = {}
        #: its model's voices and adapter slots, as the last "voice" or "forget" answer said
        self.pool: dict[str, int] = {}
        #: request ids waited for by `ask` -> (ended, its last event's data)
        self._waiting: dict[str, tuple[threading.Event, dict[str, Any]]] = {}

    @property
    def shared(self) -> bool:
        """A base's worker: its adapter and instant voices speak by name."""
        return self.identity.startswith(BASE_IDENTITY)

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        """Submit `request` and wait for its end (blocking: run it off the event loop);
        its result's data with "kind" "result" or "error"."""
        done, answer = threading.Event(), {}
        self._waiting[str(request["id"])] = (done, answer)
        try:
            self.worker.submit(request)
            done.wait()
        finally:
            self._waiting.pop(str(request["id"]), None)
        return answer

    def _route(self, event: Event) -> None:
        rid = str(event.data.get("request") or "")
        waiter = self._waiting.get(rid)
        if waiter is not None and event.kind in ("result", "error"):
            waiter[1].update(event.data, kind=event.kind)
            waiter[0].set()
        with self._lock:  # one lock with `Pool.finish`: an orphan is cleaned exactly once
            ticket = self.tickets.get(rid)
            if ticket is None:
                return
            ticket.on_event(event)
            if ticket.orphan and event.kind in ("result", "error"):
                self.tickets.pop(rid, None)
                ticket.close()

    def track(self, ticket: Ticket) -> None:
        with self._lock:
            self.tickets[ticket.rid] = ticket
        self.last_used = time.monotonic()

    def forget(self, ticket: Ticket) -> None:
        with self._lock:
            self.tickets.pop(ticket.rid, None)

    @property
    def busy(self) -> bool:
        with self._lock:
            return bool(self.tickets)


class Pool:
    """The loaded voices and the admission bound (used from one event loop)."""

    def __init__(self, voices: dict[str, ServedVoice], *, device: str | None = None,  # noqa: PLR0913
                 dtype: str = "auto", rows: int = 8, quantize: str | None = None,
                 fuse: bool = False, max_loaded: int = 2, max_queue: int = 32,
                 reference_base: str | None = None) -> None:
        self.voices = voices
        #: the base model that clones from a client's reference clip (None: not allowed)
        self.reference_base = reference_base
        self.cloner: VoiceWorker | None = None
        self.device, self.dtype, self.rows = device, dtype, rows
        self.quantize, self.fuse = quantize, fuse
        self.max_loaded = max(1, max_loaded)
        self.max_queue = max(1, max_queue)
        self.loaded: dict[str, VoiceWorker] = {}
        #: workers no served name loads any more (`retire`), still finishing a request
        self.retired: list[VoiceWorker] = []
        #: models loaded since the start (a worker's load; a voice added to one is not)
        self.model_loads = 0
        self.admitted = 0
        self.streams = 0
        self._ids = itertools.count(1)
        self._load_lock: asyncio.Lock | None = None
        self._dir = Path(tempfile.mkdtemp(prefix="voxshard-serve-"))
        os.chmod(self._dir, 0o700)  # the renders are the user's alone

    @property
    def renders_dir(self) -> Path:
        """The private folder of the renders in progress (empty when none is)."""
        return self._dir

    # -- admission -----------------------------------------------------------------------
    def admit(self) -> None:
        if self.admitted >= self.max_queue:
            raise Busy(f"The server is already handling {self.admitted} requests, its limit.",
                       retry_after=max(1, self.admitted // max(1, self.rows)))
        self.admitted += 1

    def release(self) -> None:
        self.admitted = max(0, self.admitted - 1)

    # -- voices ----------------------------------------------------------------------------
    def _make_worker(self, sink: Callable[[Event], None]) -> Any:
        # torch loads here, not when this module is imported (start-up cost)
        from engine.synth.worker import SpeechWorker  # noqa: PLC0415

        return SpeechWorker(sink, device=self.device, dtype=self.dtype, rows=self.rows,
                            quantize=self.quantize, fuse=self.fuse).start()

    async def worker_for(self, name: str) -> VoiceWorker:
        """The warm worker of voice `name`, loading it now if needed."""
        async with self._loading():
            await self._close_retired()
            found = self.loaded.get(name)
            if found is not None and found.identity != self.identity(name):
                # the name speaks with something else now (its voice trained or exported
                # since): the next request loads that, the one under way ends on this
                await self._retire(name, found)
                found = None
            if found is None:
                # `ada` and `ada/<its latest export>` are one model: one worker serves both;
                # the adapter and instant voices of one base, one worker too
                identity = self.identity(name)
                found = next((w for w in self.loaded.values() if w.identity == identity), None)
            if found is not None:
                if found.shared and found.voices.get(name) != voice_stamp(self.voices[name]):
                    await asyncio.get_running_loop().run_in_executor(
                        None, self._add_voice, found, name)
                self.loaded[name] = found
                found.last_used = time.monotonic()
                return found
            workers = self._workers()
            if len(workers) >= self.max_loaded:
                idle = sorted((w for w in workers if not w.busy),
                              key=lambda w: w.last_used)
                if not idle:
                    raise Busy(f"Every loaded voice is busy and at most {self.max_loaded} "
                               "are kept loaded.", retry_after=5)
                await self.unload(idle[0])
            loaded = await asyncio.get_running_loop().run_in_executor(None, self._load, name)
            self.loaded[name] = loaded
            return loaded

    async def _retire(self, name: str, worker: VoiceWorker) -> None:
        """`name` no longer speaks on `worker`: let it go there, and close the worker once
        no name uses it and its requests have ended (`_close_retired`)."""
        del self.loaded[name]
        if name in worker.voices and not worker.busy:  # a reply under way ends in it
            await asyncio.get_running_loop().run_in_executor(None, self._forget_on, worker,
                                                             name)
        if all(w is not worker for w in self.loaded.values()):
            self.retired.append(worker)
        await self._close_retired()

    async def _close_retired(self) -> None:
        for worker in [w for w in self.retired if not w.busy]:
            self.retired.remove(worker)
            await self.unload(worker)

    def is_open(self, worker: VoiceWorker) -> bool:
        """`worker` still runs (a name loads it, or it is retired but not yet closed)."""
        return any(w is worker for w in (*self.loaded.values(), *self.retired))

    def identity(self, name: str) -> str:
        """What voice `name` loads (`voice_identity`)."""
        return voice_identity(self.voices[name])

    def _load(self, name: str) -> VoiceWorker:
        voice = self.voices[name]
        worker = VoiceWorker(voice, self._make_worker)
        worker.identity = self.identity(name)
        answer = worker.ask({"op": "load", "id": "load", "voice": str(voice.target),
                             **voice.load_options()})
        if answer.get("kind") != "result":
            worker.worker.close(timeout=30)
            raise LoadFailed(f"The voice {name!r} could not be loaded: "
                             f"{answer.get('message') or 'unknown error'}")
        self.model_loads += 1
        worker.languages = list(answer.get("languages") or [])
        if worker.shared:
            try:
                self._add_voice(worker, name)
            except LoadFailed:
                worker.worker.close(timeout=30)
                raise
        return worker

    def _add_voice(self, worker: VoiceWorker, name: str) -> None:
        """Load voice `name` onto its base's worker, by name (no model load); again when its
        folder was made anew since (a registered voice deleted and registered again)."""
        answer = worker.ask({"op": "voice", "id": f"voice-{next(self._ids)}", "name": name,
                             "voice": str(self.voices[name].target),
                             **self.voices[name].load_options()})
        if answer.get("kind") != "result":
            raise LoadFailed(f"The voice {name!r} could not be loaded: "
                             f"{answer.get('message') or 'unknown error'}")
        worker.voices[name] = voice_stamp(self.voices[name])
        worker.pool = dict(answer.get("pool") or worker.pool)

    def _forget_on(self, worker: VoiceWorker, name: str) -> None:
        answer = worker.ask({"op": "forget", "id": f"forget-{next(self._ids)}", "name": name})
        worker.voices.pop(name, None)
        worker.pool = dict(answer.get("pool") or worker.pool)

    async def forget(self, names: list[str]) -> None:
        """Voices `names` are no longer served (deleted from the workspace): each is let go
        by the base's worker that speaks it (its adapter slot free for the next voice once
        its last request ends), and a worker no served name uses any more is closed."""
        if not names:
            return
        async with self._loading():  # never beside a load of the same name, made anew
            workers = {id(w): w for name in names if (w := self.loaded.get(name)) is not None}
            for name in names:
                self.voices.pop(name, None)
                worker = self.loaded.pop(name, None)
                if worker is not None and name in worker.voices:
                    await asyncio.get_running_loop().run_in_executor(
                        None, self._forget_on, worker, name)
            for worker in workers.values():
                if all(w is not worker for w in self.loaded.values()):
                    await self.unload(worker)

    async def sync(self, found: dict[str, ServedVoice]) -> None:
        """Serve the voices `found` on disk now: those gone from it are forgotten (`forget`),
        the others served as found (a voice's plain name follows its best tier: a model
        switch at its next request, `worker_for`)."""
        await self.forget([name for name in self.voices if name not in found])
        self.voices.update(found)

    def _workers(self) -> list[VoiceWorker]:
        """Each loaded worker once (a base's worker serves several names)."""
        return list({id(w): w for w in self.loaded.values()}.values())

    def _loading(self) -> asyncio.Lock:
        """The lock of loading and forgetting voices (made on the event loop)."""
        if self._load_lock is None:
            self._load_lock = asyncio.Lock()
        return self._load_lock

    async def unload(self, worker: VoiceWorker) -> None:
        """Close `worker` (cancelling what it still renders); none of its names stay loaded."""
        for name in [n for n, w in self.loaded.items() if w is worker]:
            del self.loaded[name]
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: worker.worker.close(timeout=60, cancel=True))

    # -- cloning from a client's clip -------------------------------------------------------
    def speak_cloned(self, reference: Path, reference_text: str | None, text: str,
                     options: dict[str, Any], fmt: str, stream: bool) -> tuple[VoiceWorker, Ticket]:
        """Speak in the voice of `reference` (a file this server wrote), zero-shot on the
        reference base. The load and the speak are queued together: the worker runs its
        queue in order and a load waits for the speech before it, so each request speaks
        with its own clip whatever else is asked meanwhile."""
        assert self.reference_base is not None
        if self.cloner is None:
            voice = ServedVoice("(reference)", Path(self.reference_base),
                                ServedKind.REFERENCE, "")
            self.cloner = VoiceWorker(voice, self._make_worker)
        rid = f"r{next(self._ids)}"
        self.cloner.worker.submit({"op": "load", "id": f"load-{rid}",
                                   "voice": self.reference_base, "reference": str(reference),
                                   "reference_text": reference_text})
        ticket = self._submit(self.cloner, rid, text, options, fmt, stream)
        ticket.extra.append(reference)
        return self.cloner, ticket

    def reference_file(self, data: bytes) -> Path:
        """A private file for a client's reference clip (its name is the server's)."""
        path = self._dir / f"ref-{next(self._ids)}.wav"
        path.write_bytes(data)
        return path

    # -- speaking --------------------------------------------------------------------------
    def speak(self, worker: VoiceWorker, text: str, options: dict[str, Any], fmt: str,
              stream: bool, voice: str | None = None) -> Ticket:
        """Speak `text` on `worker` in voice `voice` (the name `worker_for` was asked;
        a base's worker speaks each of its voices by name)."""
        return self._submit(worker, f"r{next(self._ids)}", text, options, fmt, stream,
                            voice if voice is not None else worker.voice.name)

    def _submit(self, worker: VoiceWorker, rid: str, text: str, options: dict[str, Any],
                fmt: str, stream: bool, voice: str | None = None) -> Ticket:
        suffix = "wav" if stream or fmt == "pcm" else fmt
        ticket = Ticket(rid, self._dir / f"{rid}.{suffix}", asyncio.get_running_loop())
        worker.track(ticket)
        worker.worker.submit({"op": "speak", "id": rid, "text": text, "out": str(ticket.out),
                              "format": suffix, "options": options, "stream": stream,
                              "voice": voice if worker.shared else None})
        return ticket

    async def tail(self, worker: VoiceWorker, ticket: Ticket,
                   deadline: float) -> AsyncIterator[bytes]:
        """The growing file's 16-bit samples as they arrive (whole samples only)."""
        fh = ticket.partial
        if fh is None and ticket.result is not None:
            try:
                fh = open(ticket.result["path"], "rb")
            except OSError:
                return
        if fh is None:
            return
        buffer = b""
        start: int | None = None
        try:
            while True:
                ended = ticket.ended.is_set()  # before the read: the last read sees all
                buffer += fh.read()
                if start is None:
                    start = formats.wav_data_offset(buffer[:4096])
                    if start is not None:
                        buffer = buffer[start:]
                if start is not None:
                    whole = len(buffer) - len(buffer) % 2
                    if whole:
                        yield buffer[:whole]
                        buffer = buffer[whole:]
                if ended:
                    return
                if time.monotonic() > deadline:
                    self.cancel(worker, ticket)
                    return
                try:
                    await asyncio.wait_for(ticket.ended.wait(), TAIL_S)
                except TimeoutError:
                    pass
        finally:
            if fh is not ticket.partial:
                fh.close()

    def cancel(self, worker: VoiceWorker, ticket: Ticket) -> None:
        """Free the request's rows now (its finished chunks are thrown away)."""
        if not ticket.ended.is_set():
            worker.worker.cancel(ticket.rid)

    def finish(self, worker: VoiceWorker, ticket: Ticket) -> None:
        """The request is over for its client: remove its files now, or when the worker
        ends it (a cancelled one still writes what it had finished)."""
        self.cancel(worker, ticket)  # however it ended here, nobody waits for the rest
        with worker._lock:
            if ticket.result is None and ticket.error is None:
                ticket.orphan = True
                return
            worker.tickets.pop(ticket.rid, None)
            ticket.close()

    def health(self) -> dict[str, Any]:
        workers = self._workers()
        return {"loaded": sorted(self.loaded), "workers": len(workers),
                "models_loaded": self.model_loads,
                "queue_depth": self.admitted,
                "queue_limit": self.max_queue, "streams": self.streams, "rows": self.rows,
                # each base's worker: its named voices and adapter slots (a pool that grew
                # with voices come and gone would show here)
                "voice_pools": [w.pool for w in workers if w.shared]}

    async def close(self) -> None:
        for worker in [*self._workers(), *self.retired]:
            await self.unload(worker)
        if self.cloner is not None:
            cloner, self.cloner = self.cloner, None
            await asyncio.get_running_loop().run_in_executor(
                None, lambda: cloner.worker.close(timeout=60, cancel=True))
        shutil.rmtree(self._dir, ignore_errors=True)
