"""The server never waits on the disk or the model to list its voices (issue 54): while a
long reply renders, Wyoming `describe` (the `wyoming` package's own client), `GET /health`
and `GET /v1/audio/voices` are answered from what the server keeps in memory. Counted, not
timed: a real server in this process, on the tiny model, with the rescan of the workspace
and the resolution of a voice's source counted; neither runs for those answers. A voice
exported meanwhile is still listed soon after: the server's watch rescanned beside. And
what the server accepts sends each write at once (no wait on a delayed ACK)."""

from __future__ import annotations

import asyncio
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
from wyoming.audio import AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeVoice

from engine import api
from engine.serve import server as serve_server
from engine.serve import voices as serve_voices
from engine.serve.watch import UNREAD
from tests.helpers.serving import read_until
from tests.helpers.voices import make_workspace

#: a reply long enough to render all through the listings
LONG = " ".join(f"This is sentence number {i} of a long reply." for i in range(6))


class Counted:
    """A function of the engine, wrapped to count its calls."""

    def __init__(self, wrapped: Any) -> None:
        self.wrapped, self.calls = wrapped, 0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        return self.wrapped(*args, **kwargs)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, Counted]:
    # the server looks both up at each call: the rescan of what is served, and what a voice
    # speaks with (a voice's styles and its worker's identity read the disk through it)
    calls = {"rescan": Counted(serve_server.served_voices),
             "source": Counted(serve_voices.resolve_source)}
    monkeypatch.setattr(serve_server, "served_voices", calls["rescan"])
    monkeypatch.setattr(serve_voices, "resolve_source", calls["source"])
    return calls


@pytest.fixture
def served(tiny_model_dir: Path, tmp_path: Path, counted: dict[str, Counted]) -> Iterator[Any]:
    ws = make_workspace(tmp_path, tiny_model_dir)
    with api.serve(workspace=str(ws), port=0, device="cpu", dtype="float32", rows=2,
                   wyoming="tcp://127.0.0.1:0", timeout_s=300) as serving:
        yield serving


def _client(served: Any) -> AsyncTcpClient:
    host, port = str(served.wyoming).removeprefix("tcp://").rsplit(":", 1)
    return AsyncTcpClient(host, int(port))


async def _describe(served: Any) -> set[str]:
    async with _client(served) as client:
        await client.write_event(Describe().event())
        info = Info.from_event((await read_until(client, "info"))[-1])
    return {v.name for v in info.tts[0].voices}


def _settled(served: Any) -> None:
    """Until the watch trusts its stamp: a workspace made a moment ago is rescanned until
    its folders are older than the file system's clock tick (`watch.RACY_NS`)."""
    for _ in range(200):
        if served.watch.stamp is not UNREAD:
            return
        time.sleep(0.1)
    raise AssertionError("the watch never settled on the workspace's stamp")


def test_listings_while_a_reply_renders_read_nothing(served: Any, counted: dict[str, Counted],
                                                     tmp_path: Path) -> None:
    _settled(served)
    http = httpx.Client(base_url=served.url.removesuffix("/v1"), timeout=60)

    async def scenario() -> tuple[dict[str, int], list[set[str]], bool, list[Event]]:
        async with _client(served) as room:
            await room.write_event(Synthesize(text=LONG, voice=SynthesizeVoice(
                name="ada")).event())
            got = await read_until(room, "audio-start", timeout=300)  # the reply renders now
            assert AudioStart.is_type(got[-1].type), got[-1]
            before = {name: c.calls for name, c in counted.items()}
            rescans = served.watch.rescans
            listed = [await _describe(served) for _ in range(5)]
            for _ in range(3):
                health = (await asyncio.to_thread(http.get, "/health")).json()
                voices = (await asyncio.to_thread(http.get, "/v1/audio/voices")).json()
                assert health["status"] == "ok" and health["voices"] == 2, health
                listed.append(set(voices["voices"]))
            calls = {name: c.calls - before[name] for name, c in counted.items()}
            calls["watch"] = served.watch.rescans - rescans
            # the reply was still under way when all were answered (it counts as served
            # once its last audio is sent)
            under_way = served._service.served == 0
            rest = await read_until(room, "audio-stop", timeout=300)
        return calls, listed, under_way, rest

    try:
        calls, listed, under_way, rest = asyncio.run(scenario())
        assert under_way
        assert AudioStop.is_type(rest[-1].type), rest[-1]
        assert all(names == {"ada", "ada/ada-v1"} for names in listed), listed
        # answered from memory: no rescan of the workspace, no voice's source resolved
        assert calls == {"rescan": 0, "source": 0, "watch": 0}, calls

        # an export made now is listed soon after: the watch rescanned beside, and a
        # describe still only reads what it holds
        exports = tmp_path / "ws" / "ada" / "exports"
        shutil.copytree(exports / "ada-v1", exports / "ada-v2")
        for _ in range(120):
            if "ada/ada-v2" in asyncio.run(_describe(served)):
                break
            time.sleep(0.25)
        else:
            raise AssertionError("the export made while serving was never listed")
        assert counted["rescan"].calls >= 1 and served.watch.rescans >= 1
        assert "ada/ada-v2" in http.get("/v1/audio/voices").json()["voices"]
    finally:
        http.close()


def test_what_the_server_accepts_sends_at_once() -> None:
    """A connection the server accepts (HTTP and Wyoming alike) sends each write at once:
    with Nagle on, a reply written in two parts waits for the client's delayed ACK, some
    40 ms for every /health on a kept-alive connection."""
    listening = serve_server._bind("127.0.0.1", 0)
    client = socket.create_connection(listening.getsockname()[:2])
    accepted, _ = listening.accept()
    try:
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        for sock in (accepted, client, listening):
            sock.close()
