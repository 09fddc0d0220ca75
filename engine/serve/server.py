"""Start the speech server: check the settings, load the first voice, serve with uvicorn."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import signal
import socket
from pathlib import Path
from typing import Any

from engine.config.serve import ServeSettings
from engine.core.errors import InputError
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.serve.pool import LoadFailed, Pool
from engine.serve.voices import discover
from engine.serve.wyoming import (
    WyomingServer,
    WyomingService,
    description_of,
    home_assistant_order,
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
                         "Add --api-key-file FILE, or keep the default --host 127.0.0.1.")
    # the numbers' bounds are the settings' own (`ServeSettings` checks them once)
    if settings.reference_base:
        _check_base(settings.reference_base)
    check_wyoming(settings)
    return read_key(settings.api_key_file) if settings.api_key_file else None


def check_wyoming(settings: ServeSettings) -> tuple[str, int] | None:
    """The Wyoming (host, port) to listen on (None: none), or a one-sentence refusal."""
    if not settings.wyoming:
        if not settings.http:
            raise InputError("--no-http leaves nothing to serve.", "Add --wyoming "
                             "tcp://127.0.0.1:10200, or leave out --no-http.")
        if settings.zeroconf:
            raise InputError("--zeroconf announces the Wyoming service, which is not on.",
                             "Add --wyoming tcp://HOST:10200.")
        return None
    host, port = parse_uri(settings.wyoming)
    if not is_loopback(host) and not settings.wyoming_allow_lan:
        raise InputError(f"Refusing to serve Wyoming on {host}: the protocol has no keys, so "
                         "anyone who can reach that address could use every voice.",
                         "Add --wyoming-allow-lan if every device on that network may, or "
                         "keep tcp://127.0.0.1:10200.")
    return host, port


def _check_base(model: str) -> None:
    """A local folder must be a Qwen3-TTS Base model (a hub id is found when first used)."""
    folder = Path(model).expanduser()
    if not folder.exists():
        return
    try:
        kind = json.loads((folder / "config.json").read_text(encoding="utf-8")).get(
            "tts_model_type")
    except (OSError, ValueError):
        kind = None
    if kind != "base":
        raise InputError(f"{folder} is not a Qwen3-TTS Base model, so it cannot clone from a "
                         "reference clip.", "Give --reference-base a Base model folder or hub id.")


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise InputError(f"Cannot listen on {host}:{port} ({exc.strerror or exc}).",
                         "Choose another --port, or stop the program using it.") from None
    sock.listen(128)  # connections wait in the backlog until the server accepts them
    return sock


def _device(device: str | None) -> str:
    if device:
        return device
    import torch  # noqa: PLC0415

    return "cuda" if torch.cuda.is_available() else "cpu"


def served_voices(settings: ServeSettings) -> dict[str, Any]:
    """The voices `settings` serve, read from disk now (at start, and again by the app and
    the Wyoming service when the workspace changes); an empty workspace is served when
    clients can register into it (`--reference-base`)."""
    return discover(settings.targets, settings.workspace,
                    registers=bool(settings.reference_base))


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
    said = record.get("instructions") or {}
    if not said:
        return line, "info"
    notes = " ".join(said.get("notes") or [])
    line += (f"; instructions {said.get('text')!r} "
             + ("applied" if said.get("applied") else "ignored")
             + (f": {notes}" if notes else ""))
    return line, "warning" if not said.get("applied") or notes else "info"


def serve(settings: ServeSettings,
          on_event: EventCallback | Emitter | None = None) -> dict[str, Any]:
    """Serve until SIGINT/SIGTERM; returns what was served."""
    import uvicorn  # noqa: PLC0415

    from engine.serve.app import create_app  # starlette: see make_config  # noqa: PLC0415

    emitter = as_emitter(on_event)
    key = check_settings(settings)
    wyoming_at = check_wyoming(settings)
    voices = served_voices(settings)
    pool = make_pool(settings, voices)
    sock = _bind(settings.host, settings.port) if settings.http else None
    wyoming_sock = _bind(*wyoming_at) if wyoming_at else None
    config = make_config(settings, key)

    def log(record: dict[str, Any]) -> None:
        line, level = request_line(record)
        emitter.log(line, level=level, request_log=record)

    def close_sockets() -> None:
        for opened in (sock, wyoming_sock):
            if opened is not None:
                opened.close()

    app = create_app(pool, config, log, lambda: served_voices(settings))
    if settings.preload and voices:
        first = next(iter(voices))
        emitter.state("loading_model", detail=first)
        try:
            preload(pool, first)
        except InputError:
            close_sockets()
            raise
    port = sock.getsockname()[1] if sock is not None else None
    url = url_of(settings.host, port) if port is not None else None
    service = WyomingService(pool, lambda: served_voices(settings),
                             max_input=settings.max_input, timeout_s=settings.timeout_s,
                             log=log)
    wyoming = WyomingServer(service, wyoming_sock) if wyoming_sock is not None else None
    wyoming_url = (f"tcp://{wyoming_at[0]}:{wyoming.port}"
                   if wyoming is not None and wyoming_at else None)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                           lifespan="on", timeout_graceful_shutdown=5))

    async def run() -> None:
        announced = None
        if wyoming is not None:
            await wyoming.start()
            if settings.zeroconf and wyoming_at:
                announced = await wyoming.announce(wyoming_at[0])
        # what each name loads, for the app: its Listen page sends a source this server
        # already serves here, so the two share one warm worker (never sent to clients)
        loads = {name: pool.identity(name) for name in sorted(voices)}
        # both addresses, each said for what it serves: a person reads this line
        where = [f"HTTP {url}"] if url else []
        if wyoming_url:
            where.append(f"Home Assistant (Wyoming) {wyoming_url}"
                         + (f", announced on {announced}" if announced else ""))
        emitter.state("serving", detail="; ".join(where), url=url, port=port,
                      voices=sorted(voices), loads=loads, auth=key is not None,
                      renders=str(pool.renders_dir),
                      reference_cloning=bool(settings.reference_base),
                      wyoming=wyoming_url, zeroconf=announced,
                      # what Home Assistant lists, in its order (the Serve page shows it)
                      wyoming_voices=[[v.name, description_of(v)] for v in
                                      home_assistant_order(voices.values())]
                      if wyoming_url else [])
        try:
            if sock is not None:
                await server.serve(sockets=[sock])  # its lifespan closes the pool
            else:
                await _until_stopped()
        finally:
            if wyoming is not None:
                await wyoming.stop()
            if sock is None:
                await pool.close()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass  # uvicorn stopped gracefully on SIGINT/SIGTERM, then raised it again: a normal end
    finally:
        close_sockets()
    api = app.app.state.api  # type: ignore[attr-defined]
    served, audio_s = api.served + service.served, api.audio_s + service.audio_s
    return {"served": served, "audio_seconds": round(audio_s, 3), "url": url,
            "wyoming": wyoming_url,
            "summary": f"Served {served} request(s), {audio_s:.1f} s of audio."}


async def _until_stopped() -> None:
    """Until SIGINT or SIGTERM (the Wyoming service alone: no uvicorn to catch them)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in previous:
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig, handler in previous.items():
            loop.remove_signal_handler(sig)  # it leaves the default (a second TERM kills)
            signal.signal(sig, handler)
