"""What a prepare stages and keeps: each take's outcome (its clips, metrics and verdict)
cached by a key of its bytes, text and settings, the staging folder moved into place only
at the end, and the lock that lets one prepare run per voice.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.config import PrepareConfig
from engine.core.errors import WorkspaceError
from engine.core.process import alive
from engine.layout.manifest import PreparedFolder


@dataclass
class TakeOutcome:
    take_id: str
    key: str
    entries: list[dict[str, Any]] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    rejected: dict[str, str] | None = None
    audio_s: float = 0.0
    #: who was heard in the take (engine.prepare.target.Heard.summary), when it was checked
    speakers: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"take_id": self.take_id, "key": self.key, "entries": self.entries,
                "metrics": self.metrics, "rejected": self.rejected, "audio_s": self.audio_s,
                "speakers": self.speakers}


def settings_record(cfg: PrepareConfig, speakers: str) -> dict[str, Any]:
    """What a take's result depends on, as the cache key and report.json record it.

    `vad` and `denoise` at their defaults are left out, as they were before they
    were config fields, so the caches of voices prepared then stay valid.
    """
    record = cfg.to_dict()
    defaults = PrepareConfig()
    for name in ("vad", "denoise"):
        if record[name] == getattr(defaults, name):
            del record[name]
    # what decides a take's speaker is part of what its cached result depends on
    record["speakers"] = speakers
    return record


def load_cached(path: Path, key: str, clip_file: Any) -> TakeOutcome | None:
    """A take's earlier result when its key matches and `clip_file(id)` holds each clip."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if data.get("key") != key:
        return None
    for e in data.get("entries", []):
        if not clip_file(str(e["id"])).is_file():
            return None
    return TakeOutcome(data["take_id"], key, data.get("entries", []), data.get("metrics", []),
                       data.get("rejected"), float(data.get("audio_s", 0.0)),
                       data.get("speakers"))


@contextmanager
def prepare_lock(folder: PreparedFolder) -> Iterator[None]:
    """One prepare per voice at a time (the GUI and a script may both try)."""
    folder.path.mkdir(parents=True, exist_ok=True)
    lock = folder.lock
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                pid = int(lock.read_text().strip() or 0)
            except (OSError, ValueError):
                pid = 0
            if pid and pid != os.getpid() and alive(pid):
                raise WorkspaceError(f"Another prepare (process {pid}) is running on this "
                                     "voice.", "Wait for it to finish.") from None
            lock.unlink(missing_ok=True)  # left by a crashed run
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(str(os.getpid()))
        break
    try:
        yield
    finally:
        lock.unlink(missing_ok=True)


def commit(prepared: PreparedFolder, staged: dict[str, TakeOutcome]) -> None:
    """Move the staged clips and cache entries into place, replacing their takes' old ones."""
    prepared.clips_dir.mkdir(parents=True, exist_ok=True)
    prepared.cache_dir.mkdir(parents=True, exist_ok=True)
    for take_id, outcome in staged.items():
        for old in prepared.clips_dir.glob(f"{take_id}*.wav"):
            if old.stem == take_id or old.stem.startswith(f"{take_id}_"):
                old.unlink(missing_ok=True)
        for e in outcome.entries:
            os.replace(prepared.staged_clip(str(e["id"])), prepared.clip_file(str(e["id"])))
        os.replace(prepared.staged_cache(take_id), prepared.cache_dir / f"{take_id}.json")
    shutil.rmtree(prepared.staging_dir, ignore_errors=True)


def remove_stale(prepared: PreparedFolder, take_ids: set[str],
                  outcomes: list[TakeOutcome]) -> None:
    """Delete clips and cache entries of takes that no longer exist."""
    keep = {e["id"] for o in outcomes for e in o.entries}
    for clip in prepared.clips_dir.glob("*.wav"):
        if clip.stem not in keep:
            clip.unlink(missing_ok=True)
    for cached in prepared.cache_dir.glob("*.json"):
        if cached.stem not in take_ids:
            cached.unlink(missing_ok=True)
