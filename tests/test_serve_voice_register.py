"""`POST /v1/audio/voices` (issue 30): the official `openai` client registers an instant
voice into the workspace, speaks with it, and deletes it; voices a person made stay."""

from __future__ import annotations

import io
import os
import re
import socket
import threading
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


def test_openai_client_registers_speaks_and_deletes_an_instant_voice(
        tmp_path: Path, tiny_model_dir: Path, prepared_voice: Path,
        piper_sentences: list[dict[str, Any]]) -> None:
    import httpx2 as httpx
    import uvicorn

    from engine.serve.app import ServeConfig, create_app
    from engine.serve.pool import Pool

    workspace = tmp_path / "ws"
    workspace.mkdir()
    # a voice a person made (its own instant voice): the server must not delete it
    person = copy_voice(prepared_voice, workspace / "joe")
    make_instant_voice(person, str(tiny_model_dir))
    parts = [sf.read(s["path"], dtype="float32") for s in piper_sentences[:2]]
    rate = parts[0][1]
    clip = tmp_path / "sample.wav"
    sf.write(clip, np.concatenate([p[0] for p in parts]), rate)
    words = " ".join(s["text"] for s in piper_sentences[:2])
    pool = Pool({}, device="cpu", dtype="float32", rows=2, max_queue=4,
                reference_base=str(tiny_model_dir))
    app = create_app(pool, ServeConfig(timeout_s=300, workspace=str(workspace),
                                       max_body=4 << 20))
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    client = openai.OpenAI(api_key="unused", base_url=f"{url}/v1", max_retries=0)
    try:
        with clip.open("rb") as fh:
            made = client.audio.voices.create(name="nina", audio_sample=fh,
                                              consent="I agree to my voice being cloned.",
                                              extra_body={"ref_text": words})
        assert made.id == made.name == "nina" and made.type == "audio_sample"
        instant = read_instant(workspace / "nina")
        assert instant is not None and instant.text == words
        assert instant.base == str(tiny_model_dir)
        with httpx.Client(base_url=url, timeout=300) as http:
            listed = {v["id"]: v for v in http.get("/v1/audio/voices").json()["data"]}
        assert listed["nina"]["tier"] == Tier.INSTANT
        assert listed["nina"]["base"] == str(tiny_model_dir)
        speech = client.audio.speech.create(model="tts-1", voice="nina", input="Hello there.",
                                            response_format="wav",
                                            extra_body={"max_frames": 8, "seed": 1})
        assert sf.read(io.BytesIO(speech.content))[1] == 24000
        with clip.open("rb") as fh, pytest.raises(openai.ConflictError):
            client.audio.voices.create(name="nina", audio_sample=fh, consent="yes")
        with pytest.raises(openai.BadRequestError, match="is not one this server takes"):
            client.audio.voices.create(name="../x", audio_sample=b"RIFF", consent="yes")
        with pytest.raises(openai.BadRequestError, match="s long; send 3 to 30 s"):
            short = io.BytesIO()
            sf.write(short, np.zeros(rate, dtype=np.float32), rate, format="WAV")
            client.audio.voices.create(name="brief", audio_sample=short.getvalue(),
                                       consent="yes")
        with pytest.raises(openai.PermissionDeniedError, match="not made by this server"):
            client.audio.voices.delete("joe")
        gone = client.audio.voices.delete("nina")
        assert gone.deleted and not (workspace / "nina").exists()
        assert person.is_dir() and read_instant(person) is not None
        with httpx.Client(base_url=url, timeout=300) as http:
            assert "nina" not in http.get("/v1/audio/voices").json()["voices"]

        # the README's example, as written, against this server (its clip: nina.wav)
        (tmp_path / "nina.wav").write_bytes(clip.read_bytes())
        readme = (ROOT / "README.md").read_text(encoding="utf-8")
        example = next(code for code in re.findall(r"```python\n(.*?)```", readme, re.S)
                       if "audio.voices.create" in code)
        cwd = os.getcwd()
        os.chdir(tmp_path)
        try:
            exec(compile(example, "README.md", "exec"), {"client": client})
        finally:
            os.chdir(cwd)
        assert not (workspace / "nina").exists()  # it deleted the voice it made
    finally:
        server.should_exit = True
        thread.join(60)
