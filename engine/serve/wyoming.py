"""Home Assistant's Wyoming protocol over the HTTP server's warm workers.

One `WyomingService` answers every connection on the event loop the HTTP
server runs on, with the same `Pool`: a voice asked for here and over HTTP is
one warm worker, and their requests share its batches and its admission bound.
The events are the `wyoming` package's own:

- `describe` -> `info`: one TTS program listing the voices served now, answered at once
  from what the server keeps current beside the rendering (`engine.serve.watch`: a voice
  exported since the start appears, a removed one goes, as soon as the watch saw it),
  each described so that Home Assistant, which sorts a language's voices by their
  description, shows a voice's best tier (its plain name) before its exports, adapters,
  instant voice and runs; each voice lists its own language first, then those the model
  speaks that no voice was recorded in (`languages_of`), as BCP-47 codes;
- `synthesize` -> one `audio-start`, the `audio-chunk`s, one `audio-stop` for the whole
  reply (Home Assistant's one-shot path reads to the first `audio-stop`);
- a voice's trained styles: each is a speaker of the voice (for a `tts.speak` action
  that types it) and a voice of its own, `NAME (STYLE)` (`style_voices`), which every
  Home Assistant lets a pipeline pick;
- `synthesize-start`, `synthesize-chunk`s, `synthesize-stop`: each sentence is
  spoken the moment it is complete (`engine.text.complete_sentences`), all of them in
  one audio group, then `synthesize-stopped`. The `synthesize` a client sends inside a
  stream (for servers that do not stream) is ignored.

A reply is its text in the spoken form (`engine.text.spoken_text`: markdown, emoji,
numbers and units, each sentence's in the language it is written in, the voice's own where
the text does not tell), cut into sentences. Each connection (a room)
has at most one sentence on a worker at a time, and asks for its next one when that one
ends: sentences of several rooms take turns on a worker, so a long reply never makes
another room wait for all of it.

A refusal (empty text, an unknown voice, a voice that fails to load, a text over the
limit, a busy server, a render that fails or runs out of time) is one `error` event,
then the connection closes, as wyoming-piper does: a client that ignores `error` (Home
Assistant does) still ends the request at once. Each request, refused or not, is one
line of the request log; a client that leaves cancels its rows at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice, TtsVoiceSpeaker
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
from engine.audio.timebase import SAMPLE_RATE
from engine.config.speak import SpeakOptions
from engine.core.errors import InputError, VoxshardError
from engine.core.kinds import ServedKind, Tier
from engine.serve.pool import Busy, LoadFailed, Pool, Ticket, VoiceWorker
from engine.serve.voices import ServedVoice
from engine.serve.watch import VoiceWatch
from engine.text import (
    MODEL_LANGUAGE_NAMES,
    complete_sentences,
    language_code,
    split_sentences,
    spoken_text,
)

#: every group is in this one format: Home Assistant writes its WAV header once,
#: from the first audio-start of a stream
RATE, WIDTH, CHANNELS = SAMPLE_RATE, 2, 1
#: most audio in one audio-chunk event (0.1 s, about what Piper sends)
CHUNK_BYTES = RATE * WIDTH // 10
SERVICE_TYPE = "_wyoming._tcp.local."
ATTRIBUTION = Attribution(name="Voxshard (Qwen3-TTS fine-tuned on your own recordings)",
                          url="https://github.com/QwenLM/Qwen3-TTS")



#: the languages the model speaks, as codes: a voice is offered for those no voice of the
#: workspace was recorded in too (`languages_of`), so the engine is offered for each
MODEL_LANGUAGES = sorted(set(MODEL_LANGUAGE_NAMES.values()))
#: silence between the sentences of one reply (what `speak` puts between sentences)
PAUSE_BYTES = int(SpeakOptions().sentence_pause_s * RATE) * WIDTH
#: what each served name is, after its name in its description
TIER_WORDS = {Tier.FULL: "fine-tuned", Tier.ADAPTER: "adapter",
              Tier.INSTANT: "instant, from a reference clip"}
#: the refusal of a request with no text (one-shot or streamed)
EMPTY = "The text to speak is empty."
#: how long a refused client may go on sending after the end (`_Connection._end`)
LINGER_S = 5.0
#: HTTP statuses of the refusals in the request log
STATUS = {"malformed_event": 400, "empty_input": 400, "voice_not_found": 404,
          "input_too_long": 413, "busy": 429, "voice_load_failed": 500, "timeout": 504}


def parse_uri(uri: str) -> tuple[str, int]:
    """`tcp://HOST:PORT` as (host, port), or a one-sentence refusal."""
    try:
        parsed = urlparse(uri)
        host, port = parsed.hostname, parsed.port
    except ValueError:
        host = port = None
    if not uri.startswith("tcp://") or not host or port is None:
        raise InputError(f"The Wyoming address {uri!r} is not tcp://HOST:PORT.",
                         "Give {serve.wyoming} an address such as tcp://127.0.0.1:10200.")
    return host, port


def _own_languages(voice: ServedVoice) -> list[str]:
    """The language a voice was recorded in (a region adds its base language); [] for none."""
    own = language_code(voice.language)
    if own is None:
        return []
    return [own, own.split("-")[0]] if "-" in own else [own]


def languages_of(voice: ServedVoice, served: Iterable[ServedVoice] = ()) -> list[str]:
    """The languages Home Assistant offers `voice` for: its own first, then each language of
    the model that no voice of `served` was recorded in (the model speaks it in this voice,
    and no voice speaks it better). So a language's first pick is a voice of its own: a
    German assistant gets the German voice, not the English one sorted before it."""
    own = _own_languages(voice)
    native = {code.split("-")[0] for v in served for code in _own_languages(v)}
    return own + [code for code in MODEL_LANGUAGES if code not in own and code not in native]


def description_of(voice: ServedVoice) -> str:
    """What Home Assistant shows for a voice, and sorts by: the name, then what it is.
    A name's description begins with the name and a space, which sorts before the "/" of
    its tiers, so the plain name (its best tier) is listed first."""
    if voice.kind == ServedKind.VOICE:
        what = "best: " + (TIER_WORDS[voice.tier] if voice.tier else "its latest trained run")
    elif voice.kind == ServedKind.RUN:
        what = "a trained run's checkpoint"
    else:
        what = TIER_WORDS[voice.tier] if voice.tier else str(voice.kind)
    return f"{voice.name} ({what})"


def style_for(data: dict[str, Any]) -> str:
    """The style a request asks for: its voice's speaker (a trained style), or none."""
    voice = data.get("voice")
    speaker = voice.get("speaker") if isinstance(voice, dict) else None
    return str(speaker).strip()[:500] if speaker else ""


