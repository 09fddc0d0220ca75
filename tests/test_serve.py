"""`voxshard-engine serve`, the real server on loopback (tiny model), driven by the official
`openai` client, curl, and raw HTTP: formats, streaming, models, keys, concurrency, the
error shapes, a client that hangs up, the bounded queue, and the README's examples.

One server for the whole module (started as a user would, `voxshard-engine --json serve`);
its JSON events are collected to see the request log it writes."""

from __future__ import annotations

import base64
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx2 as httpx
import numpy as np
import openai
import pytest
import soundfile as sf

from tests.helpers.serving import KEY, Server, start_server
from tests.helpers.voices import make_workspace

ROOT = Path(__file__).resolve().parents[1]
ENGINE = [sys.executable, "-m", "engine.cli.main"]
#: short renders: the tiny model speaks noise and rarely ends a chunk by itself
SHORT = {"max_frames": 12, "seed": 3}
QUEUE = 20  # above the 16 concurrent clients


@pytest.fixture(scope="module")
def workspace_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_workspace(tmp_path_factory.mktemp("serve"), tiny_model_dir)


@pytest.fixture(scope="module")
def server(workspace_dir: Path, tiny_model_dir: Path) -> Iterator[Server]:
    ws = workspace_dir
    root = ws.parent
    (root / "key").write_text(KEY + "\n")
    srv = start_server(["--workspace", str(ws), "--port", "0", "--api-key-file",
                        str(root / "key"), "--device", "cpu", "--dtype", "float32",
                        "--queue", str(QUEUE), "--timeout", "120",
                        "--reference-base", str(tiny_model_dir)], root)
    yield srv
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=60) in (0, 130)
    assert not srv.renders.exists()  # the private renders folder goes with the server


def test_speech_create_wav_at_24khz(server: Server) -> None:
    response = server.client().audio.speech.create(
        model="tts-1", voice="ada", input="Hello from the tiny voice.", response_format="wav",
        extra_body=SHORT)
    audio, rate = sf.read(io.BytesIO(response.content))
    assert rate == 24000 and audio.ndim == 1 and len(audio) > 0
    # every other format decodes to the same length of audio
    for fmt in ("mp3", "opus", "flac"):
        other = server.client().audio.speech.create(
            model="voxshard", voice="ada/ada-v1", input="Hello from the tiny voice.",
            response_format=fmt, extra_body=SHORT)
        decoded, rate = sf.read(io.BytesIO(other.content))
        assert rate == 24000 and len(decoded) > 0, fmt
    pcm = server.client().audio.speech.create(model="tts-1", voice="ada", input="Hello there.",
                                              response_format="pcm", extra_body=SHORT)
    assert len(pcm.content) % 2 == 0 and len(pcm.content) > 0


def test_stream_sends_audio_before_the_render_is_done(server: Server) -> None:
    text = " ".join(f"Sentence number {i} is here." for i in range(12))
    pieces: list[int] = []
    with server.client().audio.speech.with_streaming_response.create(
            model="tts-1", voice="ada", input=text, response_format="pcm", stream_format="sse",
            extra_body={"max_frames": 40, "seed": 1}) as response:
        lines = response.iter_lines()
        events = (json.loads(line[5:]) for line in lines if line.startswith("data:"))
        first = next(events)
        assert first["type"] == "speech.audio.delta"
        pieces.append(len(base64.b64decode(first["audio"])))
        # the request is still open on the server when the first audio is here
        assert server.health()["streams"] >= 1
        done = None
        for event in events:
            if event["type"] == "speech.audio.delta":
                pieces.append(len(base64.b64decode(event["audio"])))
            else:
                done = event
    assert done is not None and done["type"] == "speech.audio.done"
    assert len(pieces) >= 3 and pieces[0] < sum(pieces) / 2, pieces
    assert done["usage"]["output_tokens"] == sum(pieces) // 2 // 1920

    # raw audio streaming: a WAV header of unknown length, then the samples in pieces
    with server.client().audio.speech.with_streaming_response.create(
            model="tts-1", voice="ada", input=text, response_format="wav",
            stream_format="audio", extra_body={"max_frames": 40, "seed": 1}) as response:
        body = b"".join(response.iter_bytes())
    audio, rate = sf.read(io.BytesIO(body))
    assert rate == 24000 and len(audio) * 2 == sum(pieces)  # the same seed, the same speech

    # Ogg Opus is encoded page by page as the audio comes
    with server.client().audio.speech.with_streaming_response.create(
            model="tts-1", voice="ada", input=text, response_format="opus",
            stream_format="audio", extra_body={"max_frames": 40, "seed": 1}) as response:
        opus = b"".join(response.iter_bytes())
    decoded, rate = sf.read(io.BytesIO(opus))
    assert rate == 24000 and len(decoded) == len(audio)


