"""The training loop that runs inside every Ray Train worker.

It never mentions FSDP: `build_parts` (train-core's objective, dataset and
`parallelize`) hands back a ready, sharded root module whose `forward(batch)`
computes the whole loss, plus the batches for this rank. This file owns the
optimisation around it: AdamW over the trainable parameters only, linear
warmup then cosine decay, global-norm clipping at 1.0, gradient accumulation,
validation at intervals, checkpoints, the cooperative stop flag, and the
per-step metrics sent to the driver.

Everything a rank does depends only on (config, step, data position, RNG), so
a run restarted from a checkpoint replays the same losses.
"""

from __future__ import annotations

import importlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checkpoint import Checkpointer, latest_checkpoint, step_of
from .metrics import MetricsSender, memory_values, model_state_bytes

#: the default builder of the model and data (train-core's pieces, adapted below)
DEFAULT_BUILDER = "engine.train.worker:build_parts"


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
    #: anything the builder wants recorded in trainer.json (e.g. the reference clip)
    info: dict[str, Any] = field(default_factory=dict)


def _import(path: str) -> Callable[..., TrainParts]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def lr_lambda(warmup: int, total: int, schedule: str, min_ratio: float) -> Callable[[int], float]:
    """Multiplier of the peak lr at optimizer step `s` (0-based, before the step)."""

    def f(s: int) -> float:
        if warmup > 0 and s < warmup:
            return (s + 1) / warmup
        if schedule == "constant" or total <= warmup:
            return 1.0
        progress = min(1.0, (s - warmup) / max(1, total - warmup))
        if schedule == "linear":
            return 1.0 - (1.0 - min_ratio) * progress
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


class _DataCursor:
    """Epoch and optimizer step inside it: the only data state a checkpoint needs."""

    def __init__(self, parts: TrainParts, epoch: int = 0, position: int = 0) -> None:
        self.parts = parts
        self.epoch = epoch
        self.position = position

    def next_step(self) -> list[Any]:
        if self.position >= self.parts.steps_per_epoch:
            self.epoch += 1
            self.position = 0
        batches = self.parts.step_batches(self.epoch, self.position)
        self.position += 1
        return batches

    def state(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}


def _stop_requested(flag: Any) -> bool:
    if flag is None:
        return False
    import ray

    try:
        return bool(ray.get(flag.is_set.remote(), timeout=5))
    except Exception:  # the driver is gone: stop, it cannot use the result anyway
        return True


