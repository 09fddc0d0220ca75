"""Predicted memory per worker before anything starts, with advice when it will not fit.

Model state is counted, not guessed: the objective is built on the meta
device (no memory) from the model's config, and every parameter is assigned
to its FSDP unit (each decoder layer, the text embedding when it has its own
unit, the root for the rest). FSDP2 shards each parameter along dim 0 in
`ceil(rows / N)` chunks, so rank 0 holds the largest shard; that is what we
predict (and what a test compares with the local DTensor shards of a real run).

Per worker, in bytes:
- parameters: the local shard of every parameter, fp32 master weights;
- gradients: fp32 local shards of the trainable ones; with gradient
  accumulation and reduction only on the last micro-step ("last"), the
  *unsharded* fp32 gradient of every trainable parameter instead, on every
  GPU (FSDP keeps them between micro-steps), and on the GPU even under CPU
  offload (FSDP2 offloads only reduced, sharded gradients);
  `accum_reduce="auto"` picks "last" when that fits and "every" (sharded, a
  reduce-scatter per micro-step, offloaded with the rest) when it does not;
- optimizer: AdamW's two fp32 moments per trainable element;
- the optimizer step's temporaries (`step_temp`): the fused AdamW kernel (GPU
  and CPU alike) updates in place, and what remains is per tensor (clipping's
  norms, one tensor's scratch): the largest trainable local tensor in fp32.
  The step runs after backward has freed activations, so the total counts the
  larger of the two, not both;
- all-gather buffers: the root unit stays gathered for the whole step, the
  largest other unit is gathered twice (the current one and the prefetched
  next), in the compute dtype, plus that unit's full-size gradient in fp32
  before it is reduce-scattered. Deliberately conservative: the largest unit
  is often the frozen text embedding, which needs neither a prefetched twin
  nor a gradient (it stays gathered for the whole run, `keep_frozen_gathered`,
  inside the first of its two copies here); on CPU this margin roughly covers
  what process RSS adds (allocator slack, the mmap'd weight file during loading) - measured on
  the 0.6B widths with 12 layers: predicted 8.25 / 12.24 GiB per worker
  (2 / 1 workers) against 7.9 / 11.4 GiB peak RSS. With parameters kept
  gathered between accumulation micro-steps (`keep_gathered`, only with
  "last" reduction) instead: every unit's whole parameters in the compute
  dtype as FSDP2 allocates them (N x the rank-0 shard: odd dimensions
  padded), plus the same gradient; `keep_gathered="auto"` keeps them when
  that fits and re-gathers otherwise;
- activations: what autograd keeps for backward, per token and layer, from
  the layer shapes (see `layer_activation_bytes`; matches the bytes
  `saved_tensors_hooks` records for one official layer), plus the fp32 logits of
  the codec head and the 15 sub-talker heads, once each, and the two fp32
  copies of the larger one's that backward's first node adds
  (`head_logit_bytes`; the peak measured on the tiny model); with activation
  checkpointing only each layer's input is kept, plus one layer's working set;
- runtime: on a GPU the CUDA context, cuBLAS workspaces and NCCL
  communicators (a fixed `GPU_CONTEXT_BYTES`) plus a proportional margin
  (`GPU_MARGIN` of everything else) for allocator fragmentation and NCCL's
  buffers, which grow with the tensors moved (workers run with
  `expandable_segments`, which keeps fragmentation small); on CPU the
  Python, torch and Ray worker process itself.

On the host, besides the workers (`host_terms`, `host_total`): the driver, Ray
Train's controller and Ray's own processes of a local cluster, measured (see
`DRIVER_BYTES`); CPU workers share the machine with them, so a CPU run's fit check
is the whole run's figure against the available memory.

Also planned: the size of one checkpoint on disk (trainable fp32 parameters
and AdamW's two moments, all ranks together: about 19 GB for 1.7B), and the
per-worker total of every choice of what trains (`by_trainable`).
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from engine.audio.timebase import FRAME_RATE
from engine.config.change import Change, cli_lines
from engine.config.train import TRAINABLE_CHOICES, ModelConfig
from engine.core.errors import InputError
from engine.layout.manifest import read_manifest
from engine.model.loading import read_model_config
from engine.train.gpus import min_capability, visible_gpus
from engine.train.objective import build_objective
from engine.train.parallelize import decoder_layers
from engine.train.precision import compute_bytes, resolve_precision

GIB = float(1 << 30)
#: what a plan that does not fit on the large model offers instead
SMALLER_BASE = "Qwen/Qwen3-TTS-12Hz-0.6B-Base"
#: CUDA context, cuBLAS workspaces and NCCL communicators per GPU (0.6-1.0 GiB on
#: recent drivers; the larger figure keeps advice safe)
GPU_CONTEXT_BYTES = int(1.0 * GIB)
#: fragmentation and NCCL buffers, in proportion to what the GPU holds
GPU_MARGIN = 0.05
#: the allocator setting GPU workers run with (fewer, growable segments: less slack)
ALLOC_CONF = "expandable_segments:True"
#: a Ray Train CPU worker with torch imported, before the model (measured ~0.45 GiB RSS)
CPU_RUNTIME_BYTES = int(0.5 * GIB)
# The rest of a run on this machine, besides its workers (issue 45), measured with
# bench/bench_plan_peak.py's sampler: the PSS (shared pages split between the processes
# that map them, so the figures add up to what the machine holds) of every process under
# a real `train --cpu --workers 2` driver, the tiny model and the 0.6B widths at 2 layers,
# on a shared 2-core machine. Seen: the driver 0.44 GiB (0.65 RSS), Ray Train's controller
# 0.24 (0.38 RSS), and 13 other processes of Ray's between 0.017 (raylet) and 0.11 GiB
# (Ray Train's actors): GCS, raylet, the dashboard head and agent, the runtime-env agent,
# the autoscaler monitor, the log monitor, the run's metrics queue and stop flag, Ray
# Train's autoscaling coordinator, placement-group cleaner, synchronization actor and
# dataset manager; 0.89 GiB together. The figures below are the largest, rounded up;
# the driver's is the measurement at the real 0.6B size (0.65 GiB), above ours.
#: the driver: the CLI's (or the window's engine) process, with Ray's driver, torch, the
#: plan's meta model and the data index
DRIVER_BYTES = int(0.65 * GIB)
#: Ray Train's controller actor
TRAIN_CONTROLLER_BYTES = int(0.4 * GIB)
#: each other process a local Ray cluster runs for a run (see above), and each idle worker
RAY_PROCESS_BYTES = int(0.12 * GIB)
#: how many of those besides the idle workers (Ray keeps up to one per CPU it was given)
RAY_FIXED_PROCESSES = 13
#: the plan's names for those processes (`Plan.host_terms`)
DRIVER, TRAIN_CONTROLLER, RAY_PROCESSES = "driver", "Ray Train controller", "Ray's processes"
#: specials around text and audio in one training sequence (layout facts)
SEQ_SPECIALS = 11


@dataclass
class UnitCount:
    name: str
    numel: int
    local_numel: int
    trainable_local: int
    trainable_full: int = 0


@dataclass
class Plan:
    """What `plan` prints; all sizes in bytes, per worker (rank 0, the largest shard)."""

    workers: int
    device: str
    precision: str
    total_params: int
    trainable_params: int
    params: int
    grads: int
    optimizer: int
    gather_buffer: int
    activations: int
    runtime: int
    micro_batch_clips: int
    seq_len: int
    frames: int
    #: the optimizer step's temporaries (after backward: activations are freed then)
    step_temp: int = 0
    free: list[int] = field(default_factory=list)
    #: what to change to make it fit, cheapest first (`advise`)
    changes: list[Change] = field(default_factory=list)
    #: gradient reduction with accumulation: "last", "every", or "none" (grad_accum 1)
    accum_reduce: str = "none"
    #: bytes of one checkpoint on disk, all ranks together
    checkpoint_bytes: int = 0
    #: per-worker total of each choice of what trains (`model.trainable`), same settings
    by_trainable: dict[str, int] = field(default_factory=dict)
    #: what trains in this plan
    trainable: str = "talker"
    #: with CPU offload: host bytes the sharded state takes, all workers together
    host_bytes: int = 0
    #: host memory available (0: not checked)
    host_free: int = 0
    #: parameters stay gathered between accumulation micro-steps (`keep_gathered`)
    keep_gathered: bool = False
    #: the code predictor's share of each step's frames (`model.predictor_frames`)
    predictor_frames: float = 1.0
    #: a step's compute relative to the same step on every frame (from the layer shapes;
    #: what the run's time scales by)
    step_work: float = 1.0
    #: activations of the same micro-batch with the code predictor on every frame
    activations_all_frames: int = 0
    #: the run's other processes on this machine, bytes by kind (`host_processes`): the
    #: driver, Ray Train's controller, Ray's own processes; empty on an existing cluster
    host_terms: dict[str, int] = field(default_factory=dict)
    #: how many processes "Ray's processes" counts
    ray_processes: int = 0

    @property
    def model_state(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def total(self) -> int:
        return (self.model_state + self.gather_buffer + max(self.activations, self.step_temp)
                + self.runtime)

    @property
    def host_total(self) -> int:
        """Bytes the whole run holds in this machine's memory: every CPU worker (or, with
        CPU offload, the offloaded state) and the run's other processes."""
        workers = self.total * self.workers if self.device == "cpu" else self.host_bytes
        return workers + sum(self.host_terms.values())

    @property
    def fits(self) -> bool:
        if not self.free:
            return True
        if self.device == "cpu":
            # CPU workers share host memory with each other and the run's other processes
            return self.host_total <= self.free[0]
        if self.host_bytes and self.host_free and self.host_total > self.host_free:
            return False  # offloaded state must fit in host memory too
        return all(self.total <= f for f in self.free[: self.workers])

    @property
    def short_by(self) -> int:
        """Bytes missing per GPU (on CPU: for the whole run); 0 when it fits."""
        if self.fits:
            return 0
        if self.device == "cpu":  # the workers and the run's other processes share it
            return max(0, self.host_total - self.free[0])
        need = max(0, self.total - min(self.free[: self.workers] or [0]))
        return need or max(0, self.host_total - self.host_free)  # the host's offload memory

    @property
    def advice(self) -> list[str]:
        """What a terminal prints when it does not fit: by how much, then each remedy with
        its flags (`Change.flag_args`)."""
        if self.fits:
            return []
        short = (f"Short by {self.short_by / GIB:.1f} GiB per "
                 f"{'machine' if self.device == 'cpu' else 'GPU'}.")
        return [short, *(cli_lines(self.changes) or [NO_SINGLE_CHANGE])]

    def words(self) -> str:
        """A few plain sentences: what each worker needs, what is free, whether it fits and
        what a checkpoint takes; the remedies are `changes`, which each surface words."""
        device = "GPU" if self.device == "cuda" else "CPU worker"
        said = [f"Each {device} needs about {self.total / GIB:.1f} GiB"]
        if self.device == "cpu":
            said[0] += (f" ({self.host_total / GIB:.1f} GiB for the whole run: the "
                        f"{self.workers} workers, the driver and Ray's processes)")
            if self.free:
                said.append(f"{self.free[0] / GIB:.1f} GiB of memory is available")
        elif self.free:
            said.append("free per GPU: " + ", ".join(f"{f / GIB:.1f} GiB" for f in self.free))
        text = "; ".join(said) + (": it fits." if self.fits else ": it does not fit.")
        if not self.fits:
            text += (f" It is short by {self.short_by / GIB:.1f} GiB"
                     f"{'' if self.device == 'cpu' else ' per GPU'}.")
        if self.checkpoint_bytes:
            text += f" Each checkpoint takes {self.checkpoint_bytes / GIB:.1f} GiB of disk."
        if not self.fits and not self.changes:
            text += " " + NO_SINGLE_CHANGE
        return text

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)  # each change as {"path", "value", "why"}
        d.update(model_state=self.model_state, total=self.total, fits=self.fits,
                 host_total=self.host_total, advice=self.advice, words=self.words())
        return d

    def table(self) -> str:
        rows = [("parameters (fp32 shard)", self.params), ("gradients", self.grads),
                ("optimizer (AdamW)", self.optimizer), ("all-gather buffers", self.gather_buffer),
                ("activations", self.activations),
                ("optimizer step temporaries", self.step_temp), ("runtime", self.runtime),
                ("total per worker", self.total)]
        unit = "GPU" if self.device == "cuda" else "CPU worker"
        lines = [f"Predicted memory per {unit} ({self.workers} worker(s), {self.precision}, "
                 f"{self.micro_batch_clips} clip(s) x {self.seq_len} tokens per micro-batch; "
                 f"{_millions(self.trainable_params)} of {_millions(self.total_params)} "
                 "parameters train):"]
        lines += [f"  {name:<26}{size / GIB:8.2f} GiB" for name, size in rows]
        if self.host_terms:
            lines.append("  the run's other processes on this machine:")
            lines += [f"    {self._term_name(name):<24}{size / GIB:8.2f} GiB"
                      for name, size in self.host_terms.items()]
        if self.device == "cpu":
            lines.append(f"  {'the whole run':<26}{self.host_total / GIB:8.2f} GiB "
                         f"({self.workers} worker(s) and the processes above)")
        if self.free:
            if self.device == "cpu":
                lines.append(f"  {'host memory available':<26}{self.free[0] / GIB:8.2f} GiB")
            else:
                frees = ", ".join(f"{f / GIB:.1f}" for f in self.free)
                lines.append(f"  {'free per GPU':<26}{frees} GiB")
        if self.host_bytes:
            lines.append(f"  {'offloaded to host memory':<26}{self.host_bytes / GIB:8.2f} GiB "
                         "(all workers)" + (f", {self.host_total / GIB:.1f} GiB with the run's "
                                            "other processes" if self.host_terms else "")
                         + (f", {self.host_free / GIB:.1f} GiB available"
                            if self.host_free else ""))
        lines.append("  fits" if self.fits else "  DOES NOT FIT")
        if self.accum_reduce != "none":
            lines.append("  gradient accumulation: " + (
                "reduce-scatter after every micro-step (gradients stay sharded)"
                if self.accum_reduce == "every" else
                "reduce on the last micro-step only (whole fp32 gradients between micro-steps)"))
            if self.keep_gathered:
                lines.append("  parameters stay gathered between micro-steps (one all-gather "
                             "per unit and optimizer step)")
        lines.append(f"  one checkpoint on disk: {self.checkpoint_bytes / GIB:.2f} GiB")
        if self.predictor_frames < 1:
            lines.append(f"  code predictor on {self.predictor_frames:g} of the frames: "
                         f"activations {self.activations / GIB:.2f} GiB instead of "
                         f"{self.activations_all_frames / GIB:.2f}, a step about "
                         f"{100 * self.step_work:.0f} % of the compute (and time) of one on "
                         "every frame")
        if self.by_trainable:
            lines.append("  by what trains: " + ", ".join(
                f"{k} {v / GIB:.2f}" + (" *" if k == self.trainable else "")
                for k, v in self.by_trainable.items()) + " GiB per worker")
        lines += [f"  - {a}" for a in self.advice]
        return "\n".join(lines)

    def _term_name(self, name: str) -> str:
        if name == RAY_PROCESSES and self.ray_processes:
            return f"{name} ({self.ray_processes})"
        return name


