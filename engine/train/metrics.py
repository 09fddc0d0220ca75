"""Live training metrics: every rank -> a Ray queue -> the driver -> events + metrics.jsonl.

Why a queue and not `ray.train.report`: in Ray Train V2 `report` is a
barrier every rank must call equally often, and calling it every step
throttles the step to the controller's poll interval (about 2 s). A
`ray.util.queue.Queue` actor that workers `put_nowait` into and the driver
polls delivers every rank's per-step record in milliseconds, and keeps
working through a worker-group restart (the actor belongs to the driver).
We report to Ray only together with checkpoints.

A record is a plain dict: ``{"kind": "train"|"val"|"log"|"state", "rank": r,
"time": t, "values": {...}}``. Metric keys are namespaced (`loss/train`,
`memory/peak_gib`, `perf/tokens_per_s`); `step` is always present in
train/val values.

This module is the worker side and never imports Ray (the Ray-free GPU proof's
workers use it); the queue and the driver's pump are `engine.train.metrics_pump`.
"""

from __future__ import annotations

import os
import resource
import time
from typing import Any

import psutil
import torch

GIB = float(1 << 30)


class MetricsSender:
    """Worker side. Never blocks training: a full or dead queue drops the record."""

    def __init__(self, queue: Any, rank: int) -> None:
        self.queue = queue
        self.rank = rank
        self.dropped = 0

    def send(self, kind: str, values: dict[str, Any]) -> None:
        record = {"kind": kind, "rank": self.rank, "time": time.time(), "values": values}
        if self.queue is None:
            return
        try:
            self.queue.put_nowait(record)
        except Exception:  # queue.Full, or the driver went away: training goes on
            self.dropped += 1

    def log(self, message: str, level: str = "info") -> None:
        self.send("log", {"message": message, "level": level})


# --- measuring, worker side -------------------------------------------------------------

def memory_values(device: Any) -> dict[str, float]:
    """Device memory of this rank: CUDA allocator figures on GPU, process RSS on CPU."""
    if device is not None and getattr(device, "type", "cpu") == "cuda":
        # the allocator's view, plus the device's own (what nvidia-smi shows:
        # CUDA context, NCCL buffers and any other process on the same GPU)
        # peak_gib: the allocator's peak since the model was loaded (the worker
        # resets it then); reserved_peak_gib adds the allocator's cache;
        # device_used_gib is the whole device as NVML sees it, and what runs out
        free, total = torch.cuda.mem_get_info(device)
        return {
            "memory/allocated_gib": torch.cuda.memory_allocated(device) / GIB,
            "memory/reserved_gib": torch.cuda.memory_reserved(device) / GIB,
            "memory/peak_gib": torch.cuda.max_memory_allocated(device) / GIB,
            "memory/reserved_peak_gib": torch.cuda.max_memory_reserved(device) / GIB,
            "memory/device_used_gib": (total - free) / GIB,
            # the name the GUI draws as the device limit line
            "memory/total_gib": total / GIB,
        }
    proc = psutil.Process(os.getpid())
    rss = proc.memory_info().rss
    # ru_maxrss is the process's peak RSS in KiB on Linux
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"memory/rss_gib": rss / GIB, "memory/peak_gib": peak / GIB}


def local_bytes(tensor: Any) -> int:
    """Bytes this rank really holds for a tensor: a DTensor's local shard, or all of it."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return int(local.numel() * local.element_size())


def model_state_bytes(model: Any, optimizer: Any | None = None) -> dict[str, int]:
    """Per-rank bytes of parameters, gradients and optimizer state, from local shards.

    Process RSS hides what sharding saves (runtime and allocator caches
    dominate), so this counts the tensors themselves.
    """
    params = grads = 0
    seen: set[int] = set()
    # a unit kept gathered (a frozen one: `keep_frozen_gathered`) shows its whole
    # parameters on the module; its state is still the shard FSDP keeps beside them
    shards = {id(fp._unsharded_param): fp.sharded_param for fp in _fsdp_params(model)
              if hasattr(fp, "_unsharded_param")}
    for p in model.parameters():
        p = shards.get(id(p), p)
        if id(p) in seen:
            continue
        seen.add(id(p))
        params += local_bytes(p)
        if p.grad is not None:
            grads += local_bytes(p.grad)
    opt = 0
    if optimizer is not None:
        for state in optimizer.state.values():
            for value in state.values():
                if hasattr(value, "numel") and value.dim() > 0:
                    opt += local_bytes(value)
    return {"params": params, "grads": grads, "optimizer": opt, "total": params + grads + opt}


def unsharded_grad_bytes(model: Any) -> int:
    """Bytes of whole (unsharded) gradients FSDP2 holds between accumulation micro-steps.

    With gradient reduction off (`set_requires_gradient_sync(False)`), each
    FSDP unit keeps its full-size gradient until the step that reduces: in
    the reduce dtype (fp32) under mixed precision, else on the unsharded
    parameter. Reads FSDP2's per-parameter state (torch-internal names,
    checked by the test that compares this with the plan).
    """
    total = 0
    for fsdp_param in _fsdp_params(model):
        acc = getattr(fsdp_param, "unsharded_accumulated_grad", None)
        if acc is None:
            unsharded = getattr(fsdp_param, "_unsharded_param", None)
            acc = getattr(unsharded, "grad", None) if unsharded is not None else None
        if acc is not None:
            total += int(acc.numel() * acc.element_size())
    return total


def gathered_param_bytes(model: Any) -> int:
    """Bytes of unsharded (all-gathered) parameters FSDP2 holds right now, all units.

    Counts the allocated all-gather outputs, the storage each unit's whole
    parameters live in while gathered (freed, resized to 0, on reshard); what
    `keep_gathered` holds between accumulation micro-steps. Reads FSDP2's
    per-parameter state (torch-internal names, checked by the test that
    compares this with the plan).
    """
    return sum(int(t.untyped_storage().nbytes()) for fsdp_param in _fsdp_params(model)
               for t in getattr(fsdp_param, "all_gather_outputs", None) or [])


def _fsdp_params(model: Any) -> Any:
    """FSDP2's per-parameter state objects of every unit in `model` (torch-internal)."""
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        if get_state is None:
            continue
        group = getattr(get_state(), "_fsdp_param_group", None)
        yield from getattr(group, "fsdp_params", None) or []
