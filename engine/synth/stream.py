"""Streaming: codec frames become audio while later frames are still generated.

The official codec decoder is causal, and each of its parts needs only a
bounded part of the past (a convolution's last input samples, a transposed
convolution's spill, a sliding-window layer's last keys and values).
`StreamDecoder` keeps that state between pieces (`codec_state.CodecState`), so
every frame goes through the decoder exactly once, and the streamed audio
equals the full decode of the same codes within float rounding
(tests/test_synth_stream.py, at the real codec size): the joins are not
approximations, so they cannot click.

Pieces grow (4, 8, 16 ... frames): the first audio comes after a few frames,
later pieces cost fewer calls. `finish()` decodes everything pending in one call.

Sinks take float32 blocks at 24 kHz: a file that grows (`GrowingFile`), raw
16-bit PCM for a pipe (`RawPcm`), the sound device (`Player`, which waits for a
pre-buffer sized from the generation speed and counts underruns).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np
import soundfile as sf
import torch

from engine.audio import sound
from engine.audio.timebase import SAMPLE_RATE, SAMPLES_PER_FRAME
from engine.config.speak import SOUNDFILE_FORMATS
from engine.core.errors import DeviceError, InputError, SynthesisError
from engine.synth.codec_state import CodecState
from engine.synth.jitter import PrebufferPolicy
from engine.text import spoken_weight


class StreamDecoder:
    """Incremental codec decoding of one utterance.

    `push(frames)` adds codec frames [n, 16]; `pull()` returns the samples that
    can be decoded now (a whole piece or nothing); `finish()` decodes the rest
    in one call. `prefix` frames (the reference of in-context cloning) are
    context only: decoded once together with the first piece, never returned,
    as the full decode cuts them off. `frames_decoded` counts the frames that
    went through the decoder (prefix included).
    """

    def __init__(self, decoder: Any, prefix: Any = None, first_piece: int = 4,
                 max_piece: int = 48, primed: Any = None) -> None:
        if first_piece < 1 or max_piece < first_piece:
            raise ValueError("bad streaming piece sizes")
        if primed is not None:
            # the prefix is already decoded into `primed` (see `prime`): start after it
            self.state = primed.copy()
            prefix = None
        else:
            self.state = CodecState(decoder)
        self.device = next(decoder.parameters()).device
        empty = torch.zeros(0, 16, dtype=torch.long, device=self.device)
        self.frames = [prefix.to(self.device)] if prefix is not None and len(prefix) else [empty]
        self.count = sum(len(f) for f in self.frames)
        self.skip = self.count  # prefix frames: decoded for their state, never returned
        self.done = 0  # frames already through the decoder
        self.piece = first_piece
        self.max_piece = max_piece

    @staticmethod
    def prime(decoder: Any, prefix: Any) -> Any:
        """The codec state after `prefix` (an in-context reference): decoded once per
        voice, then each chunk's `StreamDecoder(decoder, primed=...)` continues
        from a copy, so a chunk's first audio never waits for the reference."""
        state = CodecState(decoder)
        codes = prefix.to(next(decoder.parameters()).device).clamp(min=0).T[None]
        for start in range(0, codes.shape[-1], 48):
            # bounded pieces: long inputs cost more per frame (and memory) in one call
            state.decode(codes[..., start:start + 48])
        return state

    @property
    def frames_decoded(self) -> int:
        return self.state.frames_decoded

    def push(self, frames: Any) -> None:
        if len(frames):
            self.frames.append(frames.to(self.device).reshape(-1, 16))
            self.count += len(frames)

    @property
    def pending(self) -> int:
        return self.count - max(self.done, self.skip)

    def pull(self) -> np.ndarray:
        if self.pending < self.piece:
            return np.zeros(0, dtype=np.float32)
        out = self._decode(max(self.done, self.skip) + self.piece)
        self.piece = min(self.piece * 2, self.max_piece)
        return out

    def finish(self) -> np.ndarray:
        if self.pending <= 0:
            return np.zeros(0, dtype=np.float32)
        return self._decode(self.count)

    def _decode(self, end: int) -> np.ndarray:
        codes = torch.cat(self.frames) if len(self.frames) > 1 else self.frames[0]
        self.frames = [codes]
        wav = self.state.decode(codes[self.done:end].clamp(min=0).T[None])[0]
        keep = wav[max(0, self.skip - self.done) * SAMPLES_PER_FRAME:]
        self.done = end
        return keep.float().cpu().numpy()


def expected_speech_s(chunks: list[Any]) -> float:
    """About how long `chunks` (`text.Chunk`) take to say: 12 spoken-weight units
    (letters; a CJK character counts 3) per second, a little slower than usual
    speech, so the pre-buffer errs long, plus the pauses between chunks."""
    return sum(spoken_weight(c.text) / 12.0 + c.pause_after_s for c in chunks)


# -- sinks ------------------------------------------------------------------------------------

class AudioSink(Protocol):
    def write(self, audio: np.ndarray) -> None: ...

    def close(self) -> None: ...


class GrowingFile:
    """An audio file that holds everything streamed so far (its header is
    rewritten after each block, so players and `soundfile` can read it early)."""

    def __init__(self, path: str | os.PathLike[str], fmt: str,
                 sample_rate: int = SAMPLE_RATE) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise InputError(f"The output {self.path} is a folder.",
                             "Give a file name such as out.wav.")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        container, subtype = SOUNDFILE_FORMATS[fmt]
        # a plain open(): the file gets the user's normal permissions
        self._file = sf.SoundFile(str(self.path), "w", sample_rate, 1, subtype, format=container)
        self.samples = 0

    def write(self, audio: np.ndarray) -> None:
        if audio.size:
            self._file.write(np.clip(audio, -1.0, 1.0).astype(np.float32))
            self._file.flush()
            self.samples += audio.size

    def close(self) -> None:
        self._file.close()


