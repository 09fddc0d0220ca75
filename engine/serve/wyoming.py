"""Home Assistant's Wyoming protocol over the HTTP server's warm workers.

One `WyomingService` answers every connection on the event loop the HTTP
server runs on, with the same `Pool`: a voice asked for here and over HTTP is
one warm worker, and their requests share its batches and its admission bound.
The events are the `wyoming` package's own:

- `describe` -> `info`: one TTS program listing every served voice (rescanned
  each time, so a voice exported since the start appears);
- `synthesize` -> `audio-start`, `audio-chunk`s as the worker writes them, `audio-stop`
  (while the worker streams for another client, the text is rendered in the shared
  batch instead and sent when done: a second stream would wait for the first);
- `synthesize-start`, `synthesize-chunk`s, `synthesize-stop`: each sentence is
  submitted the moment it is complete (`engine.text.complete_sentences`) and
  answered by its own `audio-start`/`audio-chunk`/`audio-stop` group, in order,
  then `synthesize-stopped`. The `synthesize` a client sends inside a stream
  (for servers that do not stream) is ignored.

Anything wrong with one request is one `error` event and the connection goes on;
a client that leaves cancels its rows at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.server import AsyncEventHandler
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
)
from zeroconf import ServiceInfo
from zeroconf.asyncio import AsyncZeroconf

from engine import __version__
from engine.core.errors import InputError, VoxshardError
from engine.serve import formats
from engine.serve.pool import Busy, LoadFailed, Pool, Ticket, VoiceWorker
from engine.serve.voices import ServedVoice
from engine.text import complete_sentences, split_sentences

#: every group is in this one format: Home Assistant writes its WAV header once,
#: from the first audio-start of a stream
RATE, WIDTH, CHANNELS = formats.SAMPLE_RATE, 2, 1
#: most audio in one audio-chunk event (0.1 s, about what Piper sends)
CHUNK_BYTES = RATE * WIDTH // 10
SERVICE_TYPE = "_wyoming._tcp.local."
ATTRIBUTION = Attribution(name="Voxshard (Qwen3-TTS fine-tuned on your own recordings)",
                          url="https://github.com/QwenLM/Qwen3-TTS")
#: Qwen3-TTS's language names (a voice's `language`) as the codes Home Assistant picks by
LANGUAGE_CODES = {"english": "en", "chinese": "zh", "japanese": "ja", "korean": "ko",
                  "german": "de", "french": "fr", "russian": "ru", "portuguese": "pt",
                  "spanish": "es", "italian": "it"}
KIND_WORDS = {"voice": "the voice's latest export (else its latest trained run)",
              "export": "this export of the voice", "run": "this trained run's checkpoint",
              "reference": "a reference clip"}


def parse_uri(uri: str) -> tuple[str, int]:
    """`tcp://HOST:PORT` as (host, port), or a one-sentence refusal."""
    try:
        parsed = urlparse(uri)
        host, port = parsed.hostname, parsed.port
    except ValueError:
        host = port = None
    if not uri.startswith("tcp://") or not host or port is None:
        raise InputError(f"The Wyoming address {uri!r} is not tcp://HOST:PORT.",
                         "Use e.g. --wyoming tcp://127.0.0.1:10200.")
    return host, port


def languages_of(voice: ServedVoice) -> list[str]:
    code = LANGUAGE_CODES.get(voice.language.strip().lower())
    if code:
        return [code]
    # no language recorded: the model speaks all of them
    return [voice.language] if voice.language else sorted(LANGUAGE_CODES.values())


class _Refused(Exception):
    """One request cannot be served: its client gets one error event."""

    def __init__(self, text: str, code: str) -> None:
        super().__init__(text)
        self.text, self.code = text, code


@dataclass
class _Job:
    """One submitted text (a one-shot request or one sentence of a stream)."""

    worker: VoiceWorker
    ticket: Ticket
    voice: str
    mode: str
    chars: int
    began: float
    deadline: float
    done: bool = False


@dataclass
class _Stream:
    voice: str
    text: str = ""  # what is not yet a complete sentence
    chars: int = 0
    failed: bool = False


#: what the speaker task is given, in order: a job, an event to send, or the end of a stream
_Item = _Job | Event


@dataclass
class WyomingService:
    """The Wyoming side of one server; `rescan()` returns the voices served now."""

    pool: Pool
    rescan: Callable[[], dict[str, ServedVoice]]
    max_input: int
    timeout_s: float
    log: Callable[[dict[str, Any]], None] = field(default=lambda _record: None)
    served: int = 0
    audio_s: float = 0.0
    #: jobs submitted as streams (the worker plays one stream at a time)
    streaming: list[_Job] = field(default_factory=list)

    def may_stream(self, worker: VoiceWorker) -> bool:
        """Stream a new job only while its worker streams nothing else: a second stream
        would wait for the first to end, where the shared batch renders it meanwhile."""
        self.streaming = [j for j in self.streaming if not j.ticket.ended.is_set()]
        return self.pool.streams == 0 and all(j.worker is not worker for j in self.streaming)

    @property
    def default_voice(self) -> str:
        if not self.pool.voices:  # an empty workspace, waiting for a client to register one
            raise _Refused("No voice is served here yet.", "voice_not_found")
        return next(iter(self.pool.voices))

    async def info(self) -> Info:
        try:
            found = await asyncio.get_running_loop().run_in_executor(None, self.rescan)
        except VoxshardError:
            found = {}  # a folder gone since the start: the voices already known stay
        for name, voice in found.items():
            self.pool.voices.setdefault(name, voice)
        voices = [TtsVoice(name=v.name, description=f"{v.name}: {KIND_WORDS.get(v.kind, v.kind)}",
                           attribution=ATTRIBUTION, installed=True, version=None,
                           languages=languages_of(v)) for v in self.pool.voices.values()]
        program = TtsProgram(name="voxshard", description="Voxshard: your own cloned voices",
                             attribution=ATTRIBUTION, installed=True, version=__version__,
                             voices=voices, supports_synthesize_streaming=True)
        return Info(tts=[program])

    def voice_for(self, data: dict[str, Any]) -> str:
        """The served name a request's `voice` means (by name, else by language)."""
        voice = data.get("voice") or {}
        if not isinstance(voice, dict):
            raise _Refused("The voice must be an object with a name.", "malformed_event")
        name = voice.get("name")
        if name is not None:
            if name not in self.pool.voices:
                known = ", ".join(sorted(self.pool.voices)[:20])
                raise _Refused(f"The voice '{str(name)[:80]}' is not served here; available: "
                               f"{known}.", "voice_not_found")
            return str(name)
        language = voice.get("language")
        if language:
            wanted = str(language).split("_")[0].split("-")[0].lower()
            for v in self.pool.voices.values():
                if wanted in languages_of(v):
                    return v.name
        return self.default_voice

    def record(self, job: _Job | None, status: int, audio_s: float, **extra: Any) -> None:
        if status == 200:
            self.served += 1
            self.audio_s += audio_s
        self.log({"method": "WYOMING", "path": job.mode if job else "", "status": status,
                  "voice": job.voice if job else "", "format": "pcm", "stream": "wyoming",
                  "chars": job.chars if job else 0, "audio_s": round(audio_s, 3),
                  "seconds": round(time.monotonic() - job.began, 3) if job else 0.0, **extra})

    def handler(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> _Connection:
        return _Connection(self, reader, writer)


class _Connection(AsyncEventHandler):
    """One client. Events are read while audio is sent (so a client that leaves is seen
    at once); a speaker task sends each job's audio in the order the jobs came."""

    def __init__(self, service: WyomingService, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        super().__init__(reader, writer)
        self.service = service
        self.pool = service.pool
        self.items: asyncio.Queue[_Item] = asyncio.Queue()
        self.jobs: list[_Job] = []  # submitted, not yet finished
        self.stream: _Stream | None = None
        self.speaker = asyncio.create_task(self._speak_all())

    # -- events in ---------------------------------------------------------------------------
    async def handle_event(self, event: Event) -> bool:
        try:
            if Describe.is_type(event.type):
                await self.write_event((await self.service.info()).event())
            elif Synthesize.is_type(event.type):
                if self.stream is None:  # inside a stream it repeats the text: ignored
                    await self._one_shot(event.data)
            elif SynthesizeStart.is_type(event.type):
                # a refused voice still opens the stream: its chunks are then not spoken
                self.stream = _Stream("", failed=True)
                self.stream = _Stream(self.service.voice_for(event.data))
            elif SynthesizeChunk.is_type(event.type):
                await self._chunk(event.data)
            elif SynthesizeStop.is_type(event.type):
                await self._stop()
            # other events are not for a speech service: ignored, as Wyoming services do
        except _Refused as refused:
            self.items.put_nowait(Error(text=refused.text, code=refused.code).event())
        return True

    def _text(self, data: dict[str, Any]) -> str:
        text = data.get("text")
        if not isinstance(text, str):
            raise _Refused("The event needs its text as a string.", "malformed_event")
        return text

    async def _one_shot(self, data: dict[str, Any]) -> None:
        text = self._text(data)
        voice = self.service.voice_for(data)
        if len(text) > self.service.max_input:
            raise _Refused(f"The text is {len(text)} characters; the limit is "
                           f"{self.service.max_input}.", "input_too_long")
        if not text.strip():
            raise _Refused("The text to speak is empty.", "empty_input")
        await self._submit(voice, text, "synthesize")

    async def _chunk(self, data: dict[str, Any]) -> None:
        text = self._text(data)
        if self.stream is None:  # a client that skipped synthesize-start: a stream anyway
            self.stream = _Stream(self.service.default_voice)
        stream = self.stream
        if stream.failed:
            return
        stream.chars += len(text)
        if stream.chars > self.service.max_input:
            stream.failed = True
            raise _Refused(f"The streamed text is over the limit of {self.service.max_input} "
                           "characters; the rest of it is not spoken.", "input_too_long")
        done, stream.text = complete_sentences(stream.text + text)
        for sentence in done:
            await self._submit(stream.voice, sentence, "synthesize-stream")

    async def _stop(self) -> None:
        stream, self.stream = self.stream, None
        if stream is not None and not stream.failed:
            for sentence in split_sentences(stream.text):
                await self._submit(stream.voice, sentence, "synthesize-stream")
        self.items.put_nowait(SynthesizeStopped().event())

    async def _submit(self, voice: str, text: str, mode: str) -> None:
        if not any(c.isalnum() for c in text):
            return  # punctuation alone: nothing to say
        began = time.monotonic()
        try:
            self.pool.admit()
        except Busy as busy:
            raise _Refused(busy.message + " Retry later.", "busy") from None
        try:
            worker = await self.pool.worker_for(voice)
        except (Busy, LoadFailed) as exc:
            self.pool.release()
            raise _Refused(exc.message, "busy" if isinstance(exc, Busy) else
                           "voice_load_failed") from None
        stream = self.service.may_stream(worker)
        ticket = self.pool.speak(worker, text.strip(), {}, "wav", stream=stream, voice=voice)
        job = _Job(worker, ticket, voice, mode, len(text), began,
                   began + self.service.timeout_s)
        self.jobs.append(job)
        if stream:
            self.service.streaming.append(job)
        self.items.put_nowait(job)

    # -- audio out ---------------------------------------------------------------------------
    async def _speak_all(self) -> None:
        try:
            while True:
                item = await self.items.get()
                if isinstance(item, Event):
                    await self.write_event(item)
                else:
                    await self._play(item)
        except (ConnectionError, OSError):
            await self.stop()  # the client is gone: reading ends, `disconnect` frees the rest

    async def _play(self, job: _Job) -> None:
        status, sent, lag = 499, 0, None
        try:
            error = await self._started(job)
            if error is None:
                await self.write_event(AudioStart(rate=RATE, width=WIDTH,
                                                  channels=CHANNELS).event())
                async for pcm in self.pool.tail(job.worker, job.ticket, job.deadline):
                    for at in range(0, len(pcm), CHUNK_BYTES):
                        if lag is None and job.ticket.first_audio_at is not None:
                            # how long the worker's first audio took to leave the server
                            lag = round((time.time() - job.ticket.first_audio_at) * 1000, 1)
                        await self.write_event(AudioChunk(
                            rate=RATE, width=WIDTH, channels=CHANNELS,
                            audio=pcm[at:at + CHUNK_BYTES]).event())
                        sent += min(CHUNK_BYTES, len(pcm) - at)
                await self.write_event(AudioStop().event())
                error = self._ended(job)
            if error is not None:
                status = 504 if error.code == "timeout" else 500
                await self.write_event(error.event())
            else:
                status = 200
        finally:
            self._finish(job)
            self.service.record(job, status, sent / (WIDTH * RATE),
                                first_byte_after_audio_ms=lag)

    async def _started(self, job: _Job) -> Error | None:
        """Wait for the worker's first audio file (or its error, or the time limit)."""
        try:
            await asyncio.wait_for(job.ticket.started.wait(),
                                   max(0.0, job.deadline - time.monotonic()))
        except TimeoutError:
            self.pool.cancel(job.worker, job.ticket)
            return self._timeout()
        return self._ended(job) if job.ticket.error is not None else None

    def _ended(self, job: _Job) -> Error | None:
        error = job.ticket.error
        if error is not None:
            return Error(text=str(error.get("message") or "The speech failed."),
                         code=str(error.get("code") or "speech_failed"))
        if not job.ticket.ended.is_set():  # the tail stopped at the time limit
            return self._timeout()
        return None

    def _timeout(self) -> Error:
        return Error(text=f"The speech took longer than this server's limit of "
                     f"{self.service.timeout_s:g} s; send shorter text.", code="timeout")

    def _finish(self, job: _Job) -> None:
        if not job.done:
            job.done = True
            self.pool.finish(job.worker, job.ticket)  # cancels it if it is still speaking
            self.pool.release()
            with contextlib.suppress(ValueError):
                self.jobs.remove(job)

    async def disconnect(self) -> None:
        """The client left (or the server stops): every request of it ends now."""
        self.speaker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.speaker
        for job in list(self.jobs):
            self._finish(job)
            self.service.record(job, 499, 0.0)


class WyomingServer:
    """The listening socket, its connections, and the mDNS announcement."""

    def __init__(self, service: WyomingService, sock: socket.socket) -> None:
        self.service = service
        self.sock = sock
        self.port = int(sock.getsockname()[1])
        self._server: asyncio.Server | None = None
        self._handlers: set[_Connection] = set()
        self._zeroconf: AsyncZeroconf | None = None

    async def start(self) -> None:
        async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            handler = self.service.handler(reader, writer)
            self._handlers.add(handler)
            try:
                await handler.run()
            finally:
                self._handlers.discard(handler)

        self._server = await asyncio.start_server(connected, sock=self.sock)

    async def announce(self, host: str) -> str:
        """Announce the service as _wyoming._tcp.local.; returns the address announced."""
        address = announced_address(host)
        name = f"voxshard-{socket.gethostname()}"[:50]
        info = ServiceInfo(SERVICE_TYPE, f"{name}.{SERVICE_TYPE}", port=self.port,
                           addresses=[socket.inet_aton(address)], server=f"{name}.local.")
        self._zeroconf = AsyncZeroconf()
        # another server of this computer may hold the name: zeroconf then adds a number
        await self._zeroconf.async_register_service(info, allow_name_change=True)
        return address

    async def stop(self) -> None:
        if self._zeroconf is not None:
            await self._zeroconf.async_unregister_all_services()
            await self._zeroconf.async_close()
            self._zeroconf = None
        for handler in list(self._handlers):
            await handler.stop()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)


def announced_address(host: str) -> str:
    """The IPv4 address Home Assistant should connect to for a server bound to `host`."""
    if host not in ("0.0.0.0", "", "::"):
        try:
            return socket.gethostbyname(host)
        except OSError:
            raise InputError(f"The Wyoming host {host} has no IPv4 address to announce.",
                             "Give --wyoming an IPv4 address, or leave out --zeroconf.") from None
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("224.0.0.251", 5353))  # no packet is sent: this only picks the route
        return str(probe.getsockname()[0])
    except OSError:
        raise InputError("This computer has no network address to announce the Wyoming "
                         "service on.", "Connect it to the network, or leave out "
                         "--zeroconf.") from None
    finally:
        probe.close()
