"""Which number format a run computes in, and the loss scaler fp16 needs.

- "bf16": bf16 compute, fp32 master weights, fp32 gradient reduction. Needs
  compute capability 8.0 or newer on NVIDIA GPUs (Ampere: A100, RTX 30xx, and
  later); older cards emulate it far too slowly or not at all.
- "fp16": the same with fp16 compute, for GPUs older than 8.0 (V100, T4,
  RTX 20xx). fp16's small range needs loss scaling: `LossScaler` multiplies
  the loss, checks every gradient shard for inf/NaN (one all-reduce so all
  ranks agree), unscales, and skips the step and halves the scale on overflow.
- "fp32": no mixed precision (always on CPU by default: bf16 matmuls are
  about 40x slower on AVX2 CPUs).
- "auto": bf16 on a GPU that has it, fp16 on an older GPU, fp32 on CPU.

This module imports torch lazily (the plan and the CLI read it).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from engine.model.dtypes import BF16_CAPABILITY, gpu_half

CHOICES: tuple[str, ...] = ("auto", "bf16", "fp16", "fp32")


class PrecisionError(ValueError):
    """The chosen precision cannot run on this device (message: one sentence)."""


def resolve_precision(choice: str, device_type: str,
                      capability: tuple[int, int] | None = None) -> str:
    """"bf16", "fp16" or "fp32" for `choice` on a device ("cuda" or "cpu").

    capability: the GPU's (major, minor); None on CPU or when unknown (then
    a GPU is assumed modern, as every card Voxshard is sized for is).
    """
    if choice not in CHOICES:
        raise PrecisionError(f"Unknown precision {choice!r}; use one of {', '.join(CHOICES)}.")
    if device_type != "cuda":
        return "fp32" if choice == "auto" else choice
    has_bf16 = gpu_half(capability) == "bf16"
    if choice == "auto":
        return "bf16" if has_bf16 else "fp16"
    if choice == "bf16" and not has_bf16:
        major, minor = capability or (0, 0)
        raise PrecisionError(f"bf16 needs a GPU of compute capability 8.0 or newer; this one is "
                             f"{major}.{minor}.")
    return choice


def describe(precision: str, device_type: str,
             capability: tuple[int, int] | None = None) -> str:
    """One line for the log: what runs and why."""
    cc = f" (compute capability {capability[0]}.{capability[1]})" if capability else ""
    if precision == "bf16":
        return f"bf16 compute, fp32 master weights and reductions{cc}"
    if precision == "fp16":
        return (f"fp16 compute with loss scaling, fp32 master weights and reductions{cc}"
                + ("; bf16 needs 8.0+" if capability and capability < BF16_CAPABILITY else ""))
    return "fp32" + (" on CPU" if device_type != "cuda" else cc)


def compute_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


def device_capability(device: Any) -> tuple[int, int] | None:
    """(major, minor) of a CUDA device, None for anything else."""
    if getattr(device, "type", str(device)) != "cuda" or not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(device))  # type: ignore[return-value]


class LossScaler:
    """Dynamic loss scaling for fp16 that works on sharded (DTensor) gradients.

    torch's GradScaler unscales with a fused kernel DTensor does not
    implement; this one runs the same fused kernel on the gradients' local
    shards (one launch per device and dtype: unscale and non-finite check
    together, into one flag on the device), agrees on overflow with one
    all-reduce over the default process group, and reads the flag back once:
    one host sync per step, not one per gradient. Every rank skips or takes
    the same step. State (`state_dict`) is plain JSON.
    """

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000) -> None:
        self.scale = float(init_scale)
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.good_steps = 0
        self.skipped = 0
        #: overflowed steps since the last good one (the trainer gives up after a limit)
        self.skipped_in_a_row = 0

    def scale_loss(self, loss: Any) -> Any:
        return loss * self.scale

    def unscale_(self, params: list[Any]) -> bool:
        """Divide every gradient by the scale; True when all are finite on every rank."""
        groups: dict[tuple[Any, Any], list[Any]] = {}
        for p in params:
            if p.grad is not None:
                g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                groups.setdefault((g.device, g.dtype), []).append(g)
        device = next(iter(groups))[0] if groups else torch.device("cpu")
        bad = torch.zeros(1, dtype=torch.float32, device=device)
        with torch.no_grad():
            for (dev, _dtype), grads in groups.items():
                found = bad if dev == device else torch.zeros(1, device=dev)
                inv = torch.full((1,), 1.0 / self.scale, dtype=torch.float32, device=dev)
                torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
                if found is not bad:
                    bad = torch.maximum(bad, found.to(device))
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        return not bool(bad.item())  # the step's one read back

    def update(self, finite: bool) -> None:
        if finite:
            self.good_steps += 1
            self.skipped_in_a_row = 0
            if self.good_steps >= self.growth_interval:
                self.scale *= self.growth_factor
                self.good_steps = 0
        else:
            self.scale *= self.backoff_factor
            self.good_steps = 0
            self.skipped += 1
            self.skipped_in_a_row += 1

    def state_dict(self) -> dict[str, float]:
        return {"scale": self.scale, "good_steps": self.good_steps, "skipped": self.skipped,
                "skipped_in_a_row": self.skipped_in_a_row}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.scale = float(state["scale"])
        self.good_steps = int(state.get("good_steps", 0))
        self.skipped = int(state.get("skipped", 0))
        self.skipped_in_a_row = int(state.get("skipped_in_a_row", 0))
