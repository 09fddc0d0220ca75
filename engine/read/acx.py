"""An audiobook platform's check (ACX's rules) of each chapter of an exported file,
measured by FFmpeg's own filters (`astats`, `silencedetect`, through PyAV) on the file as a
player decodes it, so the report is the file's, not the program's before encoding.

Per chapter: RMS level -23 to -18 dB, sample peak at most -3 dBFS, noise floor (the
quietest half second's RMS) at most -60 dB, 0.5 to 1 s of room tone before the first word
and 1 to 5 s after the last.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import av
import numpy as np

RMS_DB = (-23.0, -18.0)
PEAK_DBFS = -3.0
NOISE_FLOOR_DB = -60.0
HEAD_S = (0.5, 1.0)
TAIL_S = (1.0, 5.0)
#: what counts as no speech for the head and tail: under this level for this long
_SILENCE = "n=-40dB:d=0.25"
#: the window of the noise floor, seconds
_FLOOR_WINDOW_S = 0.5


class _Chapter:
    """One chapter's filters: samples in, FFmpeg's statistics and silences out."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self.samples = 0
        self.stats: dict[str, str] = {}
        self.silences: list[tuple[str, float]] = []
        self._graph = av.filter.Graph()
        self._source = self._graph.add_abuffer(sample_rate=rate, format="flt", layout="mono")
        silence = self._graph.add("silencedetect", _SILENCE)
        stats = self._graph.add("astats", f"metadata=1:reset=0:length={_FLOOR_WINDOW_S}")
        self._sink = self._graph.add("abuffersink")
        self._source.link_to(silence)
        silence.link_to(stats)
        stats.link_to(self._sink)
        self._graph.configure()

    def push(self, samples: np.ndarray | None) -> None:
        if samples is not None:
            if not samples.size:
                return
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[None, :]),
                                               format="flt", layout="mono")
            frame.sample_rate = self.rate
            frame.pts = self.samples
            self.samples += samples.size
            self._source.push(frame)
        else:
            self._source.push(None)
        while True:
            try:
                metadata = dict(self._sink.pull().metadata)
            except (av.BlockingIOError, av.EOFError):
                return
            self.stats.update(metadata)
            for key in ("lavfi.silence_start", "lavfi.silence_end"):
                if key in metadata:
                    self.silences.append((key.rsplit("_", 1)[-1], float(metadata[key])))

    def report(self, title: str) -> dict[str, Any]:
        length = self.samples / self.rate
        head = tail = 0.0
        if self.silences and self.silences[0] == ("start", 0.0):
            ends = [t for kind, t in self.silences if kind == "end"]
            head = ends[0] if ends else length
        if self.silences and self.silences[-1][0] == "start":
            tail = length - self.silences[-1][1]

        def level(name: str) -> float:
            return float(self.stats.get(f"lavfi.astats.Overall.{name}", "-inf"))

        found = {"title": title, "duration_s": round(length, 3),
                 "rms_db": level("RMS_level"), "peak_dbfs": level("Peak_level"),
                 "noise_floor_db": level("RMS_trough"), "head_s": round(head, 3),
                 "tail_s": round(tail, 3)}
        found["problems"] = _problems(found)
        found["passed"] = not found["problems"]
        for key in ("rms_db", "peak_dbfs", "noise_floor_db"):
            found[key] = round(found[key], 2) if np.isfinite(found[key]) else None
        return found


def _problems(found: dict[str, Any]) -> list[str]:
    """What fails, each with what to change."""
    out = []
    rms, peak, floor = found["rms_db"], found["peak_dbfs"], found["noise_floor_db"]
    if not RMS_DB[0] <= rms <= RMS_DB[1]:
        out.append(f"RMS {rms:.1f} dB is outside {RMS_DB[0]:g} to {RMS_DB[1]:g} dB: "
                   f"{'raise' if rms < RMS_DB[0] else 'lower'} the loudness target")
    if peak > PEAK_DBFS:
        out.append(f"peak {peak:.1f} dBFS is over {PEAK_DBFS:g} dBFS: lower the peak ceiling")
    if not floor <= NOISE_FLOOR_DB:
        out.append(f"noise floor {floor:.1f} dB is over {NOISE_FLOOR_DB:g} dB: lower the "
                   "room tone, or clean the takes")
    if not np.isfinite(floor):
        out.append("the pauses are digital silence: give them room tone")
    head, tail = found["head_s"], found["tail_s"]
    if not HEAD_S[0] <= head <= HEAD_S[1]:
        out.append(f"head {head:.2f} s is outside {HEAD_S[0]:g} to {HEAD_S[1]:g} s: set the "
                   "head")
    if not TAIL_S[0] <= tail <= TAIL_S[1]:
        out.append(f"tail {tail:.2f} s is outside {TAIL_S[0]:g} to {TAIL_S[1]:g} s: set the "
                   "chapter pause")
    return out


def check_chapters(path: Path, starts_s: list[float], titles: list[str]) -> list[dict[str, Any]]:
    """Each chapter of the file at `path` (from its start to the next one's) as FFmpeg
    measures it, decoded a frame at a time."""
    reports: list[dict[str, Any]] = []
    with av.open(str(path)) as container:
        stream = container.streams.audio[0]
        rate = stream.rate
        bounds = [round(s * rate) for s in starts_s[1:]]
        mono = av.AudioResampler(format="flt", layout="mono", rate=rate)
        chapter, at = _Chapter(rate), 0

        def feed(samples: np.ndarray) -> None:
            nonlocal chapter, at
            while bounds and at + samples.size >= bounds[0]:
                cut = bounds.pop(0) - at
                chapter.push(samples[:cut])
                chapter.push(None)
                reports.append(chapter.report(titles[len(reports)]))
                chapter, at, samples = _Chapter(rate), at + cut, samples[cut:]
            chapter.push(samples)
            at += samples.size

        for frame in container.decode(stream):
            for out in mono.resample(frame):
                feed(out.to_ndarray().reshape(-1))
        for out in mono.resample(None):
            feed(out.to_ndarray().reshape(-1))
        chapter.push(None)
        reports.append(chapter.report(titles[len(reports)]))
    return reports


def check_words(reports: list[dict[str, Any]]) -> str:
    """The check in a sentence: how many chapters pass, and what the others need."""
    failed = [r for r in reports if not r["passed"]]
    words = f"ACX check: {len(reports) - len(failed)} of {len(reports)} chapter(s) pass"
    for r in failed:
        words += f"; {r['title']}: {', '.join(r['problems'])}"
    return words
