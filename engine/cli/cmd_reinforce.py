"""CLI: the reinforce stage of a run (issue 33).

    voxshard-engine reinforce VOICE [--run RUN] [--iterations N] [--checkpoint STEP]
                              [--resume] [--asr SPEC] [--device DEV] [--workers N]
                              [--address ADDR] [--json]

Every setting of `engine.config.reinforce.ReinforceConfig` is a flag (its help and
default from the field); a flag not given keeps the voice's voice.toml [reinforce]
value. SIGTERM (the window's Stop) ends the iteration under way, saves it and exits 130;
`--resume` continues from the stage's own checkpoint. Nothing here imports torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import signal
import threading
from typing import Any

from engine.cli.cmd_quality import ASR_HELP
from engine.cli.main import add_command
from engine.cli.settings import add_field
from engine.config.reinforce import ReinforceConfig
from engine.core.errors import Cancelled, InputError
from engine.core.events import Emitter


def _reinforce(args: argparse.Namespace, em: Emitter) -> dict[str, Any]:
    # the stage loads torch and the model code: not at --help
    from engine.layout.voice import open_voice
    from engine.reinforce.session import ReinforceRequest, reinforce

    voice = open_voice(args.voice)
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(ReinforceConfig)}
    try:
        cfg = voice.reinforce_config.replace(**given)
    except ValueError as exc:
        raise InputError(f"Invalid reinforce setting: {exc}.") from exc
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        request = ReinforceRequest(voice, args.run, args.checkpoint, cfg, args.resume, args.asr,
                                   args.device, args.workers, args.address, args.max_failures)
        result = reinforce(request, on_event=em, cancel=stop)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if result.get("stopped") and stop.is_set():
        raise Cancelled(f"Stopped after iteration {result['iterations']}; its checkpoint is "
                        "saved.", "Continue with `voxshard-engine reinforce VOICE --resume`.")
    return result


def register(sub: Any) -> None:
    p = add_command(sub, "reinforce", _reinforce,
                    "Reinforce a trained run by its own scores (GRPO: speaker similarity, "
                    "word errors, length cap, speaking rate).")
    p.add_argument("voice", help="voice folder (trained)")
    p.add_argument("--run", default=None, help="run name (default: the latest with a checkpoint)")
    p.add_argument("--checkpoint", default=None,
                   help="the step to start from (default: the evaluation's best, else the "
                        "newest training checkpoint)")
    p.add_argument("--resume", action="store_true",
                   help="continue the run's reinforce stage from its newest checkpoint")
    p.add_argument("--asr", default=None, help=ASR_HELP)
    p.add_argument("--device", default=None, help="cpu (default) or cuda:N")
    p.add_argument("--workers", type=int, default=None,
                   help="run the policy update in N Ray Train workers (FSDP2, as training), "
                        "rollouts and scoring in a Ray actor (default: one process)")
    p.add_argument("--address", default=None,
                   help="with --workers: an existing Ray cluster (host:port); default: a "
                        "private local one")
    p.add_argument("--max-failures", type=int, default=2,
                   help="with --workers: worker-group restarts from the stage's newest "
                        "checkpoint before giving up")
    for f in dataclasses.fields(ReinforceConfig):
        add_field(p, ReinforceConfig, f.name)
