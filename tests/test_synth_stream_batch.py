"""Streams in the continuous batch: every open stream advances in the one decode loop.

A streamed request's rows share the batch with everyone else's; its frames become audio
as they are made (the `speech-streamer` thread), so a new stream starts at the next frame
instead of after the batch drains. Recreated here with the tiny model on CPU: streams
joining and leaving mid-render keep their codes, a cancelled stream frees its row at the
next frame, a short reply started while a long one holds every row hears its first audio
within a few frames (counted in the batch's frames, not in seconds), a request waiting
for a row hears its place in the queue, and the worker's streamed file is the audio it
streamed.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import soundfile as sf
import torch

from engine.config.speak import SpeakOptions
from engine.core.events import Emitter, Event
from engine.synth.batcher import BatchRequest, ContinuousBatcher
from engine.synth.synthesizer import Synthesizer
from engine.synth.voice import resolve_source
from engine.synth.worker import SpeechWorker

LONG = ("The kettle started to whistle. She folded the laundry slowly. Our train was "
        "delayed again. Fresh bread tastes best warm. Please water the plants.")
SHORT = "The river curved gently."
#: greedy, several chunks per long text, short caps so the tiny model's rows end
GREEDY = {"do_sample": False, "subtalker_do_sample": False, "max_frames": 24,
          "chunk_chars": 40, "loudness_lufs": None}


@pytest.fixture(scope="module")
def synth(tiny_model_dir: Path, piper_sentences: list[dict[str, Any]]) -> Synthesizer:
    source = resolve_source(tiny_model_dir, reference=Path(piper_sentences[0]["path"]),
                            x_vector_only=True)
    return Synthesizer.load(source, device="cpu", dtype="float32")


@pytest.fixture
def batch(synth: Synthesizer) -> Any:
    """`batch(rows)`: a batcher on the shared model, closed after the test."""
    made: list[ContinuousBatcher] = []

    def make(rows: int) -> ContinuousBatcher:
        made.append(ContinuousBatcher(synth, rows=rows))
        return made[-1]

    yield make
    for batcher in made:
        batcher.close(cancel=True)


class Tracked:
    """One request's events and end, with the batch frame at which each kind came."""

    def __init__(self, batcher: ContinuousBatcher, rid: str, text: str, out: Path,
                 stream: bool, options: dict[str, Any] | None = None) -> None:
        self.batcher = batcher
        self.events: list[tuple[int, Event]] = []
        self.ended = threading.Event()
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self.request = BatchRequest(
            rid=rid, text=text, out=str(out), fmt="wav",
            options=SpeakOptions(**{**GREEDY, **(options or {})}),
            emitter=Emitter(self._event), done=self._done, stream=stream)
        self.submitted_at = batcher.frames_run
        batcher.submit(self.request)

    def _event(self, event: Event) -> None:
        self.events.append((self.batcher.frames_run, event))

    def _done(self, result: dict[str, Any] | None, exc: BaseException | None) -> None:
        self.result, self.error = result, exc
        self.ended.set()

    def frame_of(self, kind: str, **match: Any) -> int | None:
        for frame, event in self.events:
            if event.kind == kind and all(event.data.get(k) == v for k, v in match.items()):
                return frame
        return None

    def wait(self, timeout: float = 240) -> None:
        assert self.ended.wait(timeout), f"{self.request.rid} never ended"

    def codes(self) -> list[torch.Tensor]:
        return [self.request.codes[i] for i in sorted(self.request.codes)]


def _first_audio(tracked: Tracked, timeout: float = 120) -> None:
    waited = threading.Event()
    for _ in range(int(timeout / 0.02)):
        if tracked.frame_of("artifact", role="speech_partial") is not None:
            return
        waited.wait(0.02)
    raise AssertionError(f"{tracked.request.rid} never streamed")


