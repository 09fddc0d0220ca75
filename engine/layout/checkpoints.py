"""A training checkpoint on disk: its folder name, its step, when it is complete, where
a run's checkpoints are listed from, and the kept copy of a run's best one.

One checkpoint is a folder ``<run>/checkpoint_step_NNNNNNN/`` (what is inside is
`engine.train.checkpoint`'s business); ``COMPLETE`` is written in it last, so a
folder without it is torn (a crash mid-save) and is never listed or loaded.

The checkpoints of a run kept in an object store live at the URI its folder's
`storage.json` names (`engine.core.storage.checkpoint_root`) and are listed as
`Location`s; a run folder that is a symlink into a shared folder is listed
through its link, so a checkpoint's parent is still `<voice>/runs/<run>`.

The evaluation may judge an older checkpoint best than training keeps (it prunes
to the newest k): `keep_best` hard-links its files into `<run>/best/<name>/`
(copied where links cannot be made), so pruning the original leaves them in place
and one filesystem pays no extra space. Light: no torch (the GUI reads this).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

from engine.core.storage import Location, as_location, checkpoint_root

PREFIX = "checkpoint_step_"
_NAME = re.compile(rf"^{PREFIX}(\d+)$")
COMPLETE = "COMPLETE"
#: the trainer's own state inside a checkpoint: step, scheduler, data position, world size
TRAINER_STATE = "trainer.json"
BEST_DIR = "best"


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:07d}"


def step_of(path: str | os.PathLike[str] | Location) -> int | None:
    """The step a checkpoint folder holds (None for anything not named like one)."""
    name = path.name if isinstance(path, Path | Location) else str(path).rstrip("/")
    m = _NAME.match(name.rsplit("/", 1)[-1])
    return int(m.group(1)) if m else None


def is_complete(checkpoint: Path | Location) -> bool:
    return (checkpoint / COMPLETE).exists()


def listing_root(run_dir: str | os.PathLike[str] | Location) -> Path | Location:
    """Where the checkpoints of `run_dir` are listed from: the URI its pointer names, else
    the folder as named (a link into a shared folder is not resolved)."""
    root = checkpoint_root(run_dir)
    named = as_location(run_dir)
    if isinstance(root, Path) and isinstance(named, Path) and named.resolve() == root.resolve():
        return named
    return root


def list_checkpoints(run_dir: str | os.PathLike[str] | Location) -> list[Any]:
    """Complete checkpoints of a run, oldest first (`Path`s, or `Location`s for a URI).

    `run_dir` is the run's local folder or its storage location itself.
    """
    root = listing_root(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if step_of(p) is not None and p.is_dir() and is_complete(p)]
    return sorted(found, key=lambda p: step_of(p) or 0)


def latest_checkpoint(run_dir: str | os.PathLike[str] | Location) -> Any:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def holds_checkpoints(folder: Path) -> bool:
    """Whether a local folder has checkpoint folders in it, complete or not (a run folder)."""
    try:
        return folder.is_dir() and any(step_of(p) is not None for p in folder.iterdir())
    except OSError:
        return False


# -- the kept best --------------------------------------------------------------------------

def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(src, dst)


def keep_best(run_dir: str | os.PathLike[str], checkpoint: str | os.PathLike[str]) -> Path | None:
    """Mirror `checkpoint` as the run's kept best; returns the kept folder (None when the
    checkpoint is not a complete local folder, e.g. in an object store)."""
    run, ckpt = Path(run_dir), Path(checkpoint)
    if not (ckpt / COMPLETE).is_file():
        return None
    root = run / BEST_DIR
    kept = root / ckpt.name
    if ckpt.resolve() == kept.resolve() or (kept / COMPLETE).is_file():
        return kept
    staging = run / f".{BEST_DIR}-staging"
    shutil.rmtree(staging, ignore_errors=True)
    target = staging / ckpt.name
    target.mkdir(parents=True)
    files = sorted(p for p in ckpt.rglob("*") if p.is_file() and p.name != COMPLETE)
    for src in files:
        dst = target / src.relative_to(ckpt)
        dst.parent.mkdir(parents=True, exist_ok=True)
        _link_or_copy(src, dst)
    _link_or_copy(ckpt / COMPLETE, target / COMPLETE)  # last: complete only when all is there
    old = run / f".{BEST_DIR}-old"
    shutil.rmtree(old, ignore_errors=True)
    if root.exists():
        root.rename(old)
    staging.rename(root)
    shutil.rmtree(old, ignore_errors=True)
    return kept


def kept_best(run_dir: str | os.PathLike[str], name: str) -> Path | None:
    """The kept copy of checkpoint `name`, when it is complete."""
    kept = Path(run_dir) / BEST_DIR / name
    return kept if (kept / COMPLETE).is_file() else None
