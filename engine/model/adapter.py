"""Adapter voices: a LoRA run's adapters and speaker row, kept apart from the base model.

An adapter folder (file names in `engine.layout.tiers`) holds the checkpoint's tensors
as trained (`<linear>.lora_A` / `.lora_B` under official names, unmerged), the speaker
x-vector (the codec embedding's speaker row, as a full export writes it) and, in
VOXSHARD_ADAPTER.json, the base it belongs to: its name as the run gave it (hub id or
folder), and a fingerprint of its weights and the shape of the tensors the adapters
adapt. Loaded onto that base, `adapter_weights` merges them with the run's alpha /
rank exactly as export does (`engine.model.checkpoint_weights.merge_onto_base`), so an
adapter voice speaks as its full export does.

Optionally the same adapters in PEFT's folder format (`adapter_config.json`,
`adapter_model.safetensors`, module names of the official
`Qwen3TTSForConditionalGeneration`), for `peft.PeftModel.from_pretrained`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.core.atomic import atomic_folder
from engine.core.errors import InputError, ModelError
from engine.core.kinds import Tier
from engine.layout.tiers import (
    ADAPTER_INFO,
    ADAPTER_WEIGHTS,
    PEFT_CONFIG,
    PEFT_WEIGHTS,
    SPEAKER_ROW_KEY,
    read_adapter_info,
)
from engine.model.checkpoint_weights import LORA_A, LORA_B, merge_onto_base
from engine.model.export import SPEAKER_ROW, speaker_key
from engine.model.files import memo_per_version, weight_files

FORMAT = 1
#: bytes read from each weight file for its fingerprint, at evenly spaced places
_SAMPLES, _SAMPLE_BYTES = 64, 4096


def weights_fingerprint(model_dir: str | Path) -> str:
    """A fingerprint of a model's weights that costs milliseconds, not a read of gigabytes:
    each safetensors file's size, its header (every tensor's name, dtype, shape and place)
    and 64 samples of 4 KB of its bytes. Another model, or the same one trained further,
    differs in it."""
    h = hashlib.sha256(b"weights-v1")
    for file in weight_files(model_dir):
        def compute(path: Path = file) -> str:
            one = hashlib.sha256()
            size = path.stat().st_size
            with open(path, "rb") as fh:
                head = int.from_bytes(fh.read(8), "little")
                one.update(size.to_bytes(8, "little") + fh.read(min(head, size)))
                for i in range(_SAMPLES):
                    fh.seek(i * max(size - _SAMPLE_BYTES, 0) // max(_SAMPLES - 1, 1))
                    one.update(fh.read(_SAMPLE_BYTES))
            return one.hexdigest()
        h.update(memo_per_version(file, compute, "weights").encode())
    return h.hexdigest()


@dataclass(frozen=True)
class AdapterRequest:
    """What an adapter export writes: a run checkpoint's tensors, on which base, as whom."""

    tensors: Mapping[str, Any]  # checkpoint_tensors(): adapters unmerged
    base_dir: Path  # the base, resolved to a folder
    base: str  # the base as the run names it (hub id or folder)
    rank: int
    alpha: float
    speaker: str
    x_vector: Any
    info: Mapping[str, Any]  # run, checkpoint (recorded beside)
    peft: bool = False


def adapted_shapes(tensors: Mapping[str, Any]) -> dict[str, list[int]]:
    """(out, in) of each weight the adapters adapt: B's rows, A's columns."""
    out = {}
    for key, a in tensors.items():
        if key.endswith(LORA_A):
            prefix = key[: -len(LORA_A)]
            out[prefix + ".weight"] = [int(tensors[prefix + LORA_B].shape[0]), int(a.shape[1])]
    return out


def _peft_files(req: AdapterRequest, folder: Path) -> None:
    """The adapters under PEFT's names (`base_model.model.<module>.lora_A.weight`)."""
    from safetensors.torch import save_file  # noqa: PLC0415

    peft_tensors, modules = {}, []
    for key, value in req.tensors.items():
        for suffix in (LORA_A, LORA_B):
            if key.endswith(suffix):
                module = key[: -len(suffix)]
                peft_tensors[f"base_model.model.{module}{suffix}.weight"] = \
                    value.contiguous()
                if suffix == LORA_A:
                    modules.append(module)
    save_file(peft_tensors, str(folder / PEFT_WEIGHTS), metadata={"format": "pt"})
    config = {"peft_type": "LORA", "r": req.rank, "lora_alpha": req.alpha,
              "target_modules": sorted(modules), "lora_dropout": 0.0, "bias": "none",
              "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
              "init_lora_weights": True, "inference_mode": True, "task_type": None,
              "modules_to_save": None, "base_model_name_or_path": req.base}
    (folder / PEFT_CONFIG).write_text(json.dumps(config, indent=2), encoding="utf-8")