def test_speed_is_honoured_and_instructions_pass(server: Server) -> None:
    def length(**extra: object) -> int:
        response = server.client().audio.speech.create(
            model="tts-1", voice="ada", input="Faster, please.", response_format="wav",
            extra_body={"max_frames": 24, "seed": 5}, **extra)  # type: ignore[arg-type]
        return len(sf.read(io.BytesIO(response.content))[0])

    normal, double = length(), length(speed=2.0)
    # the same seed makes the same speech; a phase vocoder at rate 2 halves it (to a frame)
    assert abs(double - normal / 2) <= 512, (normal, double)
    # a model that takes no instruction still answers (the worker logs that it was ignored)
    assert length(instructions="Speak softly.") == normal


def test_each_speak_setting_of_the_schema_is_a_request_field(server: Server) -> None:
    """loudness_lufs, which the server names nowhere, reaches the synthesis: a speak
    setting is a request field by its schema. An unknown field and a value out of bounds
    are refused in OpenAI's shape, the bound in the schema's words."""
    from engine.config.schema import rule_of

    def level(**extra: object) -> float:
        response = server.client().audio.speech.create(
            model="tts-1", voice="ada", input="Quiet, then quieter.", response_format="wav",
            extra_body={**SHORT, **extra})
        audio = sf.read(io.BytesIO(response.content))[0]
        return float(np.sqrt(np.mean(np.square(audio))))

    # the same seed makes the same speech; 20 LU quieter is a tenth of the amplitude
    assert level(loudness_lufs=-50) / level(loudness_lufs=-30) == pytest.approx(0.1, rel=0.05)
    for extra, code, words in (
            ({"colour": "red"}, "unknown_parameter", "Unknown parameter: 'colour'"),
            ({"loudness_lufs": 5}, "invalid_value",
             f"loudness_lufs {rule_of('speak.loudness_lufs').problem(5)}.")):
        with pytest.raises(openai.BadRequestError) as info:
            server.client().audio.speech.create(model="tts-1", voice="ada", input="Hi.",
                                                extra_body={**SHORT, **extra})
        error = info.value
        assert (error.code, error.param) == (code, next(iter(extra))), error.body
        assert words in str(error.body["message"]), error.body  # type: ignore[index]