Styles = Callable[[ServedVoice], list[str]]


def _read_styles(voice: ServedVoice) -> list[str]:
    return voice.styles


def style_voices(voices: Iterable[ServedVoice], styles_of: Styles = _read_styles,
                 ) -> dict[str, tuple[ServedVoice, str]]:
    """Each trained style of each voice as a voice of its own, `NAME (STYLE)` -> (the
    voice, the style): no Home Assistant offers a picker for a voice's speakers, but every
    one lets a pipeline pick a voice. `styles_of`: a voice's styles as a server keeps them
    (`VoiceWatch.styles_of`), else read from disk now."""
    return {f"{v.name} ({style})": (v, style) for v in voices for style in styles_of(v)}


def style_description(voice: ServedVoice, style: str) -> str:
    """A style voice's description: its voice's, then the style, so Home Assistant lists it
    after its voice's plain name (a prefix sorts first), never as a language's first pick."""
    return f"{description_of(voice)}, style: {style}"


def home_assistant_list(voices: Iterable[ServedVoice], styles_of: Styles = _read_styles,
                        ) -> list[tuple[str, str]]:
    """(name, description) of every voice Home Assistant lists, style voices among them, in
    its order (by description): what the start line and the Serve page show."""
    voices = list(voices)
    listed = [(v.name, description_of(v)) for v in voices]
    listed += [(name, style_description(v, style))
               for name, (v, style) in style_voices(voices, styles_of).items()]
    return sorted(listed, key=lambda entry: entry[1])


def language_for(data: dict[str, Any]) -> str | None:
    """The language a request gives its text in (its voice's `language`), or None: then
    each sentence's own language says its numbers."""
    voice = data.get("voice")
    language = voice.get("language") if isinstance(voice, dict) else None
    return str(language)[:35] if language else None


