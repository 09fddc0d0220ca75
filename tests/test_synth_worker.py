"""The warm worker: continuous batching across requests, duplicate ids, cancel of a
running request, a failed voice swap, and exit when the client is gone (tiny model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf

from engine.events import Event
from engine.synth.options import SpeakOptions
from engine.synth.synthesizer import Synthesizer
from engine.synth.voice import resolve_source
from engine.synth.worker import SpeechWorker

SENTENCES = ["The kettle started to whistle.", "She folded the laundry slowly.",
             "Our train was delayed again.", "Fresh bread tastes best warm.",
             "Please water the plants.", "The river curved gently."]
GREEDY = {"do_sample": False, "subtalker_do_sample": False, "max_frames": 14,
          "loudness_lufs": None}


@pytest.fixture(scope="module")
def reference(piper_sentences: list[dict[str, Any]]) -> Path:
    return Path(piper_sentences[0]["path"])


class Client:
    def __init__(self, rows: int = 2) -> None:
        self.events: list[Event] = []
        self.ended: dict[str, Event] = {}
        self.cond = threading.Condition()
        self.worker = SpeechWorker(self.collect, device="cpu", dtype="float32", rows=rows).start()

    def collect(self, event: Event) -> None:
        with self.cond:
            self.events.append(event)
            rid = event.data.get("request")
            if event.kind in ("result", "error") and rid:
                self.ended[rid] = event
            self.cond.notify_all()

    def wait(self, *rids: str, timeout: float = 240) -> dict[str, Event]:
        with self.cond:
            assert self.cond.wait_for(lambda: all(r in self.ended for r in rids), timeout)
            return {r: self.ended[r] for r in rids}


@pytest.fixture(scope="module")
def client(tiny_model_dir: Path, reference: Path) -> Client:
    c = Client(rows=2)
    c.worker.submit({"op": "load", "id": "load", "voice": str(tiny_model_dir),
                     "reference": str(reference), "x_vector_only": True})
    assert c.wait("load")["load"].kind == "result"
    return c


def test_concurrent_requests_share_rows_and_match_speaking_alone(
        client: Client, tiny_model_dir: Path, reference: Path, tmp_path: Path) -> None:
    for i, text in enumerate(SENTENCES):
        client.worker.submit({"op": "speak", "id": f"c{i}", "text": text,
                              "out": str(tmp_path / f"c{i}.wav"), "options": GREEDY})
    ended = client.wait(*[f"c{i}" for i in range(len(SENTENCES))])
    assert all(e.kind == "result" and e.data["batched"] for e in ended.values())
    batcher = client.worker._batcher
    # six one-chunk requests on two rows: finished rows were refilled mid-batch
    assert batcher.refills >= 3
    alone = Synthesizer.load(resolve_source(tiny_model_dir, reference=reference,
                                            x_vector_only=True), device="cpu", dtype="float32")
    same = 0
    for i, text in enumerate(SENTENCES):
        mine = alone.speak(text, SpeakOptions(**GREEDY))
        got, _sr = sf.read(tmp_path / f"c{i}.wav", dtype="float32")
        if (ended[f"c{i}"].data["chunks"][0]["frames"] == len(mine.codes[0])
                and got.shape == mine.audio.shape
                and np.abs(got - mine.audio).max() < 1e-3):
            same += 1
    # greedy rows give the audio of speaking alone (a batch of other rows may round a
    # near-tie differently, as batching chunks of one text may)
    assert same >= len(SENTENCES) - 1


def test_duplicate_request_ids_are_refused(client: Client, tmp_path: Path) -> None:
    long = " ".join(SENTENCES)
    # sampled, several chunks: rows are refilled after sampled frames
    client.worker.submit({"op": "speak", "id": "dup", "text": long,
                          "out": str(tmp_path / "a.wav"),
                          "options": {"seed": 3, "max_frames": 14, "chunk_chars": 40}})
    client.worker.submit({"op": "speak", "id": "dup", "text": "Other.",
                          "out": str(tmp_path / "b.wav"), "options": GREEDY})
    ended = client.wait("dup")
    refused = [e for e in client.events if e.kind == "error" and e.data.get("duplicate_of")]
    assert refused and "already queued or running" in refused[-1].data["message"]
    assert ended["dup"].kind == "result" and (tmp_path / "a.wav").is_file()
    assert not (tmp_path / "b.wav").exists()


def test_cancel_reaches_a_running_request(client: Client, tmp_path: Path) -> None:
    started = threading.Event()

    def watch() -> None:
        with client.cond:
            client.cond.wait_for(lambda: any(
                e.kind == "state" and e.data.get("request") == "run" for e in client.events),
                120)
        started.set()

    threading.Thread(target=watch, daemon=True).start()
    client.worker.submit({"op": "speak", "id": "run", "text": " ".join(SENTENCES * 3),
                          "out": str(tmp_path / "run.wav"),
                          "options": {"max_frames": 60, "chunk_chars": 30, "seed": 1}})
    assert started.wait(120)
    time.sleep(0.5)  # it is generating now
    assert client.worker.cancel("run")
    ended = client.wait("run")["run"]
    done_chunks = [e for e in client.events if e.kind == "progress"
                   and e.data.get("request") == "run" and e.data.get("stage") == "chunks"]
    if ended.kind == "error":
        assert ended.data["code"] == "cancelled", ended.data
    else:
        assert ended.data["cancelled"] and len(ended.data["chunks"]) == len(done_chunks)
    assert len(done_chunks) < 18  # it did not run to the end


def test_a_failed_swap_never_speaks_with_the_old_voice(tiny_model_dir: Path, reference: Path,
                                                       tmp_path: Path) -> None:
    c = Client(rows=2)
    c.worker.submit({"op": "load", "id": "l1", "voice": str(tiny_model_dir),
                     "reference": str(reference), "x_vector_only": True})
    short = tmp_path / "short.wav"
    sf.write(short, np.zeros(2400, dtype="float32"), 24000)  # 0.1 s: refused
    c.worker.submit({"op": "load", "id": "l2", "voice": str(tiny_model_dir),
                     "reference": str(short)})
    c.worker.submit({"op": "speak", "id": "s", "text": "Hello.", "out": str(tmp_path / "s.wav"),
                     "options": GREEDY})
    ended = c.wait("l1", "l2", "s")
    assert ended["l1"].kind == "result"
    assert ended["l2"].kind == "error" and "shorter than half a second" in \
        ended["l2"].data["message"]
    assert ended["s"].kind == "error" and "last load failed" in ended["s"].data["message"]
    assert not (tmp_path / "s.wav").exists()
    c.worker.close(30)


def test_serve_speech_exits_when_its_client_is_gone(tiny_model_dir: Path, reference: Path,
                                                    tmp_path: Path) -> None:
    # the client starts a long request, then dies: its pipes close
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.cli.main", "--json", "serve-speech", str(tiny_model_dir),
         "--reference", str(reference), "--dtype", "float32"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps({"op": "speak", "id": "long", "text": " ".join(SENTENCES * 4),
                                 "out": str(tmp_path / "long.wav"),
                                 "options": {"max_frames": 200, "chunk_chars": 30}}) + "\n")
    proc.stdin.flush()
    for line in proc.stdout:
        event = json.loads(line)
        if event.get("request") == "long" and event["event"] == "state":
            break  # it is speaking
    proc.stdout.close()
    proc.stdin.close()
    proc.wait(60)  # cancelled at once, not after 24 long chunks
    assert proc.returncode is not None
    assert not (tmp_path / "long.wav").exists()
