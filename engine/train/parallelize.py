"""FSDP2 sharding of the training objective, in one function.

The layout that works with the official modules (measured, see
ray-fsdp-facts.md): `fully_shard` every talker decoder layer and every
code-predictor decoder layer, then the root `VoiceObjective`, whose forward
calls everything else (embeddings, text_projection, norms, codec head,
small_to_mtp_projection, the 15 heads). Making the talker the root, or the
code predictor one unit, fails or silently trains wrong, because those
modules' pieces are called from outside their own forward.

The frozen text embedding (311M parameters on the real models) optionally gets
its own unit. Frozen, its weights never change, so that unit is gathered once,
at the first forward, and stays gathered (`keep_frozen_gathered`): no all-gather
of it in every step's forward and again in backward's prefetch.

On a CPU world of one, each unit's gradient "reduce-scatter" hands FSDP its
input buffer back as the output, and the same buffer every step
(`OneRankReduce`): FSDP2 otherwise copies every gradient into a fresh flat
buffer and that into another, a third of a full-depth step on this machine
(profiled), for a reduction over one rank.

The training loop never mentions FSDP: it gets the sharded objective back.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    FSDPModule,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.utils.checkpoint import checkpoint

from engine.config.train import ParallelConfig
from engine.train.precision import device_capability
from engine.train.precision import resolve_precision as _resolve


def make_mesh(device: torch.device) -> Any:
    """A 1-D data-parallel mesh over all ranks, or None outside torch.distributed."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=("dp",))


def process_group_backend(use_gpu: bool) -> str:
    """The torch.distributed backend string for a run's process group.

    On GPU, NCCL for CUDA tensors *and* gloo for CPU tensors: with CPU offload
    the gradients and optimizer state live in host memory, and gradient
    clipping's norm, the fp16 overflow check and DCP's planning then run
    collectives on CPU tensors, which an NCCL-only group cannot do.
    """
    return "cpu:gloo,cuda:nccl" if use_gpu else "gloo"


def resolve_precision(cfg: ParallelConfig, device: torch.device,
                      capability: tuple[int, int] | None = None) -> str:
    """"bf16", "fp16" or "fp32" for this device (see `engine.train.precision`).

    capability: the GPU's compute capability; read from the device when None.
    Raises `PrecisionError` for bf16 on a GPU older than 8.0.
    """

    device = torch.device(device)
    if capability is None and device.type == "cuda" and device.index is not None:
        capability = device_capability(device)
    return _resolve(cfg.precision, device.type, capability)


def decoder_layers(objective: nn.Module) -> list[nn.Module]:
    """Every transformer block: the talker's, then the code predictor's."""
    talker = objective.talker
    return [*talker.model.layers, *talker.code_predictor.model.layers]


def enable_activation_checkpointing(objective: nn.Module) -> None:
    """Recompute each decoder layer in backward instead of keeping its activations.

    Uses the layers' own (transformers) checkpoint switch, so module names and
    state-dict keys stay the official ones. Non-reentrant checkpointing is
    the variant that composes with FSDP2's hooks.
    """
    for layer in decoder_layers(objective):
        layer.gradient_checkpointing = True
        layer._gradient_checkpointing_func = partial(checkpoint, use_reentrant=False)


def compile_layers(objective: nn.Module, device: torch.device | str,
                   backend: str = "inductor") -> int:
    """`torch.compile` every decoder layer's forward on a GPU; returns how many.

    Only the layer's own computation is compiled (its bound `forward`): FSDP's
    hooks, the activation-checkpointing wrapper and the module tree (names,
    state-dict keys) stay as they are, and a layer's unsharded parameters are
    ordinary tensors by the time its forward runs. On CPU nothing is compiled
    (0): the option is for GPU runs, where bench/gpu_proof.py measures it
    against the eager step. `backend` lets a CPU test compile with "eager"
    (dynamo's capture only) to check the wiring.
    """
    if torch.device(device).type != "cuda" and backend == "inductor":
        return 0
    layers = decoder_layers(objective)
    for layer in layers:
        # the bound method: the compiled region is the layer's math only
        layer.forward = torch.compile(layer.forward, backend=backend)
    return len(layers)