class RawPcm:
    """Signed 16-bit little-endian mono PCM to a byte stream (a pipe: `| aplay -f S16_LE
    -r 24000 -c 1`). A reader that goes away ends the speech with a clear error."""

    def __init__(self, stream: BinaryIO) -> None:
        self.stream = stream
        self.samples = 0

    def write(self, audio: np.ndarray) -> None:
        if not audio.size:
            return
        pcm = (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2")
        try:
            self.stream.write(pcm.tobytes())
            self.stream.flush()
        except BrokenPipeError as exc:
            raise SynthesisError("The program reading the audio closed the pipe.",
                                 "Keep the reader running until the speech ends.") from exc
        self.samples += audio.size

    def close(self) -> None:
        try:
            self.stream.flush()
        except (BrokenPipeError, ValueError):
            pass


class Player:
    """Plays blocks on the default sound device as they come (generation never
    waits for the device: a callback drains a queue); `close` waits for the end.

    Playback starts when `jitter.PrebufferPolicy` says the buffered audio will
    last to the end at the generation speed measured so far (`expect(seconds)`
    tells it how long the speech should be), or after `max_delay_s`. After the
    start, every callback that finds too little audio is an underrun (silence
    played); `underruns` counts the gaps, `device_underflows` the device's own
    underflow flags. `stats()` reports both, with the pre-buffer used.
    """

    def __init__(self, sample_rate: int = SAMPLE_RATE, device: Any = None,
                 max_delay_s: float = 4.0, min_prebuffer_s: float = 0.25) -> None:
        try:
            sd = sound.sounddevice()
        except DeviceError as exc:  # PortAudio did not load: what to install, or -o
            raise SynthesisError(exc.message, "Or write a file with -o.") from exc

        self.sample_rate = sample_rate
        self.policy = PrebufferPolicy(min_s=min_prebuffer_s, max_delay_s=max_delay_s)
        self._queue: queue.Queue[np.ndarray | None] = queue.Queue()
        self._buffer = np.zeros(0, dtype=np.float32)
        self._ended = threading.Event()
        self._closing = False
        self._all_written = False
        self._playing = False
        self._starved = False
        self.samples = 0
        self.played = 0
        self.underruns = 0
        self.device_underflows = 0
        self.prebuffer_s: float | None = None
        self.start_delay_s: float | None = None
        try:
            self._stream = sd.OutputStream(samplerate=sample_rate, channels=1, dtype="float32",
                                           device=device, callback=self._callback,
                                           latency="high")
            self._stream.start()
        except Exception as exc:  # PortAudio raises its own error types
            raise SynthesisError(f"The sound device cannot play ({exc}).",
                                 "Check the output device, or write a file with -o.") from exc

    def expect(self, seconds: float | None) -> None:
        """The speech should last about `seconds` (sizes the pre-buffer)."""
        self.policy.expected_s = seconds

    def _start_now(self) -> bool:
        now = time.monotonic()
        if not self.policy.ready(now, self.played / self.sample_rate, self._all_written):
            return False
        self._playing = True
        self.prebuffer_s = round((self.samples - self.played) / self.sample_rate, 3)
        first = self.policy.first_at
        self.start_delay_s = None if first is None else round(now - first, 3)
        return True

    def _callback(self, out: np.ndarray, frames: int, _time: Any, status: Any) -> None:
        if getattr(status, "output_underflow", False) and self._playing:
            self.device_underflows += 1
        if not self._playing and not self._start_now():
            out[:, 0] = 0.0  # still filling the pre-buffer: not a gap
            return
        while self._buffer.size < frames:
            try:
                block = self._queue.get_nowait()
            except queue.Empty:
                break
            if block is None:
                self._closing = True
                break
            self._buffer = np.concatenate((self._buffer, block))
        n = min(frames, self._buffer.size)
        out[:n, 0] = self._buffer[:n]
        out[n:, 0] = 0.0
        self._buffer = self._buffer[n:]
        self.played += n
        if n < frames and not self._closing:
            if not self._starved:
                self.underruns += 1  # one gap, however many callbacks it lasts
            self._starved = True
        elif n == frames:
            self._starved = False
        if self._closing and not self._buffer.size and self._queue.empty():
            self._ended.set()

    def write(self, audio: np.ndarray) -> None:
        if audio.size:
            self._queue.put(np.clip(audio, -1.0, 1.0).astype(np.float32))
            self.samples += audio.size
            self.policy.wrote(time.monotonic(), audio.size / self.sample_rate)

    def stats(self) -> dict[str, Any]:
        return {"underruns": self.underruns, "device_underflows": self.device_underflows,
                "prebuffer_s": self.prebuffer_s, "start_delay_s": self.start_delay_s}

    def close(self, timeout: float | None = None) -> None:
        self._all_written = True
        self._queue.put(None)
        wait = timeout if timeout is not None else (
            (self.samples - self.played) / self.sample_rate + self.policy.max_delay_s + 5.0)
        self._ended.wait(wait)
        self._stream.stop()
        self._stream.close()
