"""Voice activity, silence trimming and slicing at pauses.

Two detectors, chosen by name (`detect_speech(..., method=)`):
- "silero" (prepare's default): the Silero VAD network, whose model ships in
  the `silero-vad` wheel. It tells speech from noise, music and room tone by
  what it sounds like, not by how loud it is, so it holds up on real recordings.
- "energy" (the fallback, and what `speech_regions` still is): frame level
  (10 ms RMS) against a threshold between the recording's own noise floor and
  its loud level. Enough for single-speaker read speech in a quiet room, and
  needs no torch (the GUI's record check and render evaluation use it).

Slicing cuts long recordings at the longest pause inside any span still
longer than the maximum, so cuts land between sentences first, then between
phrases, and every piece stays >= the minimum length.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.audio.resample import resample
from engine.config import VAD_CHOICES

FRAME_S = 0.01
FLOOR_DB = -100.0
#: gaps shorter than this inside speech are stops and breaths, not pauses
MIN_GAP_S = 0.12
#: speech bursts shorter than this (clicks, pops) are ignored
MIN_BURST_S = 0.06
#: a recording whose speech covers less than this is treated as silent
MIN_SPEECH_S = 0.25
#: silence kept before and after speech when trimming
PAD_S = 0.15


@dataclass(frozen=True)
class Levels:
    db: np.ndarray  # per-frame RMS level in dBFS
    noise_db: float
    loud_db: float
    threshold_db: float
    frame: int  # samples per frame


def frame_levels(audio: np.ndarray, sample_rate: int) -> Levels:
    frame = max(1, round(FRAME_S * sample_rate))
    n = len(audio) // frame
    if n == 0:
        return Levels(np.zeros(0), FLOOR_DB, FLOOR_DB, 0.0, frame)
    # a view, not a float64 copy: an hour of audio stays an hour of float32 in memory
    x = np.ascontiguousarray(audio[: n * frame], dtype=np.float32).reshape(n, frame)
    power = np.einsum("ij,ij->i", x, x, dtype=np.float64) / frame
    db = np.maximum(10.0 * np.log10(np.maximum(power, 1e-12)), FLOOR_DB)
    noise = float(np.percentile(db, 10))
    loud = float(np.percentile(db, 97))
    # between the floor and the loud part, and never more than 45 dB under the loud part
    threshold = max(noise + 0.3 * (loud - noise), loud - 45.0)
    return Levels(db, noise, loud, threshold, frame)


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) index pairs of True runs."""
    if not len(mask):
        return []
    padded = np.concatenate([[False], mask, [False]]).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))


def speech_regions(audio: np.ndarray, sample_rate: int,
                   levels: Levels | None = None) -> list[tuple[int, int]]:
    """Speech as [start, end) sample ranges, pauses shorter than MIN_GAP_S bridged."""
    lv = levels or frame_levels(audio, sample_rate)
    if not len(lv.db) or lv.loud_db - lv.noise_db < 6.0 or lv.loud_db < -65.0:
        return []  # flat: silence, steady noise or a constant tone floor
    runs = _runs(lv.db > lv.threshold_db)
    min_gap = int(MIN_GAP_S / FRAME_S)
    merged: list[list[int]] = []
    for a, b in runs:
        if merged and a - merged[-1][1] < min_gap:
            merged[-1][1] = b
        else:
            merged.append([a, b])
    min_burst = int(MIN_BURST_S / FRAME_S)
    return [(a * lv.frame, b * lv.frame) for a, b in merged if b - a >= min_burst]


#: Silero runs at 16 kHz; its speech probability is thresholded here (the package default)
SILERO_RATE = 16000
SILERO_THRESHOLD = 0.5
VAD_METHODS = VAD_CHOICES  # the config owns the names; audio owns the detectors

_silero_model: Any = None
_silero_lock = threading.Lock()


def _silero() -> Any:
    """The Silero VAD network from the installed wheel (loaded once per process): its ONNX
    export where onnxruntime is installed (3x faster on CPU: 1.2 s against 3.0 s for a
    33 s interview on this 2-core box, the same 10 regions), else its TorchScript one."""
    global _silero_model
    with _silero_lock:
        if _silero_model is None:
            from silero_vad import load_silero_vad  # noqa: PLC0415

            try:
                import onnxruntime  # noqa: F401, PLC0415
                onnx = True
            except ImportError:
                onnx = False
            _silero_model = load_silero_vad(onnx=onnx)
        return _silero_model