def parallelize(objective: nn.Module, mesh: Any, cfg: ParallelConfig,
                device: torch.device | str = "cpu") -> nn.Module:
    """Shard `objective` in place over `mesh` and return it.

    With mesh None (no process group) the objective is only moved to the
    device (if materialised) and set up for activation checkpointing; mixed
    precision then needs a process group, so single-process GPU runs should
    still go through Ray Train (which always creates one, even for 1 worker).
    Parameters may still be on the meta device: call `load_base_weights` after.
    """
    device = torch.device(device)
    if cfg.activation_checkpointing:
        enable_activation_checkpointing(objective)
    # how many layers were compiled (0 on CPU), for the run's log
    objective._voxshard_compiled = compile_layers(objective, device) if cfg.compile_layers else 0
    if mesh is None:
        if not any(p.is_meta for p in objective.parameters()):
            objective.to(device)
        return objective

    precision = resolve_precision(cfg, device)
    if precision in ("bf16", "fp16"):
        low = torch.bfloat16 if precision == "bf16" else torch.float16
        # Parameters stay fp32 (the master copy the optimizer updates); compute
        # in bf16/fp16; gradients reduced and kept in fp32 so tiny updates survive.
        mp = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
        # The root must not cast its batch: the loss normalisers (token counts,
        # e.g. 1234.5) would round in bf16. `embed` casts the x-vector itself.
        root_mp = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32,
                                       cast_forward_inputs=False)
    else:
        mp = root_mp = MixedPrecisionPolicy()
    offload: OffloadPolicy = (CPUOffloadPolicy() if cfg.cpu_offload and device.type == "cuda"
                              else OffloadPolicy())
    shard = partial(fully_shard, mesh=mesh, mp_policy=mp, offload_policy=offload)
    # load_base_weights must materialise offloaded shards in host memory
    objective._voxshard_param_device = "cpu" if isinstance(offload, CPUOffloadPolicy) else None

    for layer in decoder_layers(objective):
        shard(layer)
    if cfg.separate_text_embedding:
        keep_frozen_gathered(shard(objective.talker.model.text_embedding))
    # The root holds everything else and must be the module whose forward runs it all.
    fully_shard(objective, mesh=mesh, mp_policy=root_mp, offload_policy=offload)
    if mesh.size() == 1 and device.type == "cpu":
        units = fsdp_units(objective)
        nested = {id(p) for unit in units if unit is not objective for p in unit.parameters()}
        for unit in units:
            # each unit's own parameters: the sharded ones, as registered before any forward
            own = [p for p in unit.parameters()
                   if unit is not objective or id(p) not in nested]
            unit.set_custom_reduce_scatter(OneRankReduce(own))
    if not any(p.is_meta for p in objective.parameters()) and not cfg.cpu_offload:
        objective.to(device)
    return objective


class OneRankReduce:
    """A unit's gradient reduction over a CPU world of one: the identity, with no copy,
    into one buffer for the whole run.

    FSDP2 reduces a unit's gradients by allocating an input buffer (every
    gradient copied in), then an output buffer of the same size, and on one
    rank copies the first into the second; the unit's sharded gradients are
    views of the output. This comm answers the output's allocation with the
    input buffer itself, so that copy is a copy onto itself, which torch skips.
    And the input is the same buffer every step while none of the unit's
    gradients is alive (`zero_grad(set_to_none=True)` dropped the views of it):
    a fresh one per step is tens of MB per unit, which the C allocator maps
    anew each time, and writing it paid a page fault per 4 KB (the copy-in ran
    at a sixth of memory speed, profiled). A gradient still held (accumulation
    with reduction every micro-step) gets a fresh buffer to add from.

    One instance per unit (a unit's reductions never interleave); the input's
    allocation always comes first (torch 2.13's `foreach_reduce`, which the
    sharding tests run), and a mismatch in size or dtype gets a fresh buffer.
    Never used with more than one rank, where the reduction is real.
    """

    def __init__(self, params: list[torch.Tensor]) -> None:
        self._params = params
        self._buffer: torch.Tensor | None = None
        self._input: torch.Tensor | None = None

    def allocate(self, size: Any, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        held, self._input = self._input, None
        if held is not None and _fits(held, size, dtype):
            return held  # the output: the input buffer, already holding the gradients
        free = all(p.grad is None for p in self._params)  # no gradient views the buffer
        if free and self._buffer is not None and _fits(self._buffer, size, dtype):
            self._input = self._buffer
        else:
            self._input = torch.empty(*size, dtype=dtype, device=device)
            if free:
                self._buffer = self._input
        return self._input

    def __call__(self, output_tensor: torch.Tensor, input_tensor: torch.Tensor, group: Any,
                 op: Any, async_op: bool = False) -> Any:
        # FSDP calls the comm only with more than one rank; reduce as its default does
        return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group,
                                          async_op=async_op)


