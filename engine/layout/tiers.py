"""A voice's tiers: the three ways it can speak, and what each keeps on disk.

- **instant** (no training): the voice's reference clip and its words, chosen by the
  engine's rule (`engine.layout.manifest.reference_clip`), and its speaker vector when
  a base model was at hand; it speaks zero-shot (in-context) on its base: the one it
  records, else the one the voice's runs trained from (`instant_base`). A base learnt
  later (the voice trains on one, or it first speaks on a given one) is recorded then
  (`record_instant_base`); an instant voice with no base known cannot speak and is not
  offered.
  ```
  <voice>/instant/instant.json     clip id, text, speaker, base (when known), created
  <voice>/instant/reference.wav    a copy of the clip (prepare may replace its clips)
  <voice>/instant/x_vector.npy     the speaker vector (only with a base)
  ```
- **adapter**: a LoRA run's adapters (tens of MB) and its speaker row, on the base it
  was trained from (named, with a fingerprint of its weights):
  ```
  <voice>/exports/<name>/VOXSHARD_ADAPTER.json   base, fingerprint, rank, alpha, speaker
  <voice>/exports/<name>/adapter.safetensors     <linear>.lora_A/B under official names,
                                                 the speaker row, other trained tensors
  <voice>/exports/<name>/adapter_config.json     (optional) the same adapters in PEFT's
  <voice>/exports/<name>/adapter_model.safetensors  folder format, for `peft`
  ```
  A LoRA run that finishes writes its own as `<voice>/exports/<run>-adapter`.
- **full**: an official custom-voice model folder (`engine.layout.exports`).

One home for these file names (the tiers themselves: `engine.core.kinds.Tier`); light
(no torch, no Qt).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from engine.core.atomic import atomic_folder, read_json, write_json
from engine.core.errors import WorkspaceError
from engine.core.kinds import Tier
from engine.layout.exports import EXPORT_INFO, export_folders, exports_dir, list_exports
from engine.layout.run import voice_base_model

INSTANT_DIR = "instant"
INSTANT_INFO = "instant.json"
INSTANT_CLIP = "reference.wav"
INSTANT_VECTOR = "x_vector.npy"

ADAPTER_INFO = "VOXSHARD_ADAPTER.json"
ADAPTER_WEIGHTS = "adapter.safetensors"
PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
#: the key of the speaker row in adapter.safetensors
SPEAKER_ROW_KEY = "voxshard.speaker_row"


@dataclass(frozen=True)
class VoiceTier:
    """One way a voice speaks: its tier, name, folder, size on disk and base model."""

    tier: Tier
    name: str
    path: Path
    size_bytes: int
    base: str | None = None
    speaker: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"tier": self.tier, "name": self.name, "path": str(self.path),
                "size_bytes": self.size_bytes, "base": self.base, "speaker": self.speaker}


def folder_size(folder: Path) -> int:
    """Bytes of the files under `folder` (0 when it cannot be read)."""
    total = 0
    for root, _dirs, files in os.walk(folder):
        for f in files:
            try:
                total += (Path(root) / f).stat().st_size
            except OSError:
                continue
    return total


# --- instant ------------------------------------------------------------------------------

def instant_dir(voice_dir: str | os.PathLike[str]) -> Path:
    return Path(voice_dir) / INSTANT_DIR


@dataclass(frozen=True)
class InstantVoice:
    """A saved instant voice: what it clones from, and with which base."""

    folder: Path
    clip_id: str
    text: str
    speaker: str
    base: str | None
    created: str

    @property
    def clip(self) -> Path:
        return self.folder / INSTANT_CLIP

    @property
    def x_vector_file(self) -> Path:
        return self.folder / INSTANT_VECTOR

    def x_vector(self) -> np.ndarray | None:
        """The saved speaker vector (None: saved without a base model)."""
        try:
            return np.load(self.x_vector_file)
        except (OSError, ValueError):
            return None


def read_instant(voice_dir: str | os.PathLike[str]) -> InstantVoice | None:
    """The voice's instant voice, or None when none was saved (or it is incomplete)."""
    folder = instant_dir(voice_dir)
    info = read_json(folder / INSTANT_INFO)
    if not isinstance(info, dict) or not (folder / INSTANT_CLIP).is_file():
        return None
    base = info.get("base")
    return InstantVoice(folder=folder, clip_id=str(info.get("clip_id") or ""),
                        text=str(info.get("text") or ""), speaker=str(info.get("speaker") or ""),
                        base=str(base) if base else None, created=str(info.get("created") or ""))


