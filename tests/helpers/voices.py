"""Voice folders and workspaces for tests, made with the engine's own layout code.

- `copy_voice`: a private, writable copy of a (session, read-only) voice folder.
- `make_voice`: a new empty voice in a workspace.
- `voice_with_clips`: a voice whose manifest lists `n` usable clips of `seconds` each and
  no audio (planning and validation read the manifest only).
- `make_workspace`: a workspace with one voice, `ada`, whose export is the tiny base model
  as a custom voice (what `serve` lists and speaks).
- `forced_export`: a voice of the tiny model forced by its own weights into one
  codebook-0 code (`DRONE`, or the codec's silence code): the runaway guard's drone.
- `file_states`: every file under a folder with its size and time, to prove that
  something changed nothing there.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.torch import load_file

from engine.layout.voice import create_voice
from engine.model.export import export_custom_voice


def copy_voice(src: Path, dst: Path) -> Path:
    """A private, writable copy of a (session) voice folder."""
    shutil.copytree(src, dst)
    return dst


def make_voice(workspace: Path, speaker: str = "Ada") -> Path:
    return create_voice(workspace / speaker.lower(), speaker).path


def voice_with_clips(tmp: Path, n: int, seconds: float) -> Path:
    v = create_voice(tmp / "v", "Tester")
    prep = v.prepared.path
    prep.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": f"c{i}", "path": f"prepared/clips/c{i}.wav", "text": "hello there",
                         "duration_s": seconds, "sample_rate": 24000, "usable": True,
                         "issues": [], "source_take": f"t{i}"}) for i in range(n)]
    (prep / "manifest.jsonl").write_text("\n".join(lines) + "\n")
    return v.path


def make_workspace(root: Path, model_dir: Path) -> Path:
    """A workspace with one voice, `ada`, whose export is the tiny base as a custom voice."""
    ws = root / "ws"
    ws.mkdir()
    create_voice(ws / "ada", "Ada", "english")
    hidden = json.loads((model_dir / "config.json").read_text())["talker_config"]["hidden_size"]
    vector = np.random.default_rng(0).standard_normal(hidden).astype(np.float32)
    export_custom_voice(model_dir, {}, "Ada", vector, ws / "ada" / "exports" / "ada-v1",
                        keep_dtype=False)
    return ws


def file_states(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file under `folder` (relative, '/'-separated) with its size and mtime in ns."""
    return {p.relative_to(folder).as_posix(): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


#: the code the drone voice repeats (not one the tiny codec gives silence)
DRONE = 5


def forced_export(model_dir: Path, out: Path, code: int) -> Path:
    """A voice of the tiny model whose talker always picks codebook-0 `code`: every
    codec embedding gets a large constant in one dimension (so the last hidden state
    points there, whatever was said) and only `code`'s head row reads it."""
    weights = load_file(str(model_dir / "model.safetensors"))
    embedding = weights["talker.model.codec_embedding.weight"].clone().float()
    head = weights["talker.codec_head.weight"].clone().float()
    embedding[:, 0] += 1000.0
    head[:, 0] = 0.0
    head[code, 0] = 50.0
    hidden = embedding.shape[1]
    vector = np.random.default_rng(0).standard_normal(hidden).astype(np.float32)
    return export_custom_voice(model_dir, {"talker.model.codec_embedding.weight": embedding,
                                           "talker.codec_head.weight": head},
                               "Ada", vector, out, keep_dtype=False)