def _fits(buffer: torch.Tensor, size: Any, dtype: torch.dtype) -> bool:
    return buffer.dtype == dtype and tuple(buffer.shape) == tuple(size)


def keep_frozen_gathered(unit: Any) -> Any:
    """A unit none of whose parameters train stays gathered once gathered; returns it.

    Its weights never change, so gathering it again every step (in forward, and
    in backward's prefetch of the unit before layer 0) moved the same bytes each
    time: on one CPU rank a 1.2 GB copy of the text embedding, 0.6 s of a 6 s
    step (profiled); on GPUs an all-gather of it. Costs its whole parameters in
    the compute dtype for the run, within the plan's all-gather term (which
    reserves two of the largest unit). A state-dict save or load reshards it
    (FSDP2's hook), so a loaded checkpoint is gathered afresh at the next forward.
    A unit that trains keeps FSDP's defaults.
    """
    if any(p.requires_grad for p in unit.parameters()):
        return unit
    unit.set_reshard_after_forward(False, recurse=False)
    unit.set_reshard_after_backward(False, recurse=False)
    unit._voxshard_resident = True
    return unit


def set_gradient_sync(objective: nn.Module, enabled: bool) -> None:
    """For gradient accumulation: reduce across ranks only on the last micro-step.

    Between micro-steps without reduction every rank holds the *unsharded*
    fp32 gradient of every trainable parameter (about 6 GiB for 1.7B, whatever
    the GPU count); `accum_reduce="every"` (chosen by the plan when that does
    not fit) never calls this and keeps gradients sharded.
    """
    setter = getattr(objective, "set_requires_gradient_sync", None)
    if setter is not None:
        setter(enabled)


def fsdp_units(objective: nn.Module) -> list[Any]:
    """Every FSDP module of the objective, the root last (empty when not sharded)."""
    units = [m for m in objective.modules() if isinstance(m, FSDPModule) and m is not objective]
    return units + ([objective] if isinstance(objective, FSDPModule) else [])


def set_keep_gathered(objective: nn.Module, keep: bool, last: bool = True) -> None:
    """Parameters between the micro-steps of one optimizer step ("last" reduction).

    keep True, before a micro-step: every unit stays gathered after its forward
    (FSDP2's `reshard_after_forward` off), and after its backward unless this
    is the step's last micro-step (`reshard_after_backward`): the first
    micro-step's forward gathers each unit once and nothing is gathered again
    until the next optimizer step, whose weights the optimizer has changed in
    the shards by then (the last backward reshards, which drops the stale
    gathered copies). keep False: FSDP2's defaults back (non-root units
    reshard after forward; every unit after backward; the root stays gathered
    through its forward, as `fully_shard` set it).
    """
    for unit in fsdp_units(objective):
        if getattr(unit, "_voxshard_resident", False):
            continue  # frozen: gathered for the whole run (`keep_frozen_gathered`)
        if unit is not objective:
            unit.set_reshard_after_forward(not keep, recurse=False)
        unit.set_reshard_after_backward(last or not keep, recurse=False)
