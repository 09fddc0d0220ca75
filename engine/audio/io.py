"""Audio file I/O: probe, decode to 24 kHz mono in blocks, write WAV, copy untouched.

libsndfile (>= 1.1, through soundfile) reads WAV, FLAC, OGG/Vorbis/Opus and MP3
itself, so there is no ffmpeg/audioread fallback. Decoding streams the file in
blocks: each block is downmixed and resampled before the next is read, so
memory holds only the 24 kHz mono result (a 60-minute file is ~350 MB) and a
file longer than the limit is refused from its header, before any decoding.

Light module: numpy + soundfile (+ soxr or scipy), no torch.
"""

from __future__ import annotations

import errno
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf

from engine.audio.resample import resample
from engine.audio.timebase import SAMPLE_RATE
from engine.core.atomic import atomic_path
from engine.core.errors import AudioError, DiskFullError, WorkspaceError

#: the rate prepared clips are written at: the codec's
TARGET_SR = SAMPLE_RATE
AUDIO_EXTENSIONS = frozenset({".wav", ".wave", ".flac", ".ogg", ".oga", ".opus", ".mp3"})
#: 10 ms frames at the source rate count full-scale samples (for per-clip clipping)
CLIP_FRAME_S = 0.01
#: a sample this close to full scale counts as clipped
CLIP_LEVEL = 0.999
MAX_FILE_BYTES = 8 << 30


class BadAudioFile(AudioError):
    """A file that cannot be used, with a stable `reason_code` for reports."""

    def __init__(self, reason: str, reason_code: str = "unreadable") -> None:
        super().__init__(reason)
        self.reason_code = reason_code


@dataclass(frozen=True)
class AudioInfo:
    path: Path
    sample_rate: int
    channels: int
    frames: int
    format: str
    subtype: str
    bytes: int

    @property
    def duration_s(self) -> float:
        return self.frames / self.sample_rate if self.sample_rate else 0.0


@dataclass
class DecodeStats:
    """What the raw file looked like before any processing."""

    source_rate: int
    channels: int
    frames: int
    peak: float
    dc_offset: float
    non_finite: int
    clipped: int
    #: full-scale sample count per 10 ms frame of the source (summed over channels)
    clip_frames: np.ndarray

    def clipped_between(self, start_s: float, end_s: float) -> int:
        a = max(0, int(start_s / CLIP_FRAME_S))
        b = max(a, int(np.ceil(end_s / CLIP_FRAME_S)))
        return int(self.clip_frames[a:b].sum())

    def source_samples(self, duration_s: float) -> int:
        """How many source samples (all channels) `duration_s` of the recording holds."""
        return int(duration_s * self.source_rate * self.channels)


def clip_frame_counts(absd: np.ndarray, sample_rate: int) -> np.ndarray:
    """Full-scale samples (`clipped_per_sample`) per CLIP_FRAME_S frame of a (samples,
    channels) array of magnitudes, the last frame padded."""
    frame_len = max(1, round(sample_rate * CLIP_FRAME_S))
    full = clipped_per_sample(absd)
    pad = (-len(full)) % frame_len
    if pad:
        full = np.concatenate([full, np.zeros(pad, dtype=full.dtype)])
    return full.reshape(-1, frame_len).sum(axis=1).astype(np.int32)


def without_dc(audio: np.ndarray) -> np.ndarray:
    """Mono audio with its DC offset removed: the median, not the mean, so a pop (a short
    one-sided burst) does not shift the silence around the speech into a steady offset,
    which measured as a tonal background (a "music bed") and as noise."""
    return audio - np.float32(np.median(audio)) if len(audio) else audio


def stats_of(audio: np.ndarray, sample_rate: int) -> DecodeStats:
    """`decode`'s stats of a recording in memory, (samples,) or (samples, channels) float:
    a take judged before it is saved is counted as Prepare counts its file."""
    x = np.asarray(audio, dtype=np.float32)
    x = x[:, None] if x.ndim == 1 else x
    finite = np.isfinite(x)
    x = np.where(finite, x, 0.0).astype(np.float32) if not finite.all() else x
    absd = np.abs(x)
    counts = clip_frame_counts(absd, sample_rate) if len(x) else np.zeros(0, np.int32)
    return DecodeStats(source_rate=sample_rate, channels=x.shape[1], frames=len(x),
                       peak=float(absd.max(initial=0.0)),
                       dc_offset=float(x.mean()) if x.size else 0.0,
                       non_finite=int((~finite).sum()), clipped=int(counts.sum()),
                       clip_frames=counts)


