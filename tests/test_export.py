"""Export: a trained talker becomes a custom_voice folder the official code speaks with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from engine.core.errors import InputError, ModelError
from engine.model.export import CODEC_EMBEDDING, SPEAKER_ROW, export_custom_voice
from engine.train.objective import build_objective, full_state_dict, load_base_weights

# numeric parity (marked one by one: only the tests that compare two computations): the
# export against the official loader; packaging/run_tests.sh runs them again under other
# CPU kernel dispatches, the files and messages here once.


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path) -> dict[str, Any]:
    """A talker whose weights differ from the base (as after training)."""
    objective = build_objective(tiny_model_dir, device="meta")
    load_base_weights(objective, tiny_model_dir)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in objective.parameters():
            if p.requires_grad:
                p.add_(0.01 * torch.randn(p.shape, generator=g))
    sd = full_state_dict(objective)
    hidden = objective.talker.config.hidden_size
    xv = torch.randn(hidden, generator=g).numpy()
    return {"sd": sd, "x_vector": xv}


@pytest.fixture(scope="module")
def exported(tiny_model_dir: Path, trained: dict[str, Any],
             tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("export") / "joe-voice"
    return export_custom_voice(tiny_model_dir, trained["sd"], "Joe", trained["x_vector"], out,
                               keep_dtype=False)


def _load(path: Path) -> Any:
    from engine.model.official import import_qwen_tts

    qt = import_qwen_tts()
    return qt.Qwen3TTSModel.from_pretrained(str(path), dtype=torch.float32,
                                            attn_implementation="sdpa")


@pytest.mark.parity
def test_official_loader_speaks_the_export(exported: Path, trained: dict[str, Any]) -> None:
    tts = _load(exported)
    model = tts.model
    assert model.tts_model_type == "custom_voice" and model.speaker_encoder is None
    assert list(model.get_supported_speakers()) == ["joe"]
    weights = dict(model.named_parameters())
    assert not any(k.startswith("speaker_encoder.") for k in weights)
    # trained values made it in, and row 3000 is the x-vector
    for key in ("talker.model.layers.0.self_attn.q_proj.weight",
                "talker.code_predictor.lm_head.14.weight", "talker.codec_head.weight"):
        torch.testing.assert_close(weights[key], trained["sd"][key], rtol=0, atol=0)
    row = weights[CODEC_EMBEDDING][SPEAKER_ROW]
    np.testing.assert_array_equal(row.detach().numpy(), trained["x_vector"])
    other = trained["sd"][CODEC_EMBEDDING].clone()
    other[SPEAKER_ROW] = weights[CODEC_EMBEDDING][SPEAKER_ROW]
    torch.testing.assert_close(weights[CODEC_EMBEDDING], other, rtol=0, atol=0)

    # the name is matched case-insensitively, as the official lookup lower-cases it
    wavs, sr = tts.generate_custom_voice("Hello there.", speaker="Joe", max_new_tokens=6,
                                         do_sample=False, subtalker_dosample=False)
    assert sr == 24000 and len(wavs) == 1 and wavs[0].ndim == 1 and wavs[0].size > 0
    assert np.isfinite(wavs[0]).all()
    files = {p.name for p in exported.iterdir()}
    assert {"config.json", "model.safetensors", "speech_tokenizer", "generation_config.json",
            "VOXSHARD_EXPORT.json"} <= files
    cfg = json.loads((exported / "config.json").read_text())
    assert cfg["talker_config"]["spk_is_dialect"] == {"joe": False}


@pytest.mark.parity
def test_custom_voice_prefill_equals_training_speaker_slot(
        exported: Path, trained: dict[str, Any], tiny_model_dir: Path) -> None:
    """The exported speaker speaks exactly as the base model with that x-vector in its slot."""
    from engine.model.official import import_qwen_tts

    tts = _load(exported)
    qt = import_qwen_tts()
    base = qt.Qwen3TTSModel.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    # the base with the trained talker weights (what training evaluated)
    base.model.talker.load_state_dict(
        {k[len("talker."):]: v for k, v in trained["sd"].items()}, strict=True)
    ids = tts._tokenize_texts([tts._build_assistant_text("A small test.")])[0]
    kw = {"languages": ["auto"], "non_streaming_mode": True, "max_new_tokens": 8,
          "do_sample": False, "subtalker_dosample": False, "repetition_penalty": 1.0,
          "eos_token_id": 2149}
    got, _ = tts.model.generate(input_ids=[ids], speakers=["joe"], **kw)
    xv = torch.from_numpy(trained["x_vector"])
    want, _ = base.model.generate(
        input_ids=[ids], voice_clone_prompt={"ref_spk_embedding": [xv],
                                             "x_vector_only_mode": [True], "icl_mode": [False],
                                             "ref_code": None}, **kw)
    assert torch.equal(got[0], want[0])


def test_partial_state_dict_and_base_dtype(tiny_model_dir: Path, trained: dict[str, Any],
                                           tmp_path: Path) -> None:
    from safetensors import safe_open

    key = "talker.codec_head.weight"
    out = export_custom_voice(tiny_model_dir, {key: trained["sd"][key]}, "x",
                              trained["x_vector"], tmp_path / "out")
    with safe_open(str(out / "model.safetensors"), "pt") as fh, \
            safe_open(str(tiny_model_dir / "model.safetensors"), "pt") as base:
        assert torch.equal(fh.get_tensor(key), trained["sd"][key].to(base.get_tensor(key).dtype))
        untouched = "talker.model.layers.1.mlp.up_proj.weight"
        assert torch.equal(fh.get_tensor(untouched), base.get_tensor(untouched))
        assert not any(k.startswith("speaker_encoder.") for k in fh.keys())


def test_failed_export_leaves_nothing(tiny_model_dir: Path, trained: dict[str, Any],
                                      tmp_path: Path) -> None:
    out = tmp_path / "bad"
    with pytest.raises(ModelError):
        export_custom_voice(tiny_model_dir, {"talker.no_such.weight": torch.zeros(2)}, "x",
                            trained["x_vector"], out)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ModelError):  # x-vector of the wrong size
        export_custom_voice(tiny_model_dir, {}, "x", np.zeros(3), out)
    assert list(tmp_path.iterdir()) == []
    done = export_custom_voice(tiny_model_dir, {}, "x", trained["x_vector"], out)
    with pytest.raises(InputError):
        export_custom_voice(tiny_model_dir, {}, "x", trained["x_vector"], out)
    export_custom_voice(tiny_model_dir, {}, "y", trained["x_vector"], out, overwrite=True)
    assert json.loads((done / "config.json").read_text())["talker_config"]["spk_id"] == {"y": 3000}
    assert [p.name for p in tmp_path.iterdir()] == ["bad"]
    with pytest.raises(ModelError):  # a custom_voice folder is not a base to export from
        export_custom_voice(done, {}, "z", trained["x_vector"], tmp_path / "again")


def test_bf16_base_round_trip(tiny_model_dir: Path, trained: dict[str, Any],
                              tmp_path: Path) -> None:
    """Released bases are bf16: training loads them as fp32 masters, export writes bf16 back."""
    import shutil

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    base = tmp_path / "tiny-bf16"
    shutil.copytree(tiny_model_dir, base)
    weights = load_file(str(base / "model.safetensors"))
    save_file({k: v.to(torch.bfloat16) for k, v in weights.items()},
              str(base / "model.safetensors"), metadata={"format": "pt"})
    objective = build_objective(base, device="meta")
    load_base_weights(objective, base)
    p = dict(objective.named_parameters())["talker.codec_head.weight"]
    assert p.dtype == torch.float32
    assert torch.equal(p, weights["talker.codec_head.weight"].to(torch.bfloat16).float())
    out = export_custom_voice(base, trained["sd"], "joe", trained["x_vector"], tmp_path / "out")
    with safe_open(str(out / "model.safetensors"), "pt") as fh:
        assert {fh.get_tensor(k).dtype for k in fh.keys()} == {torch.bfloat16}
    tts = _load(out)
    wavs, _ = tts.generate_custom_voice("Hi.", speaker="joe", max_new_tokens=4, do_sample=False)
    assert wavs[0].size > 0
