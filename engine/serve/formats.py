"""Response formats of the speech endpoint: what goes on the wire for each.

The worker writes 24 kHz mono files; this module turns them into OpenAI's
`response_format`s. `pcm` is OpenAI's raw format: signed 16-bit little-endian
mono at 24 kHz, no header. Streamed `wav` is a header whose sizes say
"unknown length" (0xFFFFFFFF, as streaming WAV servers write it) followed by
the same PCM as it is generated. Light: numpy and soundfile only.
"""

from __future__ import annotations

import io
import struct

import numpy as np
import soundfile as sf

from engine.audio.timebase import SAMPLE_RATE
from engine.config.speak import SOUNDFILE_FORMATS, available_formats

#: OpenAI's formats -> (worker format written to disk, media type)
MEDIA_TYPES = {"wav": "audio/wav", "mp3": "audio/mpeg", "opus": "audio/ogg",
               "flac": "audio/flac", "pcm": "audio/pcm"}
#: formats whose bytes are produced as the audio is generated (the others are
#: encoded once the render is finished, then sent: libsndfile goes back to the
#: start of an MP3 or FLAC file at its end to fill in the length, which a stream
#: already sent cannot take)
INCREMENTAL = ("wav", "pcm", "opus")


def available() -> tuple[str, ...]:
    """The response formats this machine can encode (asks libsndfile for MP3 and Opus)."""
    writable = available_formats()
    return ("wav", *(f for f in ("opus", "mp3") if f in writable), "pcm", "flac")


def streaming_wav_header(sample_rate: int = SAMPLE_RATE) -> bytes:
    """A 16-bit mono WAV header for a body of unknown length."""
    unknown = 0xFFFFFFFF
    return (b"RIFF" + struct.pack("<I", unknown) + b"WAVE"
            + b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, sample_rate, sample_rate * 2, 2, 16)
            + b"data" + struct.pack("<I", unknown))


def wav_data_offset(head: bytes) -> int | None:
    """Where the samples start in a RIFF/WAVE file's first bytes (None: not there yet)."""
    if len(head) < 12 or head[:4] != b"RIFF" or head[8:12] != b"WAVE":
        return None
    pos = 12
    while pos + 8 <= len(head):
        tag, size = head[pos:pos + 4], struct.unpack("<I", head[pos + 4:pos + 8])[0]
        if tag == b"data":
            return pos + 8
        pos += 8 + size + (size & 1)
    return None


def to_pcm16(audio: np.ndarray) -> bytes:
    return (np.clip(audio, -1.0, 1.0) * 32767.0).round().astype("<i2").tobytes()


def encode(audio: np.ndarray, fmt: str, sample_rate: int = SAMPLE_RATE) -> bytes:
    """A whole render in `fmt` (see `available`)."""
    if fmt == "pcm":
        return to_pcm16(audio)
    container, subtype = SOUNDFILE_FORMATS[fmt]
    buffer = io.BytesIO()
    sf.write(buffer, np.clip(np.asarray(audio, dtype=np.float32), -1.0, 1.0), sample_rate,
             format=container, subtype=subtype)
    return buffer.getvalue()


def time_stretch(audio: np.ndarray, speed: float) -> np.ndarray:
    """`speed` x faster speech at the same pitch (phase vocoder); 1.0 returns it unchanged."""
    if speed == 1.0 or audio.size < 2048:
        return audio
    import librosa  # noqa: PLC0415

    return librosa.effects.time_stretch(audio.astype(np.float32), rate=speed).astype(np.float32)


class _Appended:
    """A write-only file for libsndfile that hands out what was appended since last asked."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.pos = 0
        self.taken = 0

    def write(self, data: bytes) -> int:
        chunk = bytes(data)
        self.data[self.pos:self.pos + len(chunk)] = chunk
        self.pos += len(chunk)
        return len(chunk)

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset if whence == 0 else self.pos + offset if whence == 1 else (
            len(self.data) + offset)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def read(self, _size: int = -1) -> bytes:
        return b""

    def take(self) -> bytes:
        out = bytes(self.data[self.taken:])
        self.taken = len(self.data)
        return out


class OggOpusStream:
    """Ogg Opus made as the audio comes: Ogg pages are only ever appended (checked:
    libsndfile never seeks back in an Ogg Opus file), so each page can be sent at once."""

    def __init__(self, sample_rate: int = SAMPLE_RATE) -> None:
        self._sink = _Appended()
        self._file = sf.SoundFile(self._sink, "w", sample_rate, 1, "OPUS", format="OGG")

    def feed(self, pcm16: bytes) -> bytes:
        samples = np.frombuffer(pcm16, dtype="<i2").astype(np.float32) / 32767.0
        self._file.write(samples)
        return self._sink.take()

    def close(self) -> bytes:
        self._file.close()
        return self._sink.take()
