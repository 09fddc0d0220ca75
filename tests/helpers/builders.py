"""Training builders for tests, named by module path in a loop config ("builder"), so a Ray
Train worker imports them by that name as it imports the engine's own."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import torch

from bench.proof_model import proof_builder
from engine.train.builder import TrainParts


def oom_builder(cfg: Any, loop_config: dict[str, Any], rank: int, world: int) -> Any:
    """A builder whose first step runs out of memory, as CUDA would say it."""
    model = torch.nn.Linear(2, 2)

    def forward(m: Any, batch: Any) -> dict[str, Any]:
        if rank == int(loop_config.get("oom_rank", 0)):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
                                         "has a total capacity of 15.77 GiB of which 1.2 GiB "
                                         "is free.")
        out = m(torch.ones(1, 2)).sum()
        z = torch.zeros(())
        return {"loss": out, "talker_sum": z, "talker_tokens": z, "subtalker_sum": z,
                "subtalker_tokens": z}

    return TrainParts(model=model, device=torch.device("cpu"), steps_per_epoch=10,
                      step_batches=lambda epoch, pos: [None], forward=forward)


def crashing_proof_builder(cfg: Any, loop_config: dict[str, Any], rank: int, world: int) -> Any:
    """The GPU proof's builder (bench/proof_model.py) whose rank 1 raises in its second
    step: a configuration that crashes its process mid-run, after a step of real training."""
    parts = proof_builder(cfg, loop_config, rank, world)
    forward, calls = parts.forward, [0]

    def crashing(model: Any, batch: Any) -> dict[str, Any]:
        calls[0] += 1
        if rank == 1 and calls[0] == 2:
            raise RuntimeError("rank 1 crashed in its second step")
        return forward(model, batch)

    return dataclasses.replace(parts, forward=crashing)


def hanging_proof_builder(cfg: Any, loop_config: dict[str, Any], rank: int, world: int) -> Any:
    """The GPU proof's builder (bench/proof_model.py) whose steps never end (a
    configuration that outlasts the proof's time budget)."""
    parts = proof_builder(cfg, loop_config, rank, world)

    def hanging(model: Any, batch: Any) -> dict[str, Any]:
        threading.Event().wait()
        raise AssertionError("unreachable")

    return dataclasses.replace(parts, forward=hanging)
