"""Speaker similarity: how much a render sounds like the speaker.

Two encoders, reported side by side:
- `ResemblyzerEncoder`: a d-vector encoder trained on thousands of speakers,
  independent of the model under test (its weights ship inside its wheel).
  The headline figure.
- `ModelSpeakerEncoder`: the Qwen3-TTS base model's own speaker encoder (the
  one that makes the x-vector). It scores the model's own notion of the
  voice, so it is never reported alone.

Similarity is the cosine between a render's embedding and the speaker's
centroid (the normalised mean embedding of the reference clips).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from resemblyzer.audio import normalize_volume, trim_long_silences
from resemblyzer.hparams import audio_norm_target_dBFS

from engine.audio.resample import resample
from engine.audio.timebase import SAMPLE_RATE
from engine.core.errors import ModelError
from engine.model.speaker_encoder import at_model_rate, load_speaker_encoder, x_vector

#: shorter than this after silence trimming, the d-vector is not meaningful; the
#: untrimmed audio is used instead (noise from an untrained model still gets a number)
MIN_VOICED_S = 0.5


class SpeakerEncoder(Protocol):
    name: str

    def embed(self, audio: np.ndarray, sample_rate: int) -> np.ndarray:
        """Unit-length embedding of mono float audio."""
        ...


def _unit(v: np.ndarray) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64).reshape(-1)
    n = float(np.linalg.norm(v))
    return v / n if n > 0 and np.isfinite(n) else np.zeros_like(v)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(_unit(a), _unit(b)))


def centroid(embeddings: list[np.ndarray]) -> np.ndarray:
    if not embeddings:
        raise ValueError("no embeddings")
    return _unit(np.mean([_unit(e) for e in embeddings], axis=0))


def self_similarity(embeddings: list[np.ndarray]) -> float | None:
    """Mean cosine of each reference clip to the centroid of the others (leave one out):
    the similarity a real recording of the speaker gets, i.e. the ceiling."""
    if len(embeddings) < 2:
        return None
    scores = [cosine(e, centroid(embeddings[:i] + embeddings[i + 1:]))
              for i, e in enumerate(embeddings)]
    return float(np.mean(scores))


class ResemblyzerEncoder:
    name = "resemblyzer"
    RATE = 16000

    def __init__(self, device: str = "cpu") -> None:
        try:
            from resemblyzer import VoiceEncoder  # noqa: PLC0415
        except ImportError as exc:
            raise ModelError("Speaker similarity needs the resemblyzer package.",
                             "Install it with `pip install --no-deps resemblyzer "
                             "webrtcvad-wheels` (see the README).") from exc
        self._encoder = VoiceEncoder(device=device, verbose=False)
        self._lock = threading.Lock()

    def embed(self, audio: np.ndarray, sample_rate: int) -> np.ndarray:
        audio = np.nan_to_num(np.asarray(audio, dtype=np.float32).reshape(-1))
        if audio.size == 0 or float(np.abs(audio).max()) < 1e-6:
            return np.zeros(256)  # silence has no voice: similarity 0
        audio = resample(audio, sample_rate, self.RATE)
        audio = normalize_volume(audio, audio_norm_target_dBFS, increase_only=True)
        wav = trim_long_silences(audio)
        if len(wav) < MIN_VOICED_S * self.RATE:
            # too little "voice" for the VAD: embed the (normalised) signal itself
            wav = audio
        if len(wav) < MIN_VOICED_S * self.RATE:
            wav = np.pad(wav, (0, int(MIN_VOICED_S * self.RATE) - len(wav)))
        with self._lock:
            return _unit(self._encoder.embed_utterance(wav.astype(np.float32)))


class ModelSpeakerEncoder:
    """The base model's ECAPA speaker encoder (24 kHz), loaded alone (no talker)."""

    name = "model"
    RATE = SAMPLE_RATE

    def __init__(self, base_model_dir: str | Path, device: str = "cpu") -> None:
        self._encoder = load_speaker_encoder(base_model_dir, device)
        self._lock = threading.Lock()

    def embed(self, audio: np.ndarray, sample_rate: int) -> np.ndarray:
        audio = at_model_rate(audio, sample_rate)
        if len(audio) < self.RATE // 2:
            audio = np.pad(audio, (0, self.RATE // 2 - len(audio)))
        with self._lock:
            return _unit(x_vector(self._encoder, audio))


def similarity(encoder: SpeakerEncoder, a: tuple[np.ndarray, int],
               b: tuple[np.ndarray, int]) -> float:
    """Cosine similarity of two clips, each given as (audio, sample_rate)."""
    return cosine(encoder.embed(*a), encoder.embed(*b))


def describe_encoder(encoder: Any) -> str:
    return getattr(encoder, "name", type(encoder).__name__)
