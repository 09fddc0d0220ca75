"""Export a fine-tuned talker as an official Qwen3-TTS `custom_voice` model folder.

The folder is a copy of the base model folder with (facts file):
- config.json: tts_model_type "custom_voice", talker_config.spk_id
  {name: 3000} and spk_is_dialect {name: false}; the name lower-cased
  because the official lookup lower-cases the request;
- model.safetensors: the base tensors with the trained ones put in, without
  any speaker_encoder.* tensor (a custom_voice model has no speaker encoder),
  and row 3000 of talker.model.codec_embedding.weight set to the speaker
  x-vector, which is exactly what filled the speaker slot in training.
The official `Qwen3TTSModel.from_pretrained(out)` loads it and
`generate_custom_voice(text, speaker=name)` speaks with it.

Written atomically: everything goes to a hidden temporary folder next to
`out_dir`, which is renamed into place only when complete.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from engine.core.errors import DiskFullError, InputError, ModelError, is_disk_full
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.layout.exports import EXPORT_INFO
from engine.model.files import weight_files
from engine.model.loading import read_model_config

#: the codec-embedding row the exported speaker takes (free in every 12 Hz model)
SPEAKER_ROW = 3000
CODEC_EMBEDDING = "talker.model.codec_embedding.weight"
_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def speaker_key(name: str) -> str:
    key = name.strip().lower()
    if not key:
        raise InputError("The speaker name is empty.", "Give the voice a name.")
    return key


def _custom_voice_tensors(base: Path, state_dict: Mapping[str, Any], vec: Any,
                          keep_dtype: bool) -> dict[str, Any]:
    """The base's tensors (less the speaker encoder), the trained ones put in, and the
    x-vector written into the speaker row of the codec embedding."""
    import torch  # noqa: PLC0415
    from safetensors import safe_open  # noqa: PLC0415

    tensors: dict[str, torch.Tensor] = {}
    for f in weight_files(base):
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():
                if not key.startswith("speaker_encoder."):
                    tensors[key] = fh.get_tensor(key)
    for key, value in state_dict.items():
        if key not in tensors:
            raise ModelError(f"Trained tensor {key} does not exist in {base}.",
                             "Export with the base model the run was trained from.")
        value = torch.as_tensor(value).detach().cpu()
        if tuple(value.shape) != tuple(tensors[key].shape):
            raise ModelError(f"Trained tensor {key} has shape {tuple(value.shape)}, the base "
                             f"has {tuple(tensors[key].shape)}.")
        dtype = tensors[key].dtype if keep_dtype else torch.float32
        tensors[key] = value.to(dtype).contiguous()
    emb = tensors[CODEC_EMBEDDING]
    if vec.numel() != emb.shape[1]:
        raise ModelError(f"The x-vector has {vec.numel()} values; the talker needs "
                         f"{emb.shape[1]}.", "Extract it with this base model.")
    emb = emb.clone()
    emb[SPEAKER_ROW] = vec.to(emb.dtype)
    tensors[CODEC_EMBEDDING] = emb
    return tensors


def export_custom_voice(base_model_dir: str | Path, state_dict: Mapping[str, Any],  # noqa: PLR0913
                        speaker_name: str, x_vector: Any, out_dir: str | Path, *,
                        overwrite: bool = False, keep_dtype: bool = True,
                        info: Mapping[str, Any] | None = None,
                        on_event: EventCallback | Emitter | None = None) -> Path:
    """Write the custom_voice folder at `out_dir` and return it.

    state_dict: trained tensors under their official keys ("talker...."),
    all of them or only the trained ones (the rest come from the base).
    keep_dtype: store each tensor in the base file's dtype (bf16 for the
    released models, half the size); False keeps fp32.
    """
    import torch  # noqa: PLC0415
    from safetensors.torch import save_file  # noqa: PLC0415

    em = as_emitter(on_event)
    base, out = Path(base_model_dir), Path(out_dir)
    name = speaker_key(speaker_name)
    cfg = read_model_config(base)
    if cfg.get("model_type") != "qwen3_tts" or cfg.get("tts_model_type") != "base":
        raise ModelError(f"{base} is not a Qwen3-TTS Base model.",
                         "Export from the Base model the voice was trained on.")
    if out.exists() and not overwrite:
        raise InputError(f"{out} already exists.", "Choose another folder or pass --overwrite.")
    vec = torch.as_tensor(np.asarray(x_vector, dtype=np.float32)).flatten()

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        em.state("exporting", detail=str(out))
        save_file(_custom_voice_tensors(base, state_dict, vec, keep_dtype),
                  str(tmp / "model.safetensors"), metadata={"format": "pt"})
        em.progress("export", 1, 3)

        for item in base.iterdir():
            if item.name in _WEIGHT_FILES or item.name.startswith("model-") \
                    or item.name in ("config.json", EXPORT_INFO):
                continue
            if item.is_dir():
                shutil.copytree(item, tmp / item.name)
            else:
                shutil.copy2(item, tmp / item.name)
        em.progress("export", 2, 3)

        cfg["tts_model_type"] = "custom_voice"
        talker = cfg["talker_config"]
        talker["spk_id"] = {name: SPEAKER_ROW}
        talker["spk_is_dialect"] = {name: False}
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False),
                                         encoding="utf-8")
        (tmp / EXPORT_INFO).write_text(json.dumps(
            {"speaker": name, "base_model": str(base.resolve()), "speaker_row": SPEAKER_ROW,
             "trained_tensors": len(state_dict), **(info or {})}, indent=2, default=str),
            encoding="utf-8")

        if out.exists():  # overwrite: swap, then drop the old one
            old = out.parent / f".{out.name}.old-{tmp.name.rsplit('-', 1)[-1]}"
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if is_disk_full(exc):
            raise DiskFullError(f"The disk holding {out.parent} is full; nothing was exported.",
                                "Free some space and export again.") from exc
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    em.progress("export", 3, 3)
    em.artifact(str(out), "custom_voice_model", speaker=name)
    return out