def train_loop(loop_config: dict[str, Any]) -> None:
    """Entry point given to `TorchTrainer(train_loop_per_worker=...)`."""
    import ray.train
    import torch
    import torch.distributed as dist

    from .config import TrainConfig

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    cfg = TrainConfig.from_dict(loop_config["config"])
    torch.set_num_threads(cfg.parallel.cpu_threads_per_worker)
    sender = MetricsSender(loop_config.get("queue"), rank)
    sender.send("state", {"state": "worker_started", "detail": f"rank {rank}",
                          "rank": rank, "pid": os.getpid()})
    run_dir = Path(loop_config["run_dir"])
    torch.manual_seed(cfg.run.seed + rank)

    t_build = time.monotonic()
    builder = _import(loop_config.get("builder") or DEFAULT_BUILDER)
    parts = builder(cfg, loop_config, rank, world)
    model, device = parts.model, parts.device
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise RuntimeError("nothing to train: no parameter requires a gradient")
    optimizer = torch.optim.AdamW(
        params, lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2),
        eps=cfg.optim.eps, weight_decay=cfg.optim.weight_decay,
        # foreach fuses the per-parameter loops; fine for DTensor shards
        foreach=True,
    )
    total_steps = int(loop_config["total_steps"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(cfg.optim.warmup_steps, total_steps, cfg.optim.schedule,
                             cfg.optim.min_lr_ratio))
    ckpt = Checkpointer(run_dir, rank, world, keep=cfg.run.keep_checkpoints)

    # Resume from the newest complete checkpoint: the one Ray hands back after a
    # worker failure, or a newer one in the run folder that Ray never registered.
    # The latter happens: Ray's controller polls reports every ~2 s, so a worker
    # killed within that window after a save restarts with Ray unaware of it
    # (measured). A new run's folder is empty, so scanning it is always safe.
    candidates: list[Path] = []
    ray_ckpt = ray.train.get_checkpoint()
    if ray_ckpt is not None:
        candidates.append(Path(ray_ckpt.path))
    found = latest_checkpoint(run_dir)
    if found is not None:
        candidates.append(found)
    step, cursor = 0, _DataCursor(parts)
    resumed_from = None
    if candidates:
        resumed_from = max(candidates, key=lambda p: step_of(p) or 0)
        state = ckpt.load(resumed_from, model, optimizer, scheduler)
        step = int(state["step"])
        cursor = _DataCursor(parts, state["data"]["epoch"], state["data"]["position"])
        if rank == 0:
            sender.log(f"resumed from {resumed_from.name} (step {step})")
    build_s = time.monotonic() - t_build

    stop_flag = loop_config.get("stop_flag")
    ckpt_every = cfg.run.checkpoint_every
    val_every = cfg.run.val_every
    last_ckpt_step = step if resumed_from is not None else -1
    state_bytes: dict[str, int] | None = None
    stopped = False

    def all_sum(values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def save(reason: str) -> None:
        nonlocal last_ckpt_step
        t0 = time.monotonic()
        path = ckpt.save(step, model, optimizer, scheduler, cursor.state(),
                         extra={"reason": reason, "total_steps": total_steps, **parts.info})
        last_ckpt_step = step
        save_s = time.monotonic() - t0
        if rank == 0:
            sender.send("state", {"state": "checkpoint", "detail": path.name, "step": step,
                                  "path": str(path), "save_s": round(save_s, 3)})
        report_checkpoint(path, {"step": step, "reason": reason})

    while step < total_steps:
        t0 = time.monotonic()
        model.train()
        # local sums: talker CE, talker targets, sub-talker CE, sub-talker targets
        sums = [0.0, 0.0, 0.0, 0.0]
        micro_batches = cursor.next_step()
        for i, batch in enumerate(micro_batches):
            if parts.set_grad_sync is not None:
                # reduce gradients across ranks only on the last micro-step
                parts.set_grad_sync(i == len(micro_batches) - 1)
            out = parts.forward(model, batch)
            # the data's loss normalisers count the whole optimizer step over
            # world x accumulation; FSDP averages over ranks, dividing by the
            # micro-steps here makes the gradient exactly the full-batch mean's
            (out["loss"] / len(micro_batches)).backward()
            sums = _add_sums(sums, out)
        clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        if state_bytes is None:
            # measured once, after the first step (AdamW state exists, gradients not yet freed)
            state_bytes = model_state_bytes(model, optimizer)
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        stop_local = 1.0 if _stop_requested(stop_flag) else 0.0
        tot = all_sum([*sums, stop_local])
        step_s = time.monotonic() - t0
        talker, subtalker = tot[0] / max(1.0, tot[1]), tot[2] / max(1.0, tot[3])
        tokens = tot[1]  # frames predicted (talker targets) over all ranks
        values: dict[str, Any] = {
            "step": step,
            "epoch": cursor.epoch,
            "perf/step_s": step_s,
            **memory_values(device),
        }
        if rank == 0:
            values.update({
                "loss/train": talker + parts.subtalker_weight * subtalker,
                "loss/talker": talker,
                "loss/subtalker": subtalker,
                "lr": lr,
                "grad/norm": float(grad_norm),
                "perf/tokens_per_s": tokens / step_s if step_s > 0 else 0.0,
                "perf/tokens": tokens,
                "total_steps": total_steps,
            })
        if step == 1 or (resumed_from is not None and step == (step_of(resumed_from) or 0) + 1):
            gib = float(1 << 30)
            values["memory/state_gib"] = state_bytes["total"] / gib
            # the split, from local shards: what sharding saves per rank
            for key in ("params", "grads", "optimizer"):
                values[f"memory/state_{key}_gib"] = state_bytes[key] / gib
            values["perf/build_s"] = build_s
        sender.send("train", values)
        stopped = tot[4] > 0

        if (parts.val_batches is not None and val_every > 0
                and (step % val_every == 0 or step == total_steps) and not stopped):
            _validate(parts, model, step, sender, all_sum)
        if stopped:
            save("stopped")
            break
        if step % ckpt_every == 0 or step == total_steps:
            save("final" if step == total_steps else "interval")

    if not stopped and last_ckpt_step != step:
        save("final")
    ckpt.close()
    if rank == 0:
        sender.send("state", {"state": "stopped" if stopped else "finished", "step": step,
                              "detail": f"step {step}"})


def _add_sums(sums: list[float], out: dict[str, Any]) -> list[float]:
    return [sums[0] + float(out["talker_sum"]), sums[1] + float(out["talker_tokens"]),
            sums[2] + float(out["subtalker_sum"]), sums[3] + float(out["subtalker_tokens"])]


def _validate(parts: TrainParts, model: Any, step: int, sender: MetricsSender,
              all_sum: Callable[[list[float]], list[float]]) -> None:
    import torch

    assert parts.val_batches is not None
    model.eval()
    sums = [0.0, 0.0, 0.0, 0.0]
    with torch.no_grad():
        for batch in parts.val_batches():
            sums = _add_sums(sums, parts.forward(model, batch))
    tot = all_sum(sums)
    model.train()
    if tot[1] > 0 and sender.rank == 0:
        talker, subtalker = tot[0] / tot[1], tot[2] / max(1.0, tot[3])
        sender.send("val", {"step": step,
                            "loss/val": talker + parts.subtalker_weight * subtalker,
                            "loss/val_talker": talker, "loss/val_subtalker": subtalker})


def report_checkpoint(path: Path, metrics: dict[str, Any]) -> None:
    """Tell Ray Train about a checkpoint already written inside its run folder.

    NO_UPLOAD: the shards are where Ray keeps checkpoints, so nothing is
    copied; Ray registers it for restarts and deletes old ones
    (`CheckpointConfig.num_to_keep`). Every rank must call this (a barrier);
    only rank 0 passes the checkpoint.
    """
    import ray.train
    from ray.train import Checkpoint, CheckpointUploadMode

    rank = ray.train.get_context().get_world_rank()
    checkpoint = Checkpoint.from_directory(str(path)) if rank == 0 else None
    ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=path.name,
                     checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)


def build_parts(cfg: Any, loop_config: dict[str, Any], rank: int, world: int) -> TrainParts:
    """The product builder: train-core's objective, `parallelize` and dataset.

    The objective is built on the meta device, sharded, and only then filled
    with the base weights, so no rank ever holds the whole model.
    """
    import torch

    from ..data.dataset import VoiceData
    from .objective import batch_to_device, build_objective, load_base_weights
    from .parallelize import make_mesh, parallelize, set_gradient_sync

    model_dir = Path(loop_config["model_dir"])
    voice_dir = Path(loop_config["voice_dir"])
    if cfg.parallel.use_gpu and torch.cuda.is_available():
        import ray.train

        device = ray.train.torch.get_device()
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    objective = build_objective(model_dir, cfg.model, device="meta")
    parallelize(objective, make_mesh(device), cfg.parallel, device)
    load_base_weights(objective, model_dir, device)
    data = VoiceData.open(voice_dir, model_dir, cfg.data)
    data.check(world)
    accum = cfg.data.grad_accum
    epoch_cache: dict[int, Any] = {}

    def step_batches(epoch: int, position: int) -> list[Any]:
        if epoch not in epoch_cache:
            epoch_cache.clear()  # one epoch at a time; batches collate lazily
            epoch_cache[epoch] = data.rank_batches(epoch, rank=rank, world=world)
        micro = epoch_cache[epoch]
        return [micro[k] for k in range(position * accum, (position + 1) * accum)]

    def forward(model: Any, batch: Any) -> dict[str, Any]:
        return model(batch_to_device(batch, device))

    def val_batches() -> list[Any]:
        return list(data.val_batches(rank=rank, world=world))

    return TrainParts(
        model=objective, device=device, steps_per_epoch=int(data.steps_per_epoch()),
        step_batches=step_batches, forward=forward,
        subtalker_weight=cfg.model.subtalker_weight,
        val_batches=val_batches if cfg.run.val_every > 0 else None,
        set_grad_sync=lambda enabled: set_gradient_sync(objective, enabled),
        info={"base": str(model_dir), "speaker": cfg.model.speaker_name},
    )
