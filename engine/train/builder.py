"""What a rank trains: the default builder of the model and data (train-core's
objective, dataset and `parallelize`), behind `TrainParts`.

The trainer never mentions FSDP: a builder hands back a ready, sharded root module
whose `forward(batch)` computes the whole loss, plus the batches for this rank.
A test or benchmark may name its own builder (`module:function`)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.data.dataset import VoiceData
from engine.data.frames import PredictorSample
from engine.train.failures import FatalTrainingError
from engine.train.objective import (
    batch_to_device,
    build_objective,
    load_base_weights,
    trainable_groups,
)
from engine.train.parallelize import (
    make_mesh,
    parallelize,
    resolve_precision,
    set_gradient_sync,
    set_keep_gathered,
)
from engine.train.plan import ALLOC_CONF
from engine.train.precision import PrecisionError, describe, device_capability

#: the default builder of the model and data (train-core's pieces, adapted below)
DEFAULT_BUILDER = "engine.train.builder:build_parts"


@dataclass
class TrainParts:
    """What a builder returns; the loop needs nothing else about the model or data."""

    #: the parallelized root module (its parameters are what is checkpointed)
    model: Any
    device: Any
    #: optimizer steps per epoch (identical on every rank: FSDP needs lockstep)
    steps_per_epoch: int
    #: this rank's micro-batches (grad_accum of them) for optimizer step
    #: `position` of `epoch`; deterministic, so a resumed run sees the same data
    step_batches: Callable[[int, int], list[Any]]
    #: forward + loss of one micro-batch: a dict with "loss" (to backpropagate
    #: after dividing by the micro-steps of the step), "talker_sum",
    #: "subtalker_sum", "talker_tokens", "subtalker_tokens" (local sums/counts)
    forward: Callable[[Any, Any], dict[str, Any]]
    #: weight of the sub-talker loss in the reported total
    subtalker_weight: float = 0.3
    #: this rank's validation micro-batches (may be empty; lockstep count)
    val_batches: Callable[[], list[Any]] | None = None
    #: toggles gradient reduction for accumulation micro-steps (None: always reduce)
    set_grad_sync: Callable[[bool], None] | None = None
    #: "bf16", "fp16" (the loop scales the loss) or "fp32": what the model computes in
    precision: str = "fp32"
    #: anything the builder wants recorded in trainer.json (e.g. the reference clip)
    info: dict[str, Any] = field(default_factory=dict)
    #: host-side preparation of one micro-batch (tensors on the device, through pinned
    #: memory, gather rows built); run in the prefetch thread. None: `forward` does it
    prepare: Callable[[Any], Any] | None = None
    #: (keep, last): parameters stay gathered through the coming micro-step, released
    #: after its backward only if it is the step's last; (False, True) restores the
    #: defaults. Used with "last" reduction and `keep_gathered="on"`; None: never kept
    set_keep_gathered: Callable[[bool, bool], None] | None = None
    #: the trainable parameters by group ("talker", "code_predictor"), asked once the
    #: builder is done, for the first-step check and the update metrics
    #: (`engine.train.updates`); None: not checked (a model that is not the talker)
    groups: Callable[[], dict[str, list[Any]]] | None = None


def import_builder(path: str) -> Callable[..., TrainParts]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def build_parts(cfg: Any, loop_config: dict[str, Any], rank: int, world: int) -> TrainParts:
    """The product builder: train-core's objective, `parallelize` and dataset.

    The objective is built on the meta device, sharded, and only then filled
    with the base weights, so no rank ever holds the whole model.
    """
    model_dir = Path(loop_config["model_dir"])
    voice_dir = Path(loop_config["voice_dir"])
    objective, device, precision, detail = sharded_objective(cfg, loop_config, model_dir)
    data = VoiceData.open(voice_dir, model_dir, cfg.data)
    data.check(world)
    accum = cfg.data.grad_accum
    predictor = PredictorSample(cfg.model.predictor_frames, cfg.run.seed)
    epoch_cache: dict[int, Any] = {}

    def step_batches(epoch: int, position: int) -> list[Any]:
        if epoch not in epoch_cache:
            epoch_cache.clear()  # one epoch at a time; batches collate lazily
            epoch_cache[epoch] = data.rank_batches(epoch, rank=rank, world=world,
                                                   predictor=predictor)
        micro = epoch_cache[epoch]
        return [micro[k] for k in range(position * accum, (position + 1) * accum)]

    def forward(model: Any, batch: Any) -> dict[str, Any]:
        return model(batch_to_device(batch, device))

    def prepare(batch: Any) -> Any:
        return batch_to_device(batch, device, pin=True)

    def val_batches() -> list[Any]:
        return list(data.val_batches(rank=rank, world=world))

    return TrainParts(
        model=objective, device=device, steps_per_epoch=int(data.steps_per_epoch()),
        step_batches=step_batches, forward=forward,
        subtalker_weight=cfg.model.subtalker_weight,
        val_batches=val_batches if cfg.run.val_every > 0 else None,
        set_grad_sync=lambda enabled: set_gradient_sync(objective, enabled),
        set_keep_gathered=lambda keep, last: set_keep_gathered(objective, keep, last),
        precision=precision, prepare=prepare, groups=lambda: trainable_groups(objective),
        info={"base": str(model_dir), "speaker": cfg.model.speaker_name,
              "precision": precision, "precision_detail": detail,
              "compiled_layers": getattr(objective, "_voxshard_compiled", 0)},
    )


def sharded_objective(cfg: Any, loop_config: dict[str, Any],
                      model_dir: Path) -> tuple[Any, Any, str, str]:
    """(objective, device, precision, precision line): built on meta, sharded, then loaded."""
    device = worker_device(cfg, loop_config)
    precision, detail = worker_precision(cfg, device)
    objective = build_objective(model_dir, cfg.model, device="meta")
    parallelize(objective, make_mesh(device), cfg.parallel, device)
    load_base_weights(objective, model_dir, device)
    return objective, device, precision, detail


def worker_device(cfg: Any, loop_config: dict[str, Any]) -> Any:
    """This rank's device: its GPU (Ray's choice, else LOCAL_RANK) or the CPU."""
    if not (cfg.parallel.use_gpu and torch.cuda.is_available()):
        return torch.device("cpu")

    # fewer, growable segments: less fragmentation, which the plan's margin assumes
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)
    try:
        torch.cuda.memory._set_allocator_settings(os.environ["PYTORCH_CUDA_ALLOC_CONF"])
    except (AttributeError, RuntimeError):
        pass  # an allocator already in use keeps its settings
    pick = loop_config.get("_gpu_device")
    device = pick() if pick is not None else torch.device(
        "cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    return device


def worker_precision(cfg: Any, device: Any) -> tuple[str, str]:
    """(precision, one line saying which and why) for this rank's device; a clear error for
    bf16 on a GPU older than compute capability 8.0."""
    capability = device_capability(device)
    try:
        precision = resolve_precision(cfg.parallel, device, capability)
    except PrecisionError as exc:
        raise FatalTrainingError("precision", str(exc),
                                 "Set {parallel.precision} to fp16 (or fp32) on this "
                                 "GPU.") from exc
    return precision, describe(precision, device.type, capability)