def reply_sentences(text: str, language: str | None, fallback: str) -> list[str]:
    """The sentences a reply speaks for `text`, in the spoken form (numbers in `language`
    when the request gave one, else in each sentence's own, `fallback` the voice's
    language: `engine.text.spoken_text`); those with nothing to say are left out."""
    return [sentence for sentence in split_sentences(spoken_text(text, language, fallback))
            if any(c.isalnum() for c in sentence)]


def home_assistant_order(voices: Iterable[ServedVoice]) -> list[ServedVoice]:
    """The voices in the order Home Assistant lists them (its Wyoming integration sorts
    a language's voices by description); the first is the one a new assistant picks."""
    return sorted(voices, key=description_of)


class _Refused(Exception):
    """One request cannot be served: its client gets one error event, then the
    connection closes."""

    def __init__(self, text: str, code: str, voice: str = "") -> None:
        super().__init__(text)
        #: the voice asked for, when known (the request log names it)
        self.text, self.code, self.voice = text, code, voice

    @property
    def status(self) -> int:
        return STATUS.get(self.code, 500)


@dataclass
class _Job:
    """One sentence of a reply on its worker."""

    worker: VoiceWorker
    ticket: Ticket
    deadline: float
    done: bool = False


#: what a reply's queue holds: a sentence, a refusal that ends it, or None (no more)
_Sentence = str | _Refused | None


@dataclass
class _Reply:
    """One request: its sentences, spoken in order as one audio group."""

    voice: str
    mode: str  # "synthesize" (one-shot) or "synthesize-stream"
    #: the voice's own language: what says the numbers of a sentence whose language the
    #: text does not tell (`engine.text.spoken_text`)
    fallback: str
    #: the language the request gave (Home Assistant gives none): every sentence's
    language: str | None = None
    began: float = field(default_factory=time.monotonic)
    chars: int = 0
    #: streamed text that is not yet a complete sentence
    pending: str = ""
    sentences: asyncio.Queue[_Sentence] = field(default_factory=asyncio.Queue)
    ended: bool = False
    #: the style asked for: a speaker of the voice, which is one of its trained styles
    style: str = ""
    #: no text but whitespace came yet (a stream that stops so is refused as empty)
    blank: bool = True
    #: the worker of its first sentence: the rest are said on it too, so a voice that
    #: switches model meanwhile (trained, exported) switches at the next request
    worker: VoiceWorker | None = None

    def add(self, text: str) -> None:
        for sentence in reply_sentences(text, self.language, self.fallback):
            self.sentences.put_nowait(sentence)

    def end(self, refused: _Refused | None = None) -> None:
        if not self.ended:
            self.ended = True
            self.sentences.put_nowait(refused)


