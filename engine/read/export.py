"""A project's chosen takes as one program: pauses, loudness, chapters, subtitles, tracks.

WAV and FLAC are written by libsndfile; MP3 and M4B (AAC) by FFmpeg's libraries through
PyAV, with a chapter mark where each chapter's head of room tone starts (ID3 CHAP frames
in MP3, the MP4 chapter list in M4B) and the book's title, author and cover. Pauses,
heads and tails are room tone, not digital zero. The level target is the program's
integrated loudness (BS.1770) or, for the ACX preset, its RMS; a limiter holds each
take's peaks under the ceiling. A lossy encoder moves the level (MP3 read -22.1 LUFS for
-20 asked) and lifts the limited peaks, so every export is measured as written, decoded
by the same libraries a player uses: one off its target is corrected once and written
again (a lossy file whose peaks are still over the ceiling, once more), and the export
states the file's own loudness and true peak; with a preset, each chapter is checked on
the file by FFmpeg's own filters (`engine.read.acx`). Subtitles (SRT and WebVTT) give
each line's time in the program; the tracks are one WAV per voice, each as long as the
program, silent where the others speak, so they line up in an audio editor.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
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
from engine.audio.limiter import limit_peaks, room_tone
from engine.audio.loudness import LoudnessMeter, loudness_gain_db
from engine.audio.timebase import SAMPLE_RATE
from engine.core.atomic import atomic_path, write_json, write_text
from engine.core.errors import InputError
from engine.layout import reading
from engine.read.acx import check_chapters, check_words
from engine.read.project import Plan, line_takes
from engine.synth.render import user_file_mode, write_audio_pieces

#: bit rates of the compressed exports (mono speech)
_BIT_RATES = {"mp3": 96_000, "m4b": 64_000}
_CONTAINERS = {"mp3": ("mp3", "libmp3lame"), "m4b": ("mp4", "aac")}
#: the M4B's brand: an audiobook, for the players that go by it
_M4B_OPTIONS = {"brand": "M4B "}
#: a cover's codec by its file's extension
_COVER_CODECS = {".png": "png", ".jpg": "mjpeg", ".jpeg": "mjpeg"}
#: samples handed to the encoder at a time
_SLICE = SAMPLE_RATE * 10
#: how far (LU) a written file's loudness may be from its target before it is corrected
LOUDNESS_TOLERANCE_LU = 0.3
#: the sample peak a correction may raise the program to (loudness_gain_db's ceiling)
_PEAK_CEILING = 10 ** (-1.0 / 20)
#: the most the limiter may take off the loudest peak before the gain is lowered instead
_LIMIT_DB = 12.0
#: how far (dB) under its ceiling the limiter goes when a lossy encoder lifted the peaks
_MARGIN_DB = 0.3
#: writes after the first that may bring a lossy file's lifted peaks under the ceiling
_PEAK_CORRECTIONS = 2


@dataclass
class Placed:
    """A line in the program (its parts' takes and the pauses between them): where it
    starts and ends, in samples."""

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

    #: (take file or None for a pause, samples), in order; a line's takes (its parts)
    #: lie within its `Placed` start and end
    parts: list[tuple[Path | None, int]] = field(default_factory=list)
    lines: list[Placed] = field(default_factory=list)
    #: (title, start sample) of each chapter
    chapters: list[tuple[str, int]] = field(default_factory=list)
    #: the RMS level (dBFS) of the room tone in pauses; None: digital silence
    tone_db: float | None = None
    #: the sample peak (linear) the limiter holds the takes under; None: no limiter
    ceiling: float | None = None

    @property
    def samples(self) -> int:
        return sum(n for _, n in self.parts)

    def pieces(self, gain: float = 1.0, voice: str | None = None) -> Iterator[np.ndarray]:
        """The program's samples in order, a take or at most `_SLICE` of pause at a time,
        times `gain` and held under `ceiling` by the limiter; pauses are room tone (in the
        mix) or silence; with `voice`, the other voices' lines are silence (a track)."""
        at, line = 0, 0
        for index, (path, n) in enumerate(self.parts):
            # the line a take belongs to: a line is one take or several (its parts)
            while line + 1 < len(self.lines) and self.lines[line + 1].start <= at:
                line += 1
            at += n
            if path is None or (voice is not None and self.lines[line].voice != voice):
                for begin in range(0, n, _SLICE):
                    size = min(_SLICE, n - begin)
                    yield (room_tone(size, self.tone_db, index * 1_000_003 + begin)
                           if path is None and voice is None and self.tone_db is not None
                           else np.zeros(size, dtype=np.float32))
                continue
            audio = _take(path)[:n]
            if gain != 1.0:
                audio = (audio * np.float32(gain)).astype(np.float32)
            yield (limit_peaks(audio, self.ceiling, SAMPLE_RATE) if self.ceiling is not None
                   else audio)


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
    if index == len(plan.lines) - 1 or plan.lines[index + 1].line.chapter != line.chapter:
        return request.chapter_pause_s
    return request.paragraph_pause_s if line.paragraph_end else request.line_pause_s


def assemble(plan: Plan) -> Program:
    """The chosen takes in order with their pauses (every part of every line must have a
    take): each chapter opens on `head_s` of room tone and closes on `chapter_pause_s`
    of it; a line's parts are joined with the pauses between them
    (`project.line_takes`)."""
    request = plan.request.for_export()
    program = Program(tone_db=request.room_tone_db, ceiling=10 ** (request.peak_dbfs / 20))
    head = round(request.head_s * SAMPLE_RATE)
    at = 0
    for index, planned in enumerate(plan.lines):
        takes = line_takes(plan, planned)
        line = planned.line
        if line.chapter == len(program.chapters):  # the chapter's first line
            program.chapters.append((plan.script.chapters[line.chapter].title, at))
            if head:
                program.parts.append((None, head))
                at += head
        start = at
        for path, pause_s in takes:
            length = _take_samples(path)
            program.parts.append((path, length))
            at += length
            between = round(pause_s * SAMPLE_RATE)
            if between:
                program.parts.append((None, between))
                at += between
        program.lines.append(Placed(line.number, line.chapter, planned.voice.name, line.text,
                                    start, at))
        pause = round(_pause_after(plan, index) * SAMPLE_RATE)
        if pause:
            program.parts.append((None, pause))
            at += pause
    return program


@dataclass(frozen=True)
class Tags:
    """What an MP3 or M4B says of its book: title, author, cover (file name, bytes)."""

    title: str
    author: str = ""
    cover: tuple[str, bytes] | None = None


def _add_cover(out: Any, cover: tuple[str, bytes]) -> None:
    """The cover image as the file's attached picture (its bytes as they are)."""
    name, data = cover
    codec = _COVER_CODECS.get(Path(name).suffix.lower())
    if codec is None:
        raise InputError(f"The cover {name} is not a JPEG or PNG.", "Give a .jpg or .png.")
    try:
        with av.open(io.BytesIO(data)) as image:
            picture = image.streams.video[0].codec_context
            width, height, pixels = picture.width, picture.height, picture.pix_fmt
    except (av.FFmpegError, IndexError) as exc:
        raise InputError(f"The cover {name} cannot be read as an image ({exc}).",
                         "Give a .jpg or .png.") from exc
    stream = out.add_stream(codec)
    # the encoder is opened (with the picture's own size and pixels) but never fed
    stream.width, stream.height, stream.pix_fmt = width, height, pixels
    stream.disposition = av.stream.Disposition.attached_pic
    packet = av.Packet(data)
    packet.stream = stream
    packet.pts = packet.dts = 0
    out.mux(packet)


def _encode(path: Path, pieces: Iterable[np.ndarray], total: int, fmt: str,
            chapters: list[tuple[str, int]], tags: Tags) -> None:
    """MP3 or M4B through PyAV, with chapter marks and tags, fed a piece at a time."""
    container_format, codec = _CONTAINERS[fmt]
    with atomic_path(path, suffix=f".{fmt}") as tmp:
        with av.open(str(tmp), "w", format=container_format,
                     container_options=_M4B_OPTIONS if fmt == "m4b" else {}) as out:
            stream = out.add_stream(codec, rate=SAMPLE_RATE, layout="mono")
            stream.bit_rate = _BIT_RATES[fmt]
            out.metadata["title"] = out.metadata["album"] = tags.title
            if tags.author:
                out.metadata["artist"] = out.metadata["album_artist"] = tags.author
            out.metadata["genre"] = "Audiobook"
            if tags.cover:
                _add_cover(out, tags.cover)
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
    request = plan.request.for_export()
    level = request.rms_db if request.rms_db is not None else request.loudness_lufs
    cover = plan.script.cover
    if request.cover:
        try:
            cover = (request.cover, Path(request.cover).read_bytes())
        except OSError as exc:
            raise InputError(f"Cannot read the cover {request.cover}: {exc}.",
                             "Give a .jpg or .png file.") from exc
    tags = Tags(request.title or plan.script.title or Path(request.script).stem,
                request.author or plan.script.author, cover)
    written = write_program(assemble(plan), Path(out), level, tags,
                            subtitles=request.subtitles,
                            tracks=request.tracks, check=request.preset,
                            rms=request.rms_db is not None)
    write_json(plan.project / reading.EXPORT_FILE, written)
    return written


def _gain_db(loudness: float, peak: float, wanted: float, ceiling: float | None) -> float:
    """The gain to `wanted` LUFS: the limiter takes the peaks over `ceiling`, up to
    `_LIMIT_DB` off the loudest one; without a limiter, the peak caps the gain."""
    if ceiling is None:
        return loudness_gain_db(loudness, peak, wanted)[0]
    gain_db = wanted - loudness
    if peak > 0:
        gain_db = min(gain_db, 20 * np.log10(ceiling / peak) + _LIMIT_DB)
    return gain_db


def write_program(program: Program, target: Path, wanted: float | None, tags: Tags | str,
                  subtitles: bool = False, tracks: bool = False,
                  check: str | None = None, rms: bool = False) -> dict[str, Any]:
    """`program` written to `target` at `wanted` LUFS (or dB RMS, with `rms`) in two passes
    over its takes (one measures, one writes), then measured as written and, off its
    target (a lossy encoder, the limiter), corrected once (its lifted peaks, at most
    twice: `_PEAK_CORRECTIONS`); memory one take long, whatever
    the program's length. `check` ("acx"): that platform's check of each chapter, measured
    on the file."""
    fmt = target.suffix.lower().lstrip(".")
    tags = tags if isinstance(tags, Tags) else Tags(tags)
    gain, peak = 1.0, 0.0
    if wanted is not None:
        meter = LoudnessMeter(SAMPLE_RATE)
        energy = 0.0
        for piece in Program(program.parts, program.lines, program.chapters).pieces():
            meter.push(piece)
            energy += float(np.dot(piece, piece))
        level = _rms_db(energy, meter.samples) if rms else meter.loudness()
        peak = meter.sample_peak
        if np.isfinite(level):
            gain = 10 ** (_gain_db(level, peak, wanted, program.ceiling) / 20)
    target.parent.mkdir(parents=True, exist_ok=True)
    _write(target, program, gain, fmt, tags)
    measured = measure_written(target)
    ceiling_db = 20 * np.log10(program.ceiling) if program.ceiling is not None else 0.0
    for correction in range(_PEAK_CORRECTIONS):
        level = measured[2] if rms else measured[0]
        # a lossy encoder's ringing lifts the limited peaks: the ceiling comes down by as
        # much; by how much it lifts them moves with what it is given, so a peak still
        # over is brought down once more
        overshoot = (measured[3] - ceiling_db
                     if program.ceiling is not None and fmt in _CONTAINERS else 0.0)
        off_level = (correction == 0 and wanted is not None and np.isfinite(level)
                     and abs(level - wanted) > LOUDNESS_TOLERANCE_LU)
        if not off_level and overshoot <= 0:
            break
        # the encoder or the limiter moved the level: corrected once, under the same rule
        step_db = wanted - level if off_level and wanted is not None else 0.0
        if overshoot > 0 and program.ceiling is not None:
            program = dataclasses.replace(
                program, ceiling=float(program.ceiling * 10 ** (-(overshoot + _MARGIN_DB) / 20)))
        if peak > 0:
            ceiling, over = ((program.ceiling, _LIMIT_DB) if program.ceiling is not None
                             else (_PEAK_CEILING, 0.0))
            step_db = min(step_db, 20 * np.log10(ceiling / (peak * gain)) + over)
        gain *= 10 ** (step_db / 20)
        _write(target, program, gain, fmt, tags)
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
    loudness, peak_dbtp, rms_db, _ = measured
    written.update(duration_s=round(program.samples / SAMPLE_RATE, 3), chapters=chapters,
                   loudness_lufs=round(loudness, 2) if np.isfinite(loudness) else None,
                   true_peak_dbtp=round(peak_dbtp, 2) if np.isfinite(peak_dbtp) else None,
                   loudness_target_lufs=None if rms else wanted, lines=len(program.lines))
    if rms:
        written.update(rms_db=round(rms_db, 2) if np.isfinite(rms_db) else None,
                       rms_target_db=wanted)
    written["level"] = level_words(written)
    if check:
        report = check_chapters(target, [start / SAMPLE_RATE for _, start in program.chapters],
                                [name for name, _ in program.chapters])
        written["check"] = {"preset": check, "passed": all(c["passed"] for c in report),
                            "chapters": report, "words": check_words(report)}
    return written


def _write(target: Path, program: Program, gain: float, fmt: str, tags: Tags) -> None:
    if fmt in ("wav", "flac"):
        write_audio_pieces(target, program.pieces(gain), fmt)
    else:
        _encode(target, program.pieces(gain), program.samples, fmt, program.chapters, tags)


def measure_written(path: Path) -> tuple[float, float, float, float]:
    """(integrated loudness in LUFS, true peak in dBTP, RMS in dB, sample peak in dBFS) of
    an exported file as a player decodes it (FFmpeg's decoders, through PyAV), frame by
    frame at its own rate."""
    energy = 0.0
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        rate = stream.rate or SAMPLE_RATE
        meter = LoudnessMeter(rate)
        mono = av.AudioResampler(format="flt", layout="mono", rate=rate)
        for frame in itertools.chain(container.decode(stream), [None]):
            for out in mono.resample(frame):
                samples = out.to_ndarray().reshape(-1)
                meter.push(samples)
                energy += float(np.dot(samples, samples))
    sample_peak = 20 * np.log10(meter.sample_peak) if meter.sample_peak > 0 else float("-inf")
    return (meter.loudness(), meter.true_peak_dbtp(), _rms_db(energy, meter.samples),
            sample_peak)


def _rms_db(energy: float, samples: int) -> float:
    return 10 * np.log10(energy / samples) if energy > 0 and samples else float("-inf")


def level_words(written: dict[str, Any]) -> str:
    """The export's level as measured on the file, and how far from its target."""
    lufs, peak, wanted = (written.get("loudness_lufs"), written.get("true_peak_dbtp"),
                          written.get("loudness_target_lufs"))
    if lufs is None:
        return "silent"
    words = f"{lufs:.1f} LUFS, true peak {peak:.1f} dBTP"
    if written.get("rms_db") is not None:
        words += f", RMS {written['rms_db']:.1f} dB"
    if wanted is not None and abs(lufs - wanted) > LOUDNESS_TOLERANCE_LU:
        words += (f" ({wanted - lufs:.1f} LU under the {wanted:g} LUFS asked: its peaks "
                  "allow no more)" if lufs < wanted else f" ({lufs - wanted:.1f} LU over "
                  f"the {wanted:g} LUFS asked)")
    return words