def test_models_voices_and_health(server: Server) -> None:
    for voice in ("ada", "ada/ada-v1"):  # the voice and its latest export: one model
        server.client().audio.speech.create(model="tts-1", voice=voice, input="Hi.",
                                            response_format="pcm", extra_body={"max_frames": 2})
    ids = {m.id for m in server.client().models.list()}
    assert {"voxshard", "tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= ids
    with server.http() as http:
        voices = http.get("/v1/audio/voices").json()
        health = http.get("/health").json()
    assert voices["voices"] == ["ada", "ada/ada-v1"]
    assert {v["language"] for v in voices["data"]} == {"english"}
    assert health["model_loaded"] and health["device"] == "cpu"
    assert health["loaded"] == ["ada", "ada/ada-v1"] and health["workers"] == 1


def test_wrong_or_missing_key_is_refused(server: Server) -> None:
    with pytest.raises(openai.AuthenticationError) as info:
        server.client(key="wrong-key-0123456789abcdef").models.list()
    assert info.value.status_code == 401
    assert info.value.body["code"] == "invalid_api_key"  # type: ignore[index]
    with server.http(key=None) as http:
        answer = http.post("/v1/audio/speech", json={"input": "hi", "voice": "ada"})
    assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"


def test_sixteen_concurrent_clients_all_answered(server: Server) -> None:
    before = server.health()["served"]

    def one(i: int) -> int:
        response = server.client().audio.speech.create(
            model="tts-1", voice="ada", input=f"Client number {i} says hello.",
            response_format="wav", extra_body={"max_frames": 10, "seed": i})
        audio, rate = sf.read(io.BytesIO(response.content))
        assert rate == 24000
        return len(audio)

    with ThreadPoolExecutor(16) as pool:
        lengths = list(pool.map(one, range(16)))
    assert len(lengths) == 16 and all(n > 0 for n in lengths)
    health = server.health()
    assert health["served"] - before == 16 and health["queue_depth"] == 0


BAD = [
    ({"input": "hi", "voice": "ada", "model": "gpt-9"}, 404, "model_not_found"),
    ({"input": "hi", "voice": "alloy"}, 404, "voice_not_found"),
    ({"input": "   ", "voice": "ada"}, 400, "empty_input"),
    ({"input": "x" * 5000, "voice": "ada"}, 413, "input_too_long"),
    ({"input": "hi", "voice": "ada", "response_format": "aac"}, 400, "unsupported_format"),
    ({"input": "hi", "voice": "ada", "stream_format": "chunks"}, 400, "invalid_value"),
    ({"input": "hi", "voice": "ada", "speed": 9}, 400, "invalid_value"),
    ({"input": "hi", "voice": "ada", "speed": 2, "stream_format": "audio"}, 400, "invalid_value"),
    ({"input": 5, "voice": "ada"}, 400, "invalid_type"),
    ({"voice": "ada"}, 400, "missing_field"),
    ({"input": "hi", "reference_audio": "not base64!"}, 400, "invalid_value"),
    ({"input": "hi", "reference_audio": base64.b64encode(b"RIFF not audio").decode()}, 400,
     "invalid_value"),
    ({"input": "hi", "voice": "ada", "seed": -4}, 400, "invalid_value"),
    ({"input": "hi", "voice": "ada", "seed": 1.5}, 400, "invalid_type"),
    ({"input": "hi", "voice": "ada", "batch_size": 4}, 400, "unknown_parameter"),
]


@pytest.mark.parametrize(("body", "status", "code"), BAD)
def test_bad_input_gets_openai_errors(server: Server, body: dict[str, Any], status: int,
                                      code: str) -> None:
    with server.http() as http:
        answer = http.post("/v1/audio/speech", json=body)
    assert answer.status_code == status
    error = answer.json()["error"]
    assert error["code"] == code and error["message"].endswith(".")
    assert set(error) == {"message", "type", "param", "code"}


def _clip(seconds: float) -> str:
    """base64 of a WAV: a gliding tone with noise, enough for the speaker encoder."""
    t = np.arange(int(24000 * seconds)) / 24000
    wave = 0.3 * np.sin(2 * np.pi * (150 + 60 * t) * t)
    wave += 0.05 * np.random.default_rng(0).standard_normal(t.size)
    buffer = io.BytesIO()
    sf.write(buffer, wave.astype(np.float32), 24000, format="WAV")
    return base64.b64encode(buffer.getvalue()).decode()


def test_cloning_from_a_reference_clip(server: Server) -> None:
    extra = {"reference_audio": _clip(2.0), "reference_text": "A short reference.", **SHORT}
    before = len(server.logged())
    response = server.client().audio.speech.create(
        model="tts-1", voice="anything", input="Spoken in the clip's voice.",
        response_format="wav", extra_body=extra)
    audio, rate = sf.read(io.BytesIO(response.content))
    assert rate == 24000 and len(audio) > 0
    assert [r["voice"] for r in server.logged_since(before)] == ["(reference)"]
    with server.http() as http:
        short = http.post("/v1/audio/speech", json={"input": "hi", "reference_audio": _clip(0.3)})
    assert short.status_code == 400 and "reference clip is 0.3 s" in short.json()["error"][
        "message"]
    assert _renders_empty(server)  # the client's clip went with its request


def test_reference_audio_needs_the_server_flag() -> None:
    from engine.serve.request import ApiError, parse_speech

    body = json.dumps({"input": "hi", "reference_audio": _clip(1.0)}).encode()
    with pytest.raises(ApiError) as info:
        parse_speech(body, voices={"ada"}, formats=("wav",), max_input=100,
                     allow_reference=False)
    assert (info.value.status, info.value.code) == (400, "reference_not_allowed")


def test_malformed_bodies_and_unknown_routes(server: Server) -> None:
    with server.http() as http:
        bad_json = http.post("/v1/audio/speech", content=b"{\"input\": ",
                             headers={"Content-Type": "application/json"})
        too_big = http.post("/v1/audio/speech", content=b" " * (2 << 20))
        nowhere = http.get("/v1/nothing")
        wrong_method = http.delete("/v1/models")
    assert (bad_json.status_code, bad_json.json()["error"]["code"]) == (400, "invalid_json")
    assert (too_big.status_code, too_big.json()["error"]["code"]) == (413, "body_too_large")
    assert nowhere.status_code == 404 and "error" in nowhere.json()
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()


def test_client_hanging_up_cancels_its_request(server: Server) -> None:
    text = " ".join(f"A long sentence number {i} to keep the rows busy." for i in range(16))
    before = len(server.logged())
    with server.http() as http, http.stream(
            "POST", "/v1/audio/speech",
            json={"input": text, "voice": "ada", "response_format": "pcm",
                  "stream_format": "audio", "max_frames": 60, "seed": 2}) as response:
        assert response.status_code == 200
        next(response.iter_raw())  # the first audio, then the client goes away
    # the server ends that request as cancelled (status 499 in its log) and holds nothing
    waited = _wait_for(server, lambda h: h["streams"] == 0 and h["queue_depth"] == 0)
    assert waited
    assert [r["status"] for r in server.logged_since(before)] == [499]
    assert _renders_empty(server)


def test_beyond_the_queue_429_with_retry_after(server: Server) -> None:
    text = " ".join(f"Queued sentence number {i} waits its turn." for i in range(16))
    body = json.dumps({"input": text, "voice": "ada", "response_format": "pcm",
                       "stream_format": "audio", "max_frames": 60}).encode()
    host, port = server.url.split("//")[1].split("/")[0].split(":")
    head = (f"POST /v1/audio/speech HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {KEY}"
            f"\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
    before = len(server.logged())
    held = []
    try:
        # streamed requests run one after another in the worker: these fill the queue
        for _ in range(QUEUE):
            sock = socket.create_connection((host, int(port)))
            sock.sendall(head.encode() + body)
            held.append(sock)
        assert _wait_for(server, lambda h: h["queue_depth"] == QUEUE)
        with server.http() as http:
            answer = http.post("/v1/audio/speech", content=body,
                               headers={"Content-Type": "application/json"})
        assert answer.status_code == 429
        assert answer.json()["error"]["code"] == "rate_limit_exceeded"
        assert int(answer.headers["retry-after"]) >= 1
    finally:
        for sock in held:
            sock.close()  # every client hangs up: each request is cancelled, rows freed
    assert _wait_for(server, lambda h: h["streams"] == 0 and h["queue_depth"] == 0)
    statuses = [r["status"] for r in server.logged_since(before, QUEUE + 1)]
    assert statuses.count(429) == 1 and statuses.count(499) == QUEUE, statuses
    assert _renders_empty(server)


def _wait_for(server: Server, ok: Any, tries: int = 600) -> bool:
    """Polls the server's health until `ok` (a count of tries, not a time limit to meet)."""
    import time

    for _ in range(tries):
        if ok(server.health()):
            return True
        time.sleep(0.1)
    return False


def _renders_empty(server: Server) -> bool:
    import time

    for _ in range(600):
        if not any(server.renders.iterdir()):
            return True
        time.sleep(0.1)
    return False


def _readme_section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index("## Use your voice in other programs")
    end = text.index("\n## ", start + 5)
    return text[start:end]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_readme_examples_run(server: Server, tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    section = _readme_section()
    blocks = re.findall(r"```(bash|python)\n(.*?)```", section, re.S)
    curl = [code for lang, code in blocks if lang == "bash" and code.startswith("curl")]
    # registering a voice needs a server with a workspace: test_serve_voice_register.py
    # runs that example against one
    python = [code for lang, code in blocks if lang == "python"
              and "audio.voices.create" not in code]
    assert curl and python
    base = server.url.removesuffix("/v1")
    env = {**os.environ, "VOXSHARD_API_KEY": KEY}
    for code in curl:
        run = subprocess.run(["bash", "-e", "-o", "pipefail", "-c",
                              code.replace("http://127.0.0.1:8000", base)],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["voices"] == ["ada", "ada/ada-v1"]
    audio, rate = sf.read(tmp_path / "hello.wav")
    assert rate == 24000 and len(audio) > 0
    streamed = (tmp_path / "streamed.pcm").stat().st_size
    assert streamed > 0 and streamed % 2 == 0
    (tmp_path / "hello.wav").unlink()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VOXSHARD_API_KEY", KEY)
    for code in python:  # run here: the openai package is already imported
        exec(compile(code.replace("http://127.0.0.1:8000", base), "README.md", "exec"), {})
    audio, rate = sf.read(tmp_path / "hello.wav")
    assert rate == 24000 and len(audio) > 0


def test_non_loopback_host_needs_a_key(tmp_path: Path) -> None:
    run = subprocess.run([*ENGINE, "serve", str(tmp_path), "--host", "0.0.0.0"],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 1
    assert "Refusing to serve on 0.0.0.0 without an API key" in run.stderr


# -- fuzz -------------------------------------------------------------------------------------

def _hostile_bodies() -> list[bytes]:
    """Malformed and hostile bodies, the same every run (seeded)."""
    import random

    rng = random.Random(16)
    ok = {"model": "tts-1", "input": "Fine.", "voice": "ada", "response_format": "pcm",
          "max_frames": 2}
    weird: list[Any] = [None, True, 0, -1, 1.5, 1e308, -1e308, 2**70, "", "x", [], {}, [1, "a"],
                        {"a": {"b": []}}, "ada\u0000", "\u202etts-1", "wav\n"]
    texts = ["\u0000\u0000", "\u202eReversed text\u202c.", "🎉" * 40, "e\u0301" * 50,
             "\ufeffBOM first.", "\uffff\U0010ffff", "日本語のテキストです。", "Z\u0336" * 60,
             "\r\n\t \u2028\u2029 line breaks", "<script>alert(1)</script>", "../../etc/passwd",
             "a" * 4096, "%s%n%x{}{0}", "\U0001f600\u200d\U0001f600" * 10]
    bodies: list[bytes] = []
    for name in ("model", "input", "voice", "response_format", "speed", "stream_format",
                 "instructions", "seed", "max_frames", "temperature", "top_k", "language"):
        for value in rng.sample(weird, 6):
            bodies.append(json.dumps({**ok, name: value}).encode())
    for text in texts:
        bodies.append(json.dumps({**ok, "input": text}, ensure_ascii=rng.random() < 0.5)
                      .encode("utf-8", "surrogatepass"))
    bodies += [
        b'{"input": "\\ud800 lone", "voice": "ada"}',  # a lone surrogate, escaped
        b'{"input": "\xff\xfe bad utf-8", "voice": "ada"}',
        b'{"input": "hi", "voice": "ada", "speed": NaN}',
        b'{"input": "hi", "voice": "ada", "speed": Infinity}',
        b'{"input": "hi", "voice": "ada", "seed": 1' + b"0" * 5000 + b"}",
        b"[" * 200_000 + b"]" * 200_000,
        b'{"input": "hi", "voice": "ada", "input": 5}',  # the last duplicate wins
        b"null", b"", b"\x00" * 64, b'"just a string"', b"{" * 3,
        json.dumps({**ok, "user": "someone", "unknown": {"deep": [1, 2, 3]}}).encode(),
    ]
    return bodies


def _server_resources(server: Server) -> tuple[int, int]:
    pid = server.proc.pid
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    threads = int(next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text()
                       .splitlines() if line.startswith("Threads:")))
    return fds, threads


def _raw(server: Server, data: bytes) -> bytes:
    """Send `data` on its own connection, then hang up; returns what came back first."""
    host, port = server.url.split("//")[1].split("/")[0].split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        try:
            return sock.recv(65536)
        except OSError:
            return b""


def test_fuzz_hostile_bodies_leave_the_server_answering(server: Server) -> None:
    with server.http() as http:
        http.get("/health")  # warm: the connection pool and the server's first-use costs
    fds, threads = _server_resources(server)
    statuses: dict[int, int] = {}
    with server.http() as http:
        for body in _hostile_bodies():
            answer = http.post("/v1/audio/speech", content=body,
                               headers={"Content-Type": "application/json"})
            statuses[answer.status_code] = statuses.get(answer.status_code, 0) + 1
            if answer.status_code == 200:
                assert len(answer.content) % 2 == 0  # pcm
            else:
                error = answer.json()["error"]
                assert set(error) == {"message", "type", "param", "code"}
                assert "Traceback" not in error["message"]
        # 10 MB of input: refused from its length alone
        huge = json.dumps({"input": "x" * 10_000_000, "voice": "ada"}).encode()
        answer = http.post("/v1/audio/speech", content=huge)
        assert answer.status_code == 413
    assert set(statuses) <= {200, 400, 404, 413}, statuses
    assert statuses.get(200, 0) >= 5 and statuses.get(400, 0) >= 30, statuses

    auth = f"Authorization: Bearer {KEY}\r\n"
    start = f"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\n{auth}"
    # a chunked body that stops in the middle of a chunk, and one that never ends
    _raw(server, (start + "Transfer-Encoding: chunked\r\n\r\n100\r\n" + "{" * 50).encode())
    _raw(server, (start + "Transfer-Encoding: chunked\r\n\r\n5\r\n{\"inp\r\n").encode())
    # a body shorter than its Content-Length; a chunk size that is not a number; no request line
    _raw(server, (start + "Content-Length: 1000\r\n\r\n{\"input\": \"hi\"").encode())
    assert _raw(server, (start + "Transfer-Encoding: chunked\r\n\r\nzz\r\n").encode()
                ).startswith(b"HTTP/1.1 400")
    assert _raw(server, b"GARBAGE\r\n\r\n").startswith(b"HTTP/1.1 400")
    # a chunked body over the limit is cut off with 413 while it is read
    big = b"".join(b"10000\r\n" + b" " * 0x10000 + b"\r\n" for _ in range(20)) + b"0\r\n\r\n"
    assert _raw(server, (start + "Transfer-Encoding: chunked\r\n\r\n").encode() + big
                ).startswith(b"HTTP/1.1 413")

    # still answering, nothing held: no queue, no stream, no render file, no fd or thread left
    assert _wait_for(server, lambda h: h["queue_depth"] == 0 and h["streams"] == 0)
    response = server.client().audio.speech.create(model="tts-1", voice="ada", input="Still here.",
                                                   response_format="wav", extra_body=SHORT)
    assert sf.read(io.BytesIO(response.content))[1] == 24000
    assert _renders_empty(server)
    after_fds, after_threads = _server_resources(server)
    # a little slack: the keep-alive connection of the last client may still be open
    assert after_fds <= fds + 2, (fds, after_fds)
    assert after_threads <= threads + 2, (threads, after_threads)


def test_time_limit_and_keyless_guard(workspace_dir: Path) -> None:
    """A server without a key (in this process, on a thread) whose per-request limit is far
    shorter than the render asked of it."""
    import time

    import uvicorn

    from engine.serve.app import ServeConfig, create_app
    from engine.serve.pool import Pool
    from engine.serve.voices import discover

    pool = Pool(discover([], workspace_dir), device="cpu", dtype="float32", rows=2, max_queue=4)
    app = create_app(pool, ServeConfig(timeout_s=0.2))
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    text = " ".join(f"Sentence {i} of a render far longer than the limit." for i in range(40))
    try:
        with httpx.Client(base_url=url, timeout=300) as http:
            # without a key, only this computer's programs: not a page in a browser
            rebound = http.get("/health", headers={"Host": "evil.example:8000"})
            page = http.get("/health", headers={"Origin": "https://evil.example"})
            local = http.get("/health", headers={"Origin": "http://localhost:3000"})
            assert (rebound.status_code, rebound.json()["error"]["code"]) == (
                403, "forbidden_host")
            assert (page.status_code, page.json()["error"]["code"]) == (403, "forbidden_origin")
            assert local.status_code == 200
            answer = http.post("/v1/audio/speech", json={"input": text, "voice": "ada",
                                                         "max_frames": 60})
            assert answer.status_code == 504
            assert answer.json()["error"]["code"] == "timeout"
            for _ in range(600):  # the cancelled rows are freed and its file removed
                if http.get("/health").json()["queue_depth"] == 0 and not any(
                        pool.renders_dir.iterdir()):
                    break
                time.sleep(0.1)
            else:
                raise AssertionError("the timed-out request was still held")
    finally:
        server.should_exit = True
        thread.join(60)
        sock.close()
    assert not thread.is_alive() and not pool.renders_dir.exists()


def test_api_serve_speaks_then_frees_its_port(workspace_dir: Path) -> None:
    """`api.serve` (the CLI's own start) in this process: the settings as keywords, checked
    by the schema; a real client speaks; stopping it frees the port."""
    from engine import api
    from engine.core.errors import InputError

    with pytest.raises(InputError, match="port must be at least 0 and at most 65535"):
        api.serve(port=70000)
    with pytest.raises(InputError, match="Unknown serve setting"):
        api.serve(colour="red")
    export = workspace_dir / "ada" / "exports" / "ada-v1"  # one voice: a path, not a list
    with api.serve(targets=export, port=0, device="cpu", dtype="float32", rows=2,
                   max_loaded=1) as served:
        assert served.url == f"http://127.0.0.1:{served.port}/v1"
        client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0,
                               timeout=120)
        response = client.audio.speech.create(model="tts-1", voice="ada-v1", input="Hello.",
                                              response_format="wav", extra_body=SHORT)
        audio, rate = sf.read(io.BytesIO(response.content))
        assert rate == 24000 and len(audio) > 0
    assert served.stop()["served"] == 1  # stopped once; a second stop tells the same
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{served.port}/health", timeout=5)
    again = socket.socket()
    again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        again.bind(("127.0.0.1", served.port))  # as a server starting next would
    finally:
        again.close()


def test_each_trained_run_is_a_voice(trained_run: dict[str, Any], tmp_path: Path) -> None:
    """A workspace voice without an export: it and each run with a checkpoint are listed by
    stable names with the voice's language, and speak; `joe` (its latest run's latest
    checkpoint) and `joe/r1` load the same thing, so they share one warm worker."""
    from tests.helpers.voices import copy_voice

    ws = tmp_path / "ws"
    voice = copy_voice(trained_run["voice"], ws / "joe")
    (voice / "runs" / "empty").mkdir()  # a run that never saved a checkpoint: not offered
    srv = start_server(["--workspace", str(ws), "--port", "0", "--device", "cpu",
                        "--dtype", "float32"], tmp_path)
    try:
        with srv.http(None) as http:
            listed = http.get("/v1/audio/voices").json()["data"]
            assert [(v["id"], v["kind"], v["language"]) for v in listed] == [
                ("joe", "voice", "english"), ("joe/r1", "run", "english")]
            for name in ("joe/r1", "joe"):
                r = http.post("/v1/audio/speech", json={
                    "model": "tts-1", "voice": name, "input": "From the run.",
                    "response_format": "wav", **SHORT})
                assert r.status_code == 200, r.text
                assert sf.read(io.BytesIO(r.content))[1] == 24000
            health = http.get("/health").json()
        assert health["loaded"] == ["joe", "joe/r1"] and health["workers"] == 1
    finally:
        srv.proc.send_signal(signal.SIGTERM)
        srv.proc.wait(timeout=60)
