"""A project's chosen takes as one program: pauses, loudness, chapters, subtitles, tracks.

WAV and FLAC are written by libsndfile; MP3 and M4B (AAC) by FFmpeg's libraries through
PyAV, with a chapter mark at each chapter's first line (ID3 CHAP frames in MP3, the MP4
chapter list in M4B). The loudness target is the program's integrated loudness (BS.1770),
peaks kept under -1 dBFS. A lossy encoder moves the level (MP3 read -22.1 LUFS for -20
asked), so every export is measured as written, decoded by the same libraries a player
uses: a lossy one off its target is corrected once and written again, and the export
states the file's own loudness and true peak. Subtitles (SRT and WebVTT) give each line's
time in the program; the tracks are one WAV per voice, each as long as the program,
silent where the others speak, so they line up in an audio editor.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np

from engine.audio.io import read_mono
from engine.audio.loudness import integrated_loudness, true_peak_dbtp
from engine.core.atomic import atomic_path, write_json, write_text
from engine.core.errors import InputError
from engine.layout import reading
from engine.read.project import Plan, best_take
from engine.synth.render import SAMPLE_RATE, match_loudness, user_file_mode, write_audio

#: bit rates of the compressed exports (mono speech)
_BIT_RATES = {"mp3": 96_000, "m4b": 64_000}
_CONTAINERS = {"mp3": ("mp3", "libmp3lame"), "m4b": ("ipod", "aac")}
#: samples handed to the encoder at a time
_SLICE = SAMPLE_RATE * 10
#: how far (LU) a written file's loudness may be from its target before it is corrected
LOUDNESS_TOLERANCE_LU = 0.3
#: the sample peak a correction may raise the program to (match_loudness's ceiling)
_PEAK_CEILING = 10 ** (-1.0 / 20)


@dataclass
class Placed:
    """A line's take in the program: where it starts and ends, in samples."""

    number: int
    chapter: int
    voice: str
    text: str
    start: int
    end: int


@dataclass
class Program:
    audio: np.ndarray
    lines: list[Placed] = field(default_factory=list)
    #: (title, start sample) of each chapter
    chapters: list[tuple[str, int]] = field(default_factory=list)


def _pause_after(plan: Plan, index: int) -> float:
    request = plan.request
    line = plan.lines[index].line
    if line.pause_s is not None:
        return line.pause_s
    if index == len(plan.lines) - 1:
        return 0.0
    if plan.lines[index + 1].line.chapter != line.chapter:
        return request.chapter_pause_s
    return request.paragraph_pause_s if line.paragraph_end else request.line_pause_s


def assemble(plan: Plan) -> Program:
    """The chosen takes in order with their pauses (every line must have a take)."""
    parts: list[np.ndarray] = []
    program = Program(np.zeros(0, dtype=np.float32))
    at = 0
    for index, planned in enumerate(plan.lines):
        seed = best_take(plan, planned)
        if seed is None:
            raise InputError(f"Line {planned.number} has no take yet.",
                             "Render the project first (an export does).")
        audio = read_mono(reading.take_audio(plan.project, planned.key, seed), SAMPLE_RATE)
        line = planned.line
        if line.chapter == len(program.chapters):  # the chapter's first line
            program.chapters.append((plan.script.chapters[line.chapter].title, at))
        program.lines.append(Placed(line.number, line.chapter, planned.voice.name, line.text,
                                    at, at + len(audio)))
        parts.append(audio.astype(np.float32))
        at += len(audio)
        pause = round(_pause_after(plan, index) * SAMPLE_RATE)
        if pause:
            parts.append(np.zeros(pause, dtype=np.float32))
            at += pause
    program.audio = np.concatenate(parts) if parts else program.audio
    return program


def _encode(path: Path, audio: np.ndarray, fmt: str, chapters: list[tuple[str, int]],
            title: str) -> None:
    """MP3 or M4B through PyAV, with chapter marks."""
    container_format, codec = _CONTAINERS[fmt]
    with atomic_path(path, suffix=f".{fmt}") as tmp:
        with av.open(str(tmp), "w", format=container_format) as out:
            stream = out.add_stream(codec, rate=SAMPLE_RATE, layout="mono")
            stream.bit_rate = _BIT_RATES[fmt]
            out.metadata["title"] = title
            total = len(audio)
            marks = [(name, start, chapters[i + 1][1] if i + 1 < len(chapters) else total)
                     for i, (name, start) in enumerate(chapters)]
            out.set_chapters([{"id": i + 1, "start": start, "end": end,
                               "time_base": Fraction(1, SAMPLE_RATE),
                               "metadata": {"title": name}}
                              for i, (name, start, end) in enumerate(marks)])
            pts = 0
            for begin in range(0, total, _SLICE):
                piece = np.ascontiguousarray(audio[None, begin:begin + _SLICE])
                frame = av.AudioFrame.from_ndarray(piece, format="flt", layout="mono")
                frame.sample_rate = SAMPLE_RATE
                frame.pts = pts
                pts += piece.shape[1]
                for packet in stream.encode(frame):
                    out.mux(packet)
            for packet in stream.encode(None):
                out.mux(packet)
        os.chmod(tmp, user_file_mode())


def _stamp(samples: int, comma: bool) -> str:
    ms = round(samples * 1000 / SAMPLE_RATE)
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{',' if comma else '.'}{ms:03d}"


