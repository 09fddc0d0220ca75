"""Start the speech server: check the settings, load the first voice, serve with uvicorn."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

from engine.config.serve import ServeSettings
from engine.core.errors import InputError
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.model.loading import default_device
from engine.serve.pool import LoadFailed, Pool
from engine.serve.voices import discover, served_stamp, serving_base
from engine.serve.watch import VoiceWatch
from engine.serve.wyoming import (
    WyomingServer,
    WyomingService,
    home_assistant_list,
    parse_uri,
)

#: shortest API key accepted (a guessable key on an open port is no protection)
MIN_KEY_CHARS = 16


def is_loopback(host: str) -> bool:
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def read_key(path: str | os.PathLike[str]) -> str:
    file = Path(path).expanduser()
    try:
        key = file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"The API key file {file} cannot be read ({exc}).",
                         "Give a readable text file that holds the key.") from None
    if len(key) < MIN_KEY_CHARS or any(c.isspace() for c in key):
        raise InputError(f"The API key in {file} must be one word of at least {MIN_KEY_CHARS} "
                         "characters.", "Make one with: python -c \"import secrets; "
                         "print(secrets.token_urlsafe(32))\" > KEYFILE")
    return key


def check_settings(settings: ServeSettings) -> str | None:
    """The API key (None: none), or a one-sentence refusal of unsafe settings."""
    if not is_loopback(settings.host) and not settings.api_key_file:
        raise InputError(f"Refusing to serve on {settings.host} without an API key: anyone who "
                         "can reach that address could use the voice.",
                         "Use {serve.api_key_file}, or {serve.host} 127.0.0.1 (this computer "
                         "only).")
    # the numbers' bounds are the settings' own (`ServeSettings` checks them once)
    if settings.reference_base:
        _check_base(settings.reference_base)
    check_wyoming(settings)
    return read_key(settings.api_key_file) if settings.api_key_file else None


def check_wyoming(settings: ServeSettings) -> tuple[str, int] | None:
    """The Wyoming (host, port) to listen on (None: none), or a one-sentence refusal."""
    if not settings.wyoming:
        if not settings.http:
            raise InputError("Turning {serve.http} off leaves nothing to serve.",
                             "Give {serve.wyoming} an address such as tcp://127.0.0.1:10200, "
                             "or turn {serve.http} back on.")
        if settings.zeroconf:
            raise InputError("Nothing to announce: {serve.zeroconf} needs the Wyoming "
                             "service, which is not on.",
                             "Give {serve.wyoming} an address such as tcp://HOST:10200.")
        return None
    host, port = parse_uri(settings.wyoming)
    if not is_loopback(host) and not settings.wyoming_allow_lan:
        raise InputError(f"Refusing to serve Wyoming on {host}: the protocol has no keys, so "
                         "anyone who can reach that address could use every voice.",
                         "Turn on {serve.wyoming_allow_lan} if every device on that network "
                         "may, or "
                         "keep tcp://127.0.0.1:10200.")
    return host, port


def _check_base(model: str) -> None:
    """A local folder must be a Qwen3-TTS Base model (a hub id is found when first used)."""
    folder = Path(model).expanduser()
    if not folder.exists():
        return
    try:
        model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get(
            "tts_model_type")
    except (OSError, ValueError):
        model_type = None
    if model_type != "base":
        raise InputError(f"{folder} is not a Qwen3-TTS Base model, so it cannot clone from a "
                         "reference clip.",
                         "Give {serve.reference_base} a Base model folder or hub id.")


def _bind(host: str, port: int, setting: str = "serve.port") -> socket.socket:
    """A listening socket; a refusal names `setting`, the one that chose the port."""
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    # TCP named, and no Nagle on what it accepts: a reply written in two parts (headers,
    # then body) would otherwise wait for the client's delayed ACK, some 40 ms a request
    # on a kept-alive connection (asyncio turns Nagle off only for a socket named TCP)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise InputError(f"Cannot listen on {host}:{port} ({exc.strerror or exc}).",
                         f"Choose another port in {{{setting}}}, or stop the program using "
                         "it.") from None
    sock.listen(128)  # connections wait in the backlog until the server accepts them
    return sock


def _device(device: str | None) -> str:
    return device or default_device()


def served_voices(settings: ServeSettings) -> dict[str, Any]:
    """The voices `settings` serve, read from disk now (at start, and again by the app and
    the Wyoming service when the workspace changes); an empty workspace is served when
    clients can register into it (`--reference-base`). An instant voice that knows no base
    speaks on --reference-base, else on the default base model where it is here."""
    return discover(settings.targets, settings.workspace,
                    registers=bool(settings.reference_base),
                    base=serving_base(settings.reference_base))


def make_pool(settings: ServeSettings, voices: dict[str, Any]) -> Any:
    """The warm workers' pool for `voices` (also each Ray Serve replica's)."""
    return Pool(voices, device=settings.device, dtype=settings.dtype, rows=settings.rows,
                quantize=settings.quantize, fuse=settings.fuse,
                max_loaded=settings.max_loaded, max_queue=settings.queue,
                reference_base=settings.reference_base)


def make_config(settings: ServeSettings, key: str | None, **instance: Any) -> Any:
    """The app's settings; `instance` adds where it runs to /health (a replica's node)."""
    # starlette loads with the app, not here: the window's Serve page imports this module
    from engine.serve.app import ServeConfig  # noqa: PLC0415

    return ServeConfig(api_key=key, max_body=settings.max_body, max_input=settings.max_input,
                       timeout_s=settings.timeout_s, device=_device(settings.device),
                       allow_reference=bool(settings.reference_base),
                       loopback=is_loopback(settings.host), instance=instance,
                       workspace=str(settings.workspace) if settings.workspace else None)


def preload(pool: Any, name: str) -> None:
    """Load voice `name` now, so the first request finds it warm."""
    try:
        pool.loaded[name] = pool._load(name)
    except LoadFailed as exc:
        raise InputError(exc.message, "Check the voice folder (speak it once with "
                         "`voxshard-engine speak`).") from None


def url_of(host: str, port: int) -> str:
    shown = f"[{host.strip('[]')}]" if ":" in host else host
    return f"http://{shown}:{port}/v1"


def request_line(record: dict[str, Any]) -> tuple[str, str]:
    """A request log record as the log's line and level: an instruction the voice was not
    trained for (ignored, or with a note) makes it a warning, never a silent ignore."""
    line = (f"{record['method']} {record['path']} {record['status']} "
            f"{record['voice']} {record['format']} {record['audio_s']:.2f} s audio "
            f"in {record['seconds']:.2f} s")
    if record.get("error"):
        line += f" ({record['error']})"  # the refusal's code, as its client got it
    said = record.get("instructions") or {}
    if not said:
        return line, "info"
    notes = " ".join(said.get("notes") or [])
    line += (f"; instructions {said.get('text')!r} "
             + ("applied" if said.get("applied") else "ignored")
             + (f": {notes}" if notes else ""))
    return line, "warning" if not said.get("applied") or notes else "info"


class Serving:
    """A started server, serving on its own thread until `stop` (or the end of a `with`).

    `url` is the HTTP endpoint ("http://127.0.0.1:8000/v1", None with `http` off), `port`
    its port (the one picked when the settings ask for 0), `wyoming` the Wyoming address.
    """

    def __init__(self, settings: ServeSettings, emitter: Emitter) -> None:
        import uvicorn  # noqa: PLC0415

        from engine.serve.app import create_app  # starlette: see make_config  # noqa: PLC0415

        self.settings, self._emitter = settings, emitter
        key = check_settings(settings)
        wyoming_at = check_wyoming(settings)
        self.voices = voices = served_voices(settings)
        self._pool = pool = make_pool(settings, voices)
        self._socks = [_bind(settings.host, settings.port) if settings.http else None]
        self._socks.append(_bind(*wyoming_at, "serve.wyoming") if wyoming_at else None)
        # the voices listed, kept current beside the rendering: describe, /health and
        # /v1/audio/voices answer from it at once
        self.watch = VoiceWatch(pool, lambda: served_voices(settings),
                                lambda: served_stamp(settings.targets, settings.workspace))
        self.watch.prime()
        self._app = create_app(pool, make_config(settings, key), self._log,
                               lambda: served_voices(settings), self.watch)
        if settings.preload and voices:
            first = next(iter(voices))
            emitter.state("loading_model", detail=first)
            try:
                preload(pool, first)
            except InputError:
                self._close_sockets()
                raise
        sock, wyoming_sock = self._socks
        self.port: int | None = sock.getsockname()[1] if sock is not None else None
        self.url = url_of(settings.host, self.port) if self.port is not None else None
        self._service = WyomingService(pool, self.watch,
                                       max_input=settings.max_input,
                                       timeout_s=settings.timeout_s, log=self._log)
        self._wyoming = (WyomingServer(self._service, wyoming_sock)
                         if wyoming_sock is not None else None)
        self.wyoming = (f"tcp://{wyoming_at[0]}:{self._wyoming.port}"
                        if self._wyoming is not None and wyoming_at else None)
        self._key, self._wyoming_at = key, wyoming_at
        self._server = uvicorn.Server(uvicorn.Config(
            self._app, log_level="warning", access_log=False, lifespan="on",
            timeout_graceful_shutdown=5))
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._ready = threading.Event()
        self._ended = threading.Event()  # not `Thread.is_alive`: see `wait`
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="voxshard-serve", daemon=True)
        self._thread.start()
        while not self._ready.wait(0.1) and not self._ended.is_set():
            pass  # until it serves, or fails on its way there
        if self._failed is not None:
            raise self._failed

    def _log(self, record: dict[str, Any]) -> None:
        line, level = request_line(record)
        self._emitter.log(line, level=level, request_log=record)

    def _close_sockets(self) -> None:
        for opened in self._socks:
            if opened is not None:
                opened.close()

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # handed to the thread that started it (or stops it)
            self._failed = exc
        finally:
            self._close_sockets()
            self._ended.set()

    async def _serve(self) -> None:
        settings, pool, voices = self.settings, self._pool, self.voices
        self._loop, self._stopping = asyncio.get_running_loop(), asyncio.Event()
        sock = self._socks[0]
        announced = None
        self.watch.start()
        try:
            if self._wyoming is not None:
                await self._wyoming.start()
                if settings.zeroconf and self._wyoming_at:
                    announced = await self._wyoming.announce(self._wyoming_at[0])
            # what each name loads, for the app: its Listen page sends a source this server
            # already serves here, so the two share one warm worker (never sent to clients)
            loads = {name: pool.identity(name) for name in sorted(voices)}
            # both addresses, each said for what it serves: a person reads this line
            where = [f"HTTP {self.url}"] if self.url else []
            if self.wyoming:
                where.append(f"Home Assistant (Wyoming) {self.wyoming}"
                             + (f", announced on {announced}" if announced else ""))
            self._emitter.state(
                "serving", detail="; ".join(where), url=self.url, port=self.port,
                voices=sorted(voices), loads=loads, auth=self._key is not None,
                renders=str(pool.renders_dir), reference_cloning=bool(settings.reference_base),
                wyoming=self.wyoming, zeroconf=announced,
                # what Home Assistant lists, in its order (the Serve page shows it)
                wyoming_voices=[list(entry) for entry in home_assistant_list(voices.values(),
                                                                  self.watch.styles_of)]
                if self.wyoming else [])
            self._ready.set()
            if sock is not None:
                await self._server.serve(sockets=[sock])  # its lifespan closes the pool
            else:
                await self._stopping.wait()
        finally:
            await self.watch.stop()
            if self._wyoming is not None:
                await self._wyoming.stop()
            if sock is None:
                await pool.close()

    def stop(self) -> dict[str, Any]:
        """End the server (requests under way get a few seconds to finish); what it served."""
        self._server.should_exit = True
        if self._loop is not None and self._stopping is not None:
            try:
                self._loop.call_soon_threadsafe(self._stopping.set)
            except RuntimeError:
                pass  # its loop has ended already
        self._ended.wait()
        return self.summary()

    def wait(self) -> dict[str, Any]:
        """Serve until stopped elsewhere, or until Ctrl+C (and SIGTERM where the caller turns
        it into KeyboardInterrupt, as the CLI does); what was served."""
        try:  # an Event, never Thread.join: Python 3.11's join, interrupted by Ctrl+C,
            self._ended.wait()  # marks a thread still running as ended
        except KeyboardInterrupt:
            pass  # a normal end
        return self.stop()

    def summary(self) -> dict[str, Any]:
        api = self._app.app.state.api  # type: ignore[attr-defined]
        served = api.served + self._service.served
        audio_s = api.audio_s + self._service.audio_s
        return {"served": served, "audio_seconds": round(audio_s, 3), "url": self.url,
                "wyoming": self.wyoming,
                "summary": f"Served {served} request(s), {audio_s:.1f} s of audio."}

    def __enter__(self) -> Serving:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start(settings: ServeSettings, on_event: EventCallback | Emitter | None = None) -> Serving:
    """Check `settings`, load the first voice and serve on a thread of this process; returns
    once it serves (`engine.api.serve`, and the CLI's `serve` through it)."""
    return Serving(settings, as_emitter(on_event))