def silero_regions(audio: np.ndarray, sample_rate: int) -> list[tuple[int, int]]:
    """Speech as [start, end) sample ranges by Silero VAD, on the same gap/burst rules."""
    import torch  # noqa: PLC0415
    from silero_vad import get_speech_timestamps  # noqa: PLC0415

    if not len(audio):
        return []
    x = np.asarray(audio, dtype=np.float32)
    x = resample(x, sample_rate, SILERO_RATE)
    model = _silero()
    with _silero_lock, torch.inference_mode():
        model.reset_states()
        stamps = get_speech_timestamps(
            torch.from_numpy(x), model, threshold=SILERO_THRESHOLD,
            sampling_rate=SILERO_RATE, min_speech_duration_ms=int(MIN_BURST_S * 1000),
            min_silence_duration_ms=int(MIN_GAP_S * 1000), speech_pad_ms=30)
    scale = sample_rate / SILERO_RATE
    return [(round(t["start"] * scale), min(len(audio), round(t["end"] * scale)))
            for t in stamps]


def detect_speech(audio: np.ndarray, sample_rate: int, method: str = "silero",
                  levels: Levels | None = None) -> list[tuple[int, int]]:
    """Speech regions by the named detector ("silero" or the "energy" fallback)."""
    if method == "silero":
        return silero_regions(audio, sample_rate)
    if method == "energy":
        return speech_regions(audio, sample_rate, levels)
    raise ValueError(f"Unknown voice activity detector {method!r}: use one of {VAD_METHODS}.")


def merge_by_words(regions: list[tuple[int, int]], words: list[dict[str, Any]],
                   sample_rate: int) -> list[tuple[int, int]]:
    """Regions grown to cover every machine-timed word that touches them, and
    merged where a word spans their gap: a cut then never falls inside a word,
    even where the VAD heard a pause the recogniser heard a word in."""
    spans = sorted((int(float(w["start"]) * sample_rate), int(float(w["end"]) * sample_rate))
                   for w in words if "start" in w and "end" in w)
    merged = [list(r) for r in regions]
    for ws, we in spans:
        hit = [i for i, (a, b) in enumerate(merged) if a < we and ws < b]
        if not hit:
            continue
        lo, hi = hit[0], hit[-1]
        merged[lo:hi + 1] = [[min(ws, merged[lo][0]), max(we, merged[hi][1])]]
    out: list[tuple[int, int]] = []
    for a, b in merged:  # growing can make neighbours touch
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(b, out[-1][1]))
        else:
            out.append((a, b))
    return out


def out_of_words(slices: list[Slice], words: list[dict[str, Any]], sample_rate: int
                 ) -> list[Slice]:
    """Slices whose ends fall inside a machine-timed word pulled back to the word's edge
    (the word is left out, never cut): for cuts made where the speaker changed."""
    spans = [(float(w["start"]) * sample_rate, float(w["end"]) * sample_rate)
             for w in words if "start" in w and "end" in w]
    out = []
    for sl in slices:
        start, end = sl.start, sl.end
        for ws, we in spans:
            if ws < start < we:
                start = int(np.ceil(we))
            if ws < end < we:
                end = int(ws)
        out.append(Slice(start, max(start, end), sl.speech_s, sl.regions))
    return out


def speech_seconds(regions: list[tuple[int, int]], sample_rate: int) -> float:
    return sum(b - a for a, b in regions) / sample_rate


@dataclass(frozen=True)
class Slice:
    start: int  # sample index, padding included
    end: int
    speech_s: float  # seconds of detected speech inside
    #: pause-separated speech spans inside this slice
    regions: tuple[tuple[int, int], ...]

    def duration(self, sample_rate: int) -> float:
        return (self.end - self.start) / sample_rate