def export_adapter(req: AdapterRequest, out_dir: str | Path, overwrite: bool = False) -> Path:
    """Write the adapter folder at `out_dir` (atomically: complete or absent)."""
    import torch  # noqa: PLC0415
    from safetensors.torch import save_file  # noqa: PLC0415

    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise InputError(f"{out} already exists.", "Choose another folder or pass --overwrite.")
    if not any(k.endswith(LORA_A) for k in req.tensors):
        raise InputError("This run trained no LoRA adapters, so it has no adapter voice.",
                         "Export it as a full voice (leave out --adapter), or train with "
                         "{model.trainable} lora.")
    tensors = {k: torch.as_tensor(v).detach().cpu().contiguous() for k, v in req.tensors.items()}
    tensors[SPEAKER_ROW_KEY] = torch.as_tensor(
        np.asarray(req.x_vector, dtype=np.float32)).flatten()
    info = {"format": FORMAT, "tier": Tier.ADAPTER, "speaker": speaker_key(req.speaker),
            "base": req.base, "base_fingerprint": weights_fingerprint(req.base_dir),
            "adapted_shapes": adapted_shapes(tensors), "rank": req.rank, "alpha": req.alpha,
            "speaker_row": SPEAKER_ROW, **req.info}
    with atomic_folder(out) as tmp:
        save_file(tensors, str(tmp / ADAPTER_WEIGHTS), metadata={"format": "pt"})
        if req.peft:
            _peft_files(req, tmp)
        (tmp / ADAPTER_INFO).write_text(json.dumps(info, indent=2, default=str),
                                        encoding="utf-8")
    return out


@dataclass(frozen=True)
class AdapterVoice:
    """A loaded adapter folder: its tensors as trained and what it needs of its base."""

    folder: Path
    info: dict[str, Any]
    tensors: dict[str, Any]  # official keys and <linear>.lora_A/B
    x_vector: Any  # the speaker row

    @property
    def speaker(self) -> str:
        return str(self.info.get("speaker") or self.folder.name)

    @property
    def base(self) -> str:
        return str(self.info.get("base") or "")

    @property
    def scaling(self) -> float:
        return float(self.info["alpha"]) / float(self.info["rank"])

    def check_base(self, base_dir: str | Path) -> None:
        """Refuse, in one sentence naming the base it needs, a base other than its own."""
        if weights_fingerprint(base_dir) != self.info.get("base_fingerprint"):
            raise ModelError(f"The adapter voice {self.folder.name} was trained on {self.base} "
                             f"and {Path(base_dir).name} is another model (its weights "
                             "differ).", f"Speak it on {self.base}, the base it was trained on.")

    def merged(self, base_dir: str | Path) -> dict[str, Any]:
        """The trained tensors merged onto the base: what its full export holds."""
        self.check_base(base_dir)
        return merge_onto_base(self.tensors, base_dir, self.scaling, self.folder.name)


def load_adapter(folder: str | Path) -> AdapterVoice:
    """Read an adapter folder (a damaged or foreign one says so in one sentence)."""
    from safetensors.torch import load_file  # noqa: PLC0415

    path = Path(folder)
    info = read_adapter_info(path)
    if not info or not (path / ADAPTER_WEIGHTS).is_file():
        raise ModelError(f"{path} is not an adapter voice (no {ADAPTER_INFO} and "
                         f"{ADAPTER_WEIGHTS}).", "Export the run again with --adapter.")
    if int(info.get("format", 0)) > FORMAT or not info.get("rank") or not info.get("alpha"):
        raise ModelError(f"The adapter voice {path.name} was written by another Voxshard.",
                         "Export the run again with this one.")
    tensors = load_file(str(path / ADAPTER_WEIGHTS))
    x_vector = tensors.pop(SPEAKER_ROW_KEY, None)
    if x_vector is None:
        raise ModelError(f"The adapter voice {path.name} has no speaker row.",
                         "Export the run again with --adapter.")
    # a copy of its own, made now: the row as loaded, kept by the voice, sat in the C heap
    # just above the adapter's hundreds of small tensors and kept them all resident once
    # they were freed (on CPU every voice loaded cost twice its adapter pool slot)
    return AdapterVoice(path, info, tensors, x_vector.clone())