def clipped_per_sample(absd: np.ndarray) -> np.ndarray:
    """Clipped channels per sample of a (samples, channels) array of magnitudes.

    Clipping flattens the wave: a full-scale sample counts only with a
    full-scale neighbour, so the lone peak of a peak-normalised file does not.
    """
    at_max = absd >= CLIP_LEVEL
    flat = np.zeros_like(at_max)
    if len(at_max) > 1:
        pair = at_max[1:] & at_max[:-1]
        flat[1:] |= pair
        flat[:-1] |= pair
    return flat.sum(axis=1)


def _reason(exc: BaseException) -> str:
    """libsndfile's message, made one short line."""
    text = str(exc).strip()
    low = text.lower()
    if "not recognised" in low or "unknown format" in low or "not recognized" in low:
        return "is not a readable audio file (format not recognised)"
    if "does not exist" in low:
        # libsndfile's words when its MP3 decoder finds no frame in a file that does exist
        return "is not a readable audio file (no valid audio frames)"
    if ": " in text:
        text = text.rsplit(": ", 1)[-1]
    return " ".join(text.split())[:160] or type(exc).__name__


def _os_reason(exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return "cannot be read: the file does not exist (or is a broken link)"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return "cannot be read: permission denied"
    if exc.errno == errno.EISDIR:
        return "is a folder, not an audio file"
    return f"cannot be read: {exc.strerror or exc}"


def probe(path: str | os.PathLike[str], max_bytes: int = MAX_FILE_BYTES) -> AudioInfo:
    """Read only the header. Raises AudioError with a one-line reason."""
    p = Path(path)
    try:
        st = p.stat()
        if not p.is_file():
            raise BadAudioFile("is a folder or device, not an audio file", "not_a_file")
        if st.st_size == 0:
            raise BadAudioFile("is empty (0 bytes)", "empty")
        if st.st_size > max_bytes:
            raise BadAudioFile(f"is too large ({st.st_size / (1 << 30):.1f} GiB; the limit is "
                               f"{max_bytes / (1 << 30):.0f} GiB)", "too_large")
        # through a Python file object: permission errors stay OSErrors, and names that
        # are not valid UTF-8 never reach libsndfile
        with open(p, "rb") as fh:
            info = sf.info(fh)
    except AudioError:
        raise
    except OSError as exc:
        raise BadAudioFile(_os_reason(exc), "unreadable") from exc
    except (RuntimeError, sf.LibsndfileError, ValueError, TypeError) as exc:
        reason = _reason(exc)
        raise BadAudioFile(reason, "not_audio" if "not a readable" in reason
                           else "damaged") from exc
    if info.samplerate <= 0 or info.channels <= 0:
        raise BadAudioFile("has an invalid header (no sample rate or channels)", "damaged")
    if info.frames <= 0:
        raise BadAudioFile("contains no audio samples", "empty")
    return AudioInfo(p, int(info.samplerate), int(info.channels), int(info.frames),
                     str(info.format), str(info.subtype), int(st.st_size))


class _Resampler:
    """Streaming resampler: soxr when installed (a librosa dependency), else scipy at the end."""

    def __init__(self, in_rate: int, out_rate: int) -> None:
        self.in_rate, self.out_rate = in_rate, out_rate
        self._stream = None
        self._pending: list[np.ndarray] = []
        if in_rate != out_rate:
            try:
                import soxr  # noqa: PLC0415
                self._stream = soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32",
                                                   quality="HQ")
            except ImportError:
                self._stream = None

    def push(self, block: np.ndarray, last: bool = False) -> np.ndarray | None:
        if self.in_rate == self.out_rate:
            return block
        if self._stream is not None:
            return self._stream.resample_chunk(block, last=last)
        self._pending.append(block)
        if not last:
            return None
        return resample(np.concatenate(self._pending), self.in_rate, self.out_rate)


@dataclass
class _SourceTally:
    """What decode measures of the source while it streams: peak, DC sum, bad and
    full-scale samples, counted block by block before downmixing."""

    sample_rate: int
    channels: int
    peak: float = 0.0
    total: float = 0.0
    non_finite: int = 0
    clipped: int = 0
    frames: int = 0
    clip_frames: list[np.ndarray] = field(default_factory=list)

    def add(self, data: np.ndarray) -> np.ndarray:
        """Count one (samples, channels) block; return it as finite float32 mono."""
        bad = ~np.isfinite(data)
        if bad.any():
            self.non_finite += int(bad.sum())
            data = np.where(bad, 0.0, data).astype(np.float32)
        absd = np.abs(data)
        self.peak = max(self.peak, float(absd.max()))
        counts = clip_frame_counts(absd, self.sample_rate)
        self.clipped += int(counts.sum())
        self.clip_frames.append(counts)
        mono = data.mean(axis=1) if self.channels > 1 else data[:, 0]
        self.total += float(mono.sum(dtype=np.float64))
        self.frames += len(data)
        return np.ascontiguousarray(mono, dtype=np.float32)

    def stats(self) -> DecodeStats:
        return DecodeStats(
            source_rate=self.sample_rate, channels=self.channels, frames=self.frames,
            peak=self.peak, dc_offset=self.total / self.frames,
            non_finite=self.non_finite, clipped=self.clipped,
            clip_frames=(np.concatenate(self.clip_frames) if self.clip_frames
                         else np.zeros(0, np.int32)),
        )


