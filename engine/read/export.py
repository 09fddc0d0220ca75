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
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
import soundfile as sf

from engine.audio.io import read_mono
from engine.audio.loudness import LoudnessMeter, loudness_gain_db
from engine.core.atomic import atomic_path, write_json, write_text
from engine.core.errors import InputError
from engine.layout import reading
from engine.read.project import Plan, best_take
from engine.synth.render import SAMPLE_RATE, user_file_mode, write_audio_pieces

#: bit rates of the compressed exports (mono speech)
_BIT_RATES = {"mp3": 96_000, "m4b": 64_000}
_CONTAINERS = {"mp3": ("mp3", "libmp3lame"), "m4b": ("ipod", "aac")}
#: samples handed to the encoder at a time
_SLICE = SAMPLE_RATE * 10
#: how far (LU) a written file's loudness may be from its target before it is corrected
LOUDNESS_TOLERANCE_LU = 0.3
#: the sample peak a correction may raise the program to (loudness_gain_db's ceiling)
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
    """Where every take and pause falls: the program is read from the takes in pieces
    (`pieces`), never held whole, so an export's memory does not grow with the book."""

    #: (take file or None for a pause, samples), in order
    parts: list[tuple[Path | None, int]] = field(default_factory=list)
    lines: list[Placed] = field(default_factory=list)
    #: (title, start sample) of each chapter
    chapters: list[tuple[str, int]] = field(default_factory=list)

    @property
    def samples(self) -> int:
        return sum(n for _, n in self.parts)

    def pieces(self, gain: float = 1.0, voice: str | None = None) -> Iterator[np.ndarray]:
        """The program's samples in order, a take or at most `_SLICE` of pause at a time,
        times `gain`; with `voice`, the other voices' lines are silence (a track)."""
        voices = iter(p.voice for p in self.lines)
        for path, n in self.parts:
            if path is None or (voice is not None and next(voices) != voice):
                for begin in range(0, n, _SLICE):
                    yield np.zeros(min(_SLICE, n - begin), dtype=np.float32)
                continue
            if voice is None:
                next(voices)
            audio = _take(path)[:n]
            yield (audio * np.float32(gain)).astype(np.float32) if gain != 1.0 else audio


def _take(path: Path) -> np.ndarray:
    return read_mono(path, SAMPLE_RATE).astype(np.float32, copy=False)


def _take_samples(path: Path) -> int:
    """A take's length at the program's rate, read from its header where it can be."""
    try:
        info = sf.info(str(path))
    except (RuntimeError, sf.LibsndfileError):
        info = None
    if info is not None and info.samplerate == SAMPLE_RATE and info.channels == 1:
        return int(info.frames)
    return len(_take(path))


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
    program = Program()
    at = 0
    for index, planned in enumerate(plan.lines):
        seed = best_take(plan, planned)
        if seed is None:
            raise InputError(f"Line {planned.number} has no take yet.",
                             "Render the project first (an export does).")
        path = reading.take_audio(plan.project, planned.key, seed)
        length = _take_samples(path)
        line = planned.line
        if line.chapter == len(program.chapters):  # the chapter's first line
            program.chapters.append((plan.script.chapters[line.chapter].title, at))
        program.lines.append(Placed(line.number, line.chapter, planned.voice.name, line.text,
                                    at, at + length))
        program.parts.append((path, length))
        at += length
        pause = round(_pause_after(plan, index) * SAMPLE_RATE)
        if pause:
            program.parts.append((None, pause))
            at += pause
    return program


def _encode(path: Path, pieces: Iterable[np.ndarray], total: int, fmt: str,
            chapters: list[tuple[str, int]], title: str) -> None:
    """MP3 or M4B through PyAV, with chapter marks, fed a piece at a time."""
    container_format, codec = _CONTAINERS[fmt]
    with atomic_path(path, suffix=f".{fmt}") as tmp:
        with av.open(str(tmp), "w", format=container_format) as out:
            stream = out.add_stream(codec, rate=SAMPLE_RATE, layout="mono")
            stream.bit_rate = _BIT_RATES[fmt]
            out.metadata["title"] = title
            marks = [(name, start, chapters[i + 1][1] if i + 1 < len(chapters) else total)
                     for i, (name, start) in enumerate(chapters)]
            out.set_chapters([{"id": i + 1, "start": start, "end": end,
                               "time_base": Fraction(1, SAMPLE_RATE),
                               "metadata": {"title": name}}
                              for i, (name, start, end) in enumerate(marks)])
            pts = 0
            for whole in pieces:
                for begin in range(0, len(whole), _SLICE):
                    piece = np.ascontiguousarray(
                        np.clip(whole[None, begin:begin + _SLICE], -1.0, 1.0))
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


