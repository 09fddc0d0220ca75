"""Continuous batching for the warm worker: many requests share one batch.

Each speak request is split into chunks (one row each). A fixed number of
rows (`RowBatch`) advance together one frame at a time; the moment a row
ends (end-of-speech or its cap) its chunk is handed back and the row is
refilled with the next waiting chunk, from any request, while the other rows
keep going. A request is finished (decoded, levelled, written) when its last
chunk is.

Rows share the structure of the batch's decode settings (sampling on/off,
top-k: the captured frame's shape); temperatures, top-p and the repetition
penalty are per-row values, so requests differing only in those share rows.
Each request carries its voice (`BatchRequest.voice`, a `RowVoice` of the loaded
base): its speaker row and prompt are in its rows' prefills and its adapter slot is
row data of the frame, so adapter, instant and plain voices of one base share rows.
Admission is fair:
- by age across settings: when the oldest waiting request has other
  settings, no younger request is admitted past it; the rows drain and the
  batch switches to its settings (the last `KEEP_BATCHES` batches are kept
  with their captured graphs, the default and greedy ones from load on);
- round-robin across requests: a free row goes to the waiting request (of
  those not behind a request with other settings) with the fewest rows, so
  one long request cannot hold every row while others wait.
Each row's sampling noise is a function of its key (seed + chunk index) and
its frame, computed on the device inside the frame (`sampling.FrameNoise`),
the same values `FastTalker.generate` uses. The trailing-text buffer is sized from each
prefill (a chunk whose text does not fit waits for a bigger batch), so every
chunk's text and end-of-text marker are fed.

A finished request is decoded, levelled and written on a second thread
(`speech-finisher`), so the rows still generating never pause for it. Each
turn of the batch and each decode is a GPU section of `capture.GATE`, so a
capture never runs beside another thread's GPU work.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from engine.audio.timebase import SAMPLE_RATE
from engine.config.speak import SpeakOptions
from engine.core.errors import Cancelled
from engine.core.events import Emitter
from engine.synth.capture import GATE
from engine.synth.decoding import graphs_enabled
from engine.synth.prompt import build_prefill
from engine.synth.render import join_chunks, match_loudness, write_audio
from engine.synth.rows import RowBatch, bucket, settings_key
from engine.synth.runaway import RunawayWatch, runaway_message
from engine.synth.sampling import choose, noise_width, row_keys
from engine.synth.stream import GrowingFile, StreamDecoder
from engine.synth.stream_render import StreamedRender
from engine.text import Chunk, split_text

#: batches (and their captured graphs) kept at once: requests that alternate between
#: two settings (the default and greedy) recapture nothing; each batch holds its own
#: KV caches, so more would cost a model's worth of memory at 1.7B
KEEP_BATCHES = 2
#: a waiting request hears each change of its place once it is this near the front
TOLD_PLACES = 16


@dataclass
class BatchRequest:
    """One speak request inside the batcher."""

    rid: str
    text: str
    out: str
    fmt: str
    options: SpeakOptions
    emitter: Emitter
    done: Callable[[dict[str, Any] | None, BaseException | None], None]
    chunks: list[Chunk] = field(default_factory=list)
    seed: int = 0
    codes: dict[int, torch.Tensor] = field(default_factory=dict)
    cancelled: bool = False
    #: cancelled with nobody left to use what was finished: write nothing
    discard: bool = False
    started: float = field(default_factory=time.perf_counter)
    settings: Any = None
    key: Any = None
    #: chunks the runaway guard cut, with why ("loop" or "silence")
    runaway: dict[int, str] = field(default_factory=dict)
    #: the voice its rows speak (`synthesizer.RowVoice`; None: the synthesizer's default
    #: voice when it is submitted): voices of one base share the batch, row by row
    voice: Any = None
    #: streamed: `out` grows while its rows generate (`_Streamer`), and is replaced by
    #: the finished render at the end
    stream: bool = False
    #: the streamed render's state (`stream_render.StreamedRender`), made at its first row
    render: Any = None
    #: the last queue position told to the client (`_tell_positions`)
    position: int | None = None
    #: why its stream could not go on (reported as its end)
    failed: BaseException | None = None


class _PartialFile:
    """A streamed request's growing file, made at its first audio, which it announces
    (artifact role "speech_partial": a server opens the file then and reads it as it grows)."""

    def __init__(self, out: str, fmt: str, emitter: Emitter) -> None:
        self.out, self.fmt, self.emitter = out, fmt, emitter
        self.file: GrowingFile | None = None

    def write(self, audio: np.ndarray) -> None:
        if self.file is None:
            self.file = GrowingFile(self.out, self.fmt)
            self.file.write(audio)
            self.emitter.artifact(self.out, role="speech_partial")
            return
        self.file.write(audio)

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


@dataclass
class _Unit:
    request: BatchRequest
    chunk: Chunk
    prefill: Any = None  # built once, kept while the unit waits for a bigger batch


@dataclass
class _Row:
    unit: _Unit
    frames: int = 0
    #: frames handed to its streamed render (stream requests)
    fed: int = 0


class ContinuousBatcher:
    """Runs speak requests of one loaded `Synthesizer` on a background thread."""

    def __init__(self, synth: Any, rows: int = 8, graphs: bool | None = None) -> None:
        self.synth = synth
        self.fast = synth.fast
        self.size = rows
        self._pending: deque[_Unit] = deque()
        self._requests: dict[str, BatchRequest] = {}
        #: requests whose chunks are all made, being decoded and written
        self._finishing: dict[str, BatchRequest] = {}
        self._finish_queue: queue.Queue[tuple[BatchRequest, bool] | None] = queue.Queue()
        #: streamed requests' frames on their way to the codec (`_stream_loop`)
        self._stream_queue: queue.Queue[tuple[Any, ...] | None] = queue.Queue()
        #: each in-context voice's reference decoded once (`StreamDecoder.prime`)
        self._primed: dict[int, tuple[Any, Any]] = {}
        #: a unit that did not fit the current batch: waits until the rows drain
        self._blocked: _Unit | None = None
        self._cond = threading.Condition()
        self._stop = False
        self._batch: RowBatch | None = None
        #: the batches kept with their graphs, least recently used first (`KEEP_BATCHES`)
        self._kept: list[RowBatch] = []
        self._rows: list[_Row | None] = [None] * rows
        #: admissions into a free row while another row was mid-utterance
        self.refills = 0
        #: rows given up by a request holding several to one that had none
        self.preempted = 0
        #: rows or the queue changed since the places were last told
        self._queue_changed = False
        self.frames_run = 0
        #: chunks whose text was longer than the trailing buffer (never, by design)
        self.text_cut = 0
        #: largest trailing text (positions) admitted so far
        self.longest_text = 0
        self._host_slot: dict[int, int] = {}
        #: the runaway guard over each row's codes (fed from the end-of-speech copies)
        self._watch = RunawayWatch(rows)
        self._cuda = self.fast.device.type == "cuda"
        # graphs=True off CUDA: the capture path with `RowBatch._record` replaced (tests)
        self._graphs = self._cuda and graphs_enabled() if graphs is None else graphs
        #: two host buffers for the rows' tokens (pinned on CUDA) and their copy events
        self._tokens = [torch.zeros(rows, dtype=torch.long, pin_memory=self._cuda)
                        for _ in range(2)]
        self._token_events: list[Any] = [None, None]
        self._thread = threading.Thread(target=self._loop, name="speech-batcher", daemon=True)
        self._finisher = threading.Thread(target=self._finish_loop, name="speech-finisher",
                                          daemon=True)
        self._streamer = threading.Thread(target=self._stream_loop, name="speech-streamer",
                                          daemon=True)
        self._thread.start()
        self._finisher.start()
        self._streamer.start()

    # -- client side -------------------------------------------------------------------------
    def submit(self, request: BatchRequest) -> None:
        """Queue a request (its text was checked by the caller)."""
        options = request.options
        request.chunks = split_text(request.text, options.chunk_chars, options.sentence_pause_s,
                                    options.paragraph_pause_s, max_frames=options.max_frames)
        request.seed = options.seed if options.seed is not None else int(
            np.random.default_rng().integers(2**31))
        request.settings = self.synth.decode_settings(options)
        request.voice = request.voice or self.synth.current_voice
        # what the frame's shape needs alike; the voice and the prompt's layout are the
        # row's own (its prefill, its adapter slot)
        request.key = (settings_key(request.settings), options.language, options.instruct)
        request.emitter.state("speaking", detail=f"{len(request.chunks)} chunk(s)",
                              chunks=len(request.chunks), batched=True)
        with self._cond:
            self._requests[request.rid] = request
            self._pending.extend(_Unit(request, c) for c in request.chunks)
            self._queue_changed = True
            self._cond.notify_all()

    def cancel(self, rid: str, discard: bool = False) -> bool:
        with self._cond:
            request = self._requests.get(rid)
            if request is None:
                return False
            request.cancelled = True
            request.discard = request.discard or discard
            self._cond.notify_all()
            return True

    def busy(self) -> bool:
        with self._cond:
            return bool(self._requests or self._finishing)

    def wait_idle(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: not self._requests and not self._finishing,
                                       timeout)

    def close(self, cancel: bool = False) -> None:
        """Finish (or cancel) what was asked, then stop both threads and drop the batch."""
        with self._cond:
            if cancel:
                for request in self._requests.values():
                    request.cancelled = True
            self._stop = True
            self._cond.notify_all()
        self._thread.join()
        self._stream_queue.put(None)  # it hands its last requests to the finisher first
        self._streamer.join()
        self._finish_queue.put(None)
        self._finisher.join()
        self._batch = None  # its caches are the bulk of the worker's memory
        self._kept.clear()

    # -- batch side --------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop or self._pending or self._active()
                                    or any(r.cancelled for r in self._requests.values()))
                if self._stop and not self._requests:
                    return
            try:
                # every buffer of the batch is made and updated in inference mode; one
                # turn is one GPU section (a capture of another thread waits for it)
                with GATE.section(), torch.inference_mode():
                    self._drop_cancelled()
                    self._admit()
                    self._tell_positions()
                    if self._active():
                        self._step()
            except Exception as exc:  # a bug or out of memory: fail the requests, keep serving
                self._fail_all(exc)

    def _active(self) -> list[int]:
        return [b for b, row in enumerate(self._rows) if row is not None]

    def _key(self) -> Any:
        for row in self._rows:
            if row is not None:
                return row.unit.request.key
        return None

    def _next_unit(self) -> _Unit | None:
        """The unit a free row takes (called with the lock held): see the module doc."""
        key = self._key()
        rows = Counter(row.unit.request.rid for row in self._rows if row is not None)
        best: _Unit | None = None
        looked: set[str] = set()
        for unit in self._pending:  # arrival order; a request's chunks in text order
            rid = unit.request.rid
            if rid in looked:
                continue
            looked.add(rid)
            if key is None:
                key = unit.request.key  # idle rows: the oldest request sets the batch
            if unit.request.key != key:
                break  # older than everything after it: nobody jumps it
            if best is None or rows[rid] < rows[best.request.rid]:
                best = unit
        return best

    def _admit(self) -> None:
        while True:
            if self._blocked is not None and self._active():
                return  # it needs a bigger batch: wait until these rows drain
            with self._cond:
                free = [b for b, row in enumerate(self._rows) if row is None]
                if not self._pending:
                    return
                unit = self._blocked or self._next_unit()
                if unit is None:
                    return  # other settings wait until these rows drain
                if not free:
                    b = self._preempt(unit)
                    if b is None:
                        return
                    free = [b]
            busy = bool(self._active())
            if not self._start_row(free[0], unit):
                self._blocked = unit
                return
            self._blocked = None
            with self._cond:
                self._pending.remove(unit)
                self._queue_changed = True
            if busy:
                self.refills += 1

    def _preempt(self, unit: _Unit) -> int | None:
        """A row for `unit`'s request when it has none and every row is taken (called with
        the lock held): the request holding the most rows (two at least) gives up its
        last chunk's row, which waits again. That chunk starts over later with the same
        codes (its noise is keyed by seed and chunk), so a long reply slows a little and a
        new listener's first audio never waits for a whole sentence of someone else's."""
        rows = Counter(row.unit.request.rid for row in self._rows if row is not None)
        if rows[unit.request.rid] or self._blocked is not None:
            return None
        donor, held = rows.most_common(1)[0] if rows else ("", 0)
        if held < 2:
            return None  # one row each: the newcomer waits for the next free one
        b = max((b for b, row in enumerate(self._rows)
                 if row is not None and row.unit.request.rid == donor),
                key=lambda b: self._rows[b].unit.chunk.index)  # type: ignore[union-attr]
        row = self._rows[b]
        assert row is not None
        self._rows[b] = None
        back = row.unit
        # before the request's own waiting chunks: its chunks start in text order
        at = next((n for n, u in enumerate(self._pending) if u.request is back.request),
                  len(self._pending))
        self._pending.insert(at, back)
        if back.request.stream:
            self._stream_queue.put(("restart", back.request, back.chunk.index))
        self.preempted += 1
        return b

    def _tell_positions(self) -> None:
        """Each request still waiting for its first row hears its place in the queue
        (state "queued", `position` 1 = next): when it first waits, then as the place
        changes once it is among the nearest `TOLD_PLACES` (a book's thousand waiting
        lines are not told every shift). Only after rows or the queue changed."""
        with self._cond:
            if not self._queue_changed:
                return
            self._queue_changed = False
            started = {row.unit.request.rid for row in self._rows if row is not None}
            waiting: dict[str, BatchRequest] = {}
            for u in self._pending:
                r = u.request
                if r.rid not in started and not r.codes and r.rid not in waiting:
                    waiting[r.rid] = r
        for position, request in enumerate(waiting.values(), 1):
            if request.position != position and (request.position is None
                                                 or position <= TOLD_PLACES):
                request.position = position
                request.emitter.state("queued", detail=f"number {position} in the queue",
                                      position=position)

    def _width(self, settings: Any) -> int:
        return max(noise_width(settings.talker, self.fast.vocab),
                   noise_width(settings.predictor, self.fast.p_vocab), 1)

    def _fits(self, unit: _Unit, needed: int, text: int,
              batch: RowBatch | None = None) -> bool:
        batch = self._batch if batch is None else batch
        settings = unit.request.settings
        return (batch is not None and batch.capacity >= needed
                and batch.limit >= unit.chunk.max_frames + 16
                and batch.trail_cap >= text
                and settings_key(batch.settings) == settings_key(settings)
                and batch.width == self._width(settings))

    def _ensure_batch(self, unit: _Unit, needed: int, text: int) -> RowBatch:
        settings = unit.request.settings
        width = self._width(settings)
        if self._fits(unit, needed, text):
            assert self._batch is not None
            return self._batch
        kept = next((b for b in reversed(self._kept) if self._fits(unit, needed, text, b)),
                    None)
        if kept is not None:  # back to settings used before: its graphs are captured
            self._kept.remove(kept)
            self._kept.append(kept)
            self._batch = kept
            return kept
        # fixed buckets, so the next requests fit (and reuse its graphs); the trail
        # has room for every text position of this chunk
        batch = self._new_batch(settings, width, bucket(needed, 1024),
                                bucket(text, 256), bucket(unit.chunk.max_frames + 16, 512))
        return batch

    def _new_batch(self, settings: Any, width: int, capacity: int, trail: int,
                   limit: int) -> RowBatch:
        while len(self._kept) >= KEEP_BATCHES:
            gone = self._kept.pop(0)  # its caches are freed before the new ones are made
            if gone is self._batch:
                self._batch = None
        batch = RowBatch(self.fast, self.size, capacity, trail, limit, settings, width)
        batch.key_valid[:, 0] = True  # idle rows attend to something: no NaN
        self._batch = batch
        self._kept.append(batch)
        return batch

    def prepare(self) -> None:
        """On CUDA: make the batches of the default and the greedy settings and capture
        their frame graphs now (at load), not during the first requests."""
        if not self._graphs:
            return
        greedy = SpeakOptions(do_sample=False, subtalker_do_sample=False)
        with GATE.section(), torch.inference_mode():
            for options in (greedy, SpeakOptions())[:KEEP_BATCHES]:
                settings = self.synth.decode_settings(options)
                batch = self._new_batch(settings, self._width(settings), 2048, 256, 1024)
                batch.prepare(True)

    def _start_row(self, b: int, unit: _Unit) -> bool:
        """Prefill `unit` into row `b`; False when it must wait for the rows to drain
        (it needs a bigger or differently set batch)."""
        synth = self.synth
        request = unit.request
        settings = request.settings
        voice = request.voice
        if unit.prefill is None:
            unit.prefill = build_prefill(
                synth.model, synth.processor, [unit.chunk.text], voice.speaker_vector,
                synth._language_id(request.options.language),
                synth._non_streaming(request.options), icl=voice.icl,
                instruct=synth.instruct_ids(request.options, Emitter(None), voice.source))
        prefill = unit.prefill
        t0 = prefill.embeds.shape[1]
        needed = t0 + unit.chunk.max_frames + 16
        text = prefill.trailing.shape[1]
        if not self._fits(unit, needed, text) and self._active():
            return False
        batch = self._ensure_batch(unit, needed, text)
        if text > batch.trail_cap:
            self.text_cut += 1
        self.longest_text = max(self.longest_text, text)
        unit.prefill = None  # loaded into the row: nothing keeps it alive
        fast = self.fast
        with torch.inference_mode():
            embeds = prefill.embeds.to(fast.device, fast.dtype)
            cos, sin = fast._talker_rope(t0)
            cache = [(k[b:b + 1], v[b:b + 1]) for k, v in batch.t_cache]
            adapter = torch.full((1,), voice.adapter, dtype=torch.long, device=fast.device)
            hidden = fast.t_stack.forward(embeds, cos[:t0][None], sin[:t0][None], cache, 0, None,
                                          lora=fast.adapters.rows(adapter) if voice.adapter
                                          else None)
            keys = row_keys([request.seed + unit.chunk.index], fast.device)
            seen = torch.zeros(1, fast.vocab, dtype=torch.bool, device=fast.device)
            scores = fast._talker_logits(hidden, seen, 0, settings)
            # codebook 0 of frame 0: the noise generate() uses for it
            token = choose(scores, settings.talker,
                           batch.frame_noise.draw(keys, 0, count=1)[:, 0]
                           if batch.sampled else None)
            batch.load_rows(slice(b, b + 1), token, hidden[:, -1:],
                            torch.ones(1, t0, dtype=torch.bool, device=fast.device),
                            torch.zeros(1, dtype=torch.long, device=fast.device),
                            prefill.trailing.to(fast.device), prefill.tts_pad.to(fast.device),
                            settings, keys, adapter)
        self._rows[b] = _Row(unit)
        self._host_slot[b] = t0
        self._watch.start(b, settings.guard)
        return True

    def _step(self) -> None:
        batch = self._batch
        assert batch is not None
        active = self._active()
        with torch.inference_mode():
            # the frame computes its rows' noise itself: nothing drawn or copied here
            longest = max(self._host_slot[b] for b in active)
            batch.run(batch.span_for(longest), graphs=self._graphs)
            self.frames_run += 1
            # end-of-speech is read one frame late: this frame's tokens go to a pinned
            # buffer asynchronously while the previous frame's (long since copied) are
            # read, so the host never waits for the frame it just launched
            now = self.frames_run % 2
            self._tokens[now].copy_(batch.token, non_blocking=True)
            if self._cuda:
                event = torch.cuda.Event()
                event.record()
                self._token_events[now] = event
                before = self._token_events[1 - now]
                if before is not None:
                    before.synchronize()
            previous = self._tokens[1 - now]
        finished: list[tuple[int, int]] = []
        eos = self.fast.eos
        # the guard sees each row's code of the frame made before this one (the copy just
        # read for end-of-speech): not the first frame's, never an end-of-speech code
        watched = [b for b in active if (r := self._rows[b]) is not None and r.frames >= 1
                   and int(previous[b]) != eos]
        cut = set(self._watch.push(watched, [int(previous[b]) for b in watched]))
        for b in active:
            row = self._rows[b]
            assert row is not None
            row.frames += 1
            self._host_slot[b] += 1
            # the token chosen after this row's previous frame (its first frame has none:
            # the prefill's token cannot be end-of-speech, min_new_tokens bans it)
            if row.frames >= 2 and int(previous[b]) == eos:
                finished.append((b, row.frames - 1))  # the frame made on it is dropped
            elif b in cut:
                finished.append((b, row.frames))  # the runaway guard ended it on this frame
                row.unit.request.runaway[row.unit.chunk.index] = str(self._watch.reason[b])
            elif row.frames >= row.unit.chunk.max_frames:
                finished.append((b, row.frames))
        ending = {b for b, _ in finished}
        for b in active:  # streamed rows: every frame made is on its way to the codec
            row = self._rows[b]
            assert row is not None
            request = row.unit.request
            if request.stream and b not in ending and not request.cancelled:
                self._stream_queue.put(("feed", request, row.unit.chunk.index,
                                        batch.codes[b, row.fed:row.frames].clone()))
                row.fed = row.frames
        for b, frames in finished:
            row = self._rows[b]
            assert row is not None
            codes = batch.codes[b, :frames].clone()
            self._rows[b] = None
            self._chunk_done(row.unit, codes)

    def _chunk_done(self, unit: _Unit, codes: torch.Tensor) -> None:
        request = unit.request
        if request.cancelled:
            return
        request.codes[unit.chunk.index] = codes
        chunk = unit.chunk
        if request.stream:
            self._stream_queue.put(("end", request, chunk.index, codes))
        if len(codes) >= chunk.max_frames:
            request.emitter.log(f"Chunk {chunk.index + 1} reached its length cap of "
                                f"{chunk.max_frames} frames without ending; it was cut there.",
                                level="warning", chunk=chunk.index)
        reason = request.runaway.get(chunk.index)
        if reason is not None:
            request.emitter.log(runaway_message(chunk.index + 1, reason, len(codes)),
                                level="warning", chunk=chunk.index, runaway=reason)
        request.emitter.progress("chunks", len(request.codes), len(request.chunks),
                                 chunk=chunk.index, text=chunk.text, frames=len(codes))
        if len(request.codes) == len(request.chunks):
            self._finish(request)

    def _finish(self, request: BatchRequest, cancelled: bool = False) -> None:
        """Hand a request whose rows are done to the finisher thread."""
        with self._cond:
            self._requests.pop(request.rid, None)
            self._finishing[request.rid] = request
            self._cond.notify_all()
        if request.stream:  # after its last frames have reached the codec
            self._stream_queue.put(("finish", request, cancelled))
        else:
            self._finish_queue.put((request, cancelled))

    def _stream_loop(self) -> None:
        """Streamed requests' frames become audio on this thread (`speech-streamer`), in
        the order the batch made them, so the rows never wait for the codec."""
        while (item := self._stream_queue.get()) is not None:
            op, request = item[0], item[1]
            try:
                with GATE.section(), torch.inference_mode():
                    self._stream_item(op, request, item[2:])
            except Exception as exc:  # a bug or out of memory: this request fails alone
                request.failed = exc
                request.cancelled = request.discard = True

    def _stream_item(self, op: str, request: BatchRequest, args: tuple[Any, ...]) -> None:
        if op == "finish":
            if request.render is not None:
                request.render.sink.close()
            self._finish_queue.put((request, bool(args[0])))
            return
        if op == "fail":
            if request.render is not None:
                request.render.sink.close()
            request.done(None, args[0])
            return
        if request.cancelled:
            return  # nobody listens: its frames are not decoded
        render = request.render or self._render(request)
        if op == "feed":
            render.feed(args[0], args[1])
        elif op == "end":
            render.on_batch([args[0]], [args[1]])
        elif op == "restart":
            render.restart(args[0])

    def _render(self, request: BatchRequest) -> StreamedRender:
        """A streamed request's render, at its first frames: each chunk continues from the
        voice's reference (decoded once per voice) as the full decode would."""
        decoder = self.synth.model.speech_tokenizer.model.decoder
        icl = request.voice.icl
        primed = None
        if icl is not None:
            cached = self._primed.get(id(icl.ref_codes))
            if cached is None or cached[0] is not icl.ref_codes:
                cached = (icl.ref_codes, StreamDecoder.prime(decoder, icl.ref_codes))
                self._primed[id(icl.ref_codes)] = cached
            primed = cached[1]
        request.render = StreamedRender(request.chunks,
                                        _PartialFile(request.out, request.fmt, request.emitter),
                                        decoder, primed, self.fast, None, request.emitter,
                                        request.started)
        return request.render

    def _finish_loop(self) -> None:
        while (item := self._finish_queue.get()) is not None:
            request, cancelled = item
            try:
                with GATE.section(), torch.inference_mode():
                    self._write(request, cancelled)
            finally:
                with self._cond:
                    self._finishing.pop(request.rid, None)
                    self._cond.notify_all()

    def _write(self, request: BatchRequest, cancelled: bool) -> None:
        """Decode, level and write a request's audio, then report it (finisher thread)."""
        try:
            if request.failed is not None:
                raise request.failed
            render = request.render
            kept = [(c, request.codes[c.index]) for c in request.chunks
                    if c.index in request.codes
                    # a stream keeps what its listener heard whole
                    and (render is None or c.index < render.heard)]
            if not kept or request.discard or (request.stream and render is None):
                raise Cancelled()
            if render is not None:  # the audio already made, as it was heard
                waves = [render.audio(c.index) for c, _ in kept]
            else:
                waves = self.synth.decode_audio([codes for _, codes in kept],
                                                ref=request.voice.icl)
            pauses = [c.pause_after_s for c, _ in kept]
            pauses[-1] = 0.0
            audio = join_chunks(waves, pauses, SAMPLE_RATE)
            audio, loudness = match_loudness(audio, request.options.loudness_lufs, SAMPLE_RATE)
            path = write_audio(request.out, audio, request.fmt, SAMPLE_RATE)
            request.emitter.artifact(str(path), role="speech")
            compute = time.perf_counter() - request.started
            duration = len(audio) / SAMPLE_RATE
            result = {
                "path": str(path), "format": request.fmt, "sample_rate": SAMPLE_RATE,
                "duration_s": round(duration, 3), "compute_s": round(compute, 3),
                "rtf": round(duration / compute, 3) if compute > 0 else 0.0,
                "seed": request.seed,
                "chunks": [{"index": c.index, "text": c.text, "frames": len(codes),
                            "max_frames": c.max_frames, "seed": request.seed + c.index,
                            "capped": bool(len(codes) >= c.max_frames),
                            "runaway": request.runaway.get(c.index)} for c, codes in kept],
                "loudness_lufs": None if loudness is None else round(loudness, 2),
                "cancelled": cancelled, "batched": True,
                "first_audio_s": (None if render is None or render.first_audio_s is None
                                  else round(render.first_audio_s, 3)),
                # why chunks were cut by the runaway guard, each reason once
                "runaway": list(dict.fromkeys(request.runaway[i] for i in sorted(request.runaway)
                                              if i in request.codes)),
                "voice": request.voice.source.to_dict()}
        except BaseException as exc:  # reported to the request, never raised here
            request.done(None, exc)
            return
        request.done(result, None)

    def _drop_cancelled(self) -> None:
        with self._cond:
            gone = [r for r in self._requests.values() if r.cancelled]
            if not gone:
                return
            self._pending = deque(u for u in self._pending if not u.request.cancelled)
            self._queue_changed = True
        if self._blocked is not None and self._blocked.request.cancelled:
            self._blocked = None
        for b, row in enumerate(self._rows):
            if row is not None and row.unit.request.cancelled:
                self._rows[b] = None  # the row is free at once; its frames are dropped
        for request in gone:
            # finished chunks are kept, as a single request's cancel keeps them
            self._finish(request, cancelled=True)

    def _fail_all(self, exc: BaseException) -> None:
        with self._cond:
            requests = list(self._requests.values())
            self._pending.clear()
        self._rows = [None] * self.size
        self._batch = None
        self._kept.clear()
        self._blocked = None
        for request in requests:
            with self._cond:
                self._requests.pop(request.rid, None)
                self._cond.notify_all()
            if request.stream:  # its sink is the streamer's to close
                self._stream_queue.put(("fail", request, exc))
            else:
                request.done(None, exc)