def _stream_blocks(info: AudioInfo, block: int, tally: _SourceTally,
                   resampler: _Resampler) -> list[np.ndarray]:
    """Read the file block by block, each counted, downmixed and resampled before
    the next is read; the resampled pieces in order."""
    out: list[np.ndarray] = []
    with open(info.path, "rb") as raw, sf.SoundFile(raw) as fh:
        while True:
            data = fh.read(block, dtype="float32", always_2d=True)
            last = len(data) < block
            if len(data):
                res = resampler.push(tally.add(data), last)
            elif last:
                res = resampler.push(np.zeros(0, dtype=np.float32), True)
            else:
                res = None
            if res is not None and len(res):
                out.append(res)
            if last:
                return out


def decode(path: str | os.PathLike[str], target_sr: int = TARGET_SR,
           max_seconds: float = 3600.0, block_s: float = 10.0
           ) -> tuple[np.ndarray, DecodeStats]:
    """Decode any supported file to float32 mono at `target_sr`.

    Non-finite samples are counted and zeroed (the caller decides whether to reject).
    Raises AudioError (one-line reason) for unreadable, empty or over-long files.
    """
    info = probe(path)
    if info.duration_s > max_seconds:
        raise BadAudioFile(f"is too long ({info.duration_s / 60:.1f} min; the limit is "
                           f"{max_seconds / 60:.0f} min per file)", "too_long_file")
    sr = info.sample_rate
    frame_len = max(1, round(sr * CLIP_FRAME_S))
    block = max(frame_len, int(sr * block_s) // frame_len * frame_len)
    tally = _SourceTally(sr, info.channels)
    try:
        out = _stream_blocks(info, block, tally, _Resampler(sr, target_sr))
    except AudioError:
        raise
    except MemoryError as exc:
        raise BadAudioFile("is too large to decode in memory", "too_large") from exc
    except OSError as exc:
        raise BadAudioFile(_os_reason(exc), "unreadable") from exc
    except (RuntimeError, sf.LibsndfileError, ValueError) as exc:
        raise BadAudioFile(f"is damaged: {_reason(exc)}", "damaged") from exc
    if tally.frames == 0:
        raise BadAudioFile("contains no audio samples", "empty")
    audio = np.concatenate(out) if out else np.zeros(0, dtype=np.float32)
    return audio.astype(np.float32, copy=False), tally.stats()


def read_mono(path: str | os.PathLike[str], target_sr: int = TARGET_SR) -> np.ndarray:
    """Convenience for callers that need samples only (train, synth reference audio)."""
    return decode(path, target_sr)[0]


def write_wav(path: str | os.PathLike[str], audio: np.ndarray, sample_rate: int,
              subtype: str = "PCM_16") -> Path:
    """Atomically write a WAV file."""
    target = Path(path)
    with atomic_path(target, suffix=".wav") as tmp:
        sf.write(str(tmp), audio, sample_rate, subtype=subtype, format="WAV")
    return target


def write_take_array(target: Path, audio: np.ndarray, sample_rate: int) -> None:
    """Save a recorded array as WAV without changing its samples (int16 stays int16)."""
    arr = np.asarray(audio)
    if arr.dtype == np.int16:
        subtype = "PCM_16"
    elif arr.dtype == np.int32:
        subtype = "PCM_32"
    else:
        arr = arr.astype(np.float32, copy=False)
        subtype = "FLOAT"
    write_wav(target, arr, sample_rate, subtype=subtype)


def copy_and_hash(src: Path, dst: Path, chunk: int = 1 << 20) -> str:
    """Copy bytes untouched (atomically) and return their SHA-256."""
    h = hashlib.sha256()
    try:
        with open(src, "rb") as fin, atomic_path(dst, suffix=dst.suffix) as tmp, \
                open(tmp, "wb") as fout:
            while block := fin.read(chunk):
                h.update(block)
                fout.write(block)
    except (WorkspaceError, DiskFullError):
        raise
    except OSError as exc:
        raise BadAudioFile(_os_reason(exc), "unreadable") from exc
    return h.hexdigest()
