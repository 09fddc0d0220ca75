"""Registration everywhere (issue 30): `serve --workspace W --reference-base B` starts with
no voice at all and takes its first one from a client; without a base to register on, an
empty workspace is refused in one sentence (and its Wyoming service refuses a request
until a voice exists, then lists it). On Ray Serve (the real deployment, on the
session's shared cluster) a voice registered through one replica is served by every
replica, and once deleted through one, by none: the replicas share the workspace on disk
and read it again when it changes."""

from __future__ import annotations

import asyncio
import io
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2 as httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize

from engine.core.kinds import Tier
from tests.helpers.ray_cluster import SharedCluster
from tests.helpers.serving import ROOT, Server, start_server

SHORT = {"max_frames": 8, "seed": 1}
WORDS = "Hello there, this is my voice."
#: most speech requests sent while waiting for both replicas to have served the new voice
MAX_TRIES = 48


def _sample(path: Path, seconds: float = 4.0) -> Path:
    """A clip long enough to register (3-30 s): a voiced-like tone with some noise."""
    rate = 24000
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(0)
    audio = 0.3 * np.sin(2 * np.pi * 140 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    sf.write(path, (audio + 0.01 * rng.standard_normal(len(t))).astype(np.float32), rate)
    return path


def _form(clip: Path, name: str) -> dict[str, Any]:
    return {"data": {"name": name, "consent": "I agree to my voice being cloned.",
                     "ref_text": WORDS},
            "files": {"audio_sample": (clip.name, clip.read_bytes(), "audio/wav")}}


def test_an_empty_workspace_without_a_base_is_refused_in_one_sentence(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from engine.cli.main import main

    empty = tmp_path / "ws"
    empty.mkdir()
    code = main(["serve", "--workspace", str(empty), "--port", "0", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code != 0
    assert f"There is no voice in {empty} yet" in err and "--reference-base" in err


def test_serve_starts_on_an_empty_workspace_and_takes_its_first_voice(
        tmp_path: Path, tiny_model_dir: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    clip = _sample(tmp_path / "sample.wav")
    srv = start_server(["--workspace", str(ws), "--reference-base", str(tiny_model_dir),
                        "--port", "0", "--device", "cpu", "--dtype", "float32",
                        "--wyoming", "tcp://127.0.0.1:0"], ROOT)
    try:
        assert srv.serving["voices"] == []
        # Home Assistant asking before any voice exists: one error event, not a hang-up
        refused = asyncio.run(_wyoming(srv, Synthesize(text="Hello.").event(), "error"))
        assert Error.from_event(refused[-1]).text == "No voice is served here yet."
        client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=300)
        http = srv.http(key=None)
        assert http.get("/v1/audio/voices").json()["data"] == []
        with clip.open("rb") as fh:
            made = client.audio.voices.create(name="nina", audio_sample=fh, consent="yes",
                                              extra_body={"ref_text": WORDS})
        assert made.id == "nina"
        listed = {v["id"]: v for v in http.get("/v1/audio/voices").json()["data"]}
        assert listed["nina"]["tier"] == Tier.INSTANT
        speech = client.audio.speech.create(model="tts-1", voice="nina", input="Hi there.",
                                            response_format="wav", extra_body=SHORT)
        assert sf.read(io.BytesIO(speech.content))[1] == 24000
        info = asyncio.run(_wyoming(srv, Describe().event(), "info"))
        assert [v.name for v in Info.from_event(info[-1]).tts[0].voices][:1] == ["nina"]
        assert client.audio.voices.delete("nina").deleted
        assert http.get("/v1/audio/voices").json()["data"] == []
        http.close()
    finally:
        srv.proc.terminate()
        srv.proc.wait(60)


async def _wyoming(server: Server, event: Event, until: str) -> list[Event]:
    """Send one Wyoming event; every event back up to the first of type `until`."""
    host, port = str(server.serving["wyoming"]).removeprefix("tcp://").rsplit(":", 1)
    async with AsyncTcpClient(host, int(port)) as client:
        await client.write_event(event)
        out: list[Event] = []
        while not out or out[-1].type != until:
            got = await asyncio.wait_for(client.read_event(), 120)
            assert got is not None, f"the server hung up; had {[e.type for e in out]}"
            out.append(got)
        return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _speak(http: httpx.Client) -> int:
    return http.post("/v1/audio/speech", json={
        "model": "tts-1", "voice": "nina", "input": "One of many.",
        "response_format": "wav", **SHORT}).status_code


def _served(http: httpx.Client) -> dict[str, int]:
    """What each replica has served, from /health probes (the proxy picks one each)."""
    seen: dict[str, int] = {}
    for _ in range(64):
        h = http.get("/health").json()
        seen[h["replica"]] = h["served"]
        if len(seen) == 2:
            break
    return seen


def _every_replica_speaks(http: httpx.Client) -> dict[str, int]:
    """Requests for the registered voice until each replica has served some; what each
    served."""
    answers: list[int] = []
    seen: dict[str, int] = {}
    with ThreadPoolExecutor(4) as pool:
        while len(answers) < MAX_TRIES and not (
                len(seen) == 2 and all(n > 0 for n in seen.values())):
            answers += pool.map(lambda _: _speak(http), range(8))
            seen = _served(http)
    assert answers and set(answers) == {200}, answers
    assert len(seen) == 2 and all(n > 0 for n in seen.values()), seen
    return seen


@pytest.mark.slow
def test_ray_serve_replicas_share_registered_voices(
        tmp_path: Path, tiny_model_dir: Path, shared_cluster: SharedCluster) -> None:
    from engine.config.serve import ClusterServeSettings, ServeSettings
    from engine.core.events import Event as EngineEvent
    from engine.serve.ray_deploy import serve_on_ray

    shared_cluster.up()
    ws = tmp_path / "ws"
    ws.mkdir()
    clip = _sample(tmp_path / "sample.wav")
    port = _free_port()
    settings = ServeSettings(workspace=str(ws), reference_base=str(tiny_model_dir), port=port,
                             device="cpu", dtype="float32", rows=2, queue=8, timeout_s=300)
    events: list[EngineEvent] = []
    stop = threading.Event()
    failed: list[BaseException] = []

    def run() -> None:
        try:
            serve_on_ray(settings, ClusterServeSettings(address="auto", replicas=2),
                         on_event=events.append, stop=stop)
        except BaseException as exc:  # reported by the test below
            failed.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300)
    try:
        while not any(e.data.get("state") == "serving" for e in events):
            assert not failed and thread.is_alive(), failed
            time.sleep(0.5)
        serving = next(e for e in events if e.data.get("state") == "serving")
        assert serving.data["voices"] == []  # an empty workspace, ready to register into
        made = http.post("/v1/audio/voices", **_form(clip, "nina"))
        assert made.status_code == 200, made.text
        # every replica speaks the voice one of them registered
        seen = _every_replica_speaks(http)
        # deleted through one replica: no replica speaks it or lists it any more
        gone = http.delete("/v1/audio/voices/nina")
        assert gone.status_code == 200, gone.text
        with ThreadPoolExecutor(4) as pool:
            after = list(pool.map(lambda _: _speak(http), range(16)))
        assert set(after) == {404}, after
        assert all("nina" not in http.get("/v1/audio/voices").json()["voices"]
                   for _ in range(8))
        assert _served(http) == seen  # nothing more was spoken, by either replica
    finally:
        stop.set()
        thread.join(120)
        http.close()
    assert not failed, failed
    assert not thread.is_alive()
