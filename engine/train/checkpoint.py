"""Sharded training checkpoints with `torch.distributed.checkpoint` (DCP).

One checkpoint is a folder ``<run>/checkpoint_step_NNNNNNN/`` holding:
- the DCP shards of the *trainable* parameters and of the AdamW state (every
  rank writes its own shard files; rank 0 the `.metadata`). Frozen weights are
  not saved: they come unchanged from the base model, and for 1.7B the frozen
  text embedding alone would add 1.2 GB to every checkpoint;
- ``trainer.json`` (rank 0): step, scheduler state, data position, world size;
- ``rng_rank<R>.pt`` (every rank): torch / numpy / python RNG states;
- ``COMPLETE`` (rank 0, last, after a barrier): a folder without it is torn
  (a crash mid-save) and is never loaded.

Resume is exact when the world size is unchanged: model, optimizer,
scheduler, step, data position and RNG all come back. With another world
size the shards are resharded by DCP and only the RNG streams differ.

Under Ray Train the folder lives inside the run's storage folder and is
reported with `CheckpointUploadMode.NO_UPLOAD`, so Ray copies nothing and its
`CheckpointConfig(num_to_keep=k)` deletes the old ones; outside Ray,
`prune()` does the same.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

PREFIX = "checkpoint_step_"
_NAME = re.compile(rf"^{PREFIX}(\d+)$")
COMPLETE = "COMPLETE"
TRAINER_STATE = "trainer.json"


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:07d}"


def step_of(path: Path) -> int | None:
    m = _NAME.match(path.name)
    return int(m.group(1)) if m else None


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    if not run_dir.is_dir():
        return []
    found = [p for p in run_dir.iterdir()
             if p.is_dir() and step_of(p) is not None and (p / COMPLETE).exists()]
    return sorted(found, key=lambda p: step_of(p) or 0)


def latest_checkpoint(run_dir: Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def read_trainer_state(path: Path) -> dict[str, Any]:
    return json.loads((path / TRAINER_STATE).read_text(encoding="utf-8"))


def _trainable_filter(model: Any, sd: dict[str, Any]) -> dict[str, Any]:
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    kept = {k: v for k, v in sd.items() if k in trainable}
    if len(kept) != len(trainable):
        # names from get_state_dict and named_parameters disagree: saving a
        # partial model silently would make resume train from base weights
        missing = sorted(trainable - set(kept))[:3]
        raise RuntimeError(f"state dict lacks trainable parameters, e.g. {missing}")
    return kept


def _rng_state() -> dict[str, Any]:
    import numpy as np
    import torch

    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


class Checkpointer:
    """save / load / close for one run folder; every rank calls every method."""

    def __init__(self, run_dir: str | os.PathLike[str], rank: int, world_size: int,
                 keep: int = 2) -> None:
        if keep < 2:
            # one torn checkpoint would otherwise leave nothing to resume from
            raise ValueError("keep must be >= 2")
        self.run_dir = Path(run_dir)
        self.rank = rank
        self.world_size = world_size
        self.keep = keep

    # -- helpers -------------------------------------------------------------------------
    def _barrier(self) -> None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.barrier()

    def _state_dicts(self, model: Any, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(model, optimizer)
        return _trainable_filter(model, model_sd), optim_sd

    # -- API -----------------------------------------------------------------------------
    def save(self, step: int, model: Any, optimizer: Any, scheduler: Any,
             data_state: dict[str, Any], extra: dict[str, Any] | None = None) -> Path:
        """Write checkpoint `step`; returns its folder once every rank has finished."""
        import torch
        import torch.distributed.checkpoint as dcp

        path = self.run_dir / checkpoint_name(step)
        if self.rank == 0 and path.exists():
            # a torn attempt at the same step (crash mid-save, then replay)
            shutil.rmtree(path)
        self._barrier()
        path.mkdir(parents=True, exist_ok=True)
        model_sd, optim_sd = self._state_dicts(model, optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(path))
        torch.save(_rng_state(), path / f"rng_rank{self.rank}.pt")
        if self.rank == 0:
            state = {
                "step": step,
                "world_size": self.world_size,
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "data": data_state,
                **(extra or {}),
            }
            (path / TRAINER_STATE).write_text(json.dumps(state, indent=1), encoding="utf-8")
        # every rank's shards and RNG file are on disk before the marker
        self._barrier()
        if self.rank == 0:
            marker = path / COMPLETE
            tmp = path / (COMPLETE + ".tmp")
            tmp.write_text(str(step), encoding="utf-8")
            os.replace(tmp, marker)
        self._barrier()
        return path

    def load(self, path: str | os.PathLike[str], model: Any, optimizer: Any,
             scheduler: Any) -> dict[str, Any]:
        """Restore everything saved in `path`; returns trainer.json (step, data position...)."""
        import torch
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict

        path = Path(path)
        if not (path / COMPLETE).exists():
            raise FileNotFoundError(f"{path} is not a complete checkpoint")
        model_sd, optim_sd = self._state_dicts(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, checkpoint_id=str(path))
        # strict=False: the frozen weights are deliberately not in the checkpoint
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"],
                       options=StateDictOptions(strict=False))
        trainer = read_trainer_state(path)
        if scheduler is not None and trainer.get("scheduler") is not None:
            scheduler.load_state_dict(trainer["scheduler"])
        rng_file = path / f"rng_rank{self.rank}.pt"
        if trainer.get("world_size") == self.world_size and rng_file.exists():
            _set_rng_state(torch.load(rng_file, weights_only=False))
        return trainer

    def latest(self) -> Path | None:
        return latest_checkpoint(self.run_dir)

    def prune(self) -> list[Path]:
        """Delete all but the newest `keep` complete checkpoints (rank 0); returns them."""
        if self.rank != 0:
            return []
        found = list_checkpoints(self.run_dir)
        doomed = found[: max(0, len(found) - self.keep)]
        for p in doomed:
            shutil.rmtree(p, ignore_errors=True)
        return doomed

    def close(self) -> None:
        # DCP's synchronous save leaves no background work; the barrier makes
        # sure no rank leaves while another still writes
        self._barrier()
