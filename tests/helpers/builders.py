"""Training builders for tests, named by module path in a loop config ("builder"), so a Ray
Train worker imports them by that name as it imports the engine's own."""

from __future__ import annotations

from typing import Any

import torch

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
