"""CLI: `serve` (the OpenAI-compatible speech endpoint, engine/serve)."""

from __future__ import annotations

import argparse
from typing import Any

from engine.cli.main import add_command
from engine.cli.settings import FIELD, add_field
from engine.config.schema import field_help, lookup
from engine.config.serve import SERVE_SETTINGS, ClusterServeSettings, ServeSettings
from engine.core.errors import InputError
from engine.core.events import Emitter

#: the serve settings taken as flags, by field name
_SETTINGS = tuple(path.rpartition(".")[2] for path in SERVE_SETTINGS)
#: a flag's words where the command line says more than the field's comment
_HELP = {"reference_base": "allow requests to clone from their own reference_audio (base64) "
                           "on this Base model (off by default)"}
_METAVARS = {"timeout_s": "SECONDS", "reference_base": "BASE_MODEL",
             "wyoming": "tcp://HOST:PORT"}


def serve_settings(args: argparse.Namespace) -> ServeSettings:
    """The `ServeSettings` parsed `serve` flags give (the window's Serve page sends the same
    settings by the same flags)."""
    from engine.core.storage import expand_arg

    values = {name: getattr(args, name) for name in _SETTINGS}
    if values["reference_base"]:
        values["reference_base"] = expand_arg(values["reference_base"])
    return ServeSettings(targets=list(args.voices or []), **values)


def _serve(args: argparse.Namespace, emitter: Emitter) -> dict[str, Any]:
    from engine import api

    settings = serve_settings(args)
    if args.address and (args.wyoming or not args.http):
        raise InputError("--wyoming and --no-http serve from this computer, not through "
                         "--address.", "Leave out --address to serve Home Assistant.")
    if args.address:
        from engine.serve.ray_deploy import serve_on_ray

        cluster = ClusterServeSettings(
            address=args.address, replicas=args.replicas, min_replicas=args.min_replicas,
            max_replicas=args.max_replicas, replica_cpus=args.replica_cpus)
        return serve_on_ray(settings, cluster, emitter)
    # until Ctrl+C or SIGTERM (the CLI makes it KeyboardInterrupt): then a graceful stop
    return api.serve(settings, on_event=emitter).wait()


def register(sub: Any) -> None:
    p = add_command(sub, "serve", _serve,
                    "serve voices to other programs through OpenAI's /v1/audio/speech")
    p.add_argument("voices", nargs="*", metavar="VOICE_OR_EXPORT",
                   help="exported voices, voice folders or run folders to serve")
    # flag, type, default and help from the settings' fields (engine/config/serve.py)
    for path in SERVE_SETTINGS:
        cls, name = lookup(path)
        add_field(p, cls, name, default=FIELD, help=_HELP.get(name),
                  metavar=_METAVARS.get(name))
    p.add_argument("--address", metavar="HOST:PORT",
                   help="serve on this existing Ray cluster through Ray Serve (what `ray start "
                   "--head` printed, or 'auto'); the voice folders must be visible at the same "
                   "path on every node. Needs voxshard[ray-serve]")
    for name in ("replicas", "min_replicas", "max_replicas"):
        add_field(p, ClusterServeSettings, name, show_default=False,
                  help=f"with --address: {field_help(ClusterServeSettings).get(name, name)}")
    add_field(p, ClusterServeSettings, "replica_cpus",
              default=FIELD,
              help="with --address: CPUs each replica asks for")