#: a plan that no single change makes fit
NO_SINGLE_CHANGE = ("No single change fits; combine them (e.g. activation checkpointing with "
                    "LoRA adapters and a smaller batch), or use more GPUs.")


def _millions(n: int) -> str:
    # LoRA adapters of a small model are well under 0.1M parameters
    return f"{n / 1e6:,.1f}M" if n >= 1e5 else f"{n / 1e6:,.3f}M"


def _shard_rows(rows: int, n: int) -> int:
    """Rows rank 0 holds when FSDP2 chunks `rows` over `n` ranks."""
    return min(rows, math.ceil(rows / n)) if rows else 0


def _local_numel(shape: tuple[int, ...], n: int) -> int:
    if not shape:
        return 1
    rest = math.prod(shape[1:])
    return _shard_rows(shape[0], n) * rest


def count_units(model_dir: str | Path, model_cfg: Any, workers: int,
                separate_text_embedding: bool = True) -> list[UnitCount]:
    """Per FSDP unit: full and rank-0-local element counts (meta device, no memory)."""
    model_cfg = model_cfg or ModelConfig()
    table = _param_table(str(model_dir), model_cfg.trainable, model_cfg.lora_rank,
                         separate_text_embedding, model_cfg.lora_predictor)
    units: dict[str, UnitCount] = {}
    for name, shape, trainable in table:
        u = units.setdefault(name, UnitCount(name, 0, 0, 0))
        local = _local_numel(shape, workers)
        u.numel += math.prod(shape)
        u.local_numel += local
        if trainable:
            u.trainable_local += local
            u.trainable_full += math.prod(shape)
    return list(units.values())


