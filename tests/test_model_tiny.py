"""The tiny model is a real Qwen3-TTS of the official architecture and format."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.core.errors import InputError, ModelError
from engine.model.loading import inspect_model, load_model, resolve_model
from engine.model.official import import_qwen_tts
from engine.model.tiny import make_tiny_model


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            h.update(f.relative_to(folder).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def test_official_package_imports_without_torchaudio() -> None:
    qwen_tts = import_qwen_tts()
    assert hasattr(qwen_tts, "Qwen3TTSModel")
    assert hasattr(qwen_tts, "Qwen3TTSTokenizer")
    for dead in ("torchaudio", "gradio", "sox"):
        assert dead not in sys.modules


def test_tiny_model_layout_and_config(tiny_model_dir: Path) -> None:
    for name in ("config.json", "model.safetensors", "generation_config.json",
                 "tokenizer_config.json", "vocab.json", "merges.txt",
                 "speech_tokenizer/config.json", "speech_tokenizer/model.safetensors",
                 "speech_tokenizer/preprocessor_config.json"):
        assert (tiny_model_dir / name).is_file(), name
    cfg = json.loads((tiny_model_dir / "config.json").read_text())
    talker = cfg["talker_config"]
    assert cfg["tts_model_type"] == "base"
    assert talker["vocab_size"] == 3072 and talker["codec_eos_token_id"] == 2150
    assert sum(talker["rope_scaling"]["mrope_section"]) * 2 == talker["head_dim"]
    assert talker["spk_id"] == {} and talker["codec_language_id"] == {}
    assert "model_type" not in cfg["speaker_encoder_config"]
    info = inspect_model(tiny_model_dir)
    assert info.tiny and info.model_type == "base"


def test_tiny_model_is_deterministic_per_seed(tmp_path: Path, tiny_model_dir: Path) -> None:
    again = make_tiny_model(tmp_path / "again", seed=0)
    other = make_tiny_model(tmp_path / "other", seed=1)
    assert _digest(again) == _digest(tiny_model_dir)
    assert _digest(other) != _digest(tiny_model_dir)


def test_refuses_to_overwrite(tiny_model_dir: Path) -> None:
    with pytest.raises(InputError, match="not empty"):
        make_tiny_model(tiny_model_dir)


def test_official_loader_clones_a_voice_and_codec_round_trips(tiny_model_dir: Path) -> None:
    model = load_model(tiny_model_dir, device="cpu")
    sr = 24000
    t = np.arange(2 * sr) / sr
    ref = (0.2 * np.sin(2 * np.pi * 180 * t)).astype(np.float32)
    torch.manual_seed(0)
    wavs, out_sr = model.generate_voice_clone(
        text="Hello there.", language="auto", ref_audio=(ref, sr), ref_text="hi",
        x_vector_only_mode=True, max_new_tokens=12)
    assert out_sr == 24000
    assert wavs[0].ndim == 1 and 0 < len(wavs[0]) <= 12 * 1920
    assert 0.01 < float(np.abs(wavs[0]).max()) <= 1.0  # audible, not silent

    codec = model.model.speech_tokenizer
    enc = codec.encode(ref, sr=sr)
    codes = enc.audio_codes[0]
    assert codes.shape == (25, 16)  # 2 s at 12.5 frames/s, 16 codebooks
    assert int(codes.min()) >= 0 and int(codes.max()) < 2048
    assert len(torch.unique(codes)) > 16  # randomised codebooks, not all zero
    audio, dec_sr = codec.decode(enc)
    assert dec_sr == 24000 and len(audio[0]) == 25 * 1920


def test_missing_and_wrong_models_say_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model(tmp_path / "nope")
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    with pytest.raises(ModelError, match="not Qwen3-TTS"):
        resolve_model(tmp_path / "bert")
    with pytest.raises(ModelError, match="not on this machine") as err:
        resolve_model("Qwen/Qwen3-TTS-12Hz-0.6B-Base")  # HF_HUB_OFFLINE=1 in tests
    assert "model download" in str(err.value)


def test_cli_make_tiny_model_json(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "engine.cli.main", "--json", "make-tiny-model",
         str(tmp_path / "m")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    events = [json.loads(line) for line in out.stdout.splitlines()]
    assert events[-1]["event"] == "result"
    assert Path(events[-1]["path"]).joinpath("config.json").is_file()
    bad = subprocess.run([sys.executable, "-m", "engine.cli.main", "model", "info",
                          str(tmp_path)], capture_output=True, text=True)
    assert bad.returncode == 1
    assert bad.stderr.strip().startswith("error:") and "Traceback" not in bad.stderr
