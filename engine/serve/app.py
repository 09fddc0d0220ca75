"""The ASGI app (Starlette): OpenAI's speech endpoint over the warm workers.

Routes: `POST /v1/audio/speech`, `GET /v1/models`, `GET /v1/models/{id}`,
`GET /v1/audio/voices`, `POST /v1/audio/voices` and `DELETE /v1/audio/voices/{name}`
(instant voices a client registers: engine.serve.register), `GET /health`. With an API
key every route asks for `Authorization: Bearer KEY` (compared in constant time). Every error is
OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

Without `stream_format` a request is rendered whole (batched with the other
requests of its voice, levelled, encoded) and sent. With `stream_format`
"audio" the body carries the audio as it is generated (wav and pcm byte by
byte; flac, mp3 and opus are encoded when the render ends); "sse" sends
OpenAI's `speech.audio.delta` events (base64 audio) and `speech.audio.done`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import soundfile as sf
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from engine.audio.timebase import SAMPLE_RATE, SAMPLES_PER_FRAME
from engine.config.speak import SpeakOptions
from engine.core.errors import InputError
from engine.serve import formats, register
from engine.serve.guard import Guard, error_response
from engine.serve.pool import Busy, LoadFailed, Pool, Ticket, VoiceWorker
from engine.serve.request import MODELS, ApiError, SpeechRequest, parse_speech
from engine.serve.voices import ServedVoice
from engine.serve.watch import VoiceWatch

#: how often a waiting request looks whether its client is still there
POLL_S = 0.25
#: the header of an answer whose speech the runaway guard cut short (the audio up to the
#: cut is sent): why, "loop" and/or "silence" (`engine.synth.runaway`)
CUT_HEADER = "X-Voxshard-Cut"
#: the header of an answer to a request with `instructions`: "applied" (the voice was
#: trained with that style), "applied; WHY" (it may do little: the voice was trained
#: without styles, or with others) or "ignored; WHY" (the model takes none)
INSTRUCTIONS_HEADER = "X-Voxshard-Instructions"


def _headers(ticket: Ticket, cut: list[str]) -> dict[str, str]:
    """The answer's own headers: the runaway cut, what became of the instruction."""
    headers = {CUT_HEADER: ", ".join(cut)} if cut else {}
    if ticket.instruct:
        notes = " ".join(ticket.instruct.get("notes") or [])
        value = ("applied" if ticket.instruct.get("applied") else "ignored") + (
            f"; {notes}" if notes else "")
        # a header is one line of Latin-1: a style's other characters become "?"
        headers[INSTRUCTIONS_HEADER] = " ".join(value.encode("ascii", "replace").decode()
                                                .split())
    return headers


def _cut(result: dict[str, Any] | None) -> list[str]:
    """Why the render's chunks were cut by the runaway guard (empty: none was)."""
    return [str(r) for r in (result or {}).get("runaway") or []]


@dataclass
class ServeConfig:
    api_key: str | None = None
    max_body: int = 1 << 20
    max_input: int = 4096
    timeout_s: float = 300.0
    allow_reference: bool = False
    device: str = "cpu"
    #: listening on loopback only (then only this computer's names are accepted as Host)
    loopback: bool = True
    #: where this app runs, shown by /health (a Ray Serve replica: its node and replica id)
    instance: dict[str, Any] = field(default_factory=dict)
    #: where `POST /v1/audio/voices` makes instant voices (None: it registers none)
    workspace: str | None = None


class _Stream(StreamingResponse):
    """A streamed body whose clean-up runs however the response ends (finished,
    client gone before the first byte, or cancelled)."""

    def __init__(self, body: AsyncIterator[bytes], cleanup: Callable[[], None],
                 **kwargs: Any) -> None:
        super().__init__(body, **kwargs)
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._cleanup()


