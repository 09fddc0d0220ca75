"""`train(voice, base, ...)`: the Python API behind `voxshard-engine train` and the GUI.

Order of work, so that a bad configuration fails in a second and not after
a minute of cluster start-up: resolve the voice and the base model, check
the data, resolve the config (presets by data volume, then the caller's
overrides), predict memory, and only then start Ray and the run.

The stages live by concept, and callers import each from its home: `request`
(`TrainRequest`), `resolve` (data, devices, config), `run_storage` (where checkpoints go,
disk, preflight), `run` (`TrainRun`: resolve, plan, launch, watch, and cooperative
cancel), `export` (a checkpoint as a voice).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from engine.core.errors import Cancelled
from engine.core.events import Emitter, EventCallback
from engine.train.request import TrainRequest
from engine.train.run import TrainRun

__all__ = ["cancelled_error", "train"]


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

