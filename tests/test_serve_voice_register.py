"""`POST /v1/audio/voices` (issue 30): the official `openai` client registers an instant
voice into the workspace, speaks with it, and deletes it; voices a person made stay."""

from __future__ import annotations

import io
import re
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import soundfile as sf

from engine.core.kinds import Tier
from engine.layout.tiers import read_instant
from engine.prepare.instant import make_instant_voice
from tests.helpers.voices import copy_voice

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class _Served:
    """The OpenAI app over a workspace that holds a voice a person made (`person`), and a
    5 s clip of piper's speech (`words` said in it) to register voices from."""

    client: openai.OpenAI
    url: str
    workspace: Path
    person: Path
    clip: Path
    words: str
    rate: int


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path,
           prepared_voice: Path, piper_sentences: list[dict[str, Any]]) -> Iterator[_Served]:
    import uvicorn

    from engine.serve.app import ServeConfig, create_app
    from engine.serve.pool import Pool

    tmp = tmp_path_factory.mktemp("register")
    workspace = tmp / "ws"
    workspace.mkdir()
    # a voice a person made (its own instant voice): the server must not delete it
    person = copy_voice(prepared_voice, workspace / "joe")
    make_instant_voice(person, str(tiny_model_dir))
    parts = [sf.read(s["path"], dtype="float32") for s in piper_sentences[:2]]
    clip = tmp / "sample.wav"
    sf.write(clip, np.concatenate([p[0] for p in parts]), parts[0][1])
    pool = Pool({}, device="cpu", dtype="float32", rows=2, max_queue=4,
                reference_base=str(tiny_model_dir))
    app = create_app(pool, ServeConfig(timeout_s=300, workspace=str(workspace),
                                       max_body=4 << 20))
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        yield _Served(openai.OpenAI(api_key="unused", base_url=f"{url}/v1", max_retries=0),
                      url, workspace, person, clip,
                      " ".join(s["text"] for s in piper_sentences[:2]), parts[0][1])
    finally:
        server.should_exit = True
        thread.join(60)


def _listed(url: str) -> dict[str, Any]:
    import httpx2 as httpx

    with httpx.Client(base_url=url, timeout=300) as http:
        return http.get("/v1/audio/voices").json()


def test_openai_client_registers_speaks_and_deletes_an_instant_voice(
        served: _Served, tiny_model_dir: Path) -> None:
    client, workspace = served.client, served.workspace
    with served.clip.open("rb") as fh:
        made = client.audio.voices.create(name="nina", audio_sample=fh,
                                          consent="I agree to my voice being cloned.",
                                          extra_body={"ref_text": served.words})
    assert made.id == made.name == "nina" and made.type == "audio_sample"
    instant = read_instant(workspace / "nina")
    assert instant is not None and instant.text == served.words
    assert instant.base == str(tiny_model_dir)
    listed = {v["id"]: v for v in _listed(served.url)["data"]}
    assert listed["nina"]["tier"] == Tier.INSTANT
    assert listed["nina"]["base"] == str(tiny_model_dir)
    speech = client.audio.speech.create(model="tts-1", voice="nina", input="Hello there.",
                                        response_format="wav",
                                        extra_body={"max_frames": 8, "seed": 1})
    assert sf.read(io.BytesIO(speech.content))[1] == 24000
    with served.clip.open("rb") as fh, pytest.raises(openai.ConflictError):
        client.audio.voices.create(name="nina", audio_sample=fh, consent="yes")
    gone = client.audio.voices.delete("nina")
    assert gone.deleted and not (workspace / "nina").exists()
    assert "nina" not in _listed(served.url)["voices"]


def test_a_bad_name_a_short_clip_and_a_persons_voice_are_refused(served: _Served) -> None:
    client, rate = served.client, served.rate
    with pytest.raises(openai.BadRequestError, match="is not one this server takes"):
        client.audio.voices.create(name="../x", audio_sample=b"RIFF", consent="yes")
    with pytest.raises(openai.BadRequestError, match="s long; send 3 to 30 s"):
        short = io.BytesIO()
        sf.write(short, np.zeros(rate, dtype=np.float32), rate, format="WAV")
        client.audio.voices.create(name="brief", audio_sample=short.getvalue(),
                                   consent="yes")
    with pytest.raises(openai.PermissionDeniedError, match="not made by this server"):
        client.audio.voices.delete("joe")
    assert served.person.is_dir() and read_instant(served.person) is not None


def test_the_readme_example_registers_speaks_and_deletes_as_written(
        served: _Served, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "nina.wav").write_bytes(served.clip.read_bytes())  # the example's clip
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    example = next(code for code in re.findall(r"```python\n(.*?)```", readme, re.S)
                   if "audio.voices.create" in code)
    monkeypatch.chdir(tmp_path)
    exec(compile(example, "README.md", "exec"), {"client": served.client})
    assert not (served.workspace / "nina").exists()  # it deleted the voice it made
