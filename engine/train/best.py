"""The best checkpoint of a run survives the pruning of old checkpoints.

Training keeps only the newest k checkpoints (Ray's `num_to_keep`, or
`Checkpointer.prune`), but the evaluation may judge an older one best. Its
files are hard-linked into `<run>/best/<checkpoint_step_N>/` (copied where
links cannot be made): no extra disk space on one filesystem, and deleting
the original folder leaves the linked files in place. Light: no torch.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from engine.train.checkpoint import COMPLETE

BEST_DIR = "best"


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
