"""Find and load Qwen3-TTS models: a local folder or a Hugging Face hub id.

`resolve_model` turns what a user typed into a checked local folder,
downloading from the hub when needed (resumable; the hub client keeps partial
files). Every way this can fail ends in a `ModelError` that says what to do.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.errors import ModelError
from engine.core.events import Emitter, EventCallback, as_emitter
from engine.model.official import import_qwen_tts

KNOWN_BASE_MODELS = {
    "Qwen/Qwen3-TTS-12Hz-1.7B-Base": "1.7B, best quality (about 4 GB download)",
    "Qwen/Qwen3-TTS-12Hz-0.6B-Base": "0.6B, faster and smaller (about 2 GB download)",
}
DEFAULT_BASE_MODEL = "Qwen/Qwen3-TTS-12Hz-1.7B-Base"
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class ModelInfo:
    """What a model folder is, read from its config without loading weights."""

    path: Path
    model_type: str  # "base" or "custom_voice" (or "voice_design")
    size: str | None
    talker_hidden: int
    talker_layers: int
    speakers: tuple[str, ...]
    languages: tuple[str, ...]
    tiny: bool

    def to_dict(self) -> dict[str, Any]:
        return {"path": str(self.path), "model_type": self.model_type, "size": self.size,
                "talker_hidden": self.talker_hidden, "talker_layers": self.talker_layers,
                "speakers": list(self.speakers), "languages": list(self.languages),
                "tiny": self.tiny}


def read_model_config(path: str | Path) -> dict[str, Any]:
    """A model folder's `config.json`, read in one place for every reader of a model's
    widths, ids and kind."""
    folder = Path(path)
    cfg_path = folder / "config.json"
    if not folder.is_dir():
        raise ModelError(f"Model folder {folder} does not exist.",
                         "Check the path, or give a hub id like " + DEFAULT_BASE_MODEL + ".")
    if not cfg_path.is_file():
        raise ModelError(f"{folder} is not a model folder (it has no config.json).",
                         "Point to the folder that holds config.json and model.safetensors.")
    try:
        return json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelError(f"{cfg_path} cannot be read: {exc}.",
                         "The download may be incomplete; download the model again.") from exc


def inspect_model(path: str | Path) -> ModelInfo:
    """Check that `path` is a Qwen3-TTS 12 Hz model folder and describe it."""
    folder = Path(path)
    cfg = read_model_config(folder)
    if cfg.get("model_type") != "qwen3_tts":
        raise ModelError(
            f"{folder} holds a {cfg.get('model_type') or 'unknown'!s} model, not Qwen3-TTS.",
            "Use a Qwen3-TTS-12Hz model such as " + DEFAULT_BASE_MODEL + ".")
    if cfg.get("tokenizer_type") not in (None, "qwen3_tts_tokenizer_12hz"):
        raise ModelError(f"{folder} uses the {cfg.get('tokenizer_type')} speech tokenizer; "
                         "Voxshard supports the 12 Hz models only.",
                         "Use a Qwen3-TTS-12Hz model such as " + DEFAULT_BASE_MODEL + ".")
    if not (folder / "speech_tokenizer" / "config.json").is_file():
        raise ModelError(f"{folder} has no speech_tokenizer/ folder.",
                         "The download may be incomplete; download the model again.")
    if not any(folder.glob("*.safetensors")):
        raise ModelError(f"{folder} has no weights (*.safetensors).",
                         "The download may be incomplete; download the model again.")
    talker = cfg.get("talker_config", {})
    langs = tuple(k for k in (talker.get("codec_language_id") or {}) if "dialect" not in k)
    return ModelInfo(
        path=folder,
        model_type=str(cfg.get("tts_model_type") or "base"),
        size=cfg.get("tts_model_size"),
        talker_hidden=int(talker.get("hidden_size", 0)),
        talker_layers=int(talker.get("num_hidden_layers", 0)),
        speakers=tuple((talker.get("spk_id") or {}).keys()),
        languages=langs,
        tiny=(folder / "VOXSHARD_TINY_MODEL").exists(),
    )


def check_base_model(path: str | Path) -> ModelInfo:
    """`inspect_model`, and a Base model: what training starts from (the command line
    and the window's folder picker ask the same question)."""
    info = inspect_model(path)
    if info.model_type != "base":
        raise ModelError(f"{Path(path).name} is a {info.model_type} model; training starts "
                         "from a Qwen3-TTS Base model.",
                         "Choose a Base model, such as " + DEFAULT_BASE_MODEL + " or the "
                         "0.6B Base.")
    return info


def hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")


def resolve_model(name_or_path: str | os.PathLike[str], *, download: bool = True,
                  on_event: EventCallback | Emitter | None = None) -> Path:
    """Return a local, checked model folder for a path or a hub id."""
    text = str(name_or_path).strip()
    if not text:
        raise ModelError("No model was given.", f"Give a folder or a hub id such as "
                         f"{DEFAULT_BASE_MODEL}.")
    path = local_model_path(text)
    if path is not None:
        inspect_model(path)
        return path
    return download_model(text, download=download, on_event=on_event)


def local_model_path(name_or_path: str | os.PathLike[str]) -> Path | None:
    """The folder meant, when what a user typed names a local folder rather than a hub id."""
    text = str(name_or_path).strip()
    path = Path(text).expanduser()
    if path.exists() or text.startswith((".", "/", "~")) or not HUB_ID.match(text):
        return path
    return None


#: a failed download's remedy in the window's words (the command line's says to run it again)
WINDOW_RETRY = ("Check the internet connection and disk space, then press the same button "
                "again (the download resumes), or choose a local copy of the model folder.")
#: a model that cannot be fetched without a network, in the window's words
WINDOW_OFFLINE = ("Choose a local folder, or connect to the internet and press Download "
                  "again (it resumes).")
#: the hub client's words for a network it could not reach
_NO_NETWORK = ("connect", "timeout", "timed out", "resolve", "offline", "network",
               "unreachable")


def model_label(repo: str) -> str:
    """ "Qwen/Qwen3-TTS-12Hz-1.7B-Base" -> "Qwen3-TTS 1.7B" (the name a user knows)."""
    m = re.match(r".*?/(?P<family>Qwen3-TTS)-[\w]+?-(?P<size>[\d.]+B)", repo)
    return f"{m['family']} {m['size']}" if m else repo


def _download_failed(repo_id: str, exc: Exception) -> ModelError:
    """A download that failed: no network is said as such (a person chooses a local folder
    or connects), anything else with the error's own words."""
    said = f"{type(exc).__name__}: {exc}".lower()
    if any(word in said for word in _NO_NETWORK):
        return ModelError(
            f"{model_label(repo_id)} is not downloaded and there is no internet connection.",
            "Check the internet connection, then run the same command again (it resumes), "
            "or give the path of a local copy of the model folder.",
            window_hint=WINDOW_OFFLINE)
    if isinstance(exc, OSError):
        return ModelError(
            f"Could not download {repo_id}: {exc}.",
            "Check the internet connection and disk space, then run the same command again "
            "(it resumes), or give the path of a local copy of the model folder.",
            window_hint=WINDOW_RETRY)
    return ModelError(
        f"Could not download {repo_id} ({type(exc).__name__}).",
        "Check the internet connection, then run the same command again (it resumes), "
        "or give the path of a local copy of the model folder.", window_hint=WINDOW_RETRY)


def download_model(repo_id: str, *, download: bool = True,
                   on_event: EventCallback | Emitter | None = None) -> Path:
    """Fetch `repo_id` from the Hugging Face hub (or its local cache)."""
    from huggingface_hub import snapshot_download  # noqa: PLC0415
    from huggingface_hub.errors import (  # noqa: PLC0415
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    emitter = as_emitter(on_event)
    try:
        folder = Path(snapshot_download(repo_id, local_files_only=True))
        inspect_model(folder)
        return folder
    except (LocalEntryNotFoundError, FileNotFoundError, ModelError):
        pass
    if not download or hub_offline():
        raise ModelError(
            f"Model {repo_id} is not on this machine and downloading is off.",
            "Connect to the internet and run `voxshard-engine model download "
            f"{repo_id}`, or give the path of a local copy of the model folder.",
            window_hint="Choose a local folder." if hub_offline() else None)
    emitter.state("downloading_model", detail=repo_id)
    emitter.log(f"Downloading {repo_id} (resumes where it stopped if interrupted)...")
    try:
        folder = Path(snapshot_download(repo_id))
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise ModelError(f"The hub has no accessible model called {repo_id}.",
                         "Check the spelling, e.g. " + DEFAULT_BASE_MODEL + ".") from exc
    except Exception as exc:  # hub client raises many HTTP error types
        raise _download_failed(repo_id, exc) from exc
    inspect_model(folder)
    emitter.artifact(str(folder), role="model")
    return folder


def default_device() -> str:
    """Where a model runs when the user names no device: the first GPU, else the CPU (the
    one rule for speaking, serving and speech recognition)."""
    import torch  # noqa: PLC0415

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def load_model(path: str | os.PathLike[str], device: str | None = None,
               dtype: Any = None) -> Any:
    """Load a model folder with the official `Qwen3TTSModel` (returns the wrapper)."""
    import torch  # noqa: PLC0415

    folder = Path(path)
    inspect_model(folder)
    device = device or default_device()
    if dtype is None:
        # bf16 matmuls crawl on CPUs without AMX; fp32 there.
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    qwen_tts = import_qwen_tts()
    try:
        return qwen_tts.Qwen3TTSModel.from_pretrained(
            str(folder), device_map=device, dtype=dtype, attn_implementation="sdpa")
    except ModelError:
        raise
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        raise ModelError(f"Could not load the model in {folder}: {exc}.",
                         "The folder may be damaged; download or export it again.") from exc
