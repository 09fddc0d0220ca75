"""Home Assistant's Wyoming protocol (`serve --wyoming`), driven by the `wyoming` package's own
`AsyncTcpClient` against the real server on the tiny model: describe (following the
workspace, in Home Assistant's order, BCP-47 languages), one-shot synthesize and a
streamed request each one audio group, a language model's markdown, each refusal an
error then the end of the connection, a client that leaves mid-stream, four clients at
once, two rooms taking turns by sentence, Wyoming alone."""

from __future__ import annotations

import asyncio
import re
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

from engine.core.kinds import ServedKind, Tier
from engine.serve.voices import ServedVoice
from engine.serve.wyoming import (
    MODEL_LANGUAGES,
    SERVICE_TYPE,
    home_assistant_order,
    languages_of,
)
from engine.text import complete_sentences
from tests.helpers.serving import ENGINE, ROOT, Server, serve_workspace, start_server
from tests.helpers.voices import make_voice, make_workspace

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
    srv = serve_workspace(workspace_dir, "--queue", "12", "--timeout", "120", "--max-input",
                          "400")
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


async def _describe(server: Server) -> Info:
    async with _client(server) as client:
        await client.write_event(Describe().event())
        return Info.from_event((await _until(client, "info"))[-1])


def _described(server: Server, check: Any) -> set[str]:
    """The names a describe lists, once `check(names)` holds: the server's watch sees a
    change of the workspace beside the rendering, within a second or so, and describe
    answers from what it saw (never reading the disk itself)."""
    for _ in range(120):
        names = {v.name for v in asyncio.run(_describe(server)).tts[0].voices}
        if check(names):
            return names
        time.sleep(0.25)
    raise AssertionError(f"describe never showed the change; it lists {sorted(names)}")


def _as_home_assistant_lists(info: Info) -> dict[str, list[str]]:
    """What Home Assistant's Wyoming integration (components/wyoming/tts.py) makes of `info`:
    for each language of an installed voice, its voices sorted by description (else name)."""
    program = next(t for t in info.tts if t.installed)
    listed: dict[str, list[tuple[str, str]]] = {}
    for voice in program.voices:
        if voice.installed:
            for language in voice.languages:
                listed.setdefault(language, []).append(
                    (voice.description or voice.name, voice.name))
    return {language: [name for _, name in sorted(voices)]
            for language, voices in listed.items()}


def test_describe_follows_the_workspace(server: Server, workspace_dir: Path) -> None:
    info = asyncio.run(_describe(server))
    assert len(info.tts) == 1 and info.tts[0].supports_synthesize_streaming
    voices = {v.name: v for v in info.tts[0].voices}
    assert set(voices) == {"ada", "ada/ada-v1"}
    assert voices["ada"].languages[0] == "en" and voices["ada"].attribution.name
    # an export made while the server runs is offered at a describe soon after
    exports = workspace_dir / "ada" / "exports"
    shutil.copytree(exports / "ada-v1", exports / "ada-v2")
    shutil.copytree(exports / "ada-v1", exports / "ada-v3")
    _described(server, lambda names: {"ada/ada-v2", "ada/ada-v3"} <= names)
    # and one removed is gone from a describe soon after (and from HTTP's list alike)
    shutil.rmtree(exports / "ada-v3")
    _described(server, lambda names: "ada/ada-v3" not in names)
    with server.http() as http:
        assert "ada/ada-v3" not in http.get("/v1/audio/voices").json()["voices"]


def test_home_assistant_lists_the_best_tier_first(server: Server) -> None:
    listed = _as_home_assistant_lists(asyncio.run(_describe(server)))
    # the voice a new assistant picks is the first Home Assistant lists: the plain name
    # (its best tier); each export stays selectable after it
    assert listed["en"][0] == "ada"
    assert "ada/ada-v1" in listed["en"][1:]  # the workspace's export (others may come)
    # Home Assistant never sends a language: every language listed is a BCP-47 code
    assert all(re.fullmatch(r"[a-z]{2,3}(-[A-Z]{2})?", code) for code in listed)


