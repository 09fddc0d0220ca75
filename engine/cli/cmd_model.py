"""CLI: models (`make-tiny-model`, `model info`, `model download`)."""

from __future__ import annotations

import argparse
from typing import Any

from engine.cli.main import add_command
from engine.core.events import Emitter


def _make_tiny(args: argparse.Namespace, emitter: Emitter) -> dict[str, Any]:
    from engine.model.tiny import make_tiny_model

    emitter.log(f"Building a tiny random Qwen3-TTS model in {args.out_dir}...")
    path = make_tiny_model(args.out_dir, seed=args.seed, overwrite=args.overwrite)
    emitter.artifact(str(path), role="model")
    return {"path": str(path), "summary": f"Tiny model written to {path}"}


def _info(args: argparse.Namespace, emitter: Emitter) -> dict[str, Any]:
    from engine.model.loading import inspect_model, resolve_model

    info = inspect_model(resolve_model(args.model, download=False, on_event=emitter))
    d = info.to_dict()
    d["summary"] = (f"{info.path}: Qwen3-TTS {info.size or ''} {info.model_type}, "
                    f"talker {info.talker_layers} layers x {info.talker_hidden}"
                    + (f", speakers {', '.join(info.speakers)}" if info.speakers else "")
                    + (" (tiny test model)" if info.tiny else ""))
    return d


def _download(args: argparse.Namespace, emitter: Emitter) -> dict[str, Any]:
    from engine.model.loading import download_model

    path = download_model(args.repo_id, on_event=emitter)
    return {"path": str(path), "summary": f"{args.repo_id} is in {path}"}


def register(sub: Any) -> None:
    p = add_command(sub, "make-tiny-model", _make_tiny,
                    "write a tiny random Qwen3-TTS model (for tests and offline demos)")
    p.add_argument("out_dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true")

    model = sub.add_parser("model", help="inspect or download base models")
    msub = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    p = add_command(msub, "info", _info, "describe a model folder or hub id")
    p.add_argument("model")
    p = add_command(msub, "download", _download,
                    "download a base model from the Hugging Face hub (resumable)")
    p.add_argument("repo_id")
