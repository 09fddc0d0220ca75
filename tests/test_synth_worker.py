"""The warm worker: continuous batching across requests, duplicate ids, cancel of a
running request, a failed voice swap, exit when the client is gone, reloads that
leave nothing behind, long text fed to its end, fair admission (tiny model)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import torch

from engine.config.speak import SpeakOptions
from engine.core.errors import InputError
from engine.core.events import Emitter, Event
from engine.synth.batcher import BatchRequest, ContinuousBatcher, _Row, _Unit
from engine.synth.prompt import build_prefill
from engine.synth.rows import RowBatch
from engine.synth.synthesizer import Synthesizer
from engine.synth.voice import resolve_source
from engine.synth.worker import SpeechWorker
from engine.text import MAX_CHUNK_CHARS, Chunk, split_text

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


def _live_row_batches() -> int:
    gc.collect()
    # type(), not isinstance(): isinstance touches lazy modules, which warn
    return sum(1 for o in gc.get_objects() if type(o) is RowBatch)


def test_reloading_the_same_base_keeps_one_batcher(client: Client, tiny_model_dir: Path,
                                                   reference: Path, tmp_path: Path) -> None:
    seen = []
    for i in range(5):
        client.worker.submit({"op": "load", "id": f"again{i}", "voice": str(tiny_model_dir),
                              "reference": str(reference), "x_vector_only": True})
        client.worker.submit({"op": "speak", "id": f"after{i}", "text": "Hello there.",
                              "out": str(tmp_path / f"a{i}.wav"),
                              "options": {**GREEDY, "max_frames": 3}})
        ended = client.wait(f"again{i}", f"after{i}")
        assert ended[f"again{i}"].kind == "result" and ended[f"after{i}"].kind == "result"
        names = [t.name for t in threading.enumerate()]
        # threads and the batch caches (the bulk of the memory) stay flat
        seen.append((names.count("speech-batcher"), names.count("speech-finisher"),
                     _live_row_batches()))
    assert seen == [seen[0]] * 5, seen
    assert seen[0][0] >= 1 and seen[0][2] >= 1


def test_a_long_paragraph_without_punctuation_is_fed_to_its_end_of_text(
        client: Client, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    letters = list("bcdfghjklmnpqrstvwxz0123456789")
    words: list[str] = []
    while len(" ".join(words)) < 1500:
        words.append("".join(rng.choice(letters, rng.integers(2, 8))))
    text = " ".join(words)[:1500].strip()
    with pytest.raises(InputError, match="chunk_chars must be at least 20 and at most 400"):
        SpeakOptions(chunk_chars=1500)
    # the text fed as speech goes (the other layout, still an option): a long trail
    options = {"seed": 1, "chunk_chars": MAX_CHUNK_CHARS, "loudness_lufs": None,
               "non_streaming": False}
    chunks = split_text(text, MAX_CHUNK_CHARS)
    assert " ".join(c.text for c in chunks).split() == text.split()  # nothing dropped
    synth = client.worker._synth
    settings = SpeakOptions(**options)
    prefills = [build_prefill(synth.model, synth.processor, [c.text], synth.speaker_vector,
                              synth._language_id("auto"), synth._non_streaming(settings),
                              icl=synth.icl).trailing[0] for c in chunks]
    # these chunks' text (+ end-of-text) is longer than the old fixed 256 positions,
    # and each chunk's frame cap leaves room to feed all of it
    assert max(len(p) for p in prefills) > 256
    assert all(c.max_frames >= len(p) for c, p in zip(chunks, prefills, strict=True))
    batcher = client.worker._batcher
    start = batcher.frames_run
    client.worker.submit({"op": "speak", "id": "para", "text": text,
                          "out": str(tmp_path / "para.wav"), "options": options})
    deadline = time.monotonic() + 120
    while batcher.frames_run < start + 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    client.worker.cancel("para")
    client.wait("para")
    assert batcher.text_cut == 0 and batcher.longest_text == max(len(p) for p in prefills[:2])
    batch = batcher._batch
    assert batch.trail_cap >= batcher.longest_text
    # rows 0 and 1 hold chunks 0 and 1: their whole text, end-of-text marker included,
    # then the pad the model reads after it
    for row in range(2):
        fed = prefills[row]
        torch.testing.assert_close(batch.trailing[row, :len(fed)], fed, rtol=0, atol=0)
        assert torch.equal(batch.trailing[row, len(fed)], batch.trailing[row, -1])


def _unit(rid: str, key: str, index: int = 0) -> Any:
    request = BatchRequest(rid=rid, text="x", out="", fmt="wav", options=SpeakOptions(),
                           emitter=Emitter(None), done=lambda *_: None)
    request.key = key
    return _Unit(request, Chunk(index=index, text="x", pause_after_s=0.0, max_frames=10))


def test_rows_go_round_robin_across_requests_and_by_age_across_settings(
        client: Client) -> None:
    batcher = ContinuousBatcher(client.worker._synth, rows=3)
    try:
        long = [_unit("long", "k1", i) for i in range(40)]
        later = _unit("later", "k1")
        # one 40-chunk request holds two rows; a later request gets the free one
        batcher._rows = [_Row(long[0]), _Row(long[1]), None]
        batcher._pending = deque([*long[2:], later])
        assert batcher._next_unit() is later
        # equal rows: the older request goes first
        batcher._rows = [_Row(long[0]), _Row(_unit("later", "k1")), None]
        assert batcher._next_unit() is long[2]
        # an older request with other settings: nobody younger passes it, the rows drain
        other, young = _unit("other", "k2"), _unit("young", "k1")
        batcher._rows = [_Row(long[0]), None, None]
        batcher._pending = deque([other, young])
        assert batcher._next_unit() is None
        batcher._rows = [None, None, None]
        assert batcher._next_unit() is other  # then its settings take the batch
    finally:
        batcher._rows = [None] * 3
        batcher._pending = deque()
        batcher.close()


def test_a_streamed_request_leaves_the_worker_answering(client: Client,
                                                        tmp_path: Path) -> None:
    client.worker.submit({"op": "speak", "id": "live", "text": " ".join(SENTENCES * 2),
                          "out": str(tmp_path / "live.wav"), "stream": True,
                          "options": {"seed": 1, "max_frames": 40, "chunk_chars": 40}})
    client.worker.submit({"op": "ping", "id": "during"})
    assert client.wait("during")["during"].kind == "result"
    # the ping was answered while the stream was still speaking: it can be cancelled
    assert "live" not in client.ended
    assert client.worker.cancel("live")
    ended = client.wait("live")["live"]
    assert (ended.kind == "error" and ended.data["code"] == "cancelled") or \
        ended.data["cancelled"]
    # the stream's rows went with it: nothing of it is left in the batch
    assert client.worker._batcher.wait_idle(30)
    assert all(row is None for row in client.worker._batcher._rows)