def _split(regions: list[tuple[int, int]], sr: int, min_s: float, max_s: float
           ) -> list[list[tuple[int, int]]]:
    span = (regions[-1][1] - regions[0][0]) / sr
    if span <= max_s or len(regions) < 2:
        return [regions]
    best, best_key = -1, (-1.0, 0.0)
    mid = (regions[0][0] + regions[-1][1]) / 2
    for i in range(1, len(regions)):
        left = (regions[i - 1][1] - regions[0][0]) / sr
        right = (regions[-1][1] - regions[i][0]) / sr
        if left < min_s or right < min_s:
            continue
        gap = (regions[i][0] - regions[i - 1][1]) / sr
        # longest pause wins; among equal pauses (10 ms) the one nearer the middle
        key = (round(gap, 2), -abs(regions[i][0] - mid))
        if key > best_key:
            best, best_key = i, key
    if best < 0:
        return [regions]
    return _split(regions[:best], sr, min_s, max_s) + _split(regions[best:], sr, min_s, max_s)


def _pad(groups: list[list[tuple[int, int]]], total: int, sr: int) -> list[Slice]:
    pad = int(PAD_S * sr)
    out: list[Slice] = []
    for i, g in enumerate(groups):
        start, end = g[0][0], g[-1][1]
        # padding never reaches past the middle of the pause to a neighbour
        lo = 0 if i == 0 else (groups[i - 1][-1][1] + start) // 2
        hi = total if i == len(groups) - 1 else (end + groups[i + 1][0][0]) // 2
        out.append(Slice(max(lo, start - pad), min(hi, end + pad),
                         speech_seconds(g, sr), tuple(g)))
    return out


def plan_slices(regions: list[tuple[int, int]], total: int, sample_rate: int,
                min_s: float = 1.0, max_s: float = 15.0) -> list[Slice]:
    """Trim leading/trailing silence and cut at pauses into pieces of at most `max_s`.

    A piece without any pause longer than MIN_GAP_S stays whole even if too
    long; the quality gate flags it instead of cutting a word in half.
    """
    if not regions:
        return []
    return _pad(_split(regions, sample_rate, min_s, max_s), total, sample_rate)


def slices_at(regions: list[tuple[int, int]], cuts: list[int], total: int,
              sample_rate: int) -> list[Slice]:
    """Slices formed by cutting `regions` before the region indices in `cuts`."""
    bounds = [0, *sorted(cuts), len(regions)]
    groups = [regions[a:b] for a, b in itertools.pairwise(bounds) if b > a]
    return _pad(groups, total, sample_rate)


def longest_gaps(regions: list[tuple[int, int]], count: int) -> list[int]:
    """Indices i (cut before regions[i]) of the `count` longest pauses."""
    gaps = [(regions[i][0] - regions[i - 1][1], i) for i in range(1, len(regions))]
    gaps.sort(key=lambda g: (-g[0], g[1]))
    return sorted(i for _, i in gaps[:count])


def snr_db(audio: np.ndarray, sample_rate: int, levels: Levels | None = None,
           regions: list[tuple[int, int]] | None = None) -> float:
    """Speech-to-background ratio in dB, capped to [-10, 100].

    Signal: mean power of speech frames; noise: mean power of the quietest
    non-speech frames (or the 5th-percentile frame when there are no pauses).
    """
    lv = levels or frame_levels(audio, sample_rate)
    if not len(lv.db):
        return 0.0
    power = 10.0 ** (lv.db / 10.0)
    speech = np.zeros(len(lv.db), dtype=bool)
    for a, b in regions if regions is not None else speech_regions(audio, sample_rate, lv):
        speech[a // lv.frame: b // lv.frame] = True
    if not speech.any():
        return 0.0
    quiet = power[~speech]
    # ignore the loudest half of the pauses: breaths and tails of words
    if len(quiet) >= int(0.1 / FRAME_S):
        noise = float(np.mean(np.sort(quiet)[: max(1, len(quiet) // 2)]))
    else:
        noise = float(np.percentile(power, 5))
    signal = float(np.mean(power[speech]))
    if noise <= 1e-10:
        return 100.0
    return float(np.clip(10.0 * np.log10(max(signal - noise, 1e-12) / noise), -10.0, 100.0))
