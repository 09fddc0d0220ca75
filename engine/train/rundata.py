"""A run is tied to the data it trains on.

When a run starts, its folder gets:
- `data.json`: a fingerprint of the prepared data (every usable clip's id,
  transcript, audio hash and style description, in manifest order), the clip
  count, the style descriptions the run trains with and the reference clip;
- `x_vector.npy`: the speaker x-vector that fills the speaker slot in
  training. Export and speech from the run's checkpoints use this copy, so
  preparing the voice again (which may pick another reference clip) cannot
  change the voice a finished run speaks with.

`--resume` refuses, with one sentence, when the data changed (the data
position saved in a checkpoint indexes the old clip list; silently training
on other clips would make the run neither the old one nor a new one). A
changed number of steps, batch size, accumulation or workers is allowed but
said, with what it changes, and recorded in `resumes.jsonl`.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from engine.core.atomic import atomic_path, write_json
from engine.core.errors import InputError
from engine.core.jsonl import append_jsonl
from engine.layout.manifest import prepared_folder, read_manifest
from engine.layout.run import DATA_FILE
from engine.layout.voice import file_sha256

X_VECTOR_FILE = "x_vector.npy"
RESUMES_FILE = "resumes.jsonl"


def data_fingerprint(voice_dir: Path) -> dict[str, Any]:
    """{"fingerprint", "clips"} of the voice's usable prepared clips (reads every clip once)."""
    h = hashlib.sha256()
    clips = read_manifest(voice_dir)
    for c in clips:
        audio = prepared_folder(voice_dir).row_file(c)
        sha = file_sha256(audio) if audio.is_file() else "missing"
        style = str(c.get("style") or "").strip()
        # a style changes the clip's sequence, so an edited one is other data; a clip
        # without one hashes as it did before styles existed (old runs still resume)
        h.update(json.dumps([c["id"], c.get("text", ""), sha] + ([style] if style else []))
                 .encode())
        h.update(b"\n")
    return {"fingerprint": h.hexdigest(), "clips": len(clips), "styles": clip_styles(clips)}


def clip_styles(rows: list[dict[str, Any]]) -> list[str]:
    """The distinct style descriptions of these manifest rows, in first-seen order."""
    seen: dict[str, None] = {}
    for r in rows:
        style = str(r.get("style") or "").strip()
        if style:
            seen.setdefault(style, None)
    return list(seen)


def record_data(run_dir: Path, voice_dir: Path, fingerprint: dict[str, Any] | None = None,
                x_vector: np.ndarray | None = None, reference_clip: str | None = None) -> None:
    """Write data.json (and x_vector.npy when given) into a new run's folder."""
    run_dir.mkdir(parents=True, exist_ok=True)
    info = dict(fingerprint or data_fingerprint(voice_dir))
    if reference_clip is not None:
        info["reference_clip"] = reference_clip
    write_json(run_dir / DATA_FILE, info)
    if x_vector is not None:
        with atomic_path(run_dir / X_VECTOR_FILE, suffix=".npy") as tmp, open(tmp, "wb") as fh:
            np.save(fh, np.asarray(x_vector, dtype=np.float32))


def check_same_data(run_dir: Path, voice_dir: Path, current: dict[str, Any]) -> None:
    """Raise InputError when the voice's prepared data differ from the run's."""
    path = run_dir / DATA_FILE
    if not path.is_file():
        return  # a run from before fingerprints: nothing to compare with
    saved = json.loads(path.read_text(encoding="utf-8"))
    if saved.get("fingerprint") == current["fingerprint"]:
        return
    then, now = saved.get("clips"), current["clips"]
    what = (f"{then} clips then, {now} now" if then != now
            else "the same number of clips, but different audio or transcripts")
    raise InputError(f"The prepared data of this voice changed since run {run_dir.name} "
                     f"started ({what}), so it cannot be resumed.",
                     "Start a new run (without --resume) to train on the data as it is now.")


def run_x_vector(run_dir: Path) -> np.ndarray | None:
    """The x-vector the run trained with (None for runs from before it was kept)."""
    path = Path(run_dir) / X_VECTOR_FILE
    return np.load(path).astype(np.float32) if path.is_file() else None


#: (section, field, label, what a change does to a resumed run)
_WATCHED = (
    ("run", "steps", "steps",
     "the learning-rate schedule is recomputed for the new length, so the rate jumps to "
     "where the new curve is at this step"),
    ("run", "epochs", "epochs",
     "the run's length and so its learning-rate schedule change"),
    ("data", "batch_size", "batch size",
     "each step now sees a different number of clips; the data position is kept, the "
     "clip order from here on differs from an uninterrupted run"),
    ("data", "grad_accum", "gradient accumulation",
     "the effective batch changes from here on"),
    ("parallel", "workers", "workers",
     "the checkpoint is resharded and the random streams restart, so the run is no longer "
     "bit-identical to an uninterrupted one"),
)


def resume_changes(saved: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """What differs between a run's saved config and the resumed one, with its effect."""
    out = []
    for section, key, label, effect in _WATCHED:
        old_v, new_v = saved.get(section, {}).get(key), new.get(section, {}).get(key)
        if old_v != new_v and new_v is not None:
            out.append({"field": f"{section}.{key}", "was": old_v, "now": new_v,
                        "message": f"Resuming with {label} {new_v} instead of {old_v}: "
                                   f"{effect}."})
    return out


def record_resume(run_dir: Path, changes: list[dict[str, Any]]) -> None:
    """Append one line to the run's resumes.jsonl (when and what changed)."""
    append_jsonl(run_dir / RESUMES_FILE, {"time": round(time.time(), 3), "changes": changes})
