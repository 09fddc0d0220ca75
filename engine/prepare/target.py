"""Prepare's target-speaker stage: the enrolment, who is heard in a take, and its slices.

engine/prepare/speakers.py finds the speakers; this module ties that to a voice:
where the enrolment comes from (a clip named with --speaker-reference, kept in
the voice as `speaker_reference.<ext>` for later runs, else the voice's own
recorded takes, else none: the dominant speaker of each recording), how a take
with more than one voice is sliced (the target's turns cut at pauses, every
other speaker's and every overlapped stretch a clip of its own, excluded), and
the report's words for what was excluded.
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.audio.checks import SPEAKER_CODES, issue
from engine.audio.io import AUDIO_EXTENSIONS, TARGET_SR, BadAudioFile, decode
from engine.audio.vad import Slice, plan_slices, speech_seconds
from engine.core.atomic import read_json, write_json
from engine.core.errors import InputError
from engine.layout.voice import Take, Voice, file_sha256
from engine.prepare.speakers import (
    FRAME,
    HOP_FRAMES,
    MIN_CLUSTER_WINDOWS,
    OTHER,
    OVERLAP,
    RATE,
    TARGET,
    Segment,
    Speakers,
    Windows,
    enrolment_embedding,
    find_speakers,
    segments,
    similarity_in,
    speech_windows,
)

REFERENCE_STEM = "speaker_reference"
#: enough of the voice's own takes for a stable centroid, few enough to stay quick
MAX_ENROL_TAKES = 8
MAX_ENROL_S = 60.0


def reference_path(voice: Voice) -> Path | None:
    found = sorted(voice.path.glob(f"{REFERENCE_STEM}.*"))
    return found[0] if found else None


def set_speaker_reference(voice: Voice, clip: Path) -> Path:
    """Keep a copy of `clip` in the voice as its speaker reference (replacing any)."""
    if not clip.is_file():
        raise InputError(f"The speaker reference {clip} does not exist.",
                         "Name a WAV, FLAC, OGG or MP3 clip of the target speaker alone.")
    if clip.suffix.lower() not in AUDIO_EXTENSIONS:
        raise InputError(f"The speaker reference {clip.name} is not an audio file.",
                         "Name a WAV, FLAC, OGG or MP3 clip of the target speaker alone.")
    try:
        audio, _ = decode(clip, TARGET_SR, max_seconds=600.0)
    except BadAudioFile as exc:
        raise InputError(f"The speaker reference {clip.name} {exc.message}.",
                         "Name a clip that plays, of the target speaker alone.") from exc
    if len(audio) < TARGET_SR:
        raise InputError(f"The speaker reference {clip.name} is shorter than a second.",
                         "Name a clip with a few seconds of the target speaker alone.")
    for old in voice.path.glob(f"{REFERENCE_STEM}.*"):
        old.unlink()
    dest = voice.path / f"{REFERENCE_STEM}{clip.suffix.lower()}"
    shutil.copyfile(clip, dest)
    return dest


class Enrolment:
    """The target speaker's centroid, computed only if a take needs it."""

    def __init__(self, voice: Voice, takes: list[Take], encoder: Any = None) -> None:
        #: None: resemblyzer; else a speakers.ModelEncoder (its key joins the cache key)
        self.encoder = encoder
        self.reference = reference_path(voice)
        self.takes = [t for t in takes if t.origin == "recorded"
                      and not (t.extra or {}).get("excluded")][:MAX_ENROL_TAKES]
        if self.reference is not None:
            self.source = "speaker reference"
            self.key = "reference:" + file_sha256(self.reference)
        elif self.takes:
            self.source = "recorded takes"
            blob = ",".join(sorted(t.sha256 for t in self.takes))
            self.key = "takes:" + hashlib.sha256(blob.encode()).hexdigest()
        else:
            self.source = "dominant speaker"
            self.key = "dominant"
        if encoder is not None:
            self.key += "|" + encoder.key
        self._embedding: np.ndarray | None = None
        self._done = False

    def embedding(self) -> np.ndarray | None:
        if not self._done:
            self._done = True
            files = [self.reference] if self.reference is not None else [
                t.audio_path for t in self.takes]
            clips, total = [], 0.0
            for f in files:
                try:
                    audio, _ = decode(f, TARGET_SR, max_seconds=MAX_ENROL_S)
                except BadAudioFile:
                    continue  # the take itself is reported as rejected
                clips.append((audio, TARGET_SR))
                total += len(audio) / TARGET_SR
                if total >= MAX_ENROL_S:
                    break
            self._embedding = enrolment_embedding(clips, self.encoder)
        return self._embedding


