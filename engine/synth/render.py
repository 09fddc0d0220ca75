"""From per-chunk waveforms to one file: trim, join with pauses, level, write."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import soundfile as sf

from engine.audio.timebase import SAMPLE_RATE
from engine.config.speak import SOUNDFILE_FORMATS, available_formats
from engine.core.atomic import atomic_path
from engine.core.errors import InputError

_FADE_S = 0.005
_TRIM_FLOOR_DB = -45.0
_TRIM_KEEP_S = 0.04


def trim_silence(audio: np.ndarray, sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Drop leading/trailing near-silence (relative to the chunk's peak), keeping
    a short margin, so the pauses we insert are the pauses people hear."""
    if audio.size == 0:
        return audio
    peak = float(np.max(np.abs(audio)))
    if peak <= 0:
        return audio[:0]
    hop = max(1, sample_rate // 100)
    frames = len(audio) // hop
    if frames == 0:
        return audio
    env = np.abs(audio[: frames * hop]).reshape(frames, hop).max(axis=1)
    loud = np.nonzero(env > peak * 10 ** (_TRIM_FLOOR_DB / 20))[0]
    if loud.size == 0:
        return audio[:0]
    keep = int(_TRIM_KEEP_S * sample_rate)
    start = max(0, loud[0] * hop - keep)
    end = min(len(audio), (loud[-1] + 1) * hop + keep)
    return audio[start:end]


def _fade(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    # a few milliseconds of fade at each cut: no click where chunks meet
    n = min(len(audio) // 2, int(_FADE_S * sample_rate))
    if n <= 0:
        return audio
    out = audio.copy()
    ramp = np.linspace(0.0, 1.0, n, dtype=np.float32)
    out[:n] *= ramp
    out[-n:] *= ramp[::-1]
    return out


def join_chunks(chunks: list[np.ndarray], pauses_s: list[float],
                sample_rate: int = SAMPLE_RATE) -> np.ndarray:
    """Concatenate trimmed, faded chunks with `pauses_s[i]` of silence after chunk i."""
    parts: list[np.ndarray] = []
    for audio, pause in zip(chunks, pauses_s, strict=True):
        trimmed = trim_silence(np.asarray(audio, dtype=np.float32), sample_rate)
        parts.append(_fade(trimmed, sample_rate))
        if pause > 0:
            parts.append(np.zeros(round(pause * sample_rate), dtype=np.float32))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


def match_loudness(audio: np.ndarray, target_lufs: float | None,
                   sample_rate: int = SAMPLE_RATE) -> tuple[np.ndarray, float | None]:
    """Scale to `target_lufs` (peak kept under -1 dBFS); returns (audio, loudness after)."""
    if target_lufs is None or audio.size == 0:
        return audio, None
    # pyloudnorm and scipy load here: the window saves renders through this module, and
    # its bundle has neither
    from engine.audio.loudness import normalize_loudness  # noqa: PLC0415

    result = normalize_loudness(audio, sample_rate, target_lufs=target_lufs)
    after = result.loudness_after
    return result.audio, (after if np.isfinite(after) else None)


def user_file_mode() -> int:
    """The mode a plain new file gets from this process (0o666 less the umask).

    Atomic writes start from a private temporary file (mkstemp: owner only);
    a finished output must look like any file the user creates."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_audio(path: str | os.PathLike[str], audio: np.ndarray, fmt: str = "wav",
                sample_rate: int = SAMPLE_RATE) -> Path:
    """Write mono audio atomically: 16-bit WAV/FLAC, Ogg Vorbis, Ogg Opus or MP3
    (the last two where libsndfile writes them), with the user's normal permissions."""
    return write_audio_pieces(path, [audio], fmt, sample_rate)


def write_audio_pieces(path: str | os.PathLike[str], pieces: Iterable[np.ndarray],
                       fmt: str = "wav", sample_rate: int = SAMPLE_RATE) -> Path:
    """`write_audio` for a signal that comes in pieces (a book), in memory one piece
    long: nothing of it is held once written."""
    if fmt not in SOUNDFILE_FORMATS:
        raise InputError(f"Audio format {fmt!r} is not supported.",
                         f"Use one of: {', '.join(SOUNDFILE_FORMATS)}.")
    if fmt not in available_formats():
        raise InputError(f"This machine's libsndfile cannot write {fmt}.",
                         f"Use one of: {', '.join(available_formats())}.")
    container, subtype = SOUNDFILE_FORMATS[fmt]
    target = Path(path)
    if target.is_dir():
        raise InputError(f"The output {target} is a folder.", "Give a file name such as out.wav.")
    with atomic_path(target, suffix=f".{fmt}") as tmp:
        with sf.SoundFile(str(tmp), "w", sample_rate, 1, format=container,
                          subtype=subtype) as out:
            for piece in pieces:
                out.write(np.clip(np.asarray(piece, dtype=np.float32), -1.0, 1.0))
        os.chmod(tmp, user_file_mode())
    return target
