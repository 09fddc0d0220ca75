"""Many listeners at once, through the official `openai` client against the real server
(tiny model, CPU): streams advance together in the warm worker's one batch, and a stream
beyond the batch's rows waits in a queue whose place the request log records.

Orderings, not durations: every stream that has a row sends its first audio before any
stream ends (one at a time, the second would start only after the first ended)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.serving import Server, serve_workspace
from tests.helpers.voices import make_workspace

#: long enough that the tiny model's rows run to the cap (it rarely ends a sentence)
SENTENCE = ("The lighthouse keeper climbed the winding stairs every evening, "
            "counting each step aloud while the gulls circled far below.")
ROWS = 3


@pytest.fixture(scope="module")
def server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    workspace = make_workspace(tmp_path_factory.mktemp("streams"), tiny_model_dir)
    srv = serve_workspace(workspace, "--rows", str(ROWS), "--timeout", "300")
    yield srv
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=60) in (0, 130)


def _stream(server: Server, voice: str, start: threading.Barrier) -> dict[str, Any]:
    client = server.client()
    start.wait()
    asked = time.monotonic()
    first = None
    size = 0
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice=voice, input=SENTENCE, response_format="pcm",
            extra_body={"stream_format": "audio", "max_frames": 200, "seed": 1}) as response:
        assert response.status_code == 200
        for piece in response.iter_bytes():
            if piece and first is None:
                first = time.monotonic()
            size += len(piece)
    return {"asked": asked, "first": first, "end": time.monotonic(), "bytes": size}


def test_streams_advance_together_and_one_beyond_the_rows_waits_its_turn(
        server: Server) -> None:
    voice = server.serving["voices"][0]
    before = len(server.logged())
    count = ROWS + 1
    start = threading.Barrier(count)
    with ThreadPoolExecutor(count) as pool:
        streams = list(pool.map(lambda _i: _stream(server, voice, start), range(count)))
    assert all(s["first"] is not None and s["bytes"] > 0 for s in streams)
    by_first = sorted(streams, key=lambda s: s["first"])
    first_end = min(s["end"] for s in streams)
    # the streams with a row all began to play before any of them finished
    assert all(s["first"] < first_end for s in by_first[:ROWS]), streams
    logs = server.logged_since(before, count)
    assert [r["status"] for r in logs] == [200] * count
    # one stream more than the rows: it waited, first in the queue
    assert sorted(r.get("queue_position", 0) for r in logs) == [0] * ROWS + [1], logs
