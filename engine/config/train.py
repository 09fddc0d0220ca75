"""The training configuration: one tree of dataclasses, every field documented.

Every field is validated in `__post_init__` (a bad value raises `ValueError`
naming the field), and `TrainConfig.to_dict()` / `TrainConfig.from_dict()`
round-trip exactly so the resolved config saved with a run can re-create it.

This module must stay light (no torch import): the GUI and `plan` read it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal

# how prepared clips become batches lives with the data (data never imports train)
from engine.config.data import DataConfig

#: Which parameters receive gradients and go to the optimizer.
#: - "talker": every talker parameter (decoder layers, norms, codec embedding,
#:   text_projection, codec_head) and the whole code predictor; the 311M-param
#:   text embedding stays frozen (it only maps the fixed text vocabulary).
#: - "talker+text": as "talker", plus the text embedding.
#: - "code_predictor": only the code predictor (sub-talker); cheap, fixes timbre
#:   detail but not prosody.
#: - "talker_layers": the talker decoder layers, its final norm and codec_head
#:   (not the embeddings, not the code predictor).
#: - "lora": low-rank adapters (rank `lora_rank`) on every talker decoder
#:   layer's attention (q, k, v, o) and MLP (gate, up, down) projections; the
#:   base weights stay frozen, so gradients and AdamW state are a few MB and a
#:   single 16-24 GB card can fine-tune 1.7B. Export merges the adapters.
#:   With `lora_predictor` the code predictor's decoder layers get them too.
Trainable = Literal["talker", "talker+text", "code_predictor", "talker_layers", "lora"]
TRAINABLE_CHOICES: tuple[str, ...] = ("talker", "talker+text", "code_predictor", "talker_layers",
                                      "lora")


def trained_groups(trainable: str) -> tuple[str, ...]:
    """The parameter groups ("talker", "code_predictor") a `trainable` choice trains."""
    return {"talker": ("talker", "code_predictor"), "talker+text": ("talker", "code_predictor"),
            "code_predictor": ("code_predictor",), "talker_layers": ("talker",),
            "lora": ("talker",)}[trainable]


Precision = Literal["auto", "bf16", "fp16", "fp32"]
PRECISION_CHOICES: tuple[str, ...] = ("auto", "bf16", "fp16", "fp32")
#: gradient reduction during accumulation: "auto" (the driver picks from the
#: plan), "last" (only on the last micro-step: fewer collectives, but every
#: GPU holds whole fp32 gradients between micro-steps), "every" (reduce-scatter
#: after every micro-step: gradients stay sharded)
ACCUM_REDUCE_CHOICES: tuple[str, ...] = ("auto", "last", "every")
#: parameters between accumulation micro-steps (with "last" reduction): "on" keeps
#: every FSDP unit gathered from the first micro-step's forward to the last one's
#: backward (one all-gather per unit per optimizer step instead of two per
#: micro-step, for the memory of the whole model in the compute dtype), "off"
#: re-gathers them in every forward and backward, "auto" (the driver picks from the
#: plan) keeps them when that fits
KEEP_GATHERED_CHOICES: tuple[str, ...] = ("auto", "on", "off")
Schedule = Literal["cosine", "constant", "linear"]


def _check(cond: bool, name: str, why: str) -> None:
    if not cond:
        raise ValueError(f"{name}: {why}")


@dataclass
class ModelConfig:
    """What is trained and how the loss is weighted."""

    #: base model: a Hub id or a local folder in the official format
    base: str = "Qwen/Qwen3-TTS-12Hz-1.7B-Base"
    #: which parameters train (see `Trainable`)
    trainable: str = "talker"
    #: weight of the sub-talker (code predictor) loss in the total
    subtalker_weight: float = 0.3
    #: fraction F (0 < F <= 1) of each step's frames the code predictor is trained on;
    #: codebook 0 is always scored on every frame, validation on all frames. Below 1 a
    #: step is faster (the predictor is most of it) but each frame's finer codebooks
    #: are learnt from less often
    predictor_frames: float = 1.0
    #: name the exported custom voice answers to (lower-cased on export)
    speaker_name: str = "voice"
    #: LoRA (trainable "lora"): the adapters' rank
    lora_rank: int = 16
    #: LoRA scale numerator: the adapters' update is scaled by lora_alpha / lora_rank
    lora_alpha: float = 32.0
    #: LoRA: adapters on the code predictor's decoder layers too (it carries codebooks
    #: 1-15: the fine detail of the sound), not on the talker's alone; the other trainable
    #: choices train the code predictor whole or not at all, and ignore it
    lora_predictor: bool = False

    def __post_init__(self) -> None:
        _check(bool(self.base), "model.base", "must name a model")
        _check(self.trainable in TRAINABLE_CHOICES, "model.trainable",
               f"must be one of {', '.join(TRAINABLE_CHOICES)}, not {self.trainable!r}")
        _check(self.subtalker_weight >= 0, "model.subtalker_weight", "must be >= 0")
        _check(0 < self.predictor_frames <= 1, "model.predictor_frames",
               "must be above 0 and at most 1 (1: every frame)")
        _check(bool(self.speaker_name.strip()), "model.speaker_name", "must not be empty")
        _check(self.lora_rank >= 1, "model.lora_rank", "must be >= 1")
        _check(self.lora_alpha > 0, "model.lora_alpha", "must be > 0")

    @property
    def lora_scaling(self) -> float:
        """What the adapters' update is multiplied by, in training and in every merge."""
        return float(self.lora_alpha) / float(self.lora_rank)


