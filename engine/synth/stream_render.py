"""One streamed render's bookkeeping: codes arrive frame by frame, audio leaves in text order.

`Synthesizer.speak_stream` generates the chunks in text order and hands each frame's codes
to `StreamedRender.on_codes` (and each finished batch to `on_batch`). Every chunk has its
own `StreamDecoder`; the sink hears chunk i's audio as it is decoded, and chunk i+1's only
once chunk i has ended, after its pause. A chunk ends at end-of-speech, at its frame cap,
or where the runaway guard cuts it (the same rule over the same codes as generation).

On a GPU a frame's codes are read one frame late: they are copied to pinned memory
without waiting, and the previous frame's, copied long ago, are decoded meanwhile, so
generation never waits for the host.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch

from engine.audio.timebase import SAMPLE_RATE
from engine.core.events import Emitter
from engine.synth.runaway import FIRST_WATCHED, RunawayGuard, RunawayWatch
from engine.synth.stream import StreamDecoder
from engine.text import Chunk


class StreamedRender:
    """The state of one streamed render: each chunk's decoder, the audio each sent to the
    sink (`streamed`), which have ended, and when the first audio left (`first_audio_s`)."""

    def __init__(self, chunks: list[Chunk], sink: Any, decoder: Any, primed: Any, fast: Any,
                 guard: RunawayGuard | None, emitter: Emitter, started: float) -> None:
        """`decoder`: the codec's; `fast`: the `FastTalker` generating (its end-of-speech
        code and device); `started`: `time.perf_counter()` at the call."""
        self.chunks = chunks
        self.sink = sink
        self.emitter = emitter
        self.started = started
        self.eos = int(fast.eos)
        self.cuda = fast.device.type == "cuda"
        self._codec = decoder
        #: the reference's decoder state, every chunk continues from (in-context voices)
        self._primed = primed
        self._decoders: dict[int, StreamDecoder] = {}
        self._ended: set[int] = set()
        #: frames given to each chunk's decoder
        self._pushed: dict[int, int] = {}
        #: the previous frame, not yet read: (picked, frame, host codes, device codes, event)
        self._late: list[tuple[list[int], int, Any, Any, Any]] = []
        self._watch = RunawayWatch.of(guard, len(chunks))
        #: the next chunk to reach the sink
        self._cursor = 0
        self.streamed: list[list[np.ndarray]] = [[] for _ in chunks]
        self.first_audio_s: float | None = None

    def audio(self, index: int) -> np.ndarray:
        """All chunk `index` sent to the sink, joined."""
        parts = self.streamed[index]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)

    def _emit(self, index: int, audio: np.ndarray) -> None:
        if not audio.size:
            return
        self.streamed[index].append(audio)
        if self.first_audio_s is None:
            self.first_audio_s = time.perf_counter() - self.started
            self.emitter.metric({"synth/first_audio_s": round(self.first_audio_s, 3)})
        self.sink.write(audio)

    def _flush(self) -> None:
        """Send what is decoded, in text order: a chunk's audio waits for the one before."""
        while self._cursor < len(self.chunks) and self._cursor in self._decoders:
            i = self._cursor
            dec = self._decoders[i]
            while (block := dec.pull()).size:
                self._emit(i, block)
            if i not in self._ended:
                return
            self._emit(i, dec.finish())
            pause = self.chunks[i].pause_after_s
            if pause > 0 and self.streamed[i]:
                self.sink.write(np.zeros(round(pause * SAMPLE_RATE), dtype=np.float32))
            self._cursor = i + 1

    def _decoder(self, i: int) -> StreamDecoder:
        if i not in self._decoders:
            self._decoders[i] = StreamDecoder(self._codec, primed=self._primed)
        return self._decoders[i]

    def _take(self, picked: list[int], frame: int, host: Any, device: Any) -> None:
        for row, i in enumerate(picked):
            if i in self._ended:
                continue
            dec = self._decoder(i)
            if int(host[row, 0]) == self.eos:  # the pinned copy: no wait
                self._ended.add(i)
                continue
            # the decoder gets the device copy: a pinned host slice would go back
            # to the GPU by a blocking copy every frame
            dec.push(device[row:row + 1])
            self._pushed[i] = self._pushed.get(i, 0) + 1
            if frame + 1 >= self.chunks[i].max_frames or (
                    self._watch is not None and frame >= FIRST_WATCHED
                    and self._watch.push([i], [int(host[row, 0])])):
                self._ended.add(i)  # its cap, or the runaway guard cut it on this frame
        self._flush()

    def _take_late(self) -> None:
        if self._late:
            picked, frame, host, device, event = self._late.pop()
            if event is not None:
                event.synchronize()
            self._take(picked, frame, host, device)

    def on_codes(self, picked: list[int], frame: int, codes: Any) -> None:
        """Frame `frame`'s codes [B, 16] of the chunks `picked` (generation's callback)."""
        host = torch.empty(codes.shape, dtype=codes.dtype, pin_memory=self.cuda)
        host.copy_(codes, non_blocking=self.cuda)
        # the frame's buffer is reused by the next frame: a device-side copy (no sync)
        device = codes.clone() if self.cuda else host
        event = None
        if self.cuda:
            event = torch.cuda.Event()
            event.record()
        self._take_late()
        self._late.append((picked, frame, host, device, event))

    # -- fed by the continuous batcher: one row per chunk, frames already checked ---------
    def feed(self, i: int, frames: Any) -> None:
        """More frames of chunk `i` (its row has not ended; end-of-speech, the cap and the
        runaway guard are the batcher's), decoded and sent as far as they go."""
        if i in self._ended or not len(frames):
            return
        self._decoder(i).push(frames)
        self._pushed[i] = self._pushed.get(i, 0) + len(frames)
        self._flush()

    def restart(self, i: int) -> None:
        """Chunk `i` lost its row before any of it was heard and starts over: its next
        frames are its first (the same codes again: its noise is keyed by chunk)."""
        if i < self._cursor:
            raise ValueError(f"chunk {i} was already heard")
        self._decoders.pop(i, None)
        self._pushed.pop(i, None)
        self._ended.discard(i)

    @property
    def heard(self) -> int:
        """Chunks sent whole to the sink (the first `heard` of them, in text order)."""
        return self._cursor

    def on_batch(self, picked: list[int], codes: list[Any]) -> None:
        """The chunks `picked` are finished with these codes: decode what `on_codes` did
        not see, and end them."""
        self._take_late()
        for i, final in zip(picked, codes, strict=True):
            rest = final[self._pushed.get(i, 0):]
            if i not in self._ended and len(rest):
                self._decoder(i).push(rest)
            self._decoder(i)
            self._ended.add(i)
        self._flush()
