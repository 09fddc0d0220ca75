"""The Base model's speaker encoder: the ECAPA-TDNN that turns 24 kHz speech into the x-vector.

One home for loading it alone (its `speaker_encoder.*` tensors, not the talker),
its fingerprint, its mel front end and the embedding call, used by code
extraction (the run's x-vector), prepare (`--speaker-encoder model`) and
quality (the model's own speaker similarity).

The front end is the official one: `extract_speaker_embedding` of
qwen_tts' Qwen3TTSForConditionalGeneration calls `mel_spectrogram` with the
settings below on (1, samples) audio; a batch of equal-length windows goes
through the same call.

torch, safetensors and the official code are imported inside the functions:
prepare imports this module, and the window imports prepare (start-up cost;
tests/test_boundary.py checks the window stays torch-free).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from engine.audio.resample import resample
from engine.audio.timebase import SAMPLE_RATE
from engine.core.errors import TrainingError
from engine.model.files import memo_per_version, weight_files
from engine.model.official import configuration, modeling

#: the official extract_speaker_embedding's mel settings
N_FFT = 1024
NUM_MELS = 128
HOP = 256
WINDOW = 1024
FMIN = 0
FMAX = 12000
PREFIX = "speaker_encoder."


def speaker_encoder_fingerprint(model_dir: str | Path) -> str:
    """sha256 over the speaker encoder's tensors only (the talker may change freely)."""
    files = weight_files(model_dir)

    def compute() -> str:
        import torch  # noqa: PLC0415
        from safetensors import safe_open  # noqa: PLC0415

        h = hashlib.sha256(b"xvec-v1")
        for f in files:
            # framework "pt": the released weights are bf16, which numpy cannot hold
            with safe_open(str(f), framework="pt") as fh:
                for key in sorted(k for k in fh.keys() if k.startswith(PREFIX)):
                    t = fh.get_tensor(key).contiguous().reshape(-1)
                    h.update(f"{key}:{t.dtype}".encode())
                    h.update(t.view(torch.uint8).numpy().tobytes())
        return h.hexdigest()

    return memo_per_version(files[0], compute, "speaker_encoder")


def load_speaker_encoder(model_dir: str | Path, device: str = "cpu") -> Any:
    """The base model's speaker encoder alone (not the 1.7B talker), fp32, eval."""
    import torch  # noqa: PLC0415
    from safetensors import safe_open  # noqa: PLC0415

    cfg = configuration().Qwen3TTSConfig.from_pretrained(str(model_dir))
    if cfg.tts_model_type != "base":
        raise TrainingError(f"{model_dir} is a {cfg.tts_model_type} model without a speaker "
                            "encoder.", "Train from a Qwen3-TTS Base model.")
    enc = modeling().Qwen3TTSSpeakerEncoder(cfg.speaker_encoder_config)
    state = {}
    for f in weight_files(model_dir):
        with safe_open(str(f), framework="pt") as fh:
            for k in fh.keys():
                if k.startswith(PREFIX):
                    state[k[len(PREFIX):]] = fh.get_tensor(k).to(torch.float32)
    enc.load_state_dict(state, strict=True)
    return enc.to(device).eval()


def at_model_rate(audio: np.ndarray, sample_rate: int) -> np.ndarray:
    """Mono float32 audio at the encoder's 24 kHz (polyphase resampling)."""
    return resample(audio, sample_rate, SAMPLE_RATE)


def log_mel(batch: np.ndarray) -> Any:
    """(B, frames, 128) log-mel tensor of (B, samples) 24 kHz audio: the encoder's input."""
    import torch  # noqa: PLC0415

    y = torch.from_numpy(np.ascontiguousarray(batch, dtype=np.float32))
    return modeling().mel_spectrogram(
        y, n_fft=N_FFT, num_mels=NUM_MELS, sampling_rate=SAMPLE_RATE, hop_size=HOP,
        win_size=WINDOW, fmin=FMIN, fmax=FMAX).transpose(1, 2)


def x_vectors(encoder: Any, batch: np.ndarray) -> np.ndarray:
    """(B, dim) float32 x-vectors of equal-length 24 kHz clips, (B, samples)."""
    import torch  # noqa: PLC0415

    with torch.inference_mode():
        device = next(encoder.parameters()).device
        return encoder(log_mel(batch).to(device)).float().cpu().numpy()


def x_vector(encoder: Any, audio: np.ndarray) -> np.ndarray:
    """The x-vector of one 24 kHz clip: what extract_speaker_embedding gives."""
    return x_vectors(encoder, np.asarray(audio, dtype=np.float32)[None, :])[0]
