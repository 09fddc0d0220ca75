"""CLI: train, plan and export.

    voxshard-engine train VOICE --base MODEL [--workers N] [--steps N | --epochs N]
                          [--lr LR] [--precision auto|bf16|fp16|fp32]
                          [--trainable talker|talker+text|code_predictor|talker_layers|lora]
                          [--address ADDR] [--resume] [--dry-run] [--json]
    voxshard-engine plan VOICE --base MODEL [--workers N]
    voxshard-engine export VOICE [--run RUN] [--step STEP] OUT_DIR

Thin layers over `engine.train.driver`; nothing here imports torch or ray at
module level, so `voxshard-engine --help` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from engine.cli.main import add_command
from engine.cli.settings import add_field
from engine.config.data import DataConfig
from engine.config.train import (
    KEEP_GATHERED_CHOICES,
    PRECISION_CHOICES,
    TRAINABLE_CHOICES,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    RunConfig,
)
from engine.core.events import Emitter


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {value}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, not {value}")
    return value


def _add_shape_options(p: argparse.ArgumentParser) -> None:
    """Options that change the memory plan; shared by train and plan."""
    p.add_argument("voice", help="voice folder (prepared)")
    p.add_argument("--base", required=True,
                   help="base model: a folder or a hub id such as Qwen/Qwen3-TTS-12Hz-1.7B-Base")
    # Settings that are config fields take their type and help from the field
    # (engine/config); None means "not given": the driver picks by data volume
    # and GPUs, or keeps what a resumed run used.
    add_field(p, ParallelConfig, "workers", type=_positive_int, show_default=False,
              help="Ray Train workers: one per GPU (default: every GPU), or CPU workers")
    p.add_argument("--cpu", action="store_true", help="train on the CPU even if GPUs exist")
    add_field(p, DataConfig, "batch_size", type=_positive_int, show_default=False,
              help="clips per micro-step over all workers (default: by data volume)")
    add_field(p, DataConfig, "grad_accum", type=_positive_int)
    for name in ("activation_checkpointing", "cpu_offload"):
        add_field(p, ParallelConfig, name)
    add_field(p, ParallelConfig, "keep_gathered", choices=KEEP_GATHERED_CHOICES,
              help="with --grad-accum: keep parameters gathered between micro-steps "
                   "(auto: when the memory plan says it fits)")
    add_field(p, ParallelConfig, "compile_layers", flag="--compile")
    add_field(p, ParallelConfig, "precision", choices=PRECISION_CHOICES,
              help="auto: bf16 on GPUs of compute capability 8.0+, fp16 with loss scaling "
                   "on older GPUs, fp32 on CPU")
    add_field(p, ModelConfig, "trainable", choices=TRAINABLE_CHOICES,
              help="what trains: talker (the talker and code predictor), "
                   "talker+text (plus the text embedding), code_predictor, talker_layers, "
                   "lora (adapters on the talker's attention and MLP; fits one 16-24 GB "
                   "GPU for 1.7B); `plan` shows the memory of each")
    add_field(p, ModelConfig, "lora_rank", type=_positive_int)
    add_field(p, ModelConfig, "lora_alpha", type=_positive_float)
    add_field(p, ModelConfig, "lora_predictor",
              help="with --trainable lora: adapters on the code predictor's layers too (it "
                   "carries codebooks 1-15; default: the voice's [train] lora_predictor, "
                   "else the talker's alone)")
    add_field(p, ModelConfig, "predictor_frames", type=_fraction, show_default=False,
              help="fraction F (0 < F <= 1) of each step's frames the code predictor "
                   "trains on; codebook 0 and validation always see every frame; below 1 a "
                   "step is faster, each frame's finer codebooks learnt from less often "
                   "(default: the voice's [train] predictor_frames, else 1)")
    p.add_argument("--address", default=None,
                   help="an existing Ray cluster (host:port); default: a private local one")


def _common_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "workers": args.workers,
        "batch_size": args.batch_size,
        "grad_accum": args.grad_accum,
        "activation_checkpointing": args.activation_checkpointing,
        "cpu_offload": args.cpu_offload,
        "keep_gathered": args.keep_gathered,
        "compile_layers": args.compile_layers,
        "precision": args.precision,
        "trainable": args.trainable,
        "lora_rank": args.lora_rank,
        "lora_alpha": args.lora_alpha,
        "lora_predictor": args.lora_predictor,
        "predictor_frames": args.predictor_frames,
        "use_gpu": False if args.cpu else None,
        "address": args.address,
    }


def _train(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    from engine.train.driver import cancelled_error, train

    result = train(args.voice, args.base, steps=args.steps, epochs=args.epochs, lr=args.lr,
                   checkpoint_every=args.checkpoint_every, val_every=args.val_every,
                   keep_checkpoints=args.keep, resume=args.resume, run=args.run,
                   dry_run=args.dry_run, max_failures=args.max_failures,
                   verbose=args.verbose, on_event=em, storage=args.storage,
                   preflight=args.preflight, **_common_kwargs(args))
    if result.get("stopped"):
        # a cancel is not a failure, but the run did not finish: exit code 130
        raise cancelled_error(result)
    return result


def _plan(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    from engine.train.driver import train

    return train(args.voice, args.base, dry_run=True, on_event=em, **_common_kwargs(args))


def _preflight(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    from engine.core.errors import ClusterError
    from engine.train.preflight import check_cluster

    out = check_cluster(args.voice, args.base, address=args.address, storage=args.storage,
                        timeout_s=args.timeout, on_event=em)
    if not out["ok"]:
        raise ClusterError(f"The cluster is not ready: {out['problems']}.",
                           "Fix what is listed for each node, then run preflight again.")
    return out


def _export(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    from engine.train.driver import export

    return export(args.voice, Path(args.out_dir), run=args.run, step=args.step,
                  name=args.name, adapter=args.adapter, peft=args.peft, on_event=em)


def register(sub: Any) -> None:
    p = add_command(sub, "train", _train,
                    "Fine-tune a Qwen3-TTS Base model on a prepared voice (FSDP on Ray).")
    _add_shape_options(p)
    length = p.add_mutually_exclusive_group()
    add_field(length, RunConfig, "steps", type=_positive_int, help="optimizer steps")
    add_field(length, RunConfig, "epochs", type=_positive_float, show_default=False,
              help="passes over the training clips (default: by data volume)")
    add_field(p, OptimConfig, "lr", type=_positive_float, show_default=False,
              help="peak learning rate (default: 2e-6 for 1.7B, 4e-6 for 0.6B)")
    add_field(p, RunConfig, "checkpoint_every", type=_positive_int)
    add_field(p, RunConfig, "val_every")
    add_field(p, RunConfig, "keep_checkpoints", flag="--keep", dest="keep")
    p.add_argument("--run", default=None, help="run name under VOICE/runs/ (default: a timestamp)")
    p.add_argument("--resume", action="store_true",
                   help="continue the latest run (or --run NAME) from its last checkpoint")
    p.add_argument("--dry-run", action="store_true",
                   help="check everything and print the memory plan; start nothing")
    p.add_argument("--max-failures", type=int, default=2,
                   help="worker-group restarts from the last checkpoint before giving up")
    p.add_argument("--verbose", action="store_true", help="forward Ray's own logs")
    p.add_argument("--storage", default=None, metavar="DIR_OR_URI",
                   help="where runs live: a folder every node mounts, or s3://bucket/prefix "
                        "(gs://... too); remembered for the voice; 'default' = VOICE/runs/")
    p.add_argument("--preflight", action=argparse.BooleanOptionalAction, default=None,
                   help="check every node (storage, model, versions) before training "
                        "(default: on with --address)")

    p = add_command(sub, "preflight", _preflight,
                    "Check every node of a Ray cluster for a run: storage, model, versions.")
    p.add_argument("voice", help="voice folder")
    p.add_argument("--base", required=True, help="base model: a folder or a hub id")
    p.add_argument("--address", default=None,
                   help="the Ray cluster (host:port or auto); default: a private local one")
    p.add_argument("--storage", default=None, metavar="DIR_OR_URI",
                   help="where runs will live (default: the voice's setting, else VOICE/runs/)")
    p.add_argument("--timeout", type=_positive_float, default=120.0,
                   help="seconds to wait for every node's answer")

    p = add_command(sub, "plan", _plan,
                    "Predict memory per GPU (or CPU worker) for a training run; start nothing.")
    _add_shape_options(p)

    p = add_command(sub, "export", _export,
                    "Write a trained checkpoint as an official custom-voice model folder.")
    p.add_argument("voice", help="voice folder")
    p.add_argument("out_dir", help="folder to create (must not exist or be empty)")
    p.add_argument("--run", default=None, help="run name (default: the latest run)")
    p.add_argument("--step", type=int, default=None,
                   help="checkpoint step (default: the evaluation's best, else the latest)")
    p.add_argument("--name", default=None,
                   help="speaker name the model answers to (default: the voice's speaker)")
    p.add_argument("--adapter", action="store_true",
                   help="a LoRA run: write its adapters and speaker row alone (tens of MB), "
                        "an adapter voice that speaks on the run's base model")
    p.add_argument("--peft", action="store_true",
                   help="with --adapter: also write PEFT's adapter_config.json and "
                        "adapter_model.safetensors, for peft on the official model")