@pytest.mark.parity
def test_streams_joining_and_leaving_keep_their_codes(synth: Synthesizer, batch: Any,
                                                      tmp_path: Path) -> None:
    batcher = batch(3)
    alone = Tracked(batcher, "alone", LONG, tmp_path / "alone.wav", stream=True)
    alone.wait()
    assert alone.error is None
    crowd = Tracked(batcher, "crowd", LONG, tmp_path / "crowd.wav", stream=True)
    _first_audio(crowd)
    # others join mid-render: a plain request and a stream that leaves half-way
    joined = Tracked(batcher, "joined", SHORT * 3, tmp_path / "joined.wav", stream=False)
    leaver = Tracked(batcher, "leaver", LONG, tmp_path / "leaver.wav", stream=True)
    _first_audio(leaver)
    batcher.cancel("leaver", discard=True)
    for t in (crowd, joined, leaver):
        t.wait()
    assert crowd.error is None and joined.error is None
    assert leaver.result is None  # discarded: nothing kept, nothing written
    mine, theirs = alone.codes(), crowd.codes()
    assert len(mine) == len(theirs) >= 3
    # greedy codes of a row do not depend on its neighbours: every row of the batch
    # is computed, occupied or not, so the row's arithmetic is the same
    for a, b in zip(mine, theirs, strict=True):
        assert torch.equal(a, b)
    # what was streamed is what is kept, and it equals the plain render's decode
    heard, _sr = sf.read(tmp_path / "crowd.wav", dtype="float32")
    again, _sr = sf.read(tmp_path / "alone.wav", dtype="float32")
    assert heard.shape == again.shape and np.abs(heard - again).max() < 1e-4
    decoded = synth.decode_audio(theirs)
    assert sum(len(w) for w in decoded) == pytest.approx(
        len(heard) - sum(c.pause_after_s for c in crowd.request.chunks[:-1]) * 24000,
        abs=len(crowd.request.chunks))


def test_a_cancelled_stream_frees_its_row_at_the_next_frame(batch: Any,
                                                            tmp_path: Path) -> None:
    batcher = batch(1)
    gone = Tracked(batcher, "gone", LONG, tmp_path / "gone.wav", stream=True,
                   options={"max_frames": 200})
    _first_audio(gone)
    waiting = Tracked(batcher, "waiting", SHORT, tmp_path / "waiting.wav", stream=True)
    # one row, held by the long stream's first chunk (one row each: no preemption)
    cancelled_at = batcher.frames_run
    batcher.cancel("gone", discard=True)
    waiting.wait()
    gone.wait()
    assert waiting.error is None and waiting.result is not None
    started = waiting.frame_of("artifact", role="speech_partial")
    assert started is not None
    # its row was free at the next turn: the newcomer's first piece (4 frames) and
    # the lag of a turn or two, never the rest of the cancelled chunk (200 frames)
    assert started - cancelled_at <= 12, (cancelled_at, started)


def test_a_short_reply_beside_a_long_one_hears_its_first_audio_within_a_few_frames(
        batch: Any, tmp_path: Path) -> None:
    batcher = batch(2)
    long = Tracked(batcher, "long", LONG * 2, tmp_path / "long.wav", stream=True,
                   options={"max_frames": 60})
    _first_audio(long)
    assert sum(row is not None for row in batcher._rows) == 2  # it holds every row
    short = Tracked(batcher, "short", SHORT, tmp_path / "short.wav", stream=True)
    short.wait()
    first = short.frame_of("artifact", role="speech_partial")
    assert first is not None and short.result is not None
    # a row was given up for it at once: its first piece (4 frames) plus a turn's lag,
    # where waiting for a free row would take up to a chunk's cap (60 frames)
    assert first - short.submitted_at <= 8, (short.submitted_at, first)
    assert batcher.preempted >= 1
    long.wait()
    assert long.error is None and long.result is not None
    # the long reply gave a row back and still says all of it, in order
    assert len(long.request.codes) == len(long.request.chunks)