def subtitles(program: Program, vtt: bool) -> str:
    """The lines' times as SRT (numbered cues, commas) or WebVTT."""
    cues = []
    for i, placed in enumerate(program.lines, 1):
        times = f"{_stamp(placed.start, not vtt)} --> {_stamp(placed.end, not vtt)}"
        cues.append(f"{times}\n{placed.text}" if vtt else f"{i}\n{times}\n{placed.text}")
    return ("WEBVTT\n\n" if vtt else "") + "\n\n".join(cues) + "\n"


def _tracks(program: Program, folder: Path) -> list[str]:
    """One WAV per voice, as long as the program, at the mix's level."""
    written = []
    folder.mkdir(parents=True, exist_ok=True)
    for voice in dict.fromkeys(p.voice for p in program.lines):
        track = np.zeros_like(program.audio)
        for placed in program.lines:
            if placed.voice == voice:
                track[placed.start:placed.end] = program.audio[placed.start:placed.end]
        name = voice.replace("/", "-") + ".wav"
        written.append(str(write_audio(folder / name, track, "wav")))
    return written


def export(plan: Plan, out: str | os.PathLike[str]) -> dict[str, Any]:
    """Write the program to `out` (its extension picks the format), and beside it the
    subtitles and tracks the request asks for; returns what was written."""
    request = plan.request
    target = Path(out)
    fmt = target.suffix.lower().lstrip(".")
    program = assemble(plan)
    audio, _ = match_loudness(program.audio, request.loudness_lufs, SAMPLE_RATE)
    target.parent.mkdir(parents=True, exist_ok=True)
    title = Path(request.script).stem
    _write(target, audio, fmt, program.chapters, title)
    measured = measure_written(target)
    wanted = request.loudness_lufs
    if (wanted is not None and fmt in _CONTAINERS and np.isfinite(measured[0])
            and abs(measured[0] - wanted) > LOUDNESS_TOLERANCE_LU):
        gain = 10 ** ((wanted - measured[0]) / 20)
        peak = float(np.max(np.abs(audio))) if audio.size else 0.0
        if peak > 0:
            gain = min(gain, _PEAK_CEILING / peak)
        audio = (audio * gain).astype(np.float32)
        _write(target, audio, fmt, program.chapters, title)
        measured = measure_written(target)
    program.audio = audio
    written: dict[str, Any] = {"path": str(target), "format": fmt}
    if request.subtitles:
        for kind in ("srt", "vtt"):
            written[kind] = str(write_text(target.with_suffix(f".{kind}"),
                                           subtitles(program, kind == "vtt")))
    if request.tracks:
        written["tracks"] = _tracks(program, target.with_name(target.stem + "-tracks"))
    duration = len(audio) / SAMPLE_RATE
    chapters = [{"title": name, "start_s": round(start / SAMPLE_RATE, 3)}
                for name, start in program.chapters]
    loudness, peak_dbtp = measured
    written.update(duration_s=round(duration, 3), chapters=chapters,
                   loudness_lufs=round(loudness, 2) if np.isfinite(loudness) else None,
                   true_peak_dbtp=round(peak_dbtp, 2) if np.isfinite(peak_dbtp) else None,
                   loudness_target_lufs=wanted, lines=len(program.lines))
    written["level"] = level_words(written)
    write_json(plan.project / reading.EXPORT_FILE, written)
    return written


def _write(target: Path, audio: np.ndarray, fmt: str, chapters: list[tuple[str, int]],
           title: str) -> None:
    if fmt in ("wav", "flac"):
        write_audio(target, audio, fmt)
    else:
        _encode(target, audio, fmt, chapters, title)


def measure_written(path: Path) -> tuple[float, float]:
    """(integrated loudness in LUFS, true peak in dBTP) of an exported file as a player
    decodes it (FFmpeg's decoders, through PyAV), mono at its own rate."""
    pieces: list[np.ndarray] = []
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        rate = stream.rate or SAMPLE_RATE
        mono = av.AudioResampler(format="flt", layout="mono", rate=rate)
        for frame in container.decode(stream):
            for out in mono.resample(frame):
                pieces.append(out.to_ndarray().reshape(-1))
        for out in mono.resample(None):
            pieces.append(out.to_ndarray().reshape(-1))
    audio = np.concatenate(pieces) if pieces else np.zeros(0, np.float32)
    if audio.size == 0:
        return float("-inf"), float("-inf")
    return integrated_loudness(audio, rate), true_peak_dbtp(audio, rate)


def level_words(written: dict[str, Any]) -> str:
    """The export's level as measured on the file, and how far from its target."""
    lufs, peak, wanted = (written.get("loudness_lufs"), written.get("true_peak_dbtp"),
                          written.get("loudness_target_lufs"))
    if lufs is None:
        return "silent"
    words = f"{lufs:.1f} LUFS, true peak {peak:.1f} dBTP"
    if wanted is not None and abs(lufs - wanted) > LOUDNESS_TOLERANCE_LU:
        words += (f" ({wanted - lufs:.1f} LU under the {wanted:g} LUFS asked: its peaks "
                  "allow no more)" if lufs < wanted else f" ({lufs - wanted:.1f} LU over "
                  f"the {wanted:g} LUFS asked)")
    return words
