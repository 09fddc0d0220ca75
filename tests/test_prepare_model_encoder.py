"""`prepare --speaker-encoder model`: the Base model's own speaker encoder decides who speaks.

Run with the tiny random model (tests/helpers/model.py): its encoder's weights are
random, so what it decides says nothing about speakers; these tests check that the
option is wired end to end (CLI, cache key, report) and that its window embeddings
are the official x-vector computation. bench/bench_prepare.py --mixtures measures
the encoders against each other.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.core.errors import ModelError
from engine.layout.voice import create_voice
from engine.prepare.importer import import_files
from engine.prepare.pipeline import prepare
from engine.prepare.speakers import WINDOW_FRAMES, ModelEncoder, embed_clip
from tests.helpers.mixtures import RATE, Mixture, write_mixture


def test_prepare_with_the_models_speaker_encoder(mixtures: dict[str, Mixture],
                                                 tiny_model_dir: Path,
                                                 tmp_path: Path) -> None:
    m = mixtures["white20"]
    files = write_mixture(m, tmp_path / "src")
    voice = create_voice(tmp_path / "voice", "Joe", "english")
    assert len(import_files(voice, [files["interview"]])["imported"]) == 1
    env = {"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "engine.cli.main", "--json", "prepare", str(voice.path),
         "--speaker-reference", str(files["enrol0"]), "--speaker-encoder", "model",
         "--base", str(tiny_model_dir)],
        capture_output=True, text=True, timeout=600, env=env, cwd=Path(__file__).parent.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(voice.prepared.report.read_text())
    sp = report["speakers"]
    assert sp["encoder"] == "model" and sp["enrolment"] == "speaker reference"
    assert "model's own speaker encoder" in sp["note"]
    assert report["clips"]
    for c in report["clips"]:
        sim = c["speaker"]["similarity"]
        assert sim is not None and -1.0 <= sim <= 1.0

    enc = ModelEncoder(tiny_model_dir)
    enrol = embed_clip(m.enrolment[0], RATE, enc)
    assert enrol.shape == (enc.dim,) and enc.dim != 256  # not resemblyzer's d-vector

    # another encoder is another result: not served from the cache
    again = prepare(voice)
    assert again["run"]["takes_processed"] == 1
    assert again["speakers"]["encoder"] == "resemblyzer"
    back = prepare(voice, speaker_encoder="model", base_model=tiny_model_dir)
    assert back["run"]["takes_processed"] == 1  # the key holds the encoder's fingerprint

    with pytest.raises(ModelError):
        prepare(voice, speaker_encoder="model", base_model=tmp_path / "no-model")


@pytest.mark.parity
def test_model_window_embedding_is_the_x_vector(tiny_model_dir: Path,
                                                mixtures: dict[str, Mixture]) -> None:
    import torch

    from engine.model.official import import_qwen_tts

    audio = mixtures["clean"].audio
    enc = ModelEncoder(tiny_model_dir)
    feats, n = enc.features(audio, RATE)
    assert n == len(audio) // 240
    starts = [0, 137, n - WINDOW_FRAMES]
    got = enc.embed(feats, starts)
    # the official model's own extraction, window by window
    official = import_qwen_tts().Qwen3TTSModel.from_pretrained(
        str(tiny_model_dir), dtype=torch.float32).model
    for row, s in zip(got, starts, strict=True):
        x = official.extract_speaker_embedding(audio[s * 240:s * 240 + RATE], RATE).numpy()
        want = x / np.linalg.norm(x)
        assert np.allclose(row, want, atol=1e-4), float(np.abs(row - want).max())
