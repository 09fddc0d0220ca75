"""The speaker encoder's mel front end, written once (engine/model/speaker_encoder.py),
against a slow direct computation, and its x-vectors against the official extraction."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.model.speaker_encoder import (
    FMAX,
    HOP,
    N_FFT,
    NUM_MELS,
    SAMPLE_RATE,
    at_model_rate,
    load_speaker_encoder,
    log_mel,
    x_vector,
    x_vectors,
)


def _hz_to_slaney(f: np.ndarray) -> np.ndarray:
    """Slaney's mel scale: linear below 1 kHz, logarithmic above."""
    f = np.asarray(f, dtype=np.float64)
    lin = f / (200.0 / 3)
    log = 15.0 + np.log(np.maximum(f, 1e-10) / 1000.0) / (np.log(6.4) / 27.0)
    return np.where(f >= 1000.0, log, lin)


def _slaney_to_hz(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float64)
    return np.where(m >= 15.0, 1000.0 * np.exp((m - 15.0) * np.log(6.4) / 27.0),
                    m * 200.0 / 3)


def _filterbank() -> np.ndarray:
    """Triangles evenly spaced on the Slaney scale from 0 Hz to FMAX, each of area 1 (the
    "slaney" norm: 2 / bandwidth)."""
    edges = _slaney_to_hz(np.linspace(0.0, _hz_to_slaney(np.array(FMAX)), NUM_MELS + 2))
    bins = np.arange(N_FFT // 2 + 1) * SAMPLE_RATE / N_FFT
    bank = np.zeros((NUM_MELS, len(bins)))
    for m in range(NUM_MELS):
        lo, mid, hi = edges[m], edges[m + 1], edges[m + 2]
        rise = (bins - lo) / (mid - lo)
        fall = (hi - bins) / (hi - mid)
        bank[m] = np.maximum(0.0, np.minimum(rise, fall)) * 2.0 / (hi - lo)
    return bank


def _reference_log_mel(audio: np.ndarray) -> np.ndarray:
    """(frames, 128) the slow way: reflect-pad, frame by frame a periodic Hann window and a
    real FFT, magnitude, the filterbank, natural log floored at 1e-5."""
    pad = (N_FFT - HOP) // 2
    x = np.pad(audio.astype(np.float64), (pad, pad), mode="reflect")
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(N_FFT) / N_FFT)
    bank = _filterbank()
    frames = []
    for start in range(0, len(x) - N_FFT + 1, HOP):
        spec = np.fft.rfft(x[start:start + N_FFT] * window)
        mag = np.sqrt(spec.real ** 2 + spec.imag ** 2 + 1e-9)
        frames.append(np.log(np.maximum(bank @ mag, 1e-5)))
    return np.stack(frames)


@pytest.fixture(scope="module")
def speech(piper_synth: Callable[[str], tuple[np.ndarray, int]]) -> np.ndarray:
    """Two seconds of real speech at 24 kHz (piper's 22.05 kHz resampled)."""
    audio, sr = piper_synth("Please call Stella and ask her to bring these things with her.")
    return at_model_rate(0.7 * audio, sr)[:2 * SAMPLE_RATE]


def test_log_mel_is_the_direct_computation(speech: np.ndarray) -> None:
    want = _reference_log_mel(speech)
    got = log_mel(speech[None, :])[0].numpy()
    assert got.shape == want.shape == (len(speech) // HOP, NUM_MELS)
    # float32 FFT against float64: the log of the loud bins agrees closely; bins near
    # the 1e-5 floor (above piper's 11 kHz band) carry the FFT's absolute rounding
    loud = want > np.log(1e-3)
    assert loud.mean() > 0.5
    assert float(np.abs(got - want)[loud].max()) < 1e-4  # measured 1.7e-5
    assert float(np.abs(got - want).max()) < 1e-2  # measured 1.2e-3
    # and a batch of windows is each window alone
    windows = np.stack([speech[:SAMPLE_RATE], speech[SAMPLE_RATE // 2:3 * SAMPLE_RATE // 2]])
    batch = log_mel(windows).numpy()
    for row, w in zip(batch, windows, strict=True):
        np.testing.assert_allclose(row, log_mel(w[None, :])[0].numpy(), atol=1e-5)


def test_a_silent_clip_sits_on_the_floor() -> None:
    got = log_mel(np.zeros((1, SAMPLE_RATE), np.float32))[0].numpy()
    np.testing.assert_allclose(got, np.log(1e-5), atol=1e-6)


@pytest.mark.parity  # the official model's own extraction vs the encoder alone
def test_x_vectors_are_the_official_extraction(speech: np.ndarray,
                                               tiny_model_dir: Path) -> None:
    from engine.model.official import import_qwen_tts

    model = import_qwen_tts().Qwen3TTSModel.from_pretrained(
        str(tiny_model_dir), dtype=torch.float32).model
    enc = load_speaker_encoder(tiny_model_dir)
    windows = [speech[:SAMPLE_RATE], speech[SAMPLE_RATE // 3:SAMPLE_RATE // 3 + SAMPLE_RATE]]
    wants = [model.extract_speaker_embedding(w, SAMPLE_RATE).numpy() for w in windows]
    np.testing.assert_allclose(x_vector(enc, speech),
                               model.extract_speaker_embedding(speech, SAMPLE_RATE).numpy(),
                               rtol=1e-5, atol=1e-6)
    got = x_vectors(enc, np.stack(windows))
    for row, want in zip(got, wants, strict=True):
        np.testing.assert_allclose(row, want, rtol=1e-4, atol=1e-5)
    assert not np.allclose(wants[0], wants[1])  # the windows differ: the test can tell
