"""Measuring one render against the speaker: speaker similarity (both encoders), word
errors, speaking rate (whole, and in the first and last third), loudness, peak and clipping
(`Meter`, loaded once per evaluation), and their means over a voice's sentences (`means_of`).
The speaker's side is a `Reference`: their held-out clips and what those measure.
`engine.quality.evaluate` renders and decides; this module only measures.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.asr.recognizer import load_recognizer, to_16k
from engine.asr.wer import word_count, word_errors
from engine.audio.io import read_mono
from engine.audio.loudness import integrated_loudness
from engine.audio.timebase import SAMPLE_RATE
from engine.audio.vad import speech_regions
from engine.core.errors import VoxshardError, WorkspaceError
from engine.core.events import Emitter
from engine.data.dataset import split_ids
from engine.layout.manifest import read_manifest
from engine.layout.run import Run
from engine.layout.voice import Voice
from engine.quality.rate_thirds import RATE_THIRDS, rate_thirds
from engine.quality.similarity import (
    ModelSpeakerEncoder,
    ResemblyzerEncoder,
    centroid,
    cosine,
    self_similarity,
)

#: loudness floor reported for silence (integrated loudness of silence is -inf)
LOUDNESS_FLOOR = -70.0
PEAK_FLOOR = -100.0
CLIP_LEVEL = 0.999


@dataclass
class Reference:
    """The speaker's held-out clips and what they measure."""

    clips: list[dict[str, Any]]
    held_out: bool
    words_per_s: float | None
    centroid: dict[str, np.ndarray]
    self_similarity: dict[str, float | None]

    def to_dict(self, out_dir: Path) -> dict[str, Any]:
        return {"clips": [{"id": c["id"], "text": c.get("text", ""),
                           "path": relative_path(Path(c["abs"]), out_dir)} for c in self.clips],
                "held_out": self.held_out,
                "words_per_s": rounded(self.words_per_s),
                "self_similarity": {k: rounded(v) for k, v in self.self_similarity.items()}}


def rounded(x: float | None, nd: int = 4) -> float | None:
    return None if x is None or not math.isfinite(x) else round(float(x), nd)


def relative_path(path: Path, base: Path) -> str:
    try:
        return os.path.relpath(path, base)
    except ValueError:  # another drive (Windows)
        return str(path)


def speech_span_s(audio: np.ndarray, sample_rate: int) -> float:
    """Seconds from the first to the last speech region (pauses inside count, silence around
    does not); the whole length when no region is found."""
    if audio.size == 0:
        return 0.0
    try:
        regions = speech_regions(np.asarray(audio, dtype=np.float32), sample_rate)
    except (ValueError, IndexError):
        regions = []
    if not regions:
        return len(audio) / sample_rate
    return (regions[-1][1] - regions[0][0]) / sample_rate


def level_figures(audio: np.ndarray, sample_rate: int) -> dict[str, float]:
    """Integrated loudness (LUFS, floored), peak (dBFS, floored), clipped sample fraction."""
    audio = np.nan_to_num(np.asarray(audio, dtype=np.float32))
    try:
        lufs = float(integrated_loudness(audio, sample_rate)) if audio.size else -math.inf
    except (ValueError, ZeroDivisionError):
        lufs = -math.inf
    peak = float(np.abs(audio).max()) if audio.size else 0.0
    return {
        "loudness_lufs": round(max(LOUDNESS_FLOOR, lufs) if math.isfinite(lufs)
                               else LOUDNESS_FLOOR, 2),
        "peak_dbfs": round(max(PEAK_FLOOR, 20 * math.log10(peak)) if peak > 0 else PEAK_FLOOR,
                           2),
        "clipped_fraction": round(float(np.mean(np.abs(audio) >= CLIP_LEVEL)) if audio.size
                                  else 0.0, 6),
    }


