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
from engine.config.schema import check, section, setting

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
SCHEDULE_CHOICES: tuple[str, ...] = ("cosine", "constant", "linear")


def _check(cond: bool, name: str, why: str) -> None:
    if not cond:
        raise ValueError(f"{name}: {why}")


@section("model")
@dataclass
class ModelConfig:
    """What is trained and how the loss is weighted."""

    #: the base model: a Hugging Face hub id such as Qwen/Qwen3-TTS-12Hz-1.7B-Base, or a
    #: local model folder in the official format (a resumed run keeps its own)
    base: str = setting("Qwen/Qwen3-TTS-12Hz-1.7B-Base", label="Base model")
    # the choices' parameters in detail: `Trainable`
    #: which parts of the model learn: talker (the talker and the code predictor, the
    #: recommended full fine-tune), talker+text (also the 311M-parameter text embedding),
    #: code_predictor (acoustic detail, not prosody), talker_layers (the talker's decoder
    #: layers alone), lora (small adapters on the talker's attention and MLP, merged on
    #: export: fits 1.7B on one 16-24 GB GPU); the memory plan shows what each needs
    trainable: str = setting("talker", label="What trains", choices=TRAINABLE_CHOICES)
    #: weight of the sub-talker (code predictor) loss in the total
    subtalker_weight: float = setting(0.3, label="Code predictor loss weight", at_least=0)
    #: the share of each step's audio frames the code predictor (the fine detail of the
    #: sound) learns from; 1 uses every frame. Lower is faster, since the predictor is
    #: most of a step, but each frame's detail is learnt from less often; the main
    #: codebook and validation always use every frame (not given: the voice's own
    #: setting, else 1)
    predictor_frames: float = setting(1.0, label="Code predictor frames", above=0, at_most=1)
    #: name the exported custom voice answers to (lower-cased on export)
    speaker_name: str = setting("voice", label="Speaker name")
    #: LoRA (trainable "lora"): the adapters' rank
    lora_rank: int = setting(16, label="LoRA rank", at_least=1)
    #: LoRA scale numerator: the adapters' update is scaled by lora_alpha / lora_rank
    lora_alpha: float = setting(32.0, label="LoRA alpha", above=0)
    #: LoRA: the share of each adapter's inputs dropped while training (as peft's
    #: lora_dropout), which keeps a few minutes of speech from being learnt by heart;
    #: 0 drops nothing, and speaking never drops
    lora_dropout: float = setting(0.0, label="LoRA dropout", at_least=0, below=1)
    #: with LoRA: adapters on the code predictor's decoder layers too (it carries
    #: codebooks 1-15, the fine detail of the sound), not on the talker's alone; the other
    #: choices of what trains train the code predictor whole or not at all (not given: the
    #: voice's own setting, else off)
    lora_predictor: bool = setting(False, label="LoRA on the code predictor too")

    def __post_init__(self) -> None:
        check(self)
        _check(bool(self.base), "model.base", "must name a model")
        _check(bool(self.speaker_name.strip()), "model.speaker_name", "must not be empty")

    @property
    def lora_scaling(self) -> float:
        """What the adapters' update is multiplied by, in training and in every merge."""
        return float(self.lora_alpha) / float(self.lora_rank)


@section("optim")
@dataclass
class OptimConfig:
    """AdamW with warmup then decay; fp32 master weights always."""

    #: peak learning rate: how far each step moves the weights. Fine-tuning a voice wants
    #: a small one (2e-6 for 1.7B; the tiny test model wants ~1e-3), and too large a one
    #: forgets how to speak (not given: the preset's for the base model's size)
    lr: float = setting(2e-6, label="Learning rate", above=0)
    weight_decay: float = setting(0.01, label="Weight decay", at_least=0)
    beta1: float = setting(0.9, at_least=0, below=1)
    beta2: float = setting(0.999, at_least=0, below=1)
    eps: float = setting(1e-8, above=0)
    #: clip the global gradient norm to this (0 disables)
    grad_clip: float = setting(1.0, label="Gradient clip", at_least=0)
    #: linear warmup from 0 over this many optimizer steps
    warmup_steps: int = setting(10, label="Warmup steps", at_least=0)
    #: decay after warmup
    schedule: str = setting("cosine", choices=SCHEDULE_CHOICES)
    #: the learning rate decays to lr * min_lr_ratio
    min_lr_ratio: float = setting(0.1, at_least=0, at_most=1)

    def __post_init__(self) -> None:
        check(self)


