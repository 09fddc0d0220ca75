"""Sharded training checkpoints with `torch.distributed.checkpoint` (DCP).

One checkpoint is a folder ``<run>/checkpoint_step_NNNNNNN/`` (its name, COMPLETE and
the listing: `engine.layout.checkpoints`) holding:
- the DCP shards of the *trainable* parameters and of the AdamW state (every
  rank writes its own shard files; rank 0 the `.metadata`). Frozen weights are
  not saved: they come unchanged from the base model, and for 1.7B the frozen
  text embedding alone would add 1.2 GB to every checkpoint;
- ``trainer.json`` (rank 0): step, scheduler state, data position, world size;
- ``rng_rank<R>.pt`` (every rank): torch / numpy / python RNG states;
- ``COMPLETE`` (rank 0, last, after a barrier): a folder without it is torn
  (a crash mid-save) and is never loaded.

Before each save every rank counts the bytes of its shards and checks the
free space of the folder it writes to (ranks on one machine and one
filesystem add up); when any disk is short, no rank writes, and the run ends
with one sentence (`FatalTrainingError("disk_full")`, never retried). A disk
that fills up during the save ends the run the same way; the torn folder has
no COMPLETE marker and is removed, and the previous checkpoint is untouched.

Every rank writes its shards with several threads (`WRITER_THREADS`; DCP's
default is one). With `background=True` (GPU runs) the save is asynchronous:
`dcp.async_save` copies the state to host memory and returns, the shards are
written while training goes on, and `finish()` (the next step's end, the next
save, or `close()`) waits for them and only then writes COMPLETE; a save never
starts while another is still being written. Saves, loads and the marker's
barriers run on a gloo group of their own (`_own_group`), never the step's.

Resume is exact when the world size is unchanged: model, optimizer,
scheduler, step, data position and RNG all come back. With another world
size the shards are resharded by DCP and only the RNG streams differ.

Under Ray Train the folder lives inside the run's storage folder and is
reported with `CheckpointUploadMode.NO_UPLOAD`, so Ray copies nothing and its
`CheckpointConfig(num_to_keep=k)` deletes the old ones; outside Ray,
`prune()` does the same.

Where: the run's storage location (`engine.core.storage`): a folder (the voice's
`runs/<run>`, or a shared folder every node mounts) or an object-store URI.
For a URI every rank writes its shards straight through DCP's fsspec writer
and the small files (trainer.json, RNG, COMPLETE) with single PUTs, so a
checkpoint is never staged on a node's disk; listing and the COMPLETE check
go through the same fsspec filesystem. Object stores write whole objects,
so COMPLETE needs no rename there (and there is no free-space check).
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import socket
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from engine.core.errors import is_disk_full
from engine.core.storage import Location, as_location, checkpoint_root, rmtree
from engine.layout.checkpoints import (
    COMPLETE,
    TRAINER_STATE,
    checkpoint_name,
    latest_checkpoint,
    list_checkpoints,
    step_of,
)
from engine.train.failures import FatalTrainingError


def read_trainer_state(path: Path | Location) -> dict[str, Any]:
    return json.loads((as_location(path) / TRAINER_STATE).read_text(encoding="utf-8"))


#: shard-writing threads per rank
WRITER_THREADS = 4


def dcp_args(path: Path | Location, write: bool, threads: int = 1) -> dict[str, Any]:
    """Keyword arguments of `dcp.save`/`dcp.load` for a checkpoint folder or URI."""
    if isinstance(path, Location):
        if write:
            return {"storage_writer": FsspecWriter(path.url, thread_count=threads)}
        return {"storage_reader": FsspecReader(path.url)}
    if write:
        return {"storage_writer": FileSystemWriter(str(path), thread_count=threads)}
    return {"checkpoint_id": str(path)}


def _torch_save(obj: Any, path: Path | Location) -> None:
    if isinstance(path, Location):
        buf = io.BytesIO()
        torch.save(obj, buf)
        path.write_bytes(buf.getvalue())
    else:
        torch.save(obj, path)


def _torch_load(path: Path | Location) -> Any:
    if isinstance(path, Location):
        return torch.load(io.BytesIO(path.read_bytes()), weights_only=False)
    return torch.load(path, weights_only=False)


def _trainable_filter(model: Any, sd: dict[str, Any]) -> dict[str, Any]:
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    kept = {k: v for k, v in sd.items() if k in trainable}
    if len(kept) != len(trainable):
        # names from get_state_dict and named_parameters disagree: saving a
        # partial model silently would make resume train from base weights
        missing = sorted(trainable - set(kept))[:3]
        raise RuntimeError(f"state dict lacks trainable parameters, e.g. {missing}")
    return kept


#: room left beside a checkpoint's own bytes (trainer.json, RNG files, metadata, filesystem slack)
SPACE_MARGIN = 1.05
SPACE_SLACK_BYTES = 64 << 20


def _existing(path: Path) -> Path:
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem holding `path` (or its nearest existing parent)."""
    return int(shutil.disk_usage(_existing(path)).free)