def test_a_voice_in_another_language_keeps_the_engine_offered() -> None:
    def voice(language: str) -> ServedVoice:
        return ServedVoice("v", Path("v"), ServedKind.VOICE, language, Tier.FULL)

    # Home Assistant offers the engine for the languages its voices list together: a
    # German voice speaks English too, so an English assistant still finds it
    assert languages_of(voice("German"))[0] == "de" and "en" in languages_of(voice("German"))
    assert languages_of(voice("en_GB"))[:2] == ["en-GB", "en"]
    for unknown in ("", "auto", "Klingon"):  # no language: every one the model speaks
        assert languages_of(voice(unknown)) == MODEL_LANGUAGES
    # a tier sorts after its voice's plain name, and the next voice after both
    names = [voice_.name for voice_ in home_assistant_order([
        ServedVoice("ada/instant", Path("i"), ServedKind.INSTANT, "en", Tier.INSTANT),
        ServedVoice("adam", Path("m"), ServedKind.VOICE, "en", Tier.FULL),
        ServedVoice("ada/ada-v1", Path("e"), ServedKind.EXPORT, "en", Tier.FULL),
        ServedVoice("ada", Path("a"), ServedKind.VOICE, "en", Tier.FULL)])]
    assert names == ["ada", "ada/ada-v1", "ada/instant", "adam"]


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

    before = len(server.logged())
    events, during = asyncio.run(speak())
    assert during["queue_depth"] >= 1
    groups = _groups(events)
    assert len(groups) == 1 and len(groups[0]) > 24000 * 2  # over a second of audio
    assert sum(AudioChunk.is_type(e.type) for e in events) > 1
    # the request log the window shows, shared with the HTTP requests: the audio it logs is
    # all the client got, the pauses between the sentences too
    assert _wait_for(lambda: any(r["method"] == "WYOMING" and r["voice"] == "ada/ada-v2"
                                 and r["status"] == 200 for r in server.logged()[before:]))
    line = next(r for r in server.logged()[before:] if r["voice"] == "ada/ada-v2")
    assert line["audio_s"] == pytest.approx(len(groups[0]) / (2 * 24000), abs=0.002)


def test_stream_is_spoken_sentence_by_sentence_in_one_group(server: Server) -> None:
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
    # three sentences in one group: a client that reads to the first audio-stop has all
    assert len(_groups(events)) == 1
    assert SynthesizeStopped.is_type(events[-1].type)


def test_stray_events_are_ignored_and_the_connection_goes_on(server: Server) -> None:
    async def stray() -> list[list[Event]]:
        async with _client(server) as client:
            answers = []
            # a stop with no stream, an event for another service
            await client.write_event(SynthesizeStop().event())
            answers.append(await _until(client, "synthesize-stopped"))
            await client.write_event(Event(type="transcribe", data={}))
            # chunks from a client that never sent synthesize-start are still spoken
            await client.write_event(SynthesizeChunk(text="Hi there.").event())
            await client.write_event(SynthesizeStop().event())
            answers.append(await _until(client, "synthesize-stopped"))
            await client.write_event(Describe().event())
            answers.append(await _until(client, "info"))
            return answers

    stopped, chunked, info = asyncio.run(stray())
    assert len(stopped) == 1
    assert len(_groups(chunked)) == 1
    assert info[-1].type == "info"


async def _to_the_end(client: AsyncTcpClient) -> list[Event]:
    """Every event until the server closes the connection (a refusal's end). The limit
    only keeps a server that never closes from hanging the test, as Home Assistant hung."""
    out: list[Event] = []
    while (event := await asyncio.wait_for(client.read_event(), 60)) is not None:
        out.append(event)
    return out


STREAM_OVER = [SynthesizeStart().event(), SynthesizeChunk(text="Not me. " * 60).event()]


@pytest.mark.parametrize(("events", "code", "status"), [
    ([Synthesize(text="   ").event()], "empty_input", 400),
    ([Synthesize(text="Hello.", voice=SynthesizeVoice(name="nobody")).event()],
     "voice_not_found", 404),
    ([Synthesize(text="x" * 401).event()], "input_too_long", 413),
    ([Event(type="synthesize", data={"text": 42})], "malformed_event", 400),
    ([SynthesizeStart(voice=SynthesizeVoice(name="x")).event(),
      SynthesizeChunk(text="Not me. Nor me.").event(), SynthesizeStop().event()],
     "voice_not_found", 404),
    (STREAM_OVER, "input_too_long", 413),
    # a stream with no text is refused as a one-shot request is (Home Assistant 2026.2
    # streams every request): not a success of no audio
    ([SynthesizeStart(voice=SynthesizeVoice(name="ada")).event(),
      SynthesizeChunk(text="  ").event(), SynthesizeStop().event()], "empty_input", 400),
    ([SynthesizeStart().event(), SynthesizeStop().event()], "empty_input", 400),
], ids=["empty", "unknown-voice", "too-long", "malformed", "stream-unknown-voice",
        "stream-too-long", "stream-empty", "stream-nothing"])
def test_a_refusal_is_an_error_then_the_end(server: Server, events: list[Event], code: str,
                                             status: int) -> None:
    before = len(server.logged())

    async def ask() -> list[Event]:
        async with _client(server) as client:
            for event in events:
                await client.write_event(event)
            return await _to_the_end(client)

    answer = asyncio.run(ask())
    # the error, then nothing: the connection ends, whatever the client makes of `error`
    assert [e.type for e in answer] == ["error"], [e.type for e in answer]
    error = Error.from_event(answer[-1])
    assert error.code == code
    if code == "voice_not_found" and not events[0].type.endswith("start"):
        assert "ada/ada-v1" in error.text  # what to ask for instead
    # one line of the request log says so, naming the voice asked for and the code
    lines = server.logged_since(before)
    assert [(r["status"], r.get("error")) for r in lines] == [(status, code)], lines
    assert lines[0]["voice"] and lines[0]["path"].startswith("synthesize"), lines
    said = next(e["message"] for e in list(server.events) if e.get("request_log") is lines[0])
    assert lines[0]["voice"] in said and code in said, said