def write_instant(voice_dir: str | os.PathLike[str], info: Mapping[str, Any], clip: Path,
                  x_vector: np.ndarray | None) -> InstantVoice:
    """Save (or replace) the voice's instant voice as a whole: the folder is written
    under a hidden name and renamed in, so a reader sees the old one or the new one."""
    voice = Path(voice_dir)
    with atomic_folder(instant_dir(voice)) as tmp:
        try:
            shutil.copyfile(clip, tmp / INSTANT_CLIP)
        except OSError as exc:
            raise WorkspaceError(f"Cannot copy the reference clip {clip.name}: "
                                 f"{exc.strerror or exc}.", "Prepare the voice again.") from exc
        if x_vector is not None:
            np.save(tmp / INSTANT_VECTOR, np.asarray(x_vector, dtype=np.float32))
        (tmp / INSTANT_INFO).write_text(json.dumps(dict(info), indent=2, default=str),
                                        encoding="utf-8")
    found = read_instant(voice)
    assert found is not None
    return found


def instant_base(voice_dir: str | os.PathLike[str], instant: InstantVoice) -> str | None:
    """The base the instant voice speaks on: its recorded one, else the one the voice's
    runs trained from (None: no base is known, so it cannot speak yet)."""
    return instant.base or voice_base_model(voice_dir)


def record_instant_base(voice_dir: str | os.PathLike[str], base: str) -> bool:
    """Record `base` in the voice's instant voice when it records none yet (its vector, if
    any, came from that base, so a recorded base is never replaced). True when written."""
    info_file = instant_dir(voice_dir) / INSTANT_INFO
    if not base or not info_file.is_file():
        return False
    info = read_json(info_file)
    if not isinstance(info, dict) or info.get("base"):
        return False
    write_json(info_file, {**info, "base": str(base)})  # atomic: a reader sees one or the other
    return True


# --- adapters -----------------------------------------------------------------------------

def run_adapter_dir(voice_dir: str | os.PathLike[str], run: str) -> Path:
    """Where a finished LoRA run writes its adapter voice: `exports/<run>-adapter` (not
    the run's own name, which `serve` already gives the run's checkpoint)."""
    return exports_dir(voice_dir) / f"{run}-adapter"


def is_adapter(folder: Path) -> bool:
    return folder.is_dir() and not folder.name.startswith(".") \
        and (folder / ADAPTER_INFO).is_file() and (folder / ADAPTER_WEIGHTS).is_file()


def list_adapters(voice_dir: str | os.PathLike[str]) -> list[Path]:
    """The voice's complete adapter exports, newest first."""
    return export_folders(voice_dir, is_adapter, ADAPTER_INFO)


def read_adapter_info(folder: Path) -> dict[str, Any]:
    """VOXSHARD_ADAPTER.json of an adapter folder ({} when it is missing or damaged)."""
    info = read_json(Path(folder) / ADAPTER_INFO)
    return info if isinstance(info, dict) else {}


# --- every tier of a voice ------------------------------------------------------------------

def voice_tiers(voice_dir: str | os.PathLike[str]) -> list[VoiceTier]:
    """What a voice can speak with, by tier: its instant voice, its adapters (newest
    first), its full exports (newest first). Path logic only."""
    voice = Path(voice_dir)
    out: list[VoiceTier] = []
    instant = read_instant(voice)
    if instant is not None:
        out.append(VoiceTier(Tier.INSTANT, INSTANT_DIR, instant.folder,
                             folder_size(instant.folder), instant_base(voice, instant),
                             instant.speaker))
    for folder in list_adapters(voice):
        info = read_adapter_info(folder)
        out.append(VoiceTier(Tier.ADAPTER, folder.name, folder, folder_size(folder),
                             _text(info.get("base")), _text(info.get("speaker"))))
    for folder in list_exports(voice):
        info = read_json(folder / EXPORT_INFO)
        info = info if isinstance(info, dict) else {}
        out.append(VoiceTier(Tier.FULL, folder.name, folder, folder_size(folder),
                             _text(info.get("base_model")), _text(info.get("speaker"))))
    return out


def _text(value: Any) -> str | None:
    return str(value) if value else None
