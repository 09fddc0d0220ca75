"""Home Assistant's Wyoming protocol (`serve --wyoming`), driven by the `wyoming` package's own
`AsyncTcpClient` against the real server on the tiny model: describe (rescanned), one-shot
synthesize, a streamed request cut into sentences, stray and malformed events, a client that
leaves mid-stream, four clients at once, an unknown voice, the refusals, Wyoming alone."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)
from zeroconf import ServiceStateChange
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from engine.serve.wyoming import SERVICE_TYPE
from engine.text import complete_sentences
from tests.helpers.serving import ENGINE, KEY, ROOT, Server, start_server
from tests.helpers.voices import make_workspace

LONG = " ".join(f"A long sentence number {i} to keep the rows busy." for i in range(4))


@pytest.fixture(scope="module")
def workspace_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_workspace(tmp_path_factory.mktemp("wyoming"), tiny_model_dir)


def _stop(server: Server) -> None:
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=60) in (0, 130)
    assert not server.renders.exists()


@pytest.fixture(scope="module")
def server(workspace_dir: Path) -> Iterator[Server]:
    root = workspace_dir.parent
    (root / "key").write_text(KEY + "\n")
    srv = start_server(["--workspace", str(workspace_dir), "--port", "0", "--api-key-file",
                        str(root / "key"), "--device", "cpu", "--dtype", "float32",
                        "--queue", "12", "--timeout", "120", "--max-input", "400",
                        "--wyoming", "tcp://127.0.0.1:0"], root)
    yield srv
    _stop(srv)


def _client(server: Server) -> AsyncTcpClient:
    uri = str(server.serving["wyoming"])
    host, port = uri.removeprefix("tcp://").rsplit(":", 1)
    return AsyncTcpClient(host, int(port))


async def _until(client: AsyncTcpClient, *types: str) -> list[Event]:
    """Every event up to and including the first of `types`."""
    out: list[Event] = []
    while True:
        event = await asyncio.wait_for(client.read_event(), 120)
        assert event is not None, f"the server hung up; had {[e.type for e in out]}"
        out.append(event)
        if event.type in types:
            return out


def _groups(events: list[Event]) -> list[bytes]:
    """The audio of each audio-start ... audio-stop group, checking the format."""
    groups: list[bytes] = []
    current: bytearray | None = None
    for event in events:
        if AudioStart.is_type(event.type):
            start = AudioStart.from_event(event)
            assert (start.rate, start.width, start.channels) == (24000, 2, 1)
            assert current is None
            current = bytearray()
        elif AudioChunk.is_type(event.type):
            assert current is not None
            current += AudioChunk.from_event(event).audio
        elif AudioStop.is_type(event.type):
            assert current is not None
            groups.append(bytes(current))
            current = None
    assert current is None
    return groups


def _wait_for(check: Any) -> bool:
    for _ in range(600):
        if check():
            return True
        time.sleep(0.1)
    return False


def test_complete_sentences_as_text_arrives() -> None:
    assert complete_sentences("Hello there. How are") == (["Hello there."], " How are")
    assert complete_sentences("Hello there.") == ([], "Hello there.")  # "3." of "3.5"?
    assert complete_sentences("Is it? ") == (["Is it?"], " ")
    assert complete_sentences("See etc. ") == ([], "See etc. ")  # "etc. and" goes on
    assert complete_sentences("Hi Dr. Smith. Yes") == (["Hi Dr. Smith."], " Yes")
    assert complete_sentences("One\ntwo") == (["One"], "two")


def test_describe_lists_every_voice_and_rescans(server: Server, workspace_dir: Path) -> None:
    async def describe() -> Info:
        async with _client(server) as client:
            await client.write_event(Describe().event())
            return Info.from_event((await _until(client, "info"))[-1])

    info = asyncio.run(describe())
    assert len(info.tts) == 1 and info.tts[0].supports_synthesize_streaming
    voices = {v.name: v for v in info.tts[0].voices}
    assert set(voices) == {"ada", "ada/ada-v1"}
    assert voices["ada"].languages == ["en"] and voices["ada"].attribution.name
    # an export made while the server runs is offered at the next describe, and speaks
    exports = workspace_dir / "ada" / "exports"
    shutil.copytree(exports / "ada-v1", exports / "ada-v2")
    assert "ada/ada-v2" in {v.name for v in asyncio.run(describe()).tts[0].voices}


def test_one_shot_synthesize_sends_audio_as_it_is_generated(server: Server) -> None:
    async def speak() -> tuple[list[Event], dict[str, Any]]:
        async with _client(server) as client:
            await client.write_event(Synthesize(text=LONG, voice=SynthesizeVoice(
                name="ada/ada-v2")).event())
            first = await _until(client, "audio-chunk")
            # the request still holds its place: the render is not done yet
            during = server.health()
            rest = await _until(client, "audio-stop", "error")
            return first + rest, during

    events, during = asyncio.run(speak())
    assert during["queue_depth"] >= 1
    groups = _groups(events)
    assert len(groups) == 1 and len(groups[0]) > 24000 * 2  # over a second of audio
    assert sum(AudioChunk.is_type(e.type) for e in events) > 1
    # the request log the window shows, shared with the HTTP requests
    assert _wait_for(lambda: any(r["method"] == "WYOMING" and r["voice"] == "ada/ada-v2"
                                 and r["status"] == 200 for r in server.logged()))


def test_stream_is_spoken_sentence_by_sentence(server: Server) -> None:
    chunks = ["Hello there, this is ", "the first sentence. And here", " is the second one! Then "
              "the last"]

    async def stream() -> list[Event]:
        async with _client(server) as client:
            await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="ada")).event())
            for text in chunks:
                await client.write_event(SynthesizeChunk(text=text).event())
            # the compatibility copy of the whole text, for servers that do not stream
            await client.write_event(Synthesize(text="".join(chunks)).event())
            await client.write_event(SynthesizeStop().event())
            return await _until(client, "synthesize-stopped")

    events = asyncio.run(stream())
    assert not any(Error.is_type(e.type) for e in events)
    assert len(_groups(events)) == 3  # three sentences, three groups, nothing more
    assert SynthesizeStopped.is_type(events[-1].type)


def test_stray_and_malformed_events_get_errors_and_the_connection_goes_on(
        server: Server) -> None:
    async def stray() -> list[list[Event]]:
        async with _client(server) as client:
            answers = []
            # a stop with no stream, a malformed synthesize, an event for another service
            await client.write_event(SynthesizeStop().event())
            answers.append(await _until(client, "synthesize-stopped"))
            await client.write_event(Event(type="synthesize", data={"text": 42}))
            answers.append(await _until(client, "error"))
            await client.write_event(Event(type="transcribe", data={}))
            await client.write_event(Synthesize(text="   ").event())
            answers.append(await _until(client, "error"))
            # chunks from a client that never sent synthesize-start are still spoken
            await client.write_event(SynthesizeChunk(text="Hi there.").event())
            await client.write_event(SynthesizeStop().event())
            answers.append(await _until(client, "synthesize-stopped"))
            await client.write_event(Describe().event())
            answers.append(await _until(client, "info"))
            return answers

    stopped, malformed, empty, chunked, info = asyncio.run(stray())
    assert len(stopped) == 1
    assert Error.from_event(malformed[-1]).code == "malformed_event"
    assert Error.from_event(empty[-1]).code == "empty_input"
    assert len(_groups(chunked)) == 1
    assert info[-1].type == "info"


def test_unknown_voice_and_too_long_input(server: Server) -> None:
    async def ask() -> list[list[Event]]:
        async with _client(server) as client:
            await client.write_event(Synthesize(text="Hello.", voice=SynthesizeVoice(
                name="nobody")).event())
            unknown = await _until(client, "error")
            await client.write_event(Synthesize(text="x" * 401).event())
            long = await _until(client, "error")
            # a stream in an unknown voice: one error, its chunks are not spoken
            await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="x")).event())
            await client.write_event(SynthesizeChunk(text="Not me. Nor me.").event())
            await client.write_event(SynthesizeStop().event())
            refused = await _until(client, "synthesize-stopped")
            await client.write_event(Synthesize(text="Now me.").event())
            good = await _until(client, "audio-stop")
            return [unknown, long, refused, good]

    unknown, long, refused, good = asyncio.run(ask())
    error = Error.from_event(unknown[-1])
    assert error.code == "voice_not_found" and "ada/ada-v1" in error.text
    assert Error.from_event(long[-1]).code == "input_too_long"
    assert [e.type for e in refused] == ["error", "synthesize-stopped"]
    assert len(_groups(good)) == 1


def test_client_leaving_mid_stream_cancels_its_rows(server: Server) -> None:
    before = len(server.logged())

    async def leave() -> None:
        async with _client(server) as client:
            await client.write_event(SynthesizeStart().event())
            await client.write_event(SynthesizeChunk(text=LONG).event())
            await _until(client, "audio-chunk")  # the first audio, then the client goes

    asyncio.run(leave())
    # every sentence it had sent ends at once: nothing admitted, no render left
    assert _wait_for(lambda: server.health()["queue_depth"] == 0)
    assert _wait_for(lambda: not any(server.renders.iterdir()))
    # this client's streamed sentences: the previous test's last request is logged after
    # its response reached that client, so its line may come after `before` (seen in CI)
    mine = [r for r in server.logged()[before:]
            if r["path"] == "synthesize-stream" and r["voice"] == "ada"]
    assert mine and all(r["status"] == 499 for r in mine), server.logged()[before:]


def test_four_clients_at_once(server: Server) -> None:
    async def one(i: int) -> list[Event]:
        async with _client(server) as client:
            if i % 2:
                await client.write_event(Synthesize(text=f"Client {i} says hello.").event())
                return await _until(client, "audio-stop")
            await client.write_event(SynthesizeStart().event())
            await client.write_event(SynthesizeChunk(text=f"Client {i}. Says hi.").event())
            await client.write_event(SynthesizeStop().event())
            return await _until(client, "synthesize-stopped")

    async def together() -> list[list[Event]]:
        return await asyncio.gather(*(one(i) for i in range(4)))

    answers = asyncio.run(together())
    assert [len(_groups(a)) for a in answers] == [2, 1, 2, 1]
    # the HTTP endpoint of the same process still answers
    assert server.health()["status"] == "ok"


def _refused(args: list[str], cwd: Path) -> str:
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([*ENGINE, "serve", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    return done.stderr + done.stdout


def test_lan_needs_the_flag_and_no_http_needs_wyoming(workspace_dir: Path) -> None:
    ws = ["--workspace", str(workspace_dir)]
    lan = _refused([*ws, "--wyoming", "tcp://0.0.0.0:10200"], workspace_dir.parent)
    assert "Refusing to serve Wyoming on 0.0.0.0" in lan and "--wyoming-allow-lan" in lan
    nothing = _refused([*ws, "--no-http"], workspace_dir.parent)
    assert "--no-http leaves nothing to serve" in nothing
    bad = _refused([*ws, "--wyoming", "udp://127.0.0.1:1"], workspace_dir.parent)
    assert "is not tcp://HOST:PORT" in bad


async def _announced_then_gone(port: int, while_announced: Any) -> list[str]:
    """The addresses announced as _wyoming._tcp.local. for `port`; `while_announced()` is
    awaited once it is found, and this returns when the announcement is withdrawn."""
    seen: asyncio.Queue[tuple[str, ServiceStateChange]] = asyncio.Queue()
    looking = AsyncZeroconf()
    browser = AsyncServiceBrowser(looking.zeroconf, [SERVICE_TYPE], handlers=[
        lambda zeroconf, service_type, name, state_change: seen.put_nowait(
            (name, state_change))])
    mine, addresses = None, []
    try:
        while True:
            name, change = await asyncio.wait_for(seen.get(), 60)
            if change == ServiceStateChange.Removed and name == mine:
                return addresses
            info = AsyncServiceInfo(SERVICE_TYPE, name)
            if mine is None and change == ServiceStateChange.Added and \
                    await info.async_request(looking.zeroconf, 3000) and info.port == port:
                mine, addresses = name, info.parsed_addresses()
                await while_announced()
    finally:
        await browser.async_cancel()
        await looking.async_close()


def test_wyoming_alone_without_http_announced(workspace_dir: Path) -> None:
    srv = start_server(["--workspace", str(workspace_dir), "--device", "cpu", "--dtype",
                        "float32", "--no-http", "--wyoming", "tcp://127.0.0.1:0",
                        "--zeroconf"], workspace_dir.parent)
    try:
        assert srv.url is None and srv.serving["wyoming"].startswith("tcp://127.0.0.1:")
        assert srv.serving["zeroconf"] == "127.0.0.1"
        port = int(srv.serving["wyoming"].rsplit(":", 1)[1])
        groups: list[bytes] = []

        async def speak_then_stop() -> None:
            async with _client(srv) as client:
                await client.write_event(Synthesize(text="Only Wyoming here.").event())
                groups.extend(_groups(await _until(client, "audio-stop")))
            srv.proc.send_signal(signal.SIGTERM)  # its announcement goes with it

        # Home Assistant finds it by mDNS, at the address it listens on
        assert asyncio.run(_announced_then_gone(port, speak_then_stop)) == ["127.0.0.1"]
        assert len(groups) == 1
        assert srv.proc.wait(timeout=60) == 0 and not srv.renders.exists()
    finally:
        if srv.proc.poll() is None:
            _stop(srv)