@functools.lru_cache(maxsize=32)
def _param_table(model_dir: str, trainable: str, lora_rank: int,
                 separate_text_embedding: bool, lora_predictor: bool = False
                 ) -> tuple[tuple[str, tuple[int, ...], bool], ...]:
    """(FSDP unit, shape, trains) of every parameter; one meta build per choice, cached
    (a plan compares several choices and variants of the same model)."""
    objective = build_objective(model_dir, ModelConfig(
        trainable=trainable, lora_rank=lora_rank, lora_predictor=lora_predictor), device="meta")
    owner: dict[int, str] = {}
    for i, layer in enumerate(decoder_layers(objective)):
        for p in layer.parameters():
            owner[id(p)] = f"layer{i}"
    if separate_text_embedding:
        for p in objective.talker.model.text_embedding.parameters():
            owner[id(p)] = "text_embedding"
    return tuple((owner.get(id(p), "root"), tuple(p.shape), bool(p.requires_grad))
                 for p in objective.parameters())


def _dims(talker_cfg: dict[str, Any]) -> tuple[int, int, int, int, int]:
    h = int(talker_cfg["hidden_size"])
    inter = int(talker_cfg["intermediate_size"])
    heads = int(talker_cfg["num_attention_heads"])
    kv = int(talker_cfg["num_key_value_heads"])
    hd = int(talker_cfg.get("head_dim") or h // heads)
    return h, inter, heads, kv, hd


def layer_activation_bytes(talker_cfg: dict[str, Any], cbytes: int, seq_len: int,
                           checkpointing: bool) -> int:
    """Bytes autograd keeps per token for one official Qwen3-TTS decoder layer.

    Counted from the layer's ops (and checked against `saved_tensors_hooks`
    on the real layer at 0.6B and 1.7B widths, tests/test_plan_terms.py), in
    the compute dtype (`cbytes`) unless said:
    - each RMSNorm (two of width h; q-norm, k-norm per head) casts its input
      to fp32 and keeps that copy (4 bytes), keeps the normalised tensor for
      its weight's gradient, and its output is kept by the next linear: the
      two layer norms 2 x (4 + 2c) h, the q/k norms (4 + c)(q + k);
    - RoPE keeps only its cos/sin (2 x head_dim), the rotated q goes to
      attention; k and v reach attention repeated to all heads (2q);
      attention keeps its output (o_proj's input, same storage), a per-head
      fp32 logsumexp and, on CPU, a causal mask row (seq bytes);
    - the SwiGLU MLP keeps gate, silu(gate), up and their product (4i);
    - per-token fp32 statistics of the norms (rsqrt): 4 x (2 + heads + kv).
    The residual adds keep nothing. With activation checkpointing only the
    layer's input survives the forward.
    """
    h, inter, heads, kv, hd = _dims(talker_cfg)
    c = cbytes
    if checkpointing:
        return c * h
    q, k = heads * hd, kv * hd
    norms = 2 * (4 + 2 * c) * h + (4 + c) * (q + k)
    attention = c * q + 2 * c * q + c * q + 2 * c * hd + 4 * heads + c * seq_len
    return norms + attention + 4 * c * inter + 4 * (2 + heads + kv)


def predictor_frames_of(clips: int, frames: int, fraction: float) -> int:
    """Frames the code predictor runs on in a micro-batch of `clips` x `frames` frames."""
    total = clips * frames
    return total if fraction >= 1 else max(1, math.ceil(fraction * total))


def step_work(cfg: dict[str, Any], seq_len: int, frames: int, fraction: float) -> float:
    """A step's matmul work with the code predictor on `fraction` of the frames, relative to
    every frame: per clip, the talker's layers over `seq_len` tokens against the code
    predictor's over 16 positions per frame (plus its 15 heads); forward and backward
    scale alike, so the ratio is the forward's."""
    talker = cfg["talker_config"]
    cp = talker["code_predictor_config"]

    def per_token(c: dict[str, Any]) -> int:
        h, inter, heads, kv, hd = _dims(c)
        return int(c["num_hidden_layers"]) * (2 * h * heads * hd + 2 * h * kv * hd + 3 * h * inter)

    groups = int(talker.get("num_code_groups", 16))
    talker_work = seq_len * (per_token(talker) + int(talker["hidden_size"])
                             * int(talker["vocab_size"]))
    cp_work = frames * (groups * per_token(cp)
                        + (groups - 1) * int(cp["hidden_size"]) * int(cp["vocab_size"]))
    return (talker_work + fraction * cp_work) / (talker_work + cp_work)


def estimate_activations(cfg: dict[str, Any], clips: int, seq_len: int, frames: int,
                         compute_bytes: int, checkpointing: bool,
                         predictor_frames: float = 1.0) -> int:
    """Peak bytes above the model state in one micro-batch of `clips` sequences of `seq_len`
    tokens: what is kept for backward plus what backward's first node adds (see
    `head_logit_bytes`); predictor_frames: the code predictor's share of their frames."""
    talker = cfg["talker_config"]
    cp = talker["code_predictor_config"]
    tokens = clips * seq_len
    n_layers = int(talker["num_hidden_layers"])
    cp_layers = int(cp["num_hidden_layers"])
    groups = int(talker.get("num_code_groups", 16))
    # the code predictor runs one short sequence per frame it sees: the talker state + 15
    # codes
    cp_frames = predictor_frames_of(clips, frames, predictor_frames)
    cp_tokens = cp_frames * groups
    c = compute_bytes
    act = (tokens * n_layers * layer_activation_bytes(talker, c, seq_len, checkpointing)
           + cp_tokens * cp_layers * layer_activation_bytes(cp, c, groups, checkpointing))
    if checkpointing:
        # one layer's full working set is rebuilt during its backward
        act += max(tokens * layer_activation_bytes(talker, c, seq_len, False),
                   cp_tokens * layer_activation_bytes(cp, c, groups, False))
    # the summed input embeddings (text projection MLP keeps ~3 tensors of hidden size);
    # the code predictor's input sequence is talker-wide, and kept as its projection's
    # input when the widths differ (the projection is an identity when they match)
    h = int(talker["hidden_size"])
    cp_h = int(cp["hidden_size"])
    act += c * (tokens * 4 * h + cp_tokens * (cp_h + (h if h != cp_h else 0)))
    act += sum(head_logit_bytes(cfg, clips, frames, cp_frames))
    return int(act)


def head_logit_bytes(cfg: dict[str, Any], clips: int, frames: int,
                     cp_frames: int) -> tuple[int, int]:
    """(kept, backward's extra): the heads' share of the activation peak.

    Each cross-entropy keeps one fp32 copy of its logits (log-softmax's output; the head's
    linear keeps its input, the fp32 cast and the stack of the 15 sub-talker heads keep
    nothing), and the first node of backward, log-softmax's, briefly holds two more fp32
    copies of the larger loss's logits (the gradient arriving from the loss and its own
    result) on top of everything kept, the step's peak when the heads dominate.

    Rows: codebook 0 is scored on each clip's frames and its final eos (the prompt never
    goes through the head); the 15 sub-talker heads on the `cp_frames` the code predictor
    sees. Each fp32 copy is 4 bytes an entry, whatever the compute dtype.
    """
    talker = cfg["talker_config"]
    cp = talker["code_predictor_config"]
    groups = int(talker.get("num_code_groups", 16))
    codec = clips * (frames + 1) * int(talker["vocab_size"])
    sub = cp_frames * (groups - 1) * int(cp["vocab_size"])
    return 4 * (codec + sub), 2 * 4 * max(codec, sub)


def local_cpus(config: Any) -> int:
    """CPUs a local Ray cluster starts with: enough for every worker even on a small
    machine (Ray would otherwise wait forever for resources); the OS shares the cores."""
    return max(os.cpu_count() or 1,
               config.parallel.workers * config.parallel.cpu_threads_per_worker)


def host_processes(config: Any) -> tuple[dict[str, int], int]:
    """The run's processes on this machine besides its workers, bytes by kind, and how
    many of Ray's own (fixed ones and an idle worker per CPU); none on an existing
    cluster, whose nodes run their own."""
    if config.parallel.address is not None:
        return {}, 0
    ray = RAY_FIXED_PROCESSES + local_cpus(config)
    return {DRIVER: DRIVER_BYTES, TRAIN_CONTROLLER: TRAIN_CONTROLLER_BYTES,
            RAY_PROCESSES: ray * RAY_PROCESS_BYTES}, ray


def typical_lengths(voice_dir: Path, max_seq_len: int) -> tuple[int, int]:
    """(sequence tokens, audio frames) of the longest usable clip, from the manifest.

    Batches are bucketed by length, so the longest clip bounds a micro-batch.
    Text tokens are estimated at one per 3 characters (BPE on English).
    """
    best = (0, 0)
    # not strict: a voice not prepared yet is planned with a typical clip (below)
    for rec in read_manifest(voice_dir, strict=False):
        frames = math.ceil(float(rec.get("duration_s", 0.0)) * FRAME_RATE)
        seq = frames + len(str(rec.get("text", ""))) // 3 + 1 + SEQ_SPECIALS
        if seq > best[0] and seq <= max_seq_len:
            best = (seq, frames)
    if best[0] == 0:
        # no data yet: a 10-second clip with a sentence of text
        best = (int(10 * FRAME_RATE) + 40 + SEQ_SPECIALS, int(10 * FRAME_RATE))
    return best


def gpu_free_memory() -> list[int]:
    """Free bytes per visible GPU (NVML, honouring CUDA_VISIBLE_DEVICES; no CUDA context)."""
    return [g.free for g in visible_gpus()]


def host_available_memory() -> int:
    return int(psutil.virtual_memory().available)


def _compute(model_dir: Path, config: Any, device: str, seq_len: int, frames: int,  # noqa: PLR0913
             free: list[int], capability: tuple[int, int] | None = None,
             accum_reduce: str | None = None, keep: bool = True) -> Plan:
    cfg = read_model_config(model_dir)
    n = config.parallel.workers
    units = count_units(model_dir, config.model, n, config.parallel.separate_text_embedding)
    precision = resolve_precision(config.parallel.precision, device, capability)
    cbytes = compute_bytes(precision)
    trainable_local = sum(u.trainable_local for u in units)
    trainable_full = sum(u.trainable_full for u in units)
    if config.data.grad_accum <= 1:
        accum = "none"
    else:
        accum = accum_reduce or config.parallel.accum_reduce
        accum = "last" if accum == "auto" else accum
    root = next((u.numel for u in units if u.name == "root"), 0)
    biggest = max((u.numel for u in units if u.name != "root"), default=0)
    # kept gathered: only while gradients wait for the last micro-step
    keep = keep and accum == "last" and config.parallel.keep_gathered != "off"
    if keep:
        # every unit whole, as all-gathered (N padded shards), plus one unit's gradient
        gather = cbytes * n * sum(u.local_numel for u in units) + 4 * biggest
    else:
        gather = cbytes * root + 2 * cbytes * biggest + 4 * biggest
    clips = max(1, math.ceil(config.data.batch_size / n))
    offload = device == "cuda" and config.parallel.cpu_offload
    plan = Plan(
        workers=n, device=device, precision=precision,
        total_params=sum(u.numel for u in units),
        trainable_params=sum(u.trainable_full for u in units),
        params=4 * sum(u.local_numel for u in units),
        # "last": every unit's whole fp32 gradient stays between micro-steps
        grads=4 * (trainable_full if accum == "last" else trainable_local),
        optimizer=8 * trainable_local,
        gather_buffer=gather, keep_gathered=keep,
        activations=estimate_activations(cfg, clips, seq_len, frames, cbytes,
                                         config.parallel.activation_checkpointing,
                                         config.model.predictor_frames),
        activations_all_frames=estimate_activations(cfg, clips, seq_len, frames, cbytes,
                                                    config.parallel.activation_checkpointing),
        predictor_frames=config.model.predictor_frames,
        step_work=step_work(cfg, seq_len, frames, config.model.predictor_frames),
        runtime=0, step_temp=0,
        micro_batch_clips=clips, seq_len=seq_len, frames=frames, free=list(free),
        accum_reduce=accum, checkpoint_bytes=12 * trainable_full,
        trainable=config.model.trainable)
    plan.host_terms, plan.ray_processes = host_processes(config)
    if offload:
        # sharded state lives in host memory (AdamW steps there); the GPU keeps
        # buffers, activations and, with "last", the unreduced whole gradients
        plan.host_bytes = (plan.params + 4 * trainable_local + plan.optimizer
                           + step_temp_bytes(model_dir, config, n, "cpu", offload=True)) * n
        plan.params = plan.optimizer = 0
        plan.grads = 4 * trainable_full if accum == "last" else 0
    else:
        plan.step_temp = step_temp_bytes(model_dir, config, n, device)
    if device == "cuda":
        held = plan.model_state + plan.gather_buffer + max(plan.activations, plan.step_temp)
        plan.runtime = GPU_CONTEXT_BYTES + int(GPU_MARGIN * held)
    else:
        plan.runtime = CPU_RUNTIME_BYTES
    return plan


def step_temp_bytes(model_dir: Path, config: Any, workers: int, device: str,
                    offload: bool = False) -> int:
    """The optimizer step's temporaries on `device` (see the module docstring).

    Fused AdamW (`optimizer_kind`), in place; the largest trainable local tensor in
    fp32 bounds what one tensor's update and clipping allocate. Foreach AdamW (a device
    without the fused kernel) holds sqrt(v) of every trainable shard at once, in fp32.
    """
    table = _param_table(str(model_dir), config.model.trainable, config.model.lora_rank,
                         config.parallel.separate_text_embedding, config.model.lora_predictor)
    locals_ = [_local_numel(shape, workers) for _, shape, trains in table if trains]
    if not locals_:
        return 0
    return 4 * (max(locals_) if optimizer_kind(device, offload) == "fused" else sum(locals_))


def optimizer_kind(device: str, offload: bool = False) -> str:
    """AdamW's implementation for parameters on `device`: "fused" on GPUs and on the host
    (a CPU run, or the host shards of a CPU-offload run): one pass over each tensor, on
    every core the worker has. Foreach makes about ten passes over every trainable
    tensor and holds sqrt(v) of all of them at once: on 2 CPU threads its step over
    94 M parameters took 1.66 s of CPU time against the fused kernel's 0.25 s (issue
    32). The two round differently, by float32 ulps. Other devices: "foreach"."""
    return "fused" if device in ("cuda", "cpu") or offload else "foreach"


def make_plan(model_dir: str | Path, config: Any, *, device: str, voice_dir: Path | None = None,  # noqa: PLR0913
              free: list[int] | None = None, seq_len: int | None = None,
              frames: int | None = None, capability: tuple[int, int] | None = None,
              choices: bool = True) -> Plan:
    """The prediction for `config` (a TrainConfig) on `device` ("cuda" or "cpu").

    capability: the GPUs' (oldest) compute capability, which decides "auto"
    precision (read from the visible GPUs when None and device is "cuda").
    With `accum_reduce="auto"` and gradient accumulation, the plan picks
    "last" when it fits and "every" otherwise (`plan.accum_reduce`); with
    `keep_gathered="auto"` and "last", it keeps parameters gathered between
    micro-steps when that fits (`plan.keep_gathered`).
    choices: also plan every other `--trainable` choice (`plan.by_trainable`).
    """
    model_dir = Path(model_dir)
    if seq_len is None or frames is None:
        seq_len, frames = typical_lengths(voice_dir or Path("/nonexistent"),
                                          config.data.max_seq_len)
    if capability is None and device == "cuda":
        capability = min_capability(visible_gpus())
    if free is None:
        free = gpu_free_memory() if device == "cuda" else [host_available_memory()]
    plan = _best_accum(model_dir, config, device, seq_len, frames, free, capability)
    if plan.host_bytes and free:
        plan.host_free = host_available_memory()
    if choices:
        for choice in TRAINABLE_CHOICES:
            plan.by_trainable[choice] = plan.total if choice == config.model.trainable else \
                _best_accum(model_dir, config.replace(model={"trainable": choice}), device,
                            seq_len, frames, free, capability).total
    plan.changes = advise(plan, model_dir, config, device, capability)
    return plan


def _best_accum(model_dir: Path, config: Any, device: str, seq_len: int, frames: int,
                free: list[int], capability: tuple[int, int] | None) -> Plan:
    """`_compute`, with "auto" choices resolved, most memory first: parameters kept
    gathered if that fits, else re-gathered; "last" reduction if it fits, else "every"."""
    plan = _compute(model_dir, config, device, seq_len, frames, free, capability)
    if plan.keep_gathered and not plan.fits and config.parallel.keep_gathered == "auto":
        plan = _compute(model_dir, config, device, seq_len, frames, free, capability,
                        keep=False)
    # keeping was asked for ("on"): it needs "last", so the plan says what does not fit
    if (config.parallel.accum_reduce == "auto" and plan.accum_reduce == "last"
            and not plan.fits and config.parallel.keep_gathered != "on"):
        plan = _compute(model_dir, config, device, seq_len, frames, free, capability, "every")
    return plan


def relief(plan: Plan, model_dir: Path, config: Any, device: str,  # noqa: C901
           capability: tuple[int, int] | None = None, have: int | None = None) -> list[Change]:
    """Every change that lowers the memory a run needs, cheapest first, each with its figure
    in its `why` (changes that go together, a smaller batch and more accumulation, share it).

    have: the memory one GPU may use, or on CPU the machine's for the whole run (workers
    and the run's other processes); a change whose own figure exceeds it is left out
    (advice never recommends a setting that does not fit). None keeps them all
    (out-of-memory hints, where the real limit was just met).
    """
    def variant(section: str = "parallel", **changes: Any) -> Plan:
        return _best_accum(model_dir, config.replace(**{section: changes}), device,
                           plan.seq_len, plan.frames, plan.free, capability)

    def ok(p: Plan) -> bool:
        return have is None or (p.host_total if device == "cpu" else p.total) <= have

    def about(p: Plan) -> str:
        # CPU workers share the machine with the run's other processes: the whole figure
        return (f"about {p.host_total / GIB:.1f} GiB for the whole run" if device == "cpu"
                else f"about {p.total / GIB:.1f} GiB per worker")

    out: list[Change] = []
    if plan.keep_gathered:
        v = variant(keep_gathered="off")
        if ok(v):
            out.append(Change("parallel.keep_gathered", "off", "Gather parameters again in "
                              f"every micro-step: {about(v)}, more communication"))
    if not config.parallel.activation_checkpointing and plan.activations > 0.1 * plan.total:
        v = variant(activation_checkpointing=True)
        if ok(v):
            out.append(Change("parallel.activation_checkpointing", True, "Recompute "
                              f"activations in backward: {about(v)}, ~30% more compute"))
    if device == "cpu":
        for n in range(plan.workers - 1, 0, -1):
            v = variant(workers=n)
            if ok(v):
                out.append(Change("parallel.workers", n, f"Use fewer workers: {about(v)}, "
                                  "each with more of the machine's cores"))
                break
    if plan.micro_batch_clips > 1:
        half = max(plan.workers, config.data.batch_size // 2)
        accum = config.data.grad_accum * max(1, config.data.batch_size // half)
        v = _best_accum(model_dir, config.replace(data={"batch_size": half,
                                                        "grad_accum": accum}),
                        device, plan.seq_len, plan.frames, plan.free, capability)
        if ok(v):
            why = f"Lower the batch size, accumulating to the same effective batch: {about(v)}"
            out += [Change("data.batch_size", half, why), Change("data.grad_accum", accum, why)]
    if config.model.trainable != "lora":
        v = variant("model", trainable="lora")
        if ok(v):
            out.append(Change("model.trainable", "lora",
                              f"Train LoRA adapters only: {about(v)}"))
    if device == "cuda":
        if not config.parallel.cpu_offload:
            v = variant(cpu_offload=True)
            if ok(v) and v.host_total <= host_available_memory():
                out.append(Change("parallel.cpu_offload", True, "Keep sharded weights and "
                                  "optimizer state in host memory: about "
                                  f"{v.total / GIB:.1f} GiB per GPU, slower steps"))
        for n in (2, 4, 8, 16):
            if n <= plan.workers or config.data.batch_size < n:
                continue
            v = variant(workers=n)
            if ok(v):
                out.append(Change("parallel.workers", n,
                                  f"Use {n} GPUs: about {v.total / GIB:.1f} GiB per GPU"))
                break
    if plan.total_params > 1.2e9:
        out.append(Change("model.base", SMALLER_BASE, "Fine-tune the smaller model instead"))
    return out


def refusal(plan: Plan, where: str = "") -> InputError:
    """The refusal of a run that does not fit (`where`: " the cluster's GPUs"): what it
    needs and by how much it is short; the plan's changes are its remedy."""
    need = (f"{plan.total / GIB:.1f} GiB per GPU" if plan.device == "cuda" else
            f"{plan.host_total / GIB:.1f} GiB for the whole run")
    return InputError(f"Training will not fit{where}: it needs about {need}. "
                      f"{plan.advice[0]}", None if plan.changes else NO_SINGLE_CHANGE,
                      changes=plan.changes)


def advise(plan: Plan, model_dir: Path, config: Any, device: str,
           capability: tuple[int, int] | None = None) -> list[Change]:
    """Concrete changes that make the run fit, cheapest first (empty when it fits or when
    no single change does: `plan.short_by` says by how much)."""
    if plan.fits:
        return []
    have = plan.free[0] if device == "cpu" else min(plan.free[: plan.workers] or [0])
    return relief(plan, model_dir, config, device, capability, have=have)
