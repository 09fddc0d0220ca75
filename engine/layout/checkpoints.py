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
and one filesystem pays no extra space. The evaluator beside training holds each
checkpoint waiting to be measured the same way (`hold`, in `<run>/held/<name>/`, a
bounded few: `engine.quality.evaluate`), so training's pruning never takes it from
under the measurement; it lets go once the figures are written. Light: no torch (the
GUI reads this).

Which checkpoint a step means (`checkpoint_at`), for every command and the window:
the one training keeps in the run folder, else the kept best's copy. A copy under
`best/` or `held/` belongs to the run above it (`run_of`).
"""

from __future__ import annotations

import json
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
HELD_DIR = "held"
#: training keeps at least this many checkpoints (`run.keep_checkpoints`' floor)
MIN_KEEP = 2
#: checkpoints an evaluation beside training holds at most while they wait to be measured
#: (`hold`; each costs a checkpoint's disk once training has pruned its original)
HELD_MAX = 4
#: trainer.json's "stage" of a checkpoint the reinforce stage wrote (training's say none)
TRAIN_STAGE, REINFORCE_STAGE = "train", "reinforce"


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


def checkpoint_stage(checkpoint: Path | Location) -> str:
    """Which stage wrote a checkpoint: `REINFORCE_STAGE` or `TRAIN_STAGE`."""
    try:
        state = json.loads((checkpoint / TRAINER_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return TRAIN_STAGE
    stage = state.get("stage") if isinstance(state, dict) else None
    return stage if stage == REINFORCE_STAGE else TRAIN_STAGE


def latest_checkpoint(run_dir: str | os.PathLike[str] | Location) -> Any:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def holds_checkpoints(folder: Path) -> bool:
    """Whether a local folder has checkpoint folders in it, complete or not (a run folder)."""
    try:
        return folder.is_dir() and any(step_of(p) is not None for p in folder.iterdir())
    except OSError:
        return False


# -- copies kept from pruning: the evaluation's best, the one being measured ------------------

def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or one without hard links
        shutil.copy2(src, dst)


def _mirror(ckpt: Path, target: Path) -> None:
    """Hard-link (or copy) every file of `ckpt` into the new folder `target`, COMPLETE
    last: the copy is complete only when all of it is there."""
    target.mkdir(parents=True)
    files = sorted(p for p in ckpt.rglob("*") if p.is_file() and p.name != COMPLETE)
    for src in files:
        dst = target / src.relative_to(ckpt)
        dst.parent.mkdir(parents=True, exist_ok=True)
        _link_or_copy(src, dst)
    _link_or_copy(ckpt / COMPLETE, target / COMPLETE)


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
    _mirror(ckpt, staging / ckpt.name)
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


def hold(run_dir: str | os.PathLike[str], checkpoint: Path, keep: int = MIN_KEEP) -> Path | None:
    """A copy of `checkpoint` that training's pruning cannot delete (hard links in
    `<run>/held/<name>/`), for an evaluation about to measure it; None when there is none
    to make: not a complete local folder, or pruned before or while it was linked.

    Training deletes a checkpoint only once `keep` newer ones are complete (Ray's
    `num_to_keep` and `engine.train.checkpoint` both prune to the newest `keep`, and
    keep >= MIN_KEEP). So a copy whose original is still among the newest `keep` when
    the last link is made was linked before any deletion began: it is whole.
    """
    run, ckpt = Path(run_dir), Path(checkpoint)
    copy = run / HELD_DIR / ckpt.name
    if (copy / COMPLETE).is_file():
        return copy
    if not (ckpt / COMPLETE).is_file():
        return None
    staging = run / HELD_DIR / f".{ckpt.name}-staging"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _mirror(ckpt, staging)
    except OSError:  # pruned while it was linked
        shutil.rmtree(staging, ignore_errors=True)
        return None
    newest = [p.name for p in list_checkpoints(run)[-max(MIN_KEEP, keep):]]
    if ckpt.name not in newest:  # its deletion may have begun before the links were made
        shutil.rmtree(staging, ignore_errors=True)
        return None
    shutil.rmtree(copy, ignore_errors=True)
    staging.rename(copy)
    return copy


def release(run_dir: str | os.PathLike[str], name: str | None = None) -> None:
    """Let go of the held copy of checkpoint `name` (None: of every held copy)."""
    root = Path(run_dir) / HELD_DIR
    shutil.rmtree(root if name is None else root / name, ignore_errors=True)


# -- which checkpoint -----------------------------------------------------------------------

def checkpoint_at(run_dir: str | os.PathLike[str] | Location, step: int) -> Any:
    """The complete checkpoint of `step`: the one training keeps, else the copy kept as the
    evaluation's best (None: never written, torn, or pruned)."""
    live = listing_root(run_dir) / checkpoint_name(step)
    if is_complete(live):
        return live
    return kept_best(run_dir, checkpoint_name(step)) if not isinstance(run_dir, Location) \
        else None


def run_of(checkpoint: str | os.PathLike[str]) -> Path:
    """The run folder a local checkpoint folder belongs to: its parent, or the run above
    `best/` or `held/` for a kept copy."""
    parent = Path(checkpoint).parent
    return parent.parent if parent.name in (BEST_DIR, HELD_DIR) else parent


def evaluation_cover(steps: int | None, every: int | None) -> str:
    """What an evaluation beside training measures, in words, said as it starts: every
    checkpoint, while it falls no more than `HELD_MAX` behind (training does not wait)."""
    count = steps // every if steps and every else 0
    which = f"each of the {count} checkpoints" if count > 1 else "each checkpoint"
    return (f"Evaluating {which} as training saves it (similarity to the speaker, word "
            f"errors). Training does not wait: up to {HELD_MAX} checkpoints are kept for the "
            "evaluation until measured (their disk as well), and any it falls further behind "
            "on are skipped and named in the report.")
