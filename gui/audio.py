"""Recording and playback in the window's process, through sounddevice.

Input and output use separate streams with latency='high': full-duplex
streams through the ALSA-PulseAudio bridge returned garbage (design doc).
PortAudio calls back on its own thread; the callbacks only copy samples and
update a few numbers, and the GUI reads them from a timer, so no Qt object is
touched off the GUI thread.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from time import monotonic

import numpy as np
import soundfile as sf
from PySide6.QtCore import QObject, QTimer, Signal

# sounddevice loads PortAudio, which may be missing: the window opens without sound
from engine.audio.sound import sd, unavailable

CLIP_LEVEL = 0.99  # a sample at or above this is taken as clipped
HOLD_AFTER_STOP_MS = 300  # keep recording briefly so the last word is not cut
# a stopping input stream that delivers nothing for this long has stalled for good
STALLED_INPUT_S = 10.0


@dataclass(frozen=True)
class Device:
    index: int
    name: str
    hostapi: str
    channels: int
    default_samplerate: float

    @property
    def label(self) -> str:
        return f"{self.name} ({self.hostapi})"


def _devices(kind: str) -> list[Device]:
    try:
        raw = sd.query_devices()
        apis = sd.query_hostapis()
    except Exception:  # no PortAudio backend at all: the page says so
        return []
    key = "max_input_channels" if kind == "input" else "max_output_channels"
    out = []
    for i, d in enumerate(raw):
        if d[key] > 0:
            out.append(Device(i, d["name"], apis[d["hostapi"]]["name"], int(d[key]),
                              float(d["default_samplerate"])))
    return out


def input_devices() -> list[Device]:
    return _devices("input")


def output_devices() -> list[Device]:
    return _devices("output")


def default_device(kind: str) -> int | None:
    try:
        idx = sd.default.device[0 if kind == "input" else 1]
    except Exception:
        return None
    return None if idx is None or idx < 0 else int(idx)


def device_samplerate(device: int | None, kind: str) -> int:
    try:
        info = sd.query_devices(device, kind)
        return int(info["default_samplerate"])
    except Exception:
        return 48000


NO_MICROPHONE = ("No microphone was found. Plug one in (or turn it on in the system's "
                 "sound settings), then restart Voxshard.")


def has_input() -> bool:
    """Whether PortAudio lists any input device (a microphone, or a monitor to record)."""
    return bool(input_devices())


def input_device_or_default(device: int | None) -> int | None:
    """The device to record from: the chosen one, else the system's default input, else
    the first input there is (a system may list inputs yet name none the default)."""
    if device is not None or default_device("input") is not None:
        return device
    found = input_devices()
    return found[0].index if found else None


def _trim(chunks: list[np.ndarray], times: list[float], sr: int, t_from: float,
          t_to: float) -> np.ndarray:
    """The samples captured between two times of the stream's clock, from chunks that
    each start at their capture time (a gap the device dropped stays out)."""
    kept = []
    for chunk, t0 in zip(chunks, times, strict=True):
        a = max(0, round((t_from - t0) * sr))
        b = min(len(chunk), round((t_to - t0) * sr))
        if b > a:
            kept.append(chunk[a:b])
    return np.concatenate(kept) if kept else np.zeros(0, dtype=np.float32)


class Recorder(QObject):
    """One input stream; `stop()` keeps recording for the hold time, then emits.

    A take is cut by the times the keys were pressed, on the stream's own clock:
    from `start()` to `stop()` plus the hold. Each block the device delivers
    carries the time its first sample was captured, so an input that begins
    late (seen 1.9 s after the key on a PulseAudio path) neither shifts the end
    of the take nor counts as recorded before it arrives (`heard` says when it
    has). Stop waits until the device has delivered everything captured up to
    the stop time plus the hold; only an input that delivers nothing at all for
    STALLED_INPUT_S ends the wait early.
    """

    stopped = Signal(object, int)  # mono float32 audio, sample rate
    failed = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._lock = threading.Lock()
        self._chunks: list[np.ndarray] = []
        self._times: list[float] = []  # capture time (stream clock) of each chunk's start
        self._stream: sd.InputStream | None = None
        self._peak = 0.0
        self._rms = 0.0
        self._clipped = 0
        self._frames = 0
        self.overflows = 0  # callbacks whose input overflowed: audio the device dropped
        self.samplerate = 48000
        self.keep = True  # False: meter only (device test), nothing is stored
        self._clock = True  # the stream has a clock its callbacks' times are on
        self._t_start = 0.0  # the stream's clock when start() was called (the key press)
        self._t_end = 0.0  # the stream's clock at stop(), plus the hold
        self._next_t = 0.0  # where the next chunk starts when the device gives no time
        self._last_arrival = 0.0  # time.monotonic() of the last callback
        self._hold = QTimer(self)
        self._hold.setInterval(20)
        self._hold.timeout.connect(self._check_hold)

    @property
    def active(self) -> bool:
        return self._stream is not None

    @property
    def stopping(self) -> bool:
        return self._hold.isActive()

    @property
    def heard(self) -> bool:
        """Whether the device has delivered audio since start (the input really runs)."""
        with self._lock:
            return self._frames > 0

    def start(self, device: int | None = None, keep: bool = True) -> bool:
        self.abort()
        if why := unavailable():
            self.failed.emit(why)
            return False
        if not has_input():
            self.failed.emit(NO_MICROPHONE)
            return False
        device = input_device_or_default(device)
        self.samplerate = device_samplerate(device, "input")
        self.keep = keep
        with self._lock:
            self._chunks, self._times = [], []
            self._peak = self._rms = 0.0
            self._clipped = 0
            self._frames = 0
            self.overflows = 0
        try:
            stream = sd.InputStream(device=device, channels=1, dtype="float32",
                                    samplerate=self.samplerate, latency="high",
                                    callback=self._callback)
            self._stream = stream
            self._clock = True
            self._t_start = self._next_t = self._stream_time()
            stream.start()
        except Exception as exc:
            self._stream = None
            self.failed.emit(f"The input device could not be opened: {exc}. Choose another "
                             "microphone, or check it in the system's sound settings.")
            return False
        return True

    def _chunk_time(self, time: object, frames: int) -> float:
        """When the block's first sample was captured, on the stream's clock."""
        if self._clock:
            adc = float(getattr(time, "inputBufferAdcTime", 0.0) or 0.0)
            if adc > 0:
                return adc
            now = float(getattr(time, "currentTime", 0.0) or 0.0)
            if now > 0:
                return now - frames / float(self.samplerate or 1)
        return self._next_t  # no clock: the blocks follow one another from the start

    def _callback(self, indata: np.ndarray, frames: int, time: object, status: object) -> None:
        mono = indata[:, 0]
        peak = float(np.max(np.abs(mono))) if frames else 0.0
        rms = float(np.sqrt(np.mean(mono * mono))) if frames else 0.0
        with self._lock:
            t0 = self._chunk_time(time, frames)
            self._next_t = t0 + frames / float(self.samplerate or 1)
            if self.keep:
                self._chunks.append(mono.copy())
                self._times.append(t0)
            self._frames += frames
            self._last_arrival = monotonic()
            # the meter shows the loudest block since the GUI last looked
            self._peak = max(self._peak, peak)
            self._rms = max(self._rms, rms)
            self._clipped += int(np.count_nonzero(np.abs(mono) >= CLIP_LEVEL))
            # a busy machine that reads the input too late loses samples: say so later
            if getattr(status, "input_overflow", False):
                self.overflows += 1

    def read_level(self) -> tuple[float, float, int]:
        """(peak, rms, clipped samples) since the last call; resets peak and rms."""
        with self._lock:
            out = (self._peak, self._rms, self._clipped)
            self._peak = self._rms = 0.0
        return out

    def seconds(self) -> float:
        with self._lock:
            return self._frames / float(self.samplerate or 1)

    def recent(self, seconds: float = 30.0) -> np.ndarray:
        """The last `seconds` of what was captured so far (the live waveform)."""
        want = int(seconds * (self.samplerate or 1))
        with self._lock:
            picked: list[np.ndarray] = []
            have = 0
            for chunk in reversed(self._chunks):
                picked.append(chunk)
                have += len(chunk)
                if have >= want:
                    break
        if not picked:
            return np.zeros(0, dtype=np.float32)
        return np.concatenate(picked[::-1])[-want:]

    def _stream_time(self) -> float:
        try:
            if self._stream is not None and self._clock:
                return float(self._stream.time)
        except Exception:  # a backend without a stream clock: count blocks instead
            self._clock = False
        return self._next_t if not self._clock else monotonic()

    def stop(self, hold_ms: int = HOLD_AFTER_STOP_MS) -> None:
        if self._stream is None or self._hold.isActive():
            return
        with self._lock:
            self._last_arrival = monotonic()
        # the key press on the stream's clock, plus the hold
        self._t_end = self._stream_time() + max(0, hold_ms) / 1000.0
        self._hold.start()
        self._check_hold()

    def _check_hold(self) -> None:
        with self._lock:
            arrived = self._next_t >= self._t_end if self._frames else False
            stalled = monotonic() - self._last_arrival > STALLED_INPUT_S
        if arrived or stalled:
            self._hold.stop()
            self._finish()

    def _finish(self) -> None:
        self._hold.stop()
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.stop()
            finally:
                stream.close()
        with self._lock:
            audio = _trim(self._chunks, self._times, self.samplerate, self._t_start,
                          self._t_end)
            self._chunks, self._times = [], []
        if self.keep:
            self.stopped.emit(audio, self.samplerate)

    def abort(self) -> None:
        """Close the stream at once, dropping what was recorded."""
        self._hold.stop()
        stream, self._stream = self._stream, None
        if stream is not None:
            try:
                stream.abort()
            finally:
                stream.close()
        with self._lock:
            self._chunks, self._times = [], []


class GrowingWav:
    """A 16-bit PCM WAV file that another process is still writing, read as it grows.

    The file stays open, so the bytes read are always the streamed ones, even
    after the writer replaces the path with its finished render at the end.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._fh = open(self.path, "rb")  # kept open while it grows
        head = self._fh.read(12)
        if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
            self.close()
            raise ValueError(f"{self.path.name} is not a WAV file")
        self.samplerate = 24000
        self.channels = 1
        self.offset = 0
        while True:  # the chunks before the samples: fmt, maybe fact/PEAK, then data
            chunk = self._fh.read(8)
            if len(chunk) < 8:
                self.close()
                raise ValueError(f"{self.path.name} has no audio yet")
            cid, size = chunk[:4], int.from_bytes(chunk[4:], "little")
            if cid == b"data":
                self.offset = self._fh.tell()
                break
            body = self._fh.read(size + (size & 1))
            if cid == b"fmt ":
                fmt_tag = int.from_bytes(body[0:2], "little")
                self.channels = int.from_bytes(body[2:4], "little")
                self.samplerate = int.from_bytes(body[4:8], "little")
                bits = int.from_bytes(body[14:16], "little")
                if fmt_tag != 1 or bits != 16:
                    self.close()
                    raise ValueError(f"{self.path.name} is not 16-bit PCM")
        self._read = 0

    def read_new(self) -> np.ndarray:
        """The mono samples written since the last call (whole frames only)."""
        frame = 2 * self.channels
        size = os.fstat(self._fh.fileno()).st_size - self.offset
        ready = (size - self._read) // frame * frame
        if ready <= 0:
            return np.zeros(0, dtype=np.float32)
        self._fh.seek(self.offset + self._read)
        raw = self._fh.read(ready)
        self._read += len(raw)
        pcm = np.frombuffer(raw[: len(raw) // frame * frame], dtype="<i2")
        audio = pcm.astype(np.float32) / 32768.0
        return audio.reshape(-1, self.channels).mean(axis=1)

    def close(self) -> None:
        self._fh.close()


class Player(QObject):
    """Plays one buffer or file at a time through an output stream.

    `play_stream` plays a file while another process is still writing it
    (the speech engine streaming): it starts with the first samples, pauses
    instead of stopping when it catches up with the writer, and ends after
    `end_stream` once everything written has been played.
    """

    started = Signal()
    finished = Signal()
    failed = Signal(str)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.device: int | None = None
        self._stream: sd.OutputStream | None = None
        self._audio = np.zeros(0, dtype=np.float32)
        self._pos = 0
        self._done = threading.Event()
        self.samplerate = 24000
        self.current: Path | None = None
        self._poll = QTimer(self)
        self._poll.setInterval(40)
        self._poll.timeout.connect(self._check)
        self._growing: GrowingWav | None = None
        self._live = False  # more samples may still come (streaming)
        self.underruns = 0  # callbacks that caught up with a stream and played silence
        # the device's own underflow reports: the machine was too busy to feed it in time,
        # so what was heard had gaps
        self.device_underflows = 0

    @property
    def playing(self) -> bool:
        return self._stream is not None

    def position_s(self) -> float:
        return self._pos / float(self.samplerate or 1)

    def play_file(self, path: Path | str) -> bool:
        try:
            audio, sr = sf.read(str(path), dtype="float32", always_2d=True)
        except Exception as exc:
            self.failed.emit(f"Cannot play {Path(path).name}: {exc}")
            return False
        ok = self.play(audio.mean(axis=1), int(sr))
        self.current = Path(path) if ok else None
        return ok

    def play_stream(self, path: Path | str) -> bool:
        """Play a WAV file that is still being written, from its first samples."""
        try:
            growing = GrowingWav(path)
        except (OSError, ValueError) as exc:
            self.failed.emit(f"Cannot play {Path(path).name} as it is made: {exc}")
            return False
        ok = self.play(growing.read_new(), growing.samplerate, live=True)
        if ok:
            self._growing = growing
            self.current = Path(path)
        else:
            growing.close()
        return ok

    def end_stream(self) -> None:
        """The writer has finished: play what is left, then stop."""
        self._feed()
        self._live = False
        if self._growing is not None:
            self._growing.close()
            self._growing = None

    def _feed(self) -> None:
        if self._growing is None:
            return
        new = self._growing.read_new()
        if new.size:
            # a new array, swapped in whole: the audio thread never sees a half-grown one
            self._audio = np.concatenate([self._audio, new])

    def play(self, audio: np.ndarray, samplerate: int, live: bool = False) -> bool:
        self.stop()
        self._live = live
        self.underruns = 0
        self.device_underflows = 0
        self.current = None
        self._audio = np.ascontiguousarray(audio, dtype=np.float32).reshape(-1)
        self._pos = 0
        self.samplerate = int(samplerate)
        self._done.clear()
        if why := unavailable():
            self.failed.emit(why)
            return False
        try:
            self._stream = sd.OutputStream(device=self.device, channels=1, dtype="float32",
                                           samplerate=self.samplerate, latency="high",
                                           callback=self._callback)
            self._stream.start()
        except Exception as exc:
            self._stream = None
            self.failed.emit(f"The output device could not be opened: {exc}")
            return False
        self._poll.start()
        self.started.emit()
        return True

    def _callback(self, outdata: np.ndarray, frames: int, time: object, status: object) -> None:
        if getattr(status, "output_underflow", False):
            self.device_underflows += 1
        chunk = self._audio[self._pos:self._pos + frames]
        outdata[:len(chunk), 0] = chunk
        outdata[len(chunk):, 0] = 0.0
        self._pos += len(chunk)
        if len(chunk) < frames and self._live:
            self.underruns += 1  # caught up with the writer: silence until more comes
            return
        if len(chunk) < frames:
            self._done.set()
            # PortAudio still plays what is buffered (latency='high' holds a lot),
            # then the stream goes inactive; the poll timer notices without blocking
            raise sd.CallbackStop

    def _check(self) -> None:
        self._feed()
        stream = self._stream
        if stream is not None and self._done.is_set() and not stream.active:
            self.stop()

    def stop(self) -> None:
        self._poll.stop()
        self._live = False
        if self._growing is not None:
            self._growing.close()
            self._growing = None
        stream, self._stream = self._stream, None
        if stream is None:
            return
        try:
            stream.abort()
        finally:
            stream.close()
        self.finished.emit()


def envelope(audio: np.ndarray, samplerate: int, points: int = 1600
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Time axis with min and max per bucket: a waveform that draws fast at any length."""
    n = len(audio)
    if n == 0:
        z = np.zeros(1, dtype=np.float32)
        return z, z, z
    buckets = max(1, min(points, n))
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    starts = edges[:-1]
    lo = np.minimum.reduceat(audio, starts)
    hi = np.maximum.reduceat(audio, starts)
    t = starts / float(samplerate)
    return t, lo, hi
