"""Where a run's checkpoints go (a folder, a shared one, a URI), and whether the disk can
hold them and every node of the cluster can reach them and the base model."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.core.errors import InputError
from engine.core.events import Emitter
from engine.core.storage import storage_arg
from engine.train.checkpoint import free_bytes
from engine.train.preflight import run_preflight


@dataclass
class RunStorage:
    """Where a run's checkpoints go, and whether the cluster is checked first."""

    #: the run's storage location: a folder or a URI (== str(run_dir) by default)
    location: str
    #: the base model as the caller named it (a hub id lets each node find its own copy)
    model_spec: str
    #: run the per-node preflight before training (default: on an existing cluster)
    preflight: bool
    #: remember `setting` as the voice's storage once the run's storage exists
    remember: bool = False
    setting: str | None = None


def storage_for(voice: Any, storage: str | os.PathLike[str] | None) -> str | None:
    """--storage as given, else the voice's setting; "default" means the voice's runs/."""
    if storage is None:
        return voice.storage
    if str(storage).strip().lower() in ("", "default", "local"):
        return None
    return storage_arg(storage)


def check_disk(run_dir: Path, checkpoint_bytes: int, keep: int, emitter: Emitter) -> None:
    """Say before starting when the disk cannot hold the checkpoints the run will keep."""
    gib = float(1 << 30)
    free = free_bytes(run_dir)
    # keep + 1: a new checkpoint is written before the oldest is deleted
    need = checkpoint_bytes * (keep + 1)
    if need > free:
        emitter.log(f"The disk holding {run_dir} has {free / gib:.1f} GiB free; keeping {keep} "
                    f"checkpoints of {checkpoint_bytes / gib:.1f} GiB needs about "
                    f"{need / gib:.1f} GiB. Each save checks the space first and the run "
                    "stops cleanly if it runs out.", level="warning")


def preflight_or_fail(where: RunStorage, model_dir: Path, emitter: Emitter) -> Any:
    """Every node checked before anything starts; a bad node ends the start, named."""
    # the folder that holds the run (Ray's storage path): it exists before the run
    parent = where.location.rstrip("/").rpartition("/")[0]
    report = run_preflight(parent, str(model_dir), where.model_spec, on_event=emitter)
    if not report.ok:
        raise InputError(f"The cluster is not ready for this run: {report.problem_sentence()}.",
                         "Give every node the storage (--storage: a shared folder or an "
                         "s3:// URI) and the base model, with the same Python, torch and Ray "
                         "versions; `voxshard-engine preflight` shows each node.")
    return report