@section("parallel")
@dataclass
class ParallelConfig:
    """Workers, devices and how the model is sharded."""

    #: training processes (Ray Train workers): one per GPU, or CPU workers that each
    #: take cores (not given: every GPU)
    workers: int = setting(1, label="Workers", at_least=1)
    #: None: use GPUs when the cluster has them; True/False forces it
    use_gpu: bool | None = None
    # bf16 keeps fp32 master weights and fp32 gradient reduction; bf16 matmuls are ~40x
    # slower on AVX2 CPUs (see precision.py)
    #: number format of the computation: auto is bf16 on GPUs of compute capability
    #: 8.0+, fp16 with loss scaling on older GPUs, fp32 on CPU
    precision: str = setting("auto", label="Precision", choices=PRECISION_CHOICES)
    #: recompute each decoder layer's activations in backward: less memory, ~30% slower
    activation_checkpointing: bool = setting(False, label="Activation checkpointing")
    #: keep sharded parameters, gradients and optimizer state in CPU memory between uses
    #: (GPUs only): fits larger models, slower steps
    cpu_offload: bool = setting(False, label="Offload to CPU memory")
    #: give the (frozen) text embedding its own FSDP unit so it is freed after use
    #: instead of staying gathered for the whole step in the root unit
    separate_text_embedding: bool = True
    #: Ray cluster address; None starts a local one bound to 127.0.0.1
    address: str | None = None
    #: threads per worker for torch on CPU
    cpu_threads_per_worker: int = setting(1, at_least=1)
    #: gradient reduction with grad_accum > 1 (see ACCUM_REDUCE_CHOICES)
    accum_reduce: str = setting("auto", choices=ACCUM_REDUCE_CHOICES)
    #: with gradient accumulation: keep parameters gathered between micro-steps (on),
    #: gather them again in each (off), or auto: keep them when the memory plan says it fits
    keep_gathered: str = setting("auto", label="Keep gathered", choices=KEEP_GATHERED_CHOICES)
    #: torch.compile every decoder layer's forward (GPU runs only; on CPU the layers
    #: stay eager)
    compile_layers: bool = setting(False, label="Compile layers", flag="--compile")

    def __post_init__(self) -> None:
        check(self)
        # kept parameters only make sense while gradients are not reduced in between
        _check(not (self.keep_gathered == "on" and self.accum_reduce == "every"),
               "parallel.keep_gathered", '"on" needs accum_reduce "last" (or "auto")')


@section("run")
@dataclass
class RunConfig:
    """Length of the run, checkpoints, validation and logging."""

    #: optimizer steps in the whole run (each step sees one batch over all workers); not
    #: given: the epochs decide
    steps: int | None = setting(None, label="Steps", at_least=1)
    #: passes over the training clips, when the steps are not given (not given: the
    #: preset's for the voice's amount of audio)
    epochs: float = setting(10.0, label="Epochs", above=0)
    #: a checkpoint every N optimizer steps, and always at the end (Stop saves one too)
    checkpoint_every: int = setting(100, label="Checkpoint every", unit="steps", at_least=1)
    #: how many checkpoints to keep (>= 2 so a torn latest one has a fallback)
    keep_checkpoints: int = setting(2, label="Checkpoints kept", at_least=2, flag="--keep")
    #: validation loss every N optimizer steps (0 disables)
    val_every: int = setting(50, label="Validate every", unit="steps", at_least=0)
    #: seed of model-side randomness (dropout is off in Qwen3-TTS; kept for exactness)
    seed: int = 0
    #: run folder name under <voice>/runs/ (None: a timestamp)
    name: str | None = None

    def __post_init__(self) -> None:
        check(self)


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


#: the settings one training run may be given (`voxshard-engine train` flags, the API's
#: `train` keywords, the window's fields), each named by its field; None or left out:
#: the presets by data volume decide, or a resumed run keeps its own
REQUEST_SETTINGS: tuple[str, ...] = (
    "parallel.workers", "data.batch_size", "data.grad_accum",
    "parallel.activation_checkpointing", "parallel.cpu_offload", "parallel.keep_gathered",
    "parallel.compile_layers", "parallel.precision", "model.trainable", "model.lora_rank",
    "model.lora_alpha", "model.lora_dropout", "model.lora_predictor", "model.predictor_frames",
    "run.steps", "run.epochs", "optim.lr", "run.checkpoint_every", "run.val_every",
    "run.keep_checkpoints", "data.plain_share",
)
#: sections whose settings change what a run costs, not its memory: `plan` takes no others
LENGTH_SECTIONS: tuple[str, ...] = ("run", "optim")
