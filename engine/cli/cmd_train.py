"""CLI: train, plan and export.

    voxshard-engine train VOICE --base MODEL [--workers N] [--steps N | --epochs N]
                          [--preset few|standard|large]
                          [--lr LR] [--precision auto|bf16|fp16|fp32]
                          [--trainable talker|talker+text|code_predictor|talker_layers|lora]
                          [--address ADDR] [--resume] [--dry-run] [--json]
                          [--set SECTION.FIELD=VALUE ...] [--config FILE]
    voxshard-engine plan VOICE --base MODEL [--workers N] [--set ...] [--config FILE]
    voxshard-engine export VOICE [--run RUN] [--step STEP] OUT_DIR

Thin layers over `engine.train.driver`; nothing here imports torch or ray at
module level, so `voxshard-engine --help` stays fast.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from engine.cli.main import add_command
from engine.cli.settings import add_field, add_layer_options
from engine.config.layers import assignments
from engine.config.schema import field_help, lookup
from engine.config.train import LENGTH_SECTIONS, REQUEST_SETTINGS, ModelConfig, TrainConfig
from engine.core.events import Emitter
from engine.train.presets import ADVISED_MINUTES, LARGE_MINUTES, VOLUME_KEYS


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, not {value}")
    return value


#: settings where "not given" means more than the field's default (the presets by data
#: volume, the GPUs, or the voice's own [train] settings decide): their help says what,
#: and no "(default ...)" follows it
_DECIDED = frozenset({"workers", "batch_size", "keep_gathered", "precision", "trainable",
                      "lora_predictor", "predictor_frames", "steps", "epochs", "lr"})


def _settings(length: bool) -> list[str]:
    """The request's settings `train` (length: True) or `plan` (False) takes as flags."""
    return [path for path in REQUEST_SETTINGS
            if (path.partition(".")[0] in LENGTH_SECTIONS) == length]


def _add_settings(p: argparse.ArgumentParser, paths: list[str]) -> None:
    """A flag per setting, its words, type, bounds and choices from the config field."""
    length = None
    for path in paths:
        cls, name = lookup(path)
        target: Any = p
        if name in ("steps", "epochs"):  # one length or the other
            length = length or p.add_mutually_exclusive_group()
            target = length
        add_field(target, cls, name, show_default=name not in _DECIDED)


def _add_shape_options(p: argparse.ArgumentParser) -> None:
    """Options that change the memory plan; shared by train and plan."""
    p.add_argument("voice", help="voice folder (prepared)")
    p.add_argument("--base", default=None, help=field_help(ModelConfig)["base"])
    # None means "not given": the driver picks by data volume and GPUs, or keeps what a
    # resumed run used
    _add_settings(p, _settings(length=False))
    p.add_argument("--preset", choices=VOLUME_KEYS, default=None,
                   help="the defaults of this band of audio (few: under "
                        f"{ADVISED_MINUTES:g} min, standard, large: over {LARGE_MINUTES:g} "
                        "min); default: the voice's own amount of audio decides")
    add_layer_options(p, "training")
    p.add_argument("--cpu", action="store_true", help="train on the CPU even if GPUs exist")
    p.add_argument("--address", default=None,
                   help="an existing Ray cluster (host:port); default: a private local one")


def _common_kwargs(args: argparse.Namespace, length: bool = False) -> dict[str, Any]:
    names = [p.rpartition(".")[2] for p in _settings(False) + (_settings(True) if length
                                                                 else [])]
    # a flag wins over --set of the same setting, as the flag is the setting's own word
    paths = {k: v for k, v in assignments(args.set_values, TrainConfig).items()
             if k not in REQUEST_SETTINGS or getattr(args, k.rpartition(".")[2], None) is None}
    return {**{name: getattr(args, name) for name in names}, "settings": paths,
            "use_gpu": False if args.cpu else None, "address": args.address,
            "preset": args.preset, "config": args.config_file}


def train_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The keywords of `engine.train.driver.train` (a `TrainRequest`) that parsed `train`
    flags give."""
    return {"resume": args.resume, "run": args.run, "dry_run": args.dry_run,
            "max_failures": args.max_failures, "verbose": args.verbose,
            "storage": args.storage, "preflight": args.preflight,
            **_common_kwargs(args, length=True)}


def _train(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    from engine.train.driver import cancelled_error, train

    result = train(args.voice, args.base, on_event=em, **train_kwargs(args))
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
    from engine.train.export import export

    return export(args.voice, Path(args.out_dir), run=args.run, step=args.step,
                  name=args.name, adapter=args.adapter, peft=args.peft, on_event=em)


def register(sub: Any) -> None:
    p = add_command(sub, "train", _train,
                    "Fine-tune a Qwen3-TTS Base model on a prepared voice (FSDP on Ray).")
    _add_shape_options(p)
    _add_settings(p, _settings(length=True))
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