@dataclass
class Heard:
    """Who was heard where in one take."""

    regions: list[tuple[int, int]]
    windows: Windows
    speakers: Speakers
    segments: list[Segment]
    total: int
    sample_rate: int

    @property
    def source(self) -> str:
        return self.speakers.source

    @property
    def mixed(self) -> bool:
        """Something other than the target was heard: slice by speaker."""
        return any(s.who != TARGET for s in self.segments)

    def slices(self, min_s: float, max_s: float) -> tuple[list[Slice], list[str]]:
        """The target's turns cut at pauses (never across another voice), and each
        other-speaker or overlapped stretch as one slice; with who was heard in each."""
        out: list[tuple[Slice, str]] = []
        segs = self.segments
        i = 0
        while i < len(segs):
            if segs[i].who != TARGET:
                s = segs[i]
                out.append((Slice(s.start, s.end, (s.end - s.start) / self.sample_rate,
                                  ((s.start, s.end),)), s.who))
                i += 1
                continue
            j = i
            while j < len(segs) and segs[j].who == TARGET:
                j += 1
            lo = segs[i - 1].end if i > 0 else 0
            hi = segs[j].start if j < len(segs) else self.total
            group = [(s.start, s.end) for s in segs[i:j]]
            for sl in plan_slices(group, self.total, self.sample_rate, min_s, max_s):
                # the pause padding never reaches into the other voice
                out.append((Slice(max(lo, sl.start), min(hi, sl.end), sl.speech_s,
                                  sl.regions), TARGET))
            i = j
        out.sort(key=lambda p: p[0].start)
        return [p[0] for p in out], [p[1] for p in out]

    def judge(self, sl: Slice, who: str) -> dict[str, Any]:
        sim, other = similarity_in(self.windows, self.speakers, sl.start, sl.end,
                                   self.sample_rate)
        return {"who": who, "similarity": sim, "other_similarity": other}

    def summary(self) -> dict[str, Any]:
        by = {w: speech_seconds([(s.start, s.end) for s in self.segments if s.who == w],
                                self.sample_rate) for w in (TARGET, OTHER, OVERLAP)}
        return {"source": self.source, "speakers": self.speakers.count,
                "target_s": round(by[TARGET], 2), "other_s": round(by[OTHER], 2),
                "overlap_s": round(by[OVERLAP], 2)}


def hear_speakers(audio: np.ndarray, sample_rate: int, regions: list[tuple[int, int]],
                  enrolment: np.ndarray | None, encoder: Any = None) -> Heard | None:
    """Who speaks where; None for a take too short to hold two speakers when there is no
    enrolment to compare it with (a single read sentence: nothing to embed)."""
    min_s = 2 * MIN_CLUSTER_WINDOWS * HOP_FRAMES * FRAME / RATE
    if enrolment is None and speech_seconds(regions, sample_rate) < min_s:
        return None
    windows = speech_windows(audio, sample_rate, regions, encoder)
    speakers = find_speakers(windows, enrolment)
    segs = segments(regions, sample_rate, windows, speakers)
    return Heard(regions, windows, speakers, segs, len(audio), sample_rate)


_SOURCE_WORDS = {"enrolment": "the voice's enrolment", "dominant": "the recording's main speaker"}


def speaker_issues(speaker: dict[str, Any], source: str) -> list[dict[str, str]]:
    """The report's words for a slice that is not the target speaker."""
    who, sim = speaker.get("who"), speaker.get("similarity")
    against = _SOURCE_WORDS.get(source, source)
    sim_text = f"similarity {sim:.2f} to {against}" if sim is not None else "no similarity"
    if who == OTHER:
        return [issue("another_speaker", f"Another speaker ({sim_text}).")]
    if who == OVERLAP:
        return [issue("overlap", f"Two voices at once, or neither speaker clearly "
                                 f"({sim_text}).")]
    return []


def read_decisions(voice: Voice) -> dict[str, str]:
    """The user's own calls from the Prepare page: clip id -> "keep" or "exclude"."""
    data = read_json(voice.prepared.decisions)
    if not isinstance(data, dict):
        return {}
    return {str(k): str(v) for k, v in data.items() if v in ("keep", "exclude")}


def write_decision(voice: Voice, clip_id: str, decision: str | None) -> None:
    """Record (or with None, forget) the user's call on one clip; the next prepare
    applies it without recomputing anything."""
    if decision not in (None, "keep", "exclude"):
        raise InputError(f"Unknown decision {decision!r}.", "Use 'keep' or 'exclude'.")
    calls = read_decisions(voice)
    if decision is None:
        calls.pop(clip_id, None)
    else:
        calls[clip_id] = decision
    write_json(voice.prepared.decisions, calls)


def apply_decisions(entries: list[dict[str, Any]], calls: dict[str, str]) -> None:
    """Keep: the speaker issues become a note; exclude: a blocking issue (in place)."""
    for e in entries:
        call = calls.get(e["id"])
        if call == "keep":
            left = [i for i in e["issues"] if i["code"] in SPEAKER_CODES]
            e["issues"] = [i for i in e["issues"] if i["code"] not in SPEAKER_CODES]
            if left:
                e["issues"].append(issue("speaker_kept", "Kept by you: " + left[0]["message"]))
        elif call == "exclude":
            e["issues"].append(issue("excluded_by_you", "Left out by you."))