class Meter:
    """The recogniser and both speaker encoders, loaded once, measuring renders."""

    def __init__(self, asr: Any, base_model: Path | None, device: str | None,
                 emitter: Emitter) -> None:

        self.asr = asr if hasattr(asr, "transcribe") else load_recognizer(asr, device)
        self.encoders: dict[str, Any] = {"resemblyzer": ResemblyzerEncoder(
            "cuda" if (device or "").startswith("cuda") else "cpu")}
        if base_model is not None:
            try:
                self.encoders["model"] = ModelSpeakerEncoder(base_model, device or "cpu")
            except VoxshardError as exc:
                emitter.log(f"The model's own speaker encoder is not available: {exc.message}",
                            level="warning")

    def embed(self, audio: np.ndarray, sample_rate: int) -> dict[str, np.ndarray]:
        return {k: enc.embed(audio, sample_rate) for k, enc in self.encoders.items()}

    def reference(self, voice: Voice, run_dir: Path, limit: int) -> Reference:

        try:
            clips = read_manifest(voice.path)
        except (VoxshardError, OSError) as exc:
            raise WorkspaceError(f"The voice {voice.path.name} has no prepared clips to compare "
                                 "renders with.", "Run `voxshard-engine prepare` first.") from exc
        if not clips:
            raise WorkspaceError(f"The voice {voice.path.name} has no usable prepared clips to "
                                 "compare renders with.", "Run `voxshard-engine prepare` first.")
        data = Run(run_dir).config().get("data") or {}
        try:
            _, val = split_ids([c["id"] for c in clips], float(data.get("val_fraction", 0.05)),
                               int(data.get("val_min", 2)), int(data.get("seed", 0)))
        except (TypeError, ValueError):
            val = []
        held_out = len(val) >= 1
        chosen = [c for c in clips if c["id"] in set(val)] if held_out else clips
        chosen = chosen[:limit]
        embeds: dict[str, list[np.ndarray]] = {k: [] for k in self.encoders}
        words = 0
        speech_s = 0.0
        out: list[dict[str, Any]] = []
        for c in chosen:
            path = voice.path / c["path"]
            audio = read_mono(path, SAMPLE_RATE)
            for k, v in self.embed(audio, SAMPLE_RATE).items():
                embeds[k].append(v)
            if c.get("text"):
                words += word_count(c["text"])
                speech_s += speech_span_s(audio, SAMPLE_RATE)
            out.append({**c, "abs": str(path)})
        return Reference(
            clips=out, held_out=held_out,
            words_per_s=(words / speech_s) if speech_s > 0 and words else None,
            centroid={k: centroid(v) for k, v in embeds.items()},
            self_similarity={k: self_similarity(v) for k, v in embeds.items()})

    def measure(self, audio: np.ndarray, sample_rate: int, text: str, ref: Reference,
                language: str | None) -> dict[str, Any]:

        emb = self.embed(audio, sample_rate)
        heard = self.asr.transcribe(to_16k(audio, sample_rate), language)
        errors = word_errors(text, heard.text)
        span = speech_span_s(audio, sample_rate)
        wps = word_count(text) / span if span > 0 else 0.0
        out: dict[str, Any] = {
            "similarity": rounded(cosine(emb["resemblyzer"], ref.centroid["resemblyzer"])),
            "similarity_model": (rounded(cosine(emb["model"], ref.centroid["model"]))
                                 if "model" in emb else None),
            "heard": heard.text, "wer": rounded(errors.wer),
            "duration_s": rounded(len(audio) / sample_rate, 3), "speech_s": rounded(span, 3),
            "words_per_s": rounded(wps, 3),
            "rate_ratio": rounded(wps / ref.words_per_s, 3) if ref.words_per_s else None,
            **rate_thirds(heard.words),
            **level_figures(audio, sample_rate),
        }
        return out


METRICS = ("similarity", "similarity_model", "wer", "words_per_s", "rate_ratio",
           "loudness_lufs", "peak_dbfs", "clipped_fraction", *RATE_THIRDS)


def _mean(rows: list[dict[str, Any]], key: str) -> float | None:
    vals = [r[key] for r in rows if isinstance(r.get(key), int | float)
            and math.isfinite(r[key])]
    return rounded(float(np.mean(vals))) if vals else None


def means_of(renders: list[dict[str, Any]]) -> dict[str, Any]:
    """Means over the sentences. The speaking rate of a sentence cut at its length cap
    or by the runaway guard says nothing, so the rate is averaged over the sentences
    that ended when any did (else over all, marked `rate_from_capped`). `runaway`: the
    sentences the guard cut (a loop or silence)."""
    ended = [r for r in renders if not r["capped"] and not r.get("runaway")]
    out: dict[str, Any] = {m: _mean(renders, m) for m in METRICS}
    for m in ("words_per_s", "rate_ratio", *RATE_THIRDS):
        out[m] = _mean(ended or renders, m)
    out["rate_from_capped"] = not ended
    out["capped"] = sum(1 for r in renders if r["capped"])
    out["runaway"] = sum(1 for r in renders if r.get("runaway"))
    return out