@dataclass
class WyomingService:
    """The Wyoming side of one server; `watch` keeps the voices served now."""

    pool: Pool
    watch: VoiceWatch
    max_input: int
    timeout_s: float
    log: Callable[[dict[str, Any]], None] = field(default=lambda _record: None)
    served: int = 0
    audio_s: float = 0.0

    @property
    def default_voice(self) -> str:
        """The voice of a request that names none: the one Home Assistant lists first."""
        if not self.pool.voices:  # an empty workspace, waiting for a client to register one
            raise _Refused("No voice is served here yet.", "voice_not_found")
        return home_assistant_order(self.pool.voices.values())[0].name

    async def info(self) -> Info:
        """The voices served now, from memory: never a disk read or a wait on the model
        (Home Assistant gives a describe one second, and asks while replies render)."""
        try:
            await self.watch.listing()  # a rescan only where no watch runs beside
        except VoxshardError:
            pass  # a folder given on the command line went away: the voices known stay
        voices: list[TtsVoice] = []
        for v in home_assistant_order(self.pool.voices.values()):
            styles = self.watch.styles_of(v)
            languages = languages_of(v, self.pool.voices.values())
            # a trained style is a speaker too, for a `tts.speak` action that types its
            # text (no Home Assistant offers a picker for speakers) ...
            voices.append(TtsVoice(name=v.name, description=description_of(v),
                                   attribution=ATTRIBUTION, installed=True, version=None,
                                   languages=languages,
                                   speakers=[TtsVoiceSpeaker(name=s) for s in styles] or None))
            # ... and a voice of its own, which every Home Assistant lets a pipeline pick
            voices += [TtsVoice(name=name, description=style_description(v, style),
                                attribution=ATTRIBUTION, installed=True, version=None,
                                languages=languages)
                       for name, (_, style) in style_voices([v], self.watch.styles_of).items()]
        program = TtsProgram(name="voxshard", description="Voxshard: your own cloned voices",
                             attribution=ATTRIBUTION, installed=True, version=__version__,
                             voices=voices, supports_synthesize_streaming=True)
        return Info(tts=[program])

    def asked(self, data: dict[str, Any]) -> tuple[str, str]:
        """The served name and the style (or "") a request's `voice` means: a style voice
        (`style_voices`) is its voice in its style; a speaker given says the style."""
        voice = data.get("voice")
        name = voice.get("name") if isinstance(voice, dict) else None
        if isinstance(name, str) and name not in self.pool.voices:
            styled = style_voices(self.pool.voices.values()).get(name)
            if styled is not None:
                return styled[0].name, style_for(data) or styled[1]
        return self.voice_for(data), style_for(data)

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
                               f"{known}.", "voice_not_found", str(name)[:80])
            return str(name)
        wanted = language_code(str(voice.get("language") or ""))
        if wanted:  # a voice recorded in that language, the first as Home Assistant lists
            for v in home_assistant_order(self.pool.voices.values()):
                if languages_of(v)[0].split("-")[0] == wanted.split("-")[0]:
                    return v.name
        return self.default_voice

    def record(self, reply: _Reply | None, status: int, audio_s: float, **extra: Any) -> None:
        if status == 200:
            self.served += 1
            self.audio_s += audio_s
        self.log({"method": "WYOMING", "path": reply.mode if reply else "", "status": status,
                  "voice": reply.voice if reply else "", "format": "pcm", "stream": "wyoming",
                  "chars": reply.chars if reply else 0, "audio_s": round(audio_s, 3),
                  "seconds": round(time.monotonic() - reply.began, 3) if reply else 0.0,
                  **extra})

    def handler(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> _Connection:
        return _Connection(self, reader, writer)


class _Connection(AsyncEventHandler):
    """One client (a room). Events are read while audio is sent (so a client that leaves
    is seen at once); a speaker task plays the replies in the order they came."""

    def __init__(self, service: WyomingService, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        super().__init__(reader, writer)
        self.service = service
        self.pool = service.pool
        self.items: asyncio.Queue[_Reply | Event | _Refused] = asyncio.Queue()
        self.stream: _Reply | None = None
        #: the sentence on a worker now (at most one: see the module doc)
        self.job: _Job | None = None
        #: a refusal was queued: the connection ends after it, later events are not read
        self.closing = False
        self.speaker = asyncio.create_task(self._speak_all())

    # -- events in ---------------------------------------------------------------------------
    async def handle_event(self, event: Event) -> bool:
        if self.closing:
            return True  # the refusal ends the connection once what came before is sent
        try:
            if Describe.is_type(event.type):
                await self.write_event((await self.service.info()).event())
            elif Synthesize.is_type(event.type):
                if self.stream is None:  # inside a stream it repeats the text: ignored
                    self._one_shot(event.data)
            elif SynthesizeStart.is_type(event.type):
                voice, style = self.service.asked(event.data)
                self._open(voice, language_for(event.data)).style = style
            elif SynthesizeChunk.is_type(event.type):
                self._chunk(event.data)
            elif SynthesizeStop.is_type(event.type):
                self._stop()
            # other events are not for a speech service: ignored, as Wyoming services do
        except _Refused as refused:
            self._refuse(refused, "synthesize" if Synthesize.is_type(event.type)
                         else "synthesize-stream")
        return True

    def _refuse(self, refused: _Refused, mode: str) -> None:
        """End the open stream with `refused`, or queue it: either way the client gets it
        after what it asked before, then the connection closes."""
        self.closing = True
        if self.stream is not None:
            self.stream.end(refused)  # logged with its reply
            self.stream = None
            return
        self.service.record(None, refused.status, 0.0, error=refused.code, path=mode,
                            voice=refused.voice)
        self.items.put_nowait(refused)

    def _text(self, data: dict[str, Any], voice: str = "") -> str:
        text = data.get("text")
        if not isinstance(text, str):
            raise _Refused("The event needs its text as a string.", "malformed_event", voice)
        return text

    def _language(self, voice: str) -> str:
        return self.pool.voices[voice].language

    def _one_shot(self, data: dict[str, Any]) -> None:
        voice, style = self.service.asked(data)
        text = self._text(data, voice)
        if len(text) > self.service.max_input:
            raise _Refused(f"The text is {len(text)} characters; the limit is "
                           f"{self.service.max_input}.", "input_too_long", voice)
        if not text.strip():
            raise _Refused(EMPTY, "empty_input", voice)
        reply = _Reply(voice, "synthesize", self._language(voice), language_for(data),
                       chars=len(text), style=style)
        reply.add(text)
        reply.end()
        self.items.put_nowait(reply)

    def _open(self, voice: str, language: str | None = None) -> _Reply:
        if self.stream is not None:  # a new stream before the last one's stop: that one ends
            self.stream.add(self.stream.pending)
            self.stream.end()
        self.stream = _Reply(voice, "synthesize-stream", self._language(voice), language)
        self.items.put_nowait(self.stream)
        return self.stream

    def _chunk(self, data: dict[str, Any]) -> None:
        text = self._text(data)
        # a client that skipped synthesize-start: a stream in the default voice anyway
        stream = self.stream or self._open(self.service.default_voice)
        stream.chars += len(text)
        stream.blank = stream.blank and not text.strip()
        if stream.chars > self.service.max_input:
            raise _Refused(f"The streamed text is over the limit of {self.service.max_input} "
                           "characters.", "input_too_long")
        done, stream.pending = complete_sentences(stream.pending + text)
        for sentence in done:
            stream.add(sentence)

    def _stop(self) -> None:
        if self.stream is not None and self.stream.blank:
            raise _Refused(EMPTY, "empty_input")  # as a one-shot request's: one refusal
        stream, self.stream = self.stream, None
        if stream is not None:
            stream.add(stream.pending)
            stream.end()
        self.items.put_nowait(SynthesizeStopped().event())

    # -- audio out ---------------------------------------------------------------------------
    async def _speak_all(self) -> None:
        try:
            while True:
                item = await self.items.get()
                if isinstance(item, _Reply):
                    refused = await self._play(item)
                elif isinstance(item, _Refused):
                    refused = item
                else:
                    await self.write_event(item)
                    continue
                if refused is not None:
                    await self.write_event(Error(text=refused.text, code=refused.code).event())
                    await self._end()  # the error, then the end: what every client handles
                    return
        except (ConnectionError, OSError):
            await self.stop()  # the client is gone: reading ends, `disconnect` frees the rest

    async def _end(self) -> None:
        """End the connection from this side: the client reads to its end at once. What it
        still sends (the rest of a refused stream) is read and dropped until it closes, at
        most `LINGER_S`: closing with unread data would reset the connection, and the reset
        could lose the error on its way."""
        if self.writer.can_write_eof():
            self.writer.write_eof()
        await asyncio.sleep(LINGER_S)
        await self.stop()

    async def _play(self, reply: _Reply) -> _Refused | None:
        """Speak `reply` sentence by sentence as one audio group; the refusal that cut it."""
        status, sent, refused, lag = 499, 0, None, None
        started = False
        said: dict[str, Any] = {}  # what the worker made of the style (its first sentence)
        try:
            while (sentence := await reply.sentences.get()) is not None:
                if isinstance(sentence, _Refused):
                    refused = sentence
                    break
                if started:  # the pause between two sentences, sent while the next renders
                    sent += await self._audio(bytes(PAUSE_BYTES))
                job = self.job = await self._submit(reply, sentence)
                refused = await self._started(job)
                said = said or job.ticket.said()
                if refused is not None:
                    break
                if not started:
                    await self.write_event(AudioStart(rate=RATE, width=WIDTH,
                                                      channels=CHANNELS).event())
                    started = True
                    if job.ticket.first_audio_at is not None:
                        # how long the worker's first audio took to leave the server
                        lag = round((time.time() - job.ticket.first_audio_at) * 1000, 1)
                async for pcm in self.pool.tail(job.worker, job.ticket, job.deadline):
                    sent += await self._audio(pcm)
                refused = self._ended(job)
                self._finish(job)
                if refused is not None:
                    break
            if refused is None:
                if not started:  # nothing to say (emoji alone): an empty group still ends it
                    await self.write_event(AudioStart(rate=RATE, width=WIDTH,
                                                      channels=CHANNELS).event())
                await self.write_event(AudioStop().event())
                status = 200
            else:
                status = refused.status
        except _Refused as exc:  # busy, or the voice failed to load
            refused, status = exc, exc.status
        finally:
            if self.job is not None:
                self._finish(self.job)
            self.service.record(reply, status, sent / (WIDTH * RATE),
                                first_byte_after_audio_ms=lag, **said,
                                **({"error": refused.code} if refused else {}))
        return refused

    async def _audio(self, pcm: bytes) -> int:
        for at in range(0, len(pcm), CHUNK_BYTES):
            await self.write_event(AudioChunk(rate=RATE, width=WIDTH, channels=CHANNELS,
                                              audio=pcm[at:at + CHUNK_BYTES]).event())
        return len(pcm)

    async def _submit(self, reply: _Reply, sentence: str) -> _Job:
        try:
            self.pool.admit()
        except Busy as busy:
            raise _Refused(busy.message + " Retry later.", "busy") from None
        try:
            worker = reply.worker if reply.worker is not None and \
                self.pool.is_open(reply.worker) else await self.pool.worker_for(reply.voice)
            reply.worker = worker
        except (Busy, LoadFailed) as exc:
            self.pool.release()
            raise _Refused(exc.message, "busy" if isinstance(exc, Busy) else
                           "voice_load_failed") from None
        except KeyError:  # removed from the workspace since the request came
            self.pool.release()
            raise _Refused(f"The voice '{reply.voice}' is no longer served here.",
                           "voice_not_found") from None
        options = {"instruct": reply.style} if reply.style else {}
        # every room's sentence streams: its rows join the worker's one batch, so a
        # second room's first audio never waits for the first room's reply
        ticket = self.pool.speak(worker, sentence, options, "wav", stream=True,
                                 voice=reply.voice)
        return _Job(worker, ticket, time.monotonic() + self.service.timeout_s)

    async def _started(self, job: _Job) -> _Refused | None:
        """Wait for the worker's first audio file (or its error, or the time limit)."""
        try:
            await asyncio.wait_for(job.ticket.started.wait(),
                                   max(0.0, job.deadline - time.monotonic()))
        except TimeoutError:
            self.pool.cancel(job.worker, job.ticket)
            return self._timeout()
        return self._ended(job) if job.ticket.error is not None else None

    def _ended(self, job: _Job) -> _Refused | None:
        error = job.ticket.error
        if error is not None:
            return _Refused(str(error.get("message") or "The speech failed."),
                            str(error.get("code") or "speech_failed"))
        if not job.ticket.ended.is_set():  # the tail stopped at the time limit
            return self._timeout()
        return None

    def _timeout(self) -> _Refused:
        return _Refused(f"The speech took longer than this server's limit of "
                        f"{self.service.timeout_s:g} s a sentence; send shorter text.",
                        "timeout")

    def _finish(self, job: _Job) -> None:
        if not job.done:
            job.done = True
            self.pool.finish(job.worker, job.ticket)  # cancels it if it is still speaking
            self.pool.release()
        if self.job is job:
            self.job = None

    async def disconnect(self) -> None:
        """The client left (or the server stops): its request ends now (logged as 499)."""
        self.speaker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.speaker
        if self.stream is not None:
            self.stream.end()


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
                writer.close()  # the client sees the end (after a refusal: at once)
                with contextlib.suppress(ConnectionError, OSError):
                    await writer.wait_closed()

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
                             "Give {serve.wyoming} an IPv4 address, or turn "
                             "{serve.zeroconf} off.") from None
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("224.0.0.251", 5353))  # no packet is sent: this only picks the route
        return str(probe.getsockname()[0])
    except OSError:
        raise InputError("This computer has no network address to announce the Wyoming "
                         "service on.", "Connect it to the network, or turn "
                         "{serve.zeroconf} off.") from None
    finally:
        probe.close()