def subtitle_text(program: Program, vtt: bool) -> str:
    """The lines' times as SRT (numbered cues, commas) or WebVTT."""
    cues = []
    for i, placed in enumerate(program.lines, 1):
        times = f"{_stamp(placed.start, not vtt)} --> {_stamp(placed.end, not vtt)}"
        cues.append(f"{times}\n{placed.text}" if vtt else f"{i}\n{times}\n{placed.text}")
    return ("WEBVTT\n\n" if vtt else "") + "\n\n".join(cues) + "\n"


def _tracks(program: Program, folder: Path, gain: float) -> list[str]:
    """One WAV per voice, as long as the program, at the mix's level."""
    written = []
    folder.mkdir(parents=True, exist_ok=True)
    for voice in dict.fromkeys(p.voice for p in program.lines):
        name = voice.replace("/", "-") + ".wav"
        written.append(str(write_audio_pieces(folder / name, program.pieces(gain, voice),
                                              "wav")))
    return written


def export(plan: Plan, out: str | os.PathLike[str]) -> dict[str, Any]:
    """Write the program to `out` (its extension picks the format), and beside it the
    subtitles and tracks the request asks for; returns what was written."""
    request = plan.request
    written = write_program(assemble(plan), Path(out), request.loudness_lufs,
                            Path(request.script).stem, subtitles=request.subtitles,
                            tracks=request.tracks)
    write_json(plan.project / reading.EXPORT_FILE, written)
    return written


def write_program(program: Program, target: Path, wanted: float | None, title: str,
                  subtitles: bool = False, tracks: bool = False) -> dict[str, Any]:
    """`program` written to `target` at `wanted` LUFS in two passes over its takes (one
    measures, one writes), then measured as written and, for a lossy file off its target,
    corrected once; memory one take long, whatever the program's length."""
    fmt = target.suffix.lower().lstrip(".")
    gain, peak = 1.0, 0.0
    if wanted is not None:
        meter = LoudnessMeter(SAMPLE_RATE)
        for piece in program.pieces():
            meter.push(piece)
        loudness, peak = meter.loudness(), meter.sample_peak
        if np.isfinite(loudness):
            gain = 10 ** (loudness_gain_db(loudness, peak, wanted)[0] / 20)
    target.parent.mkdir(parents=True, exist_ok=True)
    _write(target, program, gain, fmt, title)
    measured = measure_written(target)
    if (wanted is not None and fmt in _CONTAINERS and np.isfinite(measured[0])
            and abs(measured[0] - wanted) > LOUDNESS_TOLERANCE_LU):
        # the encoder moved the level: corrected once, under the same peak ceiling
        step_db = wanted - measured[0]
        if peak > 0:
            step_db = min(step_db, 20 * np.log10(_PEAK_CEILING / (peak * gain)))
        gain *= 10 ** (step_db / 20)
        _write(target, program, gain, fmt, title)
        measured = measure_written(target)
    written: dict[str, Any] = {"path": str(target), "format": fmt}
    if subtitles:
        for kind in ("srt", "vtt"):
            written[kind] = str(write_text(target.with_suffix(f".{kind}"),
                                           subtitle_text(program, kind == "vtt")))
    if tracks:
        written["tracks"] = _tracks(program, target.with_name(target.stem + "-tracks"), gain)
    chapters = [{"title": name, "start_s": round(start / SAMPLE_RATE, 3)}
                for name, start in program.chapters]
    loudness, peak_dbtp = measured
    written.update(duration_s=round(program.samples / SAMPLE_RATE, 3), chapters=chapters,
                   loudness_lufs=round(loudness, 2) if np.isfinite(loudness) else None,
                   true_peak_dbtp=round(peak_dbtp, 2) if np.isfinite(peak_dbtp) else None,
                   loudness_target_lufs=wanted, lines=len(program.lines))
    written["level"] = level_words(written)
    return written


def _write(target: Path, program: Program, gain: float, fmt: str, title: str) -> None:
    if fmt in ("wav", "flac"):
        write_audio_pieces(target, program.pieces(gain), fmt)
    else:
        _encode(target, program.pieces(gain), program.samples, fmt, program.chapters, title)


def measure_written(path: Path) -> tuple[float, float]:
    """(integrated loudness in LUFS, true peak in dBTP) of an exported file as a player
    decodes it (FFmpeg's decoders, through PyAV), frame by frame at its own rate."""
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        rate = stream.rate or SAMPLE_RATE
        meter = LoudnessMeter(rate)
        mono = av.AudioResampler(format="flt", layout="mono", rate=rate)
        for frame in container.decode(stream):
            for out in mono.resample(frame):
                meter.push(out.to_ndarray().reshape(-1))
        for out in mono.resample(None):
            meter.push(out.to_ndarray().reshape(-1))
    return meter.loudness(), meter.true_peak_dbtp()


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
