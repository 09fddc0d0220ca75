"""`train(voice, base, ...)`: the Python API behind `voxshard-engine train` and the GUI.

Order of work, so that a bad configuration fails in a second and not after
a minute of cluster start-up: resolve the voice and the base model, check
the data, resolve the config (presets by data volume, then the caller's
overrides), predict memory, and only then start Ray and the run.

The stages live by concept: `resolve` (data, devices, config), `run_storage` (where
checkpoints go, disk, preflight), `run` (`TrainRun`: resolve, plan, launch, watch, and
cooperative cancel), `export` (a checkpoint as a voice). The names callers import from
here stay here.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from engine.core.errors import Cancelled
from engine.core.events import Emitter, EventCallback
from engine.train.export import export, write_adapter_voice
from engine.train.request import TrainRequest
from engine.train.resolve import DataSummary, detect_gpus, resolve_config, worker_threads
from engine.train.run import TrainRun, cluster_gpu_plan, resolved

__all__ = ["DataSummary", "TrainRequest", "TrainRun", "cancelled_error", "cluster_gpu_plan",
           "detect_gpus", "export", "resolve_config", "resolved", "train", "worker_threads",
           "write_adapter_voice"]


def train(voice: str | Path, base: str | None, *, on_event: EventCallback | Emitter | None = None,
          stop: threading.Event | None = None, **options: Any) -> dict[str, Any]:
    """Fine-tune `base` on a prepared voice; returns a summary dict (the CLI's result).

    `options` are the fields of `TrainRequest` (workers, steps, lr, ...).
    Paths may be relative, start with `~`, and hold spaces or any characters.
    """
    return TrainRun(TrainRequest.of(voice, base, **options), on_event, stop).start()


def cancelled_error(result: dict[str, Any]) -> Cancelled:
    """What the CLI raises after a stopped run (exit code 130, not a failure)."""
    where = f" at step {result['steps']}" if result.get("steps") else ""
    ckpt = Path(result["checkpoint"]).name if result.get("checkpoint") else None
    return Cancelled(f"Training stopped{where}" + (f"; saved {ckpt}." if ckpt else "."),
                     "Continue later with --resume." if ckpt else None)

