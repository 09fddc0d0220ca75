"""Codec extraction on a real prepared voice (piper speech) with the tiny model's codec."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.core.errors import TrainingError
from engine.data.codes import (
    encode_clip,
    extract_codes,
    extract_codes_ray,
    load_codec,
    load_codes_index,
    read_clip,
)
from engine.layout.manifest import choose_reference, prepared_folder, read_manifest
from engine.model.speaker_encoder import speaker_encoder_fingerprint
from tests.helpers.voices import copy_voice


@pytest.fixture(scope="module")
def extracted(prepared_voice: Path, tiny_model_dir: Path,
              tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    voice = copy_voice(prepared_voice, tmp_path_factory.mktemp("codes") / "joe")
    t0 = time.monotonic()
    events: list[Any] = []
    index = extract_codes(voice, tiny_model_dir, on_event=events.append)
    return {"voice": voice, "index": index, "first_s": time.monotonic() - t0, "events": events}


def test_codes_cover_every_usable_clip_with_the_right_length(extracted: dict[str, Any]) -> None:
    voice, index = extracted["voice"], extracted["index"]
    clips = read_manifest(voice)
    assert set(index.clips) == {c["id"] for c in clips}
    for c in clips:
        codes = index.codes(c["id"])
        samples = len(read_clip(voice, c))
        # 1920 samples per frame, a partial last frame still counts
        assert codes.shape == (math.ceil(samples / 1920), 16)
        assert codes.min() >= 0 and codes.max() < 2048
        assert index.clips[c["id"]]["frames"] == codes.shape[0]
    # the codebooks are random but not degenerate: codes vary over time
    assert len(np.unique(index.codes(clips[0]["id"])[:, 0])) > 1


@pytest.mark.parity  # the official encoder alone vs ours (same thread count)
def test_codes_equal_the_official_tokenizer(extracted: dict[str, Any],
                                            tiny_model_dir: Path) -> None:
    from engine.model.official import import_qwen_tts

    voice, index = extracted["voice"], extracted["index"]
    clip = read_manifest(voice)[0]
    qt = import_qwen_tts()
    tok = qt.Qwen3TTSTokenizer.from_pretrained(str(tiny_model_dir / "speech_tokenizer"))
    import soundfile as sf

    audio, sr = sf.read(str(voice / clip["path"]), dtype="float32")
    ref = tok.encode(audio, sr=sr).audio_codes[0].numpy()
    assert np.array_equal(index.codes(clip["id"]), ref)


def test_rerun_reuses_the_cache(extracted: dict[str, Any], tiny_model_dir: Path) -> None:
    voice = extracted["voice"]
    codes_dir = prepared_folder(voice).codes_dir
    before = {f.name: f.stat().st_mtime_ns for f in codes_dir.glob("*.npy")}
    events: list[Any] = []
    index = extract_codes(voice, tiny_model_dir, on_event=events.append)
    after = {f.name: f.stat().st_mtime_ns for f in codes_dir.glob("*.npy")}
    assert before == after  # nothing rewritten
    first = next(e for e in events if e.kind == "progress")
    assert first.data["total"] == 0 and first.data["cached"] == len(index.clips)


def test_changed_clip_is_encoded_again(extracted: dict[str, Any], tiny_model_dir: Path,
                                       tmp_path: Path) -> None:
    import soundfile as sf

    voice = copy_voice(extracted["voice"], tmp_path / "joe")
    clip = read_manifest(voice)[1]
    old = load_codes_index(voice).clips[clip["id"]]["file"]
    audio = read_clip(voice, clip)
    sf.write(voice / clip["path"], audio[: len(audio) // 2], 24000, subtype="PCM_16")
    events: list[Any] = []
    index = extract_codes(voice, tiny_model_dir, on_event=events.append)
    assert next(e for e in events if e.kind == "progress").data["total"] == 1
    assert index.clips[clip["id"]]["file"] != old
    assert not (prepared_folder(voice).codes_dir / old).exists()  # stale file removed


@pytest.mark.parity  # the official encoder alone vs ours (same thread count)
def test_x_vector_equals_official_extraction(extracted: dict[str, Any],
                                             tiny_model_dir: Path) -> None:
    from engine.model.official import import_qwen_tts

    voice, index = extracted["voice"], extracted["index"]
    ref_clip = next(c for c in read_manifest(voice) if c["id"] == index.reference_clip)
    audio = read_clip(voice, ref_clip)
    qt = import_qwen_tts()
    model = qt.Qwen3TTSModel.from_pretrained(str(tiny_model_dir), dtype=torch.float32).model
    want = model.extract_speaker_embedding(audio, 24000).numpy()
    np.testing.assert_allclose(index.x_vector(), want, rtol=1e-5, atol=1e-6)
    assert index.x_vector().shape == (model.config.talker_config.hidden_size,)


def test_reference_choice(extracted: dict[str, Any]) -> None:
    voice = extracted["voice"]
    clips = read_manifest(voice)
    report = json.loads(prepared_folder(voice).report.read_text())
    snr = {c["id"]: c.get("snr_db") for c in report["clips"]}
    best = choose_reference(voice, clips)
    # no clip with fewer warnings, and among equals none with a clearly better SNR
    fewest = min(len(c["issues"]) for c in clips)
    chosen = next(c for c in clips if c["id"] == best)
    assert len(chosen["issues"]) == fewest
    peers = [c for c in clips if len(c["issues"]) == fewest]
    assert snr[best] == max(snr[c["id"]] for c in peers)
    assert choose_reference(voice, clips, clips[2]["id"]) == clips[2]["id"]
    with pytest.raises(TrainingError):
        choose_reference(voice, clips, "no-such-clip")


def test_encode_is_independent_of_batch_company(tiny_model_dir: Path) -> None:
    """Each clip alone: the cached codes of a clip depend on its audio only."""
    codec = load_codec(tiny_model_dir)
    g = np.random.default_rng(0)
    a = (0.1 * g.standard_normal(24000)).astype(np.float32)
    assert np.array_equal(encode_clip(codec, a), encode_clip(codec, a.copy()))


@pytest.mark.slow
@pytest.mark.usefixtures("ray_cluster")  # connect() uses the session's cluster
def test_ray_tasks_give_the_same_codes(extracted: dict[str, Any], tiny_model_dir: Path,
                                       tmp_path: Path) -> None:
    import shutil

    from engine.cluster import connect

    voice = copy_voice(extracted["voice"], tmp_path / "joe")
    shutil.rmtree(prepared_folder(voice).codes_dir)
    with connect(num_cpus=2):
        events: list[Any] = []
        index = extract_codes_ray(voice, tiny_model_dir, num_tasks=2, on_event=events.append)
    want = extracted["index"]
    assert index.to_dict()["clips"] == want.to_dict()["clips"]
    for cid in index.clips:
        assert np.array_equal(index.codes(cid), want.codes(cid))
    progress = [e.data for e in events if e.kind == "progress"]
    assert progress[0]["total"] == len(index.clips) == progress[-1]["done"]


def test_bf16_model_folder(extracted: dict[str, Any], tiny_model_dir: Path,
                           tmp_path: Path) -> None:
    """The released weights are bf16: fingerprints and the x-vector must cope."""
    import shutil

    from safetensors.torch import load_file, save_file

    bf16 = tmp_path / "tiny-bf16"
    shutil.copytree(tiny_model_dir, bf16)
    weights = load_file(str(bf16 / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()},
              str(bf16 / "model.safetensors"), metadata={"format": "pt"})
    assert speaker_encoder_fingerprint(bf16) != speaker_encoder_fingerprint(tiny_model_dir)
    voice = copy_voice(extracted["voice"], tmp_path / "joe")
    index = extract_codes(voice, bf16)
    # same codec: every clip's codes are reused; the x-vector is the bf16 encoder's
    assert index.codec == extracted["index"].codec
    assert index.x_vector_file != extracted["index"].x_vector_file
    np.testing.assert_allclose(index.x_vector(), extracted["index"].x_vector(), atol=0.1)