def test_a_request_waiting_for_a_row_hears_its_place_in_the_queue(batch: Any,
                                                                  tmp_path: Path) -> None:
    batcher = batch(1)
    first = Tracked(batcher, "first", SHORT * 2, tmp_path / "first.wav", stream=True,
                    options={"max_frames": 40})
    _first_audio(first)
    second = Tracked(batcher, "second", SHORT, tmp_path / "second.wav", stream=True)
    third = Tracked(batcher, "third", SHORT, tmp_path / "third.wav", stream=False)
    for t in (first, second, third):
        t.wait()
        assert t.error is None
    said = [e.data["position"] for _f, e in third.events
            if e.kind == "state" and e.data.get("state") == "queued"]
    assert said and said[0] == 2 and said[-1] == 1  # behind "second", then next
    assert [e.data["position"] for _f, e in second.events
            if e.kind == "state" and e.data.get("state") == "queued"][:1] == [1]
    assert first.frame_of("state", state="queued") is None  # it never waited


def test_the_worker_streams_two_rooms_together_into_growing_files(
        tiny_model_dir: Path, piper_sentences: list[dict[str, Any]], tmp_path: Path) -> None:
    """A long reply, then a short one while it speaks (two rooms of a house): the short
    one's file starts growing within a few frames, and each file is what it streamed."""
    events: list[tuple[int, Event]] = []
    ended: dict[str, Event] = {}
    cond = threading.Condition()
    holder: list[SpeechWorker] = []

    def frames() -> int:
        batcher = holder[0]._batcher if holder else None
        return -1 if batcher is None else batcher.frames_run

    def collect(event: Event) -> None:
        with cond:
            events.append((frames(), event))
            if event.kind in ("result", "error") and event.data.get("request"):
                ended[event.data["request"]] = event
            cond.notify_all()

    def partial(rid: str) -> int | None:
        return next((f for f, e in events if e.data.get("request") == rid
                     and e.kind == "artifact" and e.data.get("role") == "speech_partial"), None)

    worker = SpeechWorker(collect, device="cpu", dtype="float32", rows=2).start()
    holder.append(worker)
    try:
        worker.submit({"op": "load", "id": "l", "voice": str(tiny_model_dir),
                       "reference": str(piper_sentences[0]["path"]), "x_vector_only": True})
        worker.submit({"op": "speak", "id": "long", "text": LONG * 2, "stream": True,
                       "out": str(tmp_path / "long.wav"),
                       "options": {**GREEDY, "max_frames": 60}})
        with cond:
            assert cond.wait_for(lambda: partial("long") is not None or "long" in ended, 240)
        asked = frames()
        worker.submit({"op": "speak", "id": "short", "text": SHORT, "stream": True,
                       "out": str(tmp_path / "short.wav"), "options": GREEDY})
        with cond:
            assert cond.wait_for(lambda: "long" in ended and "short" in ended, 240)
        assert "long" in ended and ended["long"].kind == "result"
        first = partial("short")
        assert first is not None
        # the short room heard its first audio while the long reply was still speaking
        order = [(e.data.get("request"), e.kind, e.data.get("role")) for _f, e in events]
        assert order.index(("short", "artifact", "speech_partial")) < order.index(
            ("long", "result", None))
        # in the long reply's batch at once (a row given up for it), not after it
        assert first - asked <= 10, (asked, first)
        for rid in ("long", "short"):
            result = ended[rid]
            assert result.kind == "result", result.data
            assert result.data["first_audio_s"] is not None and result.data["batched"]
            audio, rate = sf.read(tmp_path / f"{rid}.wav", dtype="float32")
            assert rate == 24000 and len(audio) / rate == pytest.approx(
                result.data["duration_s"], abs=0.01)
            kinds = [(e.kind, e.data.get("role")) for _f, e in events
                     if e.data.get("request") == rid]
            assert kinds.index(("artifact", "speech_partial")) < kinds.index(
                ("artifact", "speech"))
    finally:
        worker.close(timeout=60, cancel=True)