def state_bytes(state: Any) -> int:
    """Bytes this rank writes for a (nested) state dict: local shards of DTensors."""
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, list | tuple):
        return sum(state_bytes(v) for v in state)
    local = state.to_local() if hasattr(state, "to_local") else state
    if hasattr(local, "numel") and hasattr(local, "element_size"):
        return int(local.numel() * local.element_size())
    return 0


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _own_group(world_size: int) -> Any:
    """A gloo group of every rank for the checkpointer alone (None in one process).

    A background save runs DCP's collectives from its own thread: on the default
    group they would interleave with the step's (gradient clipping, the loss
    scaler) in a different order on each rank, pairing one rank's gather with
    another's all-reduce, a hang. Every rank makes it at the same point (the
    Checkpointer is built once per run, on every rank), as `new_group` requires.
    """
    if world_size <= 1 or not (dist.is_available() and dist.is_initialized()):
        return None  # one rank: nothing to pair up, and no barrier to wait at
    return dist.new_group(backend="gloo")


class Checkpointer:
    """save / load / close for one run folder; every rank calls every method."""

    def __init__(self, run_dir: str | os.PathLike[str], rank: int, world_size: int,
                 keep: int = 2, background: bool = False,
                 threads: int = WRITER_THREADS) -> None:
        if keep < 2:
            # one torn checkpoint would otherwise leave nothing to resume from
            raise ValueError("keep must be >= 2")
        # the storage location itself (a folder or a URI), never a pointer to it
        self.run_dir = checkpoint_root(run_dir)
        self.rank = rank
        self.world_size = world_size
        self.keep = keep
        self.background = background
        self.threads = max(1, int(threads))
        #: (future, folder, step) of a background save not yet marked COMPLETE
        self._pending: tuple[Any, Any, int] | None = None
        self.group = _own_group(world_size)
        #: a background save's host copy of the state: pinned, made once, reused by
        #: every save (fresh pageable memory each time cost a copy of the model per save)
        self._stager: Any = None


    # -- helpers -------------------------------------------------------------------------
    def _barrier(self) -> None:
        if self.group is not None:
            dist.barrier(group=self.group)

    def _state_dicts(self, model: Any, optimizer: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        return _trainable_filter(model, model_sd), optim_sd

    # -- API -----------------------------------------------------------------------------
    def save(self, step: int, model: Any, optimizer: Any, scheduler: Any,
             data_state: dict[str, Any], extra: dict[str, Any] | None = None,
             wait: bool = True) -> Path:
        """Write checkpoint `step`; returns its folder.

        wait=True (or a Checkpointer without `background`): once every rank has
        finished and COMPLETE is written. wait=False with `background`: once
        the state is staged in host memory; `finish()` completes it.
        """
        self.finish()  # never two saves at once
        path = self.run_dir / checkpoint_name(step)
        if self.rank == 0 and path.exists():
            # a torn attempt at the same step (crash mid-save, then replay)
            rmtree(path)
        self._barrier()
        model_sd, optim_sd = self._state_dicts(model, optimizer)
        self._check_space(step, state_bytes(model_sd) + state_bytes(optim_sd))
        try:
            path.mkdir(parents=True, exist_ok=True)
            state = {"model": model_sd, "optim": optim_sd}
            args = dcp_args(path, write=True, threads=self.threads) | {
                "process_group": self.group}
            if self.background:
                self._pending = (dcp.async_save(state, **args, async_stager=self._staging()),
                                 path, step)
            else:
                dcp.save(state, **args)
            _torch_save(_rng_state(), path / f"rng_rank{self.rank}.pt")
            if self.rank == 0:
                state = {
                    "step": step,
                    "world_size": self.world_size,
                    "scheduler": scheduler.state_dict() if scheduler is not None else None,
                    "data": data_state,
                    **(extra or {}),
                }
                (path / TRAINER_STATE).write_text(json.dumps(state, indent=1), encoding="utf-8")
        except Exception as exc:
            self._pending = None
            if not is_disk_full(exc):
                raise
            if self.rank == 0:
                rmtree(path)
            raise self._disk_full(step, None, None) from exc
        if self._pending is not None:
            if wait:
                self.finish()
            return path
        self._complete(path, step)
        return path

    def finish(self) -> Path | None:
        """Wait for a background save and mark it COMPLETE; its folder (None: none pending).
        Every rank calls it at the same point (it ends with barriers)."""
        if self._pending is None:
            return None
        future, path, step = self._pending
        self._pending = None
        try:
            future.result()
        except Exception as exc:
            if not is_disk_full(exc):
                raise
            self._barrier()
            if self.rank == 0:
                rmtree(path)
            raise self._disk_full(step, None, None) from exc
        self._complete(path, step)
        return path

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def written(self) -> bool:
        """Whether this rank's background writes have ended (no wait, no collective); the
        caller completes the save with `finish()` once every rank says so."""
        return self._pending is None or self._pending[0].done()

    def _staging(self) -> Any:
        if self._stager is None and torch.cuda.is_available():
            self._stager = BlockingAsyncStager(cache_staged_state_dict=True)
        return self._stager  # None off CUDA: pinned memory needs a GPU; DCP stages itself

    def _complete(self, path: Any, step: int) -> None:
        # every rank's shards and RNG file are on disk before the marker
        self._barrier()
        if self.rank == 0:
            marker = path / COMPLETE
            if isinstance(marker, Location):
                marker.write_text(str(step))  # one PUT: whole or absent
            else:
                tmp = path / (COMPLETE + ".tmp")
                tmp.write_text(str(step), encoding="utf-8")
                os.replace(tmp, marker)
        self._barrier()

    def _check_space(self, step: int, need: int) -> None:
        """Refuse the save on every rank when any rank's disk cannot hold what goes on it."""
        if isinstance(self.run_dir, Location):
            return  # an object store does not fill up; its errors say why a PUT failed
        where = self.run_dir
        try:
            dev = os.stat(free_path := _existing(where)).st_dev
        except OSError:
            free_path, dev = where, -1
        mine = (socket.gethostname(), dev, int(need), free_bytes(free_path))
        if self.group is not None:
            every: list[Any] = [None] * self.world_size
            dist.all_gather_object(every, mine, group=self.group)
        else:
            every = [mine]
        disks: dict[tuple[str, int], list[int]] = {}
        for host, d, n, free in every:
            disk = disks.setdefault((host, d), [0, free])
            disk[0] += n
            disk[1] = min(disk[1], free)
        for total, free in disks.values():
            if total * SPACE_MARGIN + SPACE_SLACK_BYTES > free:
                raise self._disk_full(step, total, free)

    def _disk_full(self, step: int, need: int | None, free: int | None) -> Exception:
        gib = float(1 << 30)
        prev = latest_checkpoint(self.run_dir)
        kept = (f"; the checkpoint of step {step_of(prev)} is intact" if prev is not None
                else "")
        if need is not None and free is not None:
            msg = (f"The disk holding {self.run_dir} has {free / gib:.1f} GiB free; the checkpoint "
                   f"of step {step} needs about {need * SPACE_MARGIN / gib:.1f} GiB{kept}.")
        else:
            msg = f"The disk holding {self.run_dir} filled up while saving step {step}{kept}."
        return FatalTrainingError("disk_full", msg,
                                  "Free some space (old runs, exports), then continue with "
                                  "--resume.")

    def _in_run(self, path: str | os.PathLike[str] | Location) -> Path | Location:
        """`path` as a location of this run.

        Ray hands a restored checkpoint back as a path inside its storage
        filesystem (for a URI: without the scheme); our checkpoints always
        sit directly in the run's location, so the name is what counts.
        """
        place = as_location(path)
        if isinstance(self.run_dir, Location) and not isinstance(place, Location):
            return self.run_dir / place.name
        return place

    def load(self, path: str | os.PathLike[str] | Location, model: Any, optimizer: Any,
             scheduler: Any) -> dict[str, Any]:
        """Restore everything saved in `path`; returns trainer.json (step, data position...)."""
        path = self._in_run(path)
        if not (path / COMPLETE).exists():
            raise FileNotFoundError(f"{path} is not a complete checkpoint")
        model_sd, optim_sd = self._state_dicts(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        dcp.load(state, **dcp_args(path, write=False), process_group=self.group)
        # strict=False: the frozen weights are deliberately not in the checkpoint
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"],
                       options=StateDictOptions(strict=False))
        trainer = read_trainer_state(path)
        if scheduler is not None and trainer.get("scheduler") is not None:
            scheduler.load_state_dict(trainer["scheduler"])
        rng_file = path / f"rng_rank{self.rank}.pt"
        if trainer.get("world_size") == self.world_size and rng_file.exists():
            _set_rng_state(_torch_load(rng_file))
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
            rmtree(p)
        return doomed

    def close(self) -> None:
        # a background save is finished first; the barrier makes sure no rank
        # leaves while another still writes
        self.finish()
        self._barrier()
        if self._stager is not None:
            self._stager.close()
            self._stager = None