def test_a_voice_that_fails_to_load_is_refused_then_the_end(server: Server,
                                                              workspace_dir: Path) -> None:
    broken = make_voice(workspace_dir, "Zed") / "exports" / "zed-v1"
    shutil.copytree(workspace_dir / "ada" / "exports" / "ada-v1", broken)
    for weights in broken.glob("*.safetensors"):
        weights.write_bytes(b"not a model")
    before = len(server.logged())
    try:
        async def ask() -> list[Event]:
            async with _client(server) as client:
                await client.write_event(Synthesize(text="Hello.", voice=SynthesizeVoice(
                    name="zed/zed-v1")).event())
                return await _to_the_end(client)

        _described(server, lambda names: "zed/zed-v1" in names)  # the watch saw zed
        answer = asyncio.run(ask())
        assert [e.type for e in answer] == ["error"]
        assert Error.from_event(answer[0]).code == "voice_load_failed"
        assert [(r["status"], r["voice"]) for r in server.logged_since(before)] == [
            (500, "zed/zed-v1")]
    finally:
        shutil.rmtree(broken.parent.parent)
    _described(server, lambda names: "zed" not in names)


def test_a_language_models_reply_is_spoken(server: Server) -> None:
    reply = ("## Today 🌤️\n**It is 21°C** and *sunny* 😀.\n- Take a [jacket](https://x.y).\n"
             "- Buy 2 kg of apples for $3.50")

    async def speak() -> list[Event]:
        async with _client(server) as client:
            await client.write_event(Synthesize(text=reply).event())
            return await _until(client, "audio-stop", "error")

    events = asyncio.run(speak())
    assert not any(Error.is_type(e.type) for e in events), events[-1].data
    assert len(_groups(events)) == 1 and len(_groups(events)[0]) > 24000


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
    assert [len(_groups(a)) for a in answers] == [1, 1, 1, 1]  # one group a reply
    # the HTTP endpoint of the same process still answers
    assert server.health()["status"] == "ok"


def test_the_start_says_both_addresses(server: Server) -> None:
    # the line a person reads when the server starts names the Wyoming address too
    detail = str(server.serving["detail"])
    assert str(server.url) in detail and str(server.serving["wyoming"]) in detail
    assert server.serving["wyoming_voices"][0][0] == "ada"


def test_two_rooms_take_turns_by_sentence(workspace_dir: Path) -> None:
    # one row: what another room gets is only what the worker's turns give it
    srv = start_server(["--workspace", str(workspace_dir), "--device", "cpu", "--dtype",
                        "float32", "--rows", "1", "--timeout", "300", "--no-http",
                        "--wyoming", "tcp://127.0.0.1:0"], workspace_dir.parent)
    long_reply = " ".join(f"Room one says sentence {i} of its long reply." for i in range(6))
    order: list[tuple[str, str]] = []

    async def read(client: AsyncTcpClient, room: str, last: str,
                   heard: asyncio.Event | None = None) -> None:
        while True:
            event = await asyncio.wait_for(client.read_event(), 300)
            assert event is not None and not Error.is_type(event.type), event
            order.append((room, event.type))
            if heard is not None and AudioChunk.is_type(event.type):
                heard.set()
            if event.type == last:
                return

    async def one(heard: asyncio.Event) -> None:
        async with _client(srv) as client:  # a reply streamed from a language model
            await client.write_event(SynthesizeStart().event())
            await client.write_event(SynthesizeChunk(text=long_reply).event())
            await client.write_event(SynthesizeStop().event())
            await read(client, "one", "synthesize-stopped", heard)

    async def two(heard: asyncio.Event) -> None:
        await heard.wait()  # room one is speaking already
        async with _client(srv) as client:
            await client.write_event(Synthesize(text="Room two asks one thing.").event())
            await read(client, "two", "audio-stop")

    async def both() -> None:
        heard = asyncio.Event()
        await asyncio.gather(one(heard), two(heard))

    try:
        asyncio.run(both())
    finally:
        _stop(srv)
    # room two's sentence took its turn between room one's sentences: its reply ended
    # while room one still had sentences to say, not after all six
    ends = [i for i, (room, kind) in enumerate(order) if kind == "audio-stop"]
    assert order[ends[0]][0] == "two", order
    assert ends[-1] > ends[0] and order[ends[-1]][0] == "one"


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
    assert "Turning --http off leaves nothing to serve" in nothing
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
