"""CLI: `serve` (the OpenAI-compatible speech endpoint, engine/serve)."""

from __future__ import annotations

import argparse
from typing import Any

from engine.cli.main import add_command
from engine.cli.settings import FIELD, add_field, field_help
from engine.config.serve import ClusterServeSettings, ServeSettings
from engine.config.speak import QUANT_MODES
from engine.core.errors import InputError
from engine.core.events import Emitter


def _serve(args: argparse.Namespace, emitter: Emitter) -> dict[str, Any]:
    from engine.core.storage import expand_arg
    from engine.serve.server import serve

    settings = ServeSettings(
        targets=list(args.voices or []), workspace=args.workspace, host=args.host,
        port=args.port, api_key_file=args.api_key_file, rows=args.rows, device=args.device,
        dtype=args.dtype, quantize=args.quantize, fuse=args.fuse, max_loaded=args.max_loaded,
        queue=args.queue, timeout_s=args.timeout, max_input=args.max_input,
        max_body=args.max_body, preload=not args.no_preload,
        reference_base=expand_arg(args.reference_base) if args.reference_base else None,
        wyoming=args.wyoming, wyoming_allow_lan=args.wyoming_allow_lan, zeroconf=args.zeroconf,
        http=args.http)
    if args.address and (args.wyoming or not args.http):
        raise InputError("--wyoming and --no-http serve from this computer, not through "
                         "--address.", "Leave out --address to serve Home Assistant.")
    if args.address:
        from engine.serve.ray_deploy import serve_on_ray

        cluster = ClusterServeSettings(
            address=args.address, replicas=args.replicas, min_replicas=args.min_replicas,
            max_replicas=args.max_replicas, replica_cpus=args.replica_cpus)
        return serve_on_ray(settings, cluster, emitter)
    return serve(settings, emitter)


def register(sub: Any) -> None:
    p = add_command(sub, "serve", _serve,
                    "serve voices to other programs through OpenAI's /v1/audio/speech")
    p.add_argument("voices", nargs="*", metavar="VOICE_OR_EXPORT",
                   help="exported voices, voice folders or run folders to serve")
    # flag, type, default and help from the settings' fields (engine/config/serve.py)
    add_field(p, ServeSettings, "workspace", show_default=False)
    for name in ("host", "port", "api_key_file", "rows", "queue"):
        add_field(p, ServeSettings, name, default=FIELD)
    add_field(p, ServeSettings, "timeout_s", flag="--timeout", metavar="SECONDS",
              default=FIELD, dest="timeout")
    for name in ("max_input", "max_body", "max_loaded"):
        add_field(p, ServeSettings, name, default=FIELD)
    p.add_argument("--no-preload", action="store_true",
                   help="load the first voice on its first request, not at start")
    add_field(p, ServeSettings, "reference_base", metavar="BASE_MODEL",
              help="allow requests to clone from their own reference_audio (base64) on "
                   "this Base model (off by default)")
    add_field(p, ServeSettings, "wyoming", metavar="tcp://HOST:PORT")
    for name in ("wyoming_allow_lan", "zeroconf", "http"):
        add_field(p, ServeSettings, name, default=FIELD)
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
    add_field(p, ServeSettings, "device")
    add_field(p, ServeSettings, "dtype", choices=("auto", "float32", "bfloat16"),
              default=FIELD)
    add_field(p, ServeSettings, "quantize", choices=QUANT_MODES)
    p.add_argument("--fuse", action="store_true", help=field_help(ServeSettings)["fuse"])