@dataclass
class OptimConfig:
    """AdamW with warmup then decay; fp32 master weights always."""

    #: peak learning rate (2e-6 is the advice for 1.7B; the tiny test model wants ~1e-3)
    lr: float = 2e-6
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    #: clip the global gradient norm to this (0 disables)
    grad_clip: float = 1.0
    #: linear warmup from 0 over this many optimizer steps
    warmup_steps: int = 10
    #: decay after warmup
    schedule: str = "cosine"
    #: the learning rate decays to lr * min_lr_ratio
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        _check(self.lr > 0, "optim.lr", "must be > 0")
        _check(self.weight_decay >= 0, "optim.weight_decay", "must be >= 0")
        _check(0 <= self.beta1 < 1 and 0 <= self.beta2 < 1, "optim.beta1/beta2",
               "must be in [0, 1)")
        _check(self.eps > 0, "optim.eps", "must be > 0")
        _check(self.grad_clip >= 0, "optim.grad_clip", "must be >= 0")
        _check(self.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
        _check(self.schedule in ("cosine", "constant", "linear"), "optim.schedule",
               "must be cosine, constant or linear")
        _check(0 <= self.min_lr_ratio <= 1, "optim.min_lr_ratio", "must be in [0, 1]")


@dataclass
class ParallelConfig:
    """Workers, devices and how the model is sharded."""

    #: number of Ray Train workers (one per GPU on a GPU machine)
    workers: int = 1
    #: None: use GPUs when the cluster has them; True/False forces it
    use_gpu: bool | None = None
    #: "auto": bf16 compute with fp32 master weights and fp32 gradient reduction
    #: on a GPU of compute capability 8.0+, fp16 with loss scaling on older GPUs,
    #: plain fp32 on CPU (bf16 matmuls are ~40x slower on AVX2 CPUs); see precision.py
    precision: str = "auto"
    #: recompute each decoder layer's activations in backward (less memory, ~30% slower)
    activation_checkpointing: bool = False
    #: keep sharded parameters, gradients and optimizer state in host memory (GPU only)
    cpu_offload: bool = False
    #: give the (frozen) text embedding its own FSDP unit so it is freed after use
    #: instead of staying gathered for the whole step in the root unit
    separate_text_embedding: bool = True
    #: Ray cluster address; None starts a local one bound to 127.0.0.1
    address: str | None = None
    #: threads per worker for torch on CPU
    cpu_threads_per_worker: int = 1
    #: gradient reduction with grad_accum > 1 (see ACCUM_REDUCE_CHOICES)
    accum_reduce: str = "auto"
    #: parameters kept gathered between accumulation micro-steps (see KEEP_GATHERED_CHOICES)
    keep_gathered: str = "auto"
    #: torch.compile every decoder layer's forward (GPU runs only; on CPU the layers
    #: stay eager)
    compile_layers: bool = False

    def __post_init__(self) -> None:
        _check(self.workers >= 1, "parallel.workers", "must be >= 1")
        _check(self.precision in PRECISION_CHOICES, "parallel.precision",
               f"must be one of {', '.join(PRECISION_CHOICES)}")
        _check(self.accum_reduce in ACCUM_REDUCE_CHOICES, "parallel.accum_reduce",
               f"must be one of {', '.join(ACCUM_REDUCE_CHOICES)}")
        _check(self.keep_gathered in KEEP_GATHERED_CHOICES, "parallel.keep_gathered",
               f"must be one of {', '.join(KEEP_GATHERED_CHOICES)}")
        # kept parameters only make sense while gradients are not reduced in between
        _check(not (self.keep_gathered == "on" and self.accum_reduce == "every"),
               "parallel.keep_gathered", '"on" needs accum_reduce "last" (or "auto")')
        _check(self.cpu_threads_per_worker >= 1, "parallel.cpu_threads_per_worker", "must be >= 1")


@dataclass
class RunConfig:
    """Length of the run, checkpoints, validation and logging."""

    #: optimizer steps; None means derive from `epochs`
    steps: int | None = None
    #: passes over the training clips (used when steps is None)
    epochs: float = 10.0
    #: write a sharded checkpoint every N optimizer steps (and always at the end)
    checkpoint_every: int = 100
    #: how many checkpoints to keep (>= 2 so a torn latest one has a fallback)
    keep_checkpoints: int = 2
    #: validation loss every N optimizer steps (0 disables)
    val_every: int = 50
    #: seed of model-side randomness (dropout is off in Qwen3-TTS; kept for exactness)
    seed: int = 0
    #: run folder name under <voice>/runs/ (None: a timestamp)
    name: str | None = None

    def __post_init__(self) -> None:
        _check(self.steps is None or self.steps >= 1, "run.steps", "must be >= 1")
        _check(self.epochs > 0, "run.epochs", "must be > 0")
        _check(self.checkpoint_every >= 1, "run.checkpoint_every", "must be >= 1")
        _check(self.keep_checkpoints >= 2, "run.keep_checkpoints", "must be >= 2")
        _check(self.val_every >= 0, "run.val_every", "must be >= 0")


@dataclass
class TrainConfig:
    """The whole training configuration; saved resolved with every run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    run: RunConfig = field(default_factory=RunConfig)

    def __post_init__(self) -> None:
        # Every worker must get at least one clip per micro-step: FSDP collectives
        # need every rank to run forward and backward.
        _check(self.data.batch_size >= self.parallel.workers, "data.batch_size",
               f"must be >= parallel.workers ({self.parallel.workers}) so every worker gets a clip")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """Inverse of `to_dict`; unknown keys are an error (a typo must not pass silently)."""
        parts: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            sub = d.get(f.name, {})
            sub_cls = {"model": ModelConfig, "data": DataConfig, "optim": OptimConfig,
                       "parallel": ParallelConfig, "run": RunConfig}[f.name]
            names = {g.name for g in dataclasses.fields(sub_cls)}
            unknown = set(sub) - names
            if unknown:
                raise ValueError(f"{f.name}: unknown field(s) {', '.join(sorted(unknown))}")
            parts[f.name] = sub_cls(**sub)
        unknown_top = set(d) - set(parts)
        if unknown_top:
            raise ValueError(f"unknown section(s) {', '.join(sorted(unknown_top))}")
        return cls(**parts)

    def replace(self, **sections: dict[str, Any]) -> TrainConfig:
        """A copy with some fields changed: cfg.replace(optim={"lr": 1e-3})."""
        d = self.to_dict()
        for name, changes in sections.items():
            if name not in d:
                raise ValueError(f"unknown section {name!r}")
            d[name].update(changes)
        return TrainConfig.from_dict(d)
