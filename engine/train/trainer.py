"""One rank's training loop (`Trainer`), run inside every Ray Train worker.

It never mentions FSDP: a builder (`engine.train.builder`) hands back a ready,
sharded root module whose `forward(batch)` computes the whole loss, plus the
batches for this rank (`engine.train.loader` walks them). This file owns the
optimisation around it: AdamW over the trainable parameters only, linear
warmup then cosine decay, global-norm clipping at 1.0, gradient accumulation,
validation at intervals, checkpoints, the cooperative stop flag, and the
per-step metrics sent to the driver. `run_worker` runs it without Ray too
(tests and benchmarks); `engine.train.entry` is what Ray calls.

Everything a rank does depends only on (config, step, data position, RNG), so
a run restarted from a checkpoint replays the same losses.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from engine.config.train import TrainConfig
from engine.core.storage import as_location
from engine.layout.checkpoints import latest_checkpoint, step_of
from engine.train.builder import (
    DEFAULT_BUILDER,
    TrainParts,
    import_builder,
)
from engine.train.checkpoint import Checkpointer
from engine.train.failures import FatalTrainingError, out_of_memory_error
from engine.train.loader import DataCursor, Prefetch
from engine.train.metrics import MetricsSender, memory_values, model_state_bytes
from engine.train.plan import optimizer_kind
from engine.train.precision import LossScaler
from engine.train.updates import UpdateProbe, check_first_step, ratios

#: fp16: this many optimizer steps in a row skipped for overflow end the run
MAX_SKIPPED_STEPS = 25


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


@dataclass
class WorkerEnv:
    """What a worker gets from whatever started it: Ray Train, or plain torch.distributed.

    The loop itself needs no Ray: `train_loop` fills this from Ray Train's
    context; `bench/gpu_proof.py` fills it after its own `init_process_group`
    (a GPU machine without Ray runs the same loop).
    """

    rank: int
    world: int
    #: send(kind, values) / log(message); MetricsSender under Ray
    sender: Any
    #: True once the user asked to stop (polled once per step)
    stop: Callable[[], bool] = lambda: False
    #: the checkpoint Ray hands back after a worker-group restart (None: none)
    restored: Path | None = None
    #: tells the launcher about a checkpoint written inside the run folder (every rank)
    report_checkpoint: Callable[[Path, dict[str, Any]], None] = lambda path, metrics: None
    #: the process's device choice for GPU runs (Ray's, or LOCAL_RANK)
    gpu_device: Callable[[], Any] | None = None


class ListSender:
    """A `WorkerEnv.sender` that keeps what the loop reports (Ray-free runs: the GPU proof,
    the benches)."""

    def __init__(self, rank: int = 0) -> None:
        self.records: list[dict[str, Any]] = []
        #: validation reports from rank 0 only, as MetricsSender's
        self.rank = rank

    def send(self, kind: str, values: dict[str, Any]) -> None:
        self.records.append({"kind": kind, **values})

    def log(self, message: str, level: str = "info") -> None:
        self.send("log", {"message": message})

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == kind]


def run_worker(loop_config: dict[str, Any], env: WorkerEnv) -> dict[str, Any]:
    """Train on this rank (process group already initialised); returns this rank's summary.

    A CUDA out-of-memory anywhere (loading, a step, a checkpoint) ends the run
    with one sentence and the plan's advice (`FatalTrainingError`, never
    retried), instead of Ray replaying the same step into the same wall.
    """
    run = Trainer(loop_config, env)
    try:
        return run.run()
    except torch.OutOfMemoryError as exc:
        raise out_of_memory_error(exc, env.rank, run.step + 1 if run.built else 0, run.device,
                                  loop_config.get("oom_advice")) from exc


class Trainer:
    """One rank's run, in named stages: build, resume, then steps with validation and saves."""

    def __init__(self, loop_config: dict[str, Any], env: WorkerEnv) -> None:
        self.loop_config = loop_config
        self.env = env
        self.cfg = TrainConfig.from_dict(loop_config["config"])
        self.rank, self.world = env.rank, env.world
        self.sender = env.sender
        # the run's storage location: a folder, or a URI (engine.core.storage)
        self.run_dir = as_location(loop_config["run_dir"])
        self.total_steps = int(loop_config["total_steps"])
        self.step = 0
        self.built = False
        self.device: Any = None
        self.resumed_from: Path | None = None
        self.last_ckpt_step = -1
        self.scaler: Any = None
        self.device_used_peak = 0.0
        self.state_bytes: dict[str, int] | None = None
        self.build_s = 0.0
        #: (folder, step, reason, start time) of a save not yet reported
        self._saving: tuple[Any, int, str, float] | None = None
        #: the update measurements (None: the builder names no parameter groups)
        self.probe: UpdateProbe | None = None
        #: whether this process has checked its first taken step (`updates`)
        self.checked = False
        #: the probe's values of the step just taken (None: not measured)
        self._probed: Any = None

    # -- stages ---------------------------------------------------------------------------
    def build(self) -> None:
        cfg = self.cfg
        torch.set_num_threads(cfg.parallel.cpu_threads_per_worker)
        self.sender.send("state", {"state": "worker_started", "detail": f"rank {self.rank}",
                                   "rank": self.rank, "pid": os.getpid()})
        torch.manual_seed(cfg.run.seed + self.rank)
        t_build = time.monotonic()
        builder = import_builder(self.loop_config.get("builder") or DEFAULT_BUILDER)
        self.loop_config.setdefault("_gpu_device", self.env.gpu_device)
        parts = builder(cfg, self.loop_config, self.rank, self.world)
        self.parts, self.model, self.device = parts, parts.model, parts.device
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        if not self.params:
            raise RuntimeError("nothing to train: no parameter requires a gradient")
        self.optimizer = make_optimizer(self.params, cfg, self.device)
        if parts.groups is not None:
            self.probe = UpdateProbe(parts.groups())
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(cfg.optim.warmup_steps, self.total_steps,
                                      cfg.optim.schedule, cfg.optim.min_lr_ratio))
        if parts.precision == "fp16":
            self.scaler = LossScaler()
        # GPU runs save in the background: the shards are written while training goes
        # on; under CPU offload the state is already in host memory, so a plain save
        # writes it without a staging copy
        self.ckpt = Checkpointer(self.run_dir, self.rank, self.world,
                                 keep=cfg.run.keep_checkpoints,
                                 background=(getattr(self.device, "type", "") == "cuda"
                                             and not cfg.parallel.cpu_offload))
        self.cursor: Any = DataCursor(parts)
        self.resume()
        self.cursor = Prefetch(self.cursor, parts.prepare, self.total_steps - self.step)
        self.build_s = time.monotonic() - t_build
        if self.device is not None and getattr(self.device, "type", "") == "cuda":
            # the reported peak is the training peak, not loading's transient one
            torch.cuda.reset_peak_memory_stats(self.device)
        if self.rank == 0 and parts.info.get("precision_detail"):
            self.sender.log(f"precision: {parts.info['precision_detail']}")
        if self.rank == 0 and self.keeps_gathered(cfg.data.grad_accum):
            self.sender.log(f"parameters stay gathered across the {cfg.data.grad_accum} "
                            "micro-steps of each optimizer step")
        if self.rank == 0 and parts.info.get("compiled_layers"):
            self.sender.log(f"torch.compile: {parts.info['compiled_layers']} decoder layers")
        self.built = True

    def resume(self) -> None:
        """From the newest complete checkpoint: Ray's after a restart, or one in the run folder.

        Ray's controller polls reports every ~2 s, so a worker killed within
        that window after a save restarts with Ray unaware of it (measured);
        a new run's folder is empty, so scanning it is always safe.
        """
        candidates = [p for p in (self.env.restored, latest_checkpoint(self.run_dir))
                      if p is not None]
        if not candidates:
            return
        self.resumed_from = max(candidates, key=lambda p: step_of(p) or 0)
        state = self.ckpt.load(self.resumed_from, self.model, self.optimizer, self.scheduler)
        self.step = int(state["step"])
        self.last_ckpt_step = self.step
        self.cursor = DataCursor(self.parts, state["data"]["epoch"], state["data"]["position"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        if self.rank == 0:
            self.sender.log(f"resumed from {self.resumed_from.name} (step {self.step})")

    def all_sum(self, values: Any) -> list[float]:
        """Sum over ranks; `values` a list or a tensor already on the device (one read back)."""
        t = torch.as_tensor(values, dtype=torch.float64).to(self.device)
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def save(self, reason: str) -> None:
        """Save this step; an interval save on a GPU completes in the background (`settle`)."""
        self.settle()
        t0 = time.monotonic()
        extra = {"reason": reason, "total_steps": self.total_steps, **self.parts.info}
        if self.scaler is not None:
            extra["scaler"] = self.scaler.state_dict()
        path = self.ckpt.save(self.step, self.model, self.optimizer, self.scheduler,
                              self.cursor.state(), extra=extra, wait=reason != "interval")
        self.last_ckpt_step = self.step
        self._saving = (path, self.step, reason, t0)
        if not self.ckpt.pending:
            self.settle()

    def settle(self) -> None:
        """Complete the save under way (COMPLETE written) and report it; every rank calls
        this at the same point of the loop."""
        if self._saving is None:
            return
        path, step, reason, t0 = self._saving
        self._saving = None
        self.ckpt.finish()
        if self.rank == 0:
            self.sender.send("state", {"state": "checkpoint", "detail": path.name,
                                       "step": step, "path": str(path),
                                       "save_s": round(time.monotonic() - t0, 3)})
        self.env.report_checkpoint(path, {"step": step, "reason": reason})

    def train_step(self) -> tuple[Any, Any, float]:
        """One optimizer step: (local loss sums, gradient norm, lr used), both on the device.

        Nothing in a micro-step reads a value back to the host: sums stay on the
        device (read once per step with the all-reduce), the loss gathers with
        host-built rows, batches arrive prepared by the prefetch thread.
        """
        cfg, parts = self.cfg, self.parts
        self.model.train()
        # local sums: talker CE, talker targets, sub-talker CE, sub-talker targets
        sums: Any = None
        micro_batches = self.cursor.next_step()
        # "every": FSDP reduce-scatters after each micro-step, gradients stay sharded
        toggle = parts.set_grad_sync is not None and cfg.parallel.accum_reduce != "every"
        keep = self.keeps_gathered(len(micro_batches))
        for i, batch in enumerate(micro_batches):
            last = i == len(micro_batches) - 1
            if toggle:
                # reduce gradients across ranks only on the last micro-step
                parts.set_grad_sync(last)
            if keep:
                # gathered once in the first forward, released after the last backward
                parts.set_keep_gathered(True, last)
            out = parts.forward(self.model, batch)
            # the data's loss normalisers count the whole optimizer step over
            # world x accumulation; FSDP averages over ranks, dividing by the
            # micro-steps here makes the gradient exactly the full-batch mean's
            loss = out["loss"] / len(micro_batches)
            (self.scaler.scale_loss(loss) if self.scaler is not None else loss).backward()
            sums = add_sums(sums, out)
        if keep:
            parts.set_keep_gathered(False, True)  # validation and saves see FSDP's defaults
        finite = self.scaler.unscale_(self.params) if self.scaler is not None else True
        clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, clip)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        lr = self.optimizer.param_groups[0]["lr"]
        self._probed = None
        if finite and self.probe is not None:
            # samples taken before the step, compared after it on the device
            self.probe.before_step(check=not self.checked)
        if finite:
            self.optimizer.step()
            if self.probe is not None:
                self._probed = self.probe.after_step(grad_norm.device)
            # a skipped step does not advance the schedule: warmup and decay count
            # the steps that changed the weights
            self.scheduler.step()
        if self.scaler is not None:
            self.scaler.update(finite)  # an overflow skips the step and halves the scale
            self._check_skips()
        if self.state_bytes is None and finite:
            # measured once, after the first step (AdamW state exists, gradients not yet freed)
            self.state_bytes = model_state_bytes(self.model, self.optimizer)
        self.optimizer.zero_grad(set_to_none=True)
        return sums, grad_norm, lr

    def keeps_gathered(self, micro_steps: int) -> bool:
        """Whether parameters stay gathered between this step's micro-steps: asked for
        ("on", which the driver sets from the plan), with "last" reduction, and more than
        one micro-step."""
        par = self.cfg.parallel
        return (micro_steps > 1 and self.parts.set_keep_gathered is not None
                and self.parts.set_grad_sync is not None
                and par.keep_gathered == "on" and par.accum_reduce != "every")

    def check_updates(self, probed: list[float], lr: float) -> dict[str, float]:
        """The update/weight ratios of this step; after the first step taken, the check that
        every trained group learns (raises FatalTrainingError on every rank alike)."""
        if not self.checked:
            self.checked = True
            dtype = str(self.params[0].dtype).removeprefix("torch.")
            line = check_first_step(probed, self.cfg.model.trainable,
                                    self.cfg.model.subtalker_weight, lr, dtype)
            if self.rank == 0:
                self.sender.log(line)
        return ratios(probed) if self.rank == 0 else {}

    def _check_skips(self) -> None:
        if self.scaler.skipped_in_a_row >= MAX_SKIPPED_STEPS:
            raise FatalTrainingError(
                "precision", f"fp16 overflowed on {self.scaler.skipped_in_a_row} optimizer "
                f"steps in a row (loss scale now {self.scaler.scale:g}), so no step changed "
                "the weights.", "Set {parallel.precision} to bf16 (compute capability 8.0+) "
                "or fp32.")

    def step_values(self, tot: list[float], grad_norm: float, lr: float,
                    step_s: float) -> dict[str, Any]:
        parts = self.parts
        talker, subtalker = tot[0] / max(1.0, tot[1]), tot[2] / max(1.0, tot[3])
        tokens = tot[1]  # frames predicted (talker targets) over all ranks
        mem = memory_values(self.device)
        if "memory/device_used_gib" in mem:
            self.device_used_peak = max(self.device_used_peak, mem["memory/device_used_gib"])
            mem["memory/device_used_peak_gib"] = self.device_used_peak
        if self.loop_config.get("plan_bytes"):
            mem["memory/plan_gib"] = float(self.loop_config["plan_bytes"]) / float(1 << 30)
        values: dict[str, Any] = {"step": self.step, "epoch": self.cursor.epoch,
                                  "perf/step_s": step_s, **mem}
        if self.rank == 0:
            values.update({
                "loss/train": talker + parts.subtalker_weight * subtalker,
                "loss/talker": talker,
                "loss/subtalker": subtalker,
                "lr": lr,
                "grad/norm": grad_norm,
                "perf/tokens_per_s": tokens / step_s if step_s > 0 else 0.0,
                "perf/tokens": tokens,
                "total_steps": self.total_steps,
            })
            if self.scaler is not None:
                values["precision/loss_scale"] = self.scaler.scale
        first = self.step == 1 or (self.resumed_from is not None
                                   and self.step == (step_of(self.resumed_from) or 0) + 1)
        if first and self.state_bytes is not None:
            gib = float(1 << 30)
            values["memory/state_gib"] = self.state_bytes["total"] / gib
            # the split, from local shards: what sharding saves per rank
            for key in ("params", "grads", "optimizer"):
                values[f"memory/state_{key}_gib"] = self.state_bytes[key] / gib
            values["perf/build_s"] = self.build_s
        return values

    def run(self) -> dict[str, Any]:
        try:
            return self._steps()
        finally:
            if isinstance(getattr(self, "cursor", None), Prefetch):
                self.cursor.close()

    def _steps(self) -> dict[str, Any]:
        self.build()
        cfg, parts = self.cfg, self.parts
        stopped = False
        losses: list[float] = []
        while self.step < self.total_steps:
            t0 = time.monotonic()
            sums, grad_norm, lr = self.train_step()
            self.step += 1
            stop_local = 1.0 if self.env.stop() else 0.0
            # a background save is completed once every rank's writes are done (counted
            # in the step's one read back, so all ranks decide alike), else at the next
            # save: the step never waits for the disk
            writing = 1.0 if self._saving is not None and not self.ckpt.written() else 0.0
            tot = self.all_sum(_with_flags(sums, stop_local, writing, probed=self._probed))
            if self._saving is not None and tot[5] == 0:
                self.settle()
            values = self.step_values(tot, float(grad_norm), lr, time.monotonic() - t0)
            if self._probed is not None:
                values.update(self.check_updates(tot[6:], lr))
            if "loss/train" in values:
                losses.append(values["loss/train"])
            self.sender.send("train", values)
            stopped = tot[4] > 0
            if (parts.val_batches is not None and cfg.run.val_every > 0 and not stopped
                    and (self.step % cfg.run.val_every == 0 or self.step == self.total_steps)):
                _validate(parts, self.model, self.step, self.sender, self.all_sum)
            if stopped:
                self.save("stopped")
                break
            final = self.step == self.total_steps and self.loop_config.get("save_final", True)
            if self.step % cfg.run.checkpoint_every == 0 or final:
                self.save("final" if self.step == self.total_steps else "interval")
        if (not stopped and self.last_ckpt_step != self.step
                and self.loop_config.get("save_final", True)):
            self.save("final")
        self.settle()
        self.ckpt.close()
        if self.rank == 0:
            self.sender.send("state", {"state": "stopped" if stopped else "finished",
                                       "step": self.step, "detail": f"step {self.step}"})
        return {"step": self.step, "stopped": stopped, "losses": losses,
                "state_bytes": self.state_bytes, "build_s": self.build_s}


def make_optimizer(params: list[Any], cfg: Any, device: Any) -> Any:
    """AdamW over `params`: fused on a GPU and on the host (CPU runs, the host shards of
    CPU offload: torch's fused CPU kernel): one kernel, in place, no fp32 temporary the
    size of every shard, which foreach allocates (`optimizer_kind`). The plan counts
    what it leaves."""
    offload = bool(cfg.parallel.cpu_offload)
    kind = optimizer_kind("cpu" if offload else getattr(device, "type", str(device)), offload)
    return torch.optim.AdamW(params, lr=cfg.optim.lr, betas=(cfg.optim.beta1, cfg.optim.beta2),
                             eps=cfg.optim.eps, weight_decay=cfg.optim.weight_decay,
                             **{kind: True})


def add_sums(sums: Any, out: dict[str, Any]) -> Any:
    """Running (talker CE, talker targets, sub-talker CE, sub-talker targets), on the
    device of the loss: nothing is read back to the host."""
    step = torch.stack([out[k].detach().to(torch.float64) for k in
                        ("talker_sum", "talker_tokens", "subtalker_sum", "subtalker_tokens")])
    return step if sums is None else sums + step


def _with_flags(sums: Any, *flags: float, probed: Any = None) -> Any:
    """The step's one all-reduce: loss sums, flags, then the update probe's values."""
    if sums is None:
        head: Any = [0.0, 0.0, 0.0, 0.0, *flags]
        return head if probed is None else head + probed.tolist()
    parts = [sums, torch.tensor(flags, dtype=sums.dtype).to(sums.device)]
    if probed is not None:
        parts.append(probed.to(sums.device, sums.dtype))
    return torch.cat(parts)


def _validate(parts: TrainParts, model: Any, step: int, sender: MetricsSender,
              all_sum: Callable[[list[float]], list[float]]) -> None:
    assert parts.val_batches is not None
    model.eval()
    sums: Any = None
    with torch.no_grad():
        for batch in parts.val_batches():
            sums = add_sums(sums, parts.forward(model, batch))
    tot = all_sum(sums if sums is not None else [0.0, 0.0, 0.0, 0.0])
    model.train()
    if tot[1] > 0 and sender.rank == 0:
        talker, subtalker = tot[0] / tot[1], tot[2] / max(1.0, tot[3])
        sender.send("val", {"step": step,
                            "loss/val": talker + parts.subtalker_weight * subtalker,
                            "loss/val_talker": talker, "loss/val_subtalker": subtalker})