async def _read_body(request: Request, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise ApiError(413, f"The request body is over the limit of {limit} bytes.",
                           code="body_too_large")
        parts.append(part)
    return b"".join(parts)


Submit = Callable[[bool], tuple[VoiceWorker, Ticket]]
#: a client's reference clip: long enough to carry a voice, short enough to stay cheap
REFERENCE_SECONDS = (1.0, 30.0)


def _reference_wav(data: bytes) -> bytes:
    """A client's reference clip, checked and rewritten as a WAV this server names."""
    audio, rate = register.read_clip(
        data, "reference_audio", REFERENCE_SECONDS,
        "reference_audio is not audio this server can read; send base64 of a WAV, FLAC, OGG "
        "or MP3 file.", "The reference clip")
    return formats.encode(audio, "wav", rate)


def _worker_error(error: dict[str, Any]) -> ApiError:
    code = str(error.get("code") or "")
    message = str(error.get("message") or "The speech failed.")
    if code == "input":
        return ApiError(400, message, code="invalid_input")
    if code == "cancelled":
        return ApiError(499, message, code="cancelled")
    return ApiError(500, message, kind="server_error", code=code or "server_error")


Rescan = Callable[[], dict[str, ServedVoice]]


def _stamp(workspace: str | None) -> int | None:
    """The workspace folder's modification time: a voice folder made or removed in it
    (a registration or a DELETE on any replica, a person's new voice) changes it."""
    try:
        return Path(workspace).expanduser().stat().st_mtime_ns if workspace else None
    except OSError:
        return None


class SpeechApp:
    """Routes over one `Pool`; `log(record)` hears one record per finished request.

    `rescan` reads the served voices from disk again (`server.served_voices`): several
    apps on one workspace (Ray Serve's replicas) then serve the same voices, whichever
    of them registered or removed one. `watch` holds them (`engine.serve.watch`): a
    server's, kept current beside the rendering, or this app's own, whose rescan runs
    for a listing, when the workspace folder changed since the last scan, and when a
    request names a voice not known here."""

    def __init__(self, pool: Pool, config: ServeConfig,
                 log: Callable[[dict[str, Any]], None] | None = None,
                 rescan: Rescan | None = None, watch: VoiceWatch | None = None) -> None:
        self.pool = pool
        self.config = config
        self.formats = formats.available()
        self.log = log or (lambda _record: None)
        self.served = 0
        self.audio_s = 0.0
        self.started = time.time()
        self.rescan = rescan
        if watch is None and rescan is not None:
            watch = VoiceWatch(pool, rescan, lambda: _stamp(config.workspace))
        self.watch = watch

    async def _sync_voices(self, force: bool = False) -> None:
        """The voices as the disk holds them now (see the class); a voice gone from it is
        let go here too, its worker closed once no other name uses it. A watch kept
        current beside the rendering is only read again when `force`d."""
        if self.watch is None or (not force and self.watch.running):
            return
        with contextlib.suppress(InputError):  # a folder given went away: keep what is served
            await self.watch.refresh(force)

    # -- small routes ----------------------------------------------------------------------
    async def health(self, _request: Request) -> Response:
        return JSONResponse({"status": "ok", "model_loaded": bool(self.pool.loaded),
                             "device": self.config.device, "voices": len(self.pool.voices),
                             "served": self.served, "audio_seconds": round(self.audio_s, 3),
                             **self.pool.health(), **self.config.instance})

    async def models(self, _request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model(m) for m in MODELS]})

    async def model(self, request: Request) -> Response:
        name = request.path_params["name"]
        if name not in MODELS:
            return error_response(ApiError(404, f"The model '{name[:80]}' does not exist here.",
                                           param="model", code="model_not_found"))
        return JSONResponse(self._model(name))

    def _model(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": int(self.started),
                "owned_by": "voxshard"}

    async def voices(self, _request: Request) -> Response:
        if self.watch is not None:
            with contextlib.suppress(InputError):  # a folder given went away: as served
                await self.watch.listing()  # never a rescan while one runs beside
        data = [v.to_dict(self.watch.styles_of(v) if self.watch else None)
                for v in self.pool.voices.values()]
        return JSONResponse({"object": "list", "data": data,
                             "voices": [v["id"] for v in data]})

    # -- voices a client registers (engine.serve.register) ---------------------------------
    def _workspace(self) -> tuple[Path, str]:
        if not self.config.workspace or not self.pool.reference_base:
            raise ApiError(400, "This server registers no voices: start it with a workspace "
                           "and a reference base model (workspace, reference_base).",
                           code="not_supported")
        return Path(self.config.workspace).expanduser(), self.pool.reference_base

    async def create_voice(self, request: Request) -> Response:
        try:
            workspace, base = self._workspace()
            raw = await _read_body(request, self.config.max_body)
            form = register.parse_voice_form(raw, request.headers.get("content-type", ""))
            voice = await asyncio.to_thread(register.register_instant, workspace, base, form)
        except ApiError as err:
            return error_response(err)
        self.pool.voices[voice.name] = voice
        return JSONResponse(register.voice_object(voice.name,
                                                  register.created_at(voice.target)))

    async def delete_voice(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            workspace, _base = self._workspace()
            await asyncio.to_thread(register.remove_registered, workspace, name)
        except ApiError as err:
            return error_response(err)
        await self.pool.forget([name])  # its worker lets it go (see `Pool.forget`)
        await self._sync_voices(force=True)  # its other names (`name/instant`) go too
        return JSONResponse({"id": name, "object": "audio.voice.deleted", "deleted": True})

    # -- speech ----------------------------------------------------------------------------
    async def speech(self, request: Request) -> Response:
        began = time.monotonic()
        try:
            raw = await _read_body(request, self.config.max_body)
        except ClientDisconnect:
            self._done(None, 499, 0.0, began)
            return Response(status_code=400)  # nobody reads it: the body never ended
        except ApiError as err:
            self._done(None, err.status, 0.0, began)
            return error_response(err)
        req = None
        try:
            req = await self._parse(raw)
            self._check_options(req)
            self.pool.admit()
        except ApiError as err:
            self._done(req, err.status, 0.0, began)
            return error_response(err)
        except Busy as busy:
            self._done(req, 429, 0.0, began)
            return error_response(ApiError(429, busy.message + " Retry later.",
                                           code="rate_limit_exceeded", kind="rate_limit_error",
                                           headers={"Retry-After": str(busy.retry_after)}))
        released = [False]
        handed = [False]  # the stream releases the request's place when it ends

        def release() -> None:
            if not released[0]:
                released[0] = True
                self.pool.release()

        try:
            deadline = began + self.config.timeout_s
            if req.reference_audio is not None:
                clip = await asyncio.get_running_loop().run_in_executor(
                    None, _reference_wav, req.reference_audio)
                reference = self.pool.reference_file(clip)

                def submit(stream: bool) -> tuple[VoiceWorker, Ticket]:
                    return self.pool.speak_cloned(reference, req.reference_text, req.text,
                                                  req.options, req.response_format, stream)
            else:
                worker = await self.pool.worker_for(req.voice)

                def submit(stream: bool) -> tuple[VoiceWorker, Ticket]:
                    return worker, self.pool.speak(worker, req.text, req.options,
                                                   req.response_format, stream, req.voice)
            if req.stream_format is None:
                return await self._whole(request, submit, req, deadline, began)
            stream = await self._stream(request, submit, req, deadline, began, release)
            handed[0] = True
            return stream
        except Busy as busy:
            err = ApiError(503, busy.message, kind="server_error", code="busy",
                           headers={"Retry-After": str(busy.retry_after)})
        except LoadFailed as exc:
            err = ApiError(500, exc.message, kind="server_error", code="voice_load_failed")
        except ApiError as exc:
            err = exc
        finally:
            if not handed[0]:
                release()
        self._done(req, err.status, 0.0, began)
        return error_response(err)

    async def _parse(self, raw: bytes) -> SpeechRequest:
        """The request, against the voices on disk now (a voice not known here is looked
        for once more: another replica may have registered it since the last scan)."""
        await self._sync_voices()
        for last in (False, True):
            try:
                return parse_speech(raw, voices=self.pool.voices, formats=self.formats,
                                    max_input=self.config.max_input,
                                    allow_reference=self.config.allow_reference)
            except ApiError as err:
                if last or err.code != "voice_not_found" or self.rescan is None:
                    raise
                await self._sync_voices(force=True)
        raise AssertionError("unreachable")

    def _check_options(self, req: SpeechRequest) -> None:
        try:
            SpeakOptions.from_dict(dict(req.options))
        except InputError as exc:  # a rule across fields; the setting is the param it names
            param = next((p.rpartition(".")[2] for p in exc.settings), None)
            raise ApiError(400, exc.message, param=param, code="invalid_value") from None

    async def _wait(self, request: Request | None, worker: VoiceWorker, ticket: Ticket,
                    flag: asyncio.Event, deadline: float) -> None:
        """Until `flag` is set; a client that left or the time limit cancels the request."""
        while not flag.is_set():
            try:
                await asyncio.wait_for(flag.wait(), POLL_S)
            except TimeoutError:
                pass
            if flag.is_set():
                return
            if request is not None and await request.is_disconnected():
                self.pool.cancel(worker, ticket)
                raise ApiError(499, "The client went away.", code="cancelled")
            if time.monotonic() > deadline:
                self.pool.cancel(worker, ticket)
                raise ApiError(504, f"The speech took longer than this server's limit of "
                               f"{self.config.timeout_s:g} s; send shorter text.",
                               kind="server_error", code="timeout")

    async def _whole(self, request: Request, submit: Submit, req: SpeechRequest,
                     deadline: float, began: float) -> Response:
        worker, ticket = submit(False)
        try:
            await self._wait(request, worker, ticket, ticket.ended, deadline)
            if ticket.error is not None:
                raise _worker_error(ticket.error)
            assert ticket.result is not None
            cut = _cut(ticket.result)
            body, seconds = await asyncio.get_running_loop().run_in_executor(
                None, self._encode_file, ticket.result["path"], req)
        finally:
            self.pool.finish(worker, ticket)
        self._done(req, 200, seconds, began, **({"runaway": cut} if cut else {}),
                   **ticket.said())
        return Response(body, media_type=formats.MEDIA_TYPES[req.response_format],
                        headers=_headers(ticket, cut) or None)

    @staticmethod
    def _encode_file(path: str, req: SpeechRequest) -> tuple[bytes, float]:
        if req.speed == 1.0 and path.endswith("." + req.response_format):
            info = sf.info(path)
            with open(path, "rb") as fh:  # the worker already wrote this format
                return fh.read(), info.frames / info.samplerate
        audio, rate = sf.read(path, dtype="float32")
        audio = formats.time_stretch(audio, req.speed)
        return formats.encode(audio, req.response_format, rate), len(audio) / rate

    async def _stream(self, request: Request, submit: Submit, req: SpeechRequest,
                      deadline: float, began: float, release: Callable[[], None]) -> Response:
        worker, ticket = submit(True)
        try:
            await self._wait(request, worker, ticket, ticket.started, deadline)
            if ticket.error is not None:
                raise _worker_error(ticket.error)
        except BaseException:
            self.pool.finish(worker, ticket)
            raise
        self.pool.streams += 1
        return _SpeechStream(self, worker, ticket, req, deadline, began, release).response()

    def _done(self, req: SpeechRequest | None, status: int, seconds: float,
              began: float, **extra: Any) -> None:
        if status == 200:
            self.served += 1
            self.audio_s += seconds
        self.log({"method": "POST", "path": "/v1/audio/speech", "status": status,
                  "voice": req.voice if req else "", "format": req.response_format if req else "",
                  "stream": (req.stream_format or "") if req else "",
                  "chars": len(req.text) if req else 0, "audio_s": round(seconds, 3),
                  "seconds": round(time.monotonic() - began, 3), **extra})


@dataclass
class _SpeechStream:
    """One streamed answer: the worker's audio as it comes (bytes, or OpenAI's SSE events)
    and, when the body ends or the client leaves, the worker freed and the request logged."""

    app: SpeechApp
    worker: VoiceWorker
    ticket: Ticket
    req: SpeechRequest
    deadline: float
    began: float
    release: Callable[[], None]
    samples: int = 0
    first_byte_at: float | None = None

    def response(self) -> Response:
        said = _headers(self.ticket, [])  # the instruction was settled before the first audio
        if self.req.stream_format == "sse":
            return _Stream(self.events(), self.cleanup, media_type="text/event-stream",
                           headers={"Cache-Control": "no-cache", **said})
        return _Stream(self.pieces(), self.cleanup,
                       media_type=formats.MEDIA_TYPES[self.req.response_format],
                       headers=said or None)

    def cleanup(self) -> None:
        pool, ticket = self.app.pool, self.ticket
        left = not ticket.ended.is_set()
        if left:
            pool.cancel(self.worker, ticket)  # the client left: its rows go now
        pool.finish(self.worker, ticket)
        pool.streams -= 1
        self.release()
        status = 499 if left else 200 if ticket.result is not None else 500
        lag = None
        if self.first_byte_at is not None and ticket.first_audio_at is not None:
            # how long the worker's first audio took to leave the server
            lag = round((self.first_byte_at - ticket.first_audio_at) * 1000, 1)
        cut = _cut(ticket.result)  # streamed: the log says what the headers could not
        self.app._done(self.req, status, self.samples / SAMPLE_RATE, self.began,
                       first_byte_after_audio_ms=lag, **({"runaway": cut} if cut else {}),
                       **ticket.said())

    async def pieces(self) -> AsyncIterator[bytes]:
        if self.req.response_format not in formats.INCREMENTAL:
            async for body in self._whole_file():
                yield body
            return
        fmt = self.req.response_format
        encoder = formats.OggOpusStream() if fmt == "opus" else None
        if fmt == "wav":
            yield formats.streaming_wav_header()
        async for pcm in self.app.pool.tail(self.worker, self.ticket, self.deadline):
            if self.first_byte_at is None:
                self.first_byte_at = time.time()
            self.samples += len(pcm) // 2
            if encoder is None:
                yield pcm
            elif page := encoder.feed(pcm):
                yield page
        if encoder is not None and (rest := encoder.close()):
            yield rest

    async def _whole_file(self) -> AsyncIterator[bytes]:
        """A format encoded only when the render ends: the file, once written."""
        await self.app._wait(None, self.worker, self.ticket, self.ticket.ended, self.deadline)
        if self.ticket.result is not None:
            body, seconds = await asyncio.get_running_loop().run_in_executor(
                None, self.app._encode_file, self.ticket.result["path"], self.req)
            self.samples = round(seconds * SAMPLE_RATE)
            yield body

    async def events(self) -> AsyncIterator[bytes]:
        async for piece in self.pieces():
            delta = {"type": "speech.audio.delta",
                     "audio": base64.b64encode(piece).decode("ascii")}
            yield f"data: {json.dumps(delta)}\n\n".encode()
        if self.ticket.error is not None:
            error = {"type": "error", **_worker_error(self.ticket.error).body()}
            yield f"data: {json.dumps(error)}\n\n".encode()
            return
        text, frames = self.req.text, self.samples // SAMPLES_PER_FRAME
        usage = {"input_tokens": len(text), "output_tokens": frames,
                 "total_tokens": len(text) + frames}
        done: dict[str, Any] = {"type": "speech.audio.done", "usage": usage}
        if cut := _cut(self.ticket.result):  # streamed: the headers left before the cut
            done["runaway"] = cut
        yield f"data: {json.dumps(done)}\n\n".encode()


def create_app(pool: Pool, config: ServeConfig,
               log: Callable[[dict[str, Any]], None] | None = None,
               rescan: Rescan | None = None, watch: VoiceWatch | None = None) -> Starlette:
    api = SpeechApp(pool, config, log, rescan, watch)

    async def http_error(_request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error_response(ApiError(exc.status_code, str(exc.detail),
                                       code=f"http_{exc.status_code}"))

    async def crash(_request: Request, exc: Exception) -> Response:
        return error_response(ApiError(500, f"Internal error: {type(exc).__name__}.",
                                       kind="server_error", code="server_error"))

    routes = [
        Route("/v1/audio/speech", api.speech, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/models/{name:path}", api.model, methods=["GET"]),
        Route("/v1/audio/voices", api.voices, methods=["GET"]),
        Route("/v1/audio/voices", api.create_voice, methods=["POST"]),
        Route("/v1/audio/voices/{name}", api.delete_voice, methods=["DELETE"]),
        Route("/health", api.health, methods=["GET"]),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        yield
        await pool.close()  # the workers stop, the renders' folder goes

    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error,
                                                       Exception: crash}, lifespan=lifespan)
    app.state.api = api
    guarded = Guard(app, config.api_key, config.max_body, loopback=config.loopback)
    return guarded  # type: ignore[return-value]
